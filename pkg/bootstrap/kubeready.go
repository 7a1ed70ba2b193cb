package bootstrap

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// controlPlaneComponents are the static pods kubeadm writes on every control-plane node (label
// component=NAME, tier=control-plane; kubeadm constants Etcd, KubeAPIServer, KubeControllerManager,
// KubeScheduler). A control plane counts as ready only when all four run and are Ready.
var controlPlaneComponents = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// adminAPI is an HTTPS client of the cluster's API server with the appliance's admin kubeconfig
// (AdminKubeconfigPath: server https://VIP:port, cluster CA, admin client certificate).
type adminAPI struct {
	path   string // the kubeconfig it was read from
	server string
	client *http.Client
	close  func()
}

// openAdminAPI reads the admin kubeconfig from the state directory. Errors name the file and what to do.
func openAdminAPI(stateDir string) (*adminAPI, error) {
	path := statedir.AdminKubeconfig(stateDir)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("admin kubeconfig: %w (rerun bootstrap: the pki phase writes it)", err)
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(b, &kc); err != nil || len(kc.Clusters) != 1 || len(kc.Users) != 1 {
		return nil, fmt.Errorf("%s: not a one-cluster kubeconfig (%v): move it away and rerun bootstrap", path, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(kc.Clusters[0].Cluster.CertificateAuthorityData) {
		return nil, fmt.Errorf("%s: no CA certificate", path)
	}
	cert, err := tls.X509KeyPair(kc.Users[0].User.ClientCertificateData, kc.Users[0].User.ClientKeyData)
	if err != nil {
		return nil, fmt.Errorf("%s: client certificate: %w", path, err)
	}
	tr := &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	return &adminAPI{
		path:   path,
		server: kc.Clusters[0].Cluster.Server,
		client: &http.Client{Transport: tr, Timeout: 5 * time.Second},
		close:  tr.CloseIdleConnections,
	}, nil
}

// get GETs server+path and decodes a JSON answer into v (nil: body ignored). A non-200 answer is an
// error carrying the status and the start of the body.
func (a *adminAPI) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.server+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	if v == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(v)
}

// The few fields of core/v1 NodeList and PodList the readiness check reads (the API's JSON names).
type (
	condition struct {
		Type   string `json:"type"`
		Status string `json:"status"`
		Reason string `json:"reason,omitempty"`
	}
	nodeList struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Status struct {
				Conditions []condition `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
	podList struct {
		Items []struct {
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec struct {
				NodeName string `json:"nodeName"`
			} `json:"spec"`
			Status struct {
				Phase      string      `json:"phase"`
				Conditions []condition `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
)

func conditionTrue(cs []condition, typ string) bool {
	for _, c := range cs {
		if c.Type == typ {
			return c.Status == "True"
		}
	}
	return false
}

// kubeNotReady asks the API which configured nodes are not yet ready in Kubernetes' own terms: the
// Node object exists with condition Ready=True, the node's kube-proxy pod is Running and Ready, and, on
// a control plane, the four static pods (controlPlaneComponents) are Running with condition Ready=True. It returns node name → what is
// missing (e.g. "Node NotReady", "kube-scheduler not Ready"); an empty map means all are ready.
func kubeNotReady(ctx context.Context, api *adminAPI, nodes []config.Node) (map[string]string, error) {
	var nl nodeList
	if err := api.get(ctx, "/api/v1/nodes", &nl); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	var pl, proxies podList
	if err := api.get(ctx, "/api/v1/namespaces/kube-system/pods?labelSelector="+url.QueryEscape("tier=control-plane"), &pl); err != nil {
		return nil, fmt.Errorf("list control-plane pods: %w", err)
	}
	if err := api.get(ctx, "/api/v1/namespaces/kube-system/pods?labelSelector="+url.QueryEscape("k8s-app=kube-proxy"), &proxies); err != nil {
		return nil, fmt.Errorf("list kube-proxy pods: %w", err)
	}
	return notReady(nl, pl, proxies, nodes), nil
}

// notReady is kubeNotReady's decision on the lists it fetched: nodes, control-plane static pods and
// kube-proxy pods (kubeadm's kube-proxy DaemonSet, label k8s-app=kube-proxy: without it the node's
// Services do not work, and right after a join it can sit in CreateContainerConfigError for seconds).
func notReady(nl nodeList, pl, proxies podList, nodes []config.Node) map[string]string {
	nodeReady := map[string]bool{}
	for _, n := range nl.Items {
		nodeReady[n.Metadata.Name] = conditionTrue(n.Status.Conditions, "Ready")
	}
	podReady := map[string]bool{} // "node/component"
	for _, p := range pl.Items {
		podReady[p.Spec.NodeName+"/"+p.Metadata.Labels["component"]] = p.Status.Phase == "Running" && conditionTrue(p.Status.Conditions, "Ready")
	}
	proxyReady := map[string]bool{}
	for _, p := range proxies.Items {
		if p.Status.Phase == "Running" && conditionTrue(p.Status.Conditions, "Ready") {
			proxyReady[p.Spec.NodeName] = true
		}
	}
	missing := map[string]string{}
	for _, n := range nodes {
		ready, ok := nodeReady[n.Name]
		switch {
		case !ok:
			missing[n.Name] = "no Node object yet"
			continue
		case !ready:
			missing[n.Name] = "Node NotReady"
			continue
		}
		var notReady []string
		if !proxyReady[n.Name] {
			notReady = append(notReady, "kube-proxy")
		}
		if !n.HasRole(config.RoleControlPlane) {
			if len(notReady) > 0 {
				missing[n.Name] = "pods not Ready: " + strings.Join(notReady, ", ")
			}
			continue
		}
		for _, c := range controlPlaneComponents {
			if !podReady[n.Name+"/"+c] {
				notReady = append(notReady, c)
			}
		}
		if len(notReady) > 0 {
			missing[n.Name] = "pods not Ready: " + strings.Join(notReady, ", ")
		}
	}
	return missing
}

// waitKubeReady polls kubeNotReady every second until every configured node is ready in Kubernetes'
// terms or limit passes; report is called with each node's status whenever it changes ("" = ready).
func waitKubeReady(ctx context.Context, api *adminAPI, nodes []config.Node, limit time.Duration, report func(node, missing string)) error {
	deadline := time.Now().Add(limit)
	last := map[string]string{}
	first := true
	for {
		missing, err := kubeNotReady(ctx, api, nodes)
		if err == nil {
			for _, n := range nodes {
				if m := missing[n.Name]; first || m != last[n.Name] {
					report(n.Name, m)
				}
			}
			last, first = missing, false
			if len(missing) == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("every hostagent is done but the API does not answer the readiness check: %w", err)
			}
			var lines []string
			for n, m := range missing {
				lines = append(lines, n+": "+m)
			}
			sort.Strings(lines)
			return fmt.Errorf("every hostagent is done but Kubernetes does not call these nodes ready after %v: %s; `kubectl --kubeconfig %s get nodes,pods -A` shows why, rerun bootstrap to keep waiting",
				limit.Round(time.Second), strings.Join(lines, "; "), api.path)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
