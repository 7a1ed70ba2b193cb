package hostagent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// Paths of the hand-off on a control plane (issue 15), each prefixed with Options.Root.
const (
	// ClusterMirrorConfigDir holds the in-cluster mirror's CA (0644), serving certificate (0644) and
	// key (0600), mounted read-only into its static pod.
	ClusterMirrorConfigDir = "/etc/appliance-mirror"
	// ClusterMirrorDataDir is where the in-cluster mirror keeps its copy of the registry and repo.
	ClusterMirrorDataDir = "/var/lib/appliance-mirror"
	// ClusterMirrorManifest is its kubelet static pod manifest (kubeadm's manifest directory).
	ClusterMirrorManifest = "/etc/kubernetes/manifests/appliance-mirror.yaml"
	// ClusterMirrorPodName is the static pod's name (the mirror pod is appliance-mirror-<node>).
	ClusterMirrorPodName = "appliance-mirror"
)

// stepHandoff does the node's part of the hand-off (nc.Handoff): on a control plane it writes the
// in-cluster mirror's certificate and static pod, then waits until the mirror reports its copy
// complete (GET /healthz 200 over TLS with the appliance CA); on every node, once the appliance
// names the mirrors' repo URLs, it points the apt source at them (containerd's mirrors follow
// Mirrors[].Endpoints in the containerd step).
func (a *Agent) stepHandoff(ctx context.Context) (string, error) {
	a.mu.Lock()
	nc := a.nc
	a.mu.Unlock()
	h := nc.Handoff
	if h == nil {
		return "unchanged: no hand-off", nil
	}
	var done []string
	changed := false
	if m := h.Mirror; m != nil {
		c, err := a.writeClusterMirror(nc, m)
		if err != nil {
			return "", err
		}
		changed = changed || c
		st, err := a.clusterMirrorHealth(ctx, nc.CAPEM, m.Port)
		if err != nil {
			return "", &waitError{"waiting for the in-cluster mirror to finish its copy: " + err.Error()}
		}
		done = append(done, "in-cluster mirror serving on port "+strconv.Itoa(int(m.Port))+": "+st)
	}
	if len(h.RepoURLs) > 0 {
		var b strings.Builder
		b.WriteString("# Written by hostagent after the hand-off: the control planes' in-cluster mirrors, in order.\n")
		for _, u := range h.RepoURLs {
			if !strings.HasPrefix(u, "https://") || strings.ContainsAny(u, " \n\t]") {
				return "", fmt.Errorf("node config handoff.repoURLs: %q is not an https URL", u)
			}
			fmt.Fprintf(&b, "deb [signed-by=%s] %s/debian stable main\n", agentapi.RepoKeyringPath, strings.TrimSuffix(u, "/"))
		}
		c, err := atomicfile.Write(a.path(agentapi.AptSourcePath), []byte(b.String()), 0o644)
		if err != nil {
			return "", fmt.Errorf("write %s: %w", a.path(agentapi.AptSourcePath), err)
		}
		changed = changed || c
		done = append(done, fmt.Sprintf("apt source on %d in-cluster mirrors", len(h.RepoURLs)))
	}
	detail := strings.Join(done, "; ")
	if detail == "" {
		detail = "waiting for the appliance to switch the mirrors"
	}
	if !changed {
		return "unchanged: " + detail, nil
	}
	return detail, nil
}

// writeClusterMirror writes the mirror's files and static pod manifest; it reports whether any changed.
func (a *Agent) writeClusterMirror(nc agentapi.NodeConfig, m *agentapi.ClusterMirror) (bool, error) {
	if m.Image == "" || m.Port == 0 || m.CertPEM == "" || m.KeyPEM == "" || !strings.HasPrefix(m.Upstream, "https://") {
		return false, errors.New("node config handoff.mirror: image, port, certPEM, keyPEM and an https upstream are required")
	}
	inventory, err := json.MarshalIndent(m.Inventory, "", "  ")
	if err != nil {
		return false, err
	}
	images, err := json.MarshalIndent(m.Images, "", "  ")
	if err != nil {
		return false, err
	}
	changed := false
	for _, f := range []struct {
		path string
		data string
		mode os.FileMode
	}{
		{ClusterMirrorConfigDir + "/ca.crt", nc.CAPEM, 0o644},
		{ClusterMirrorConfigDir + "/tls.crt", m.CertPEM, 0o644},
		{ClusterMirrorConfigDir + "/tls.key", m.KeyPEM, 0o600},
		{ClusterMirrorConfigDir + "/inventory.json", string(inventory), 0o644},
		{ClusterMirrorConfigDir + "/images.json", string(images), 0o644},
		{ClusterMirrorManifest, string(ClusterMirrorPod(m)), 0o600},
	} {
		if f.path == ClusterMirrorConfigDir+"/images.json" && len(m.Images) == 0 {
			continue
		}
		c, err := atomicfile.Write(a.path(f.path), []byte(f.data), f.mode)
		if err != nil {
			return false, fmt.Errorf("write %s: %w", a.path(f.path), err)
		}
		changed = changed || c
	}
	if err := os.MkdirAll(a.path(ClusterMirrorDataDir), 0o755); err != nil {
		return false, err
	}
	return changed, nil
}

// ClusterMirrorPod is the in-cluster mirror's static pod manifest (JSON, which kubelet reads as the
// YAML it is): host network (it serves on every node address, reachable before any CNI), priority class
// system-node-critical, the appliance image by digest running `appliance cluster-mirror`, its config
// read-only and its data directory from the host, and a readiness probe on /healthz (ready = the copy is
// complete); beside it a second container, the kubelet serving CSR approver (`appliance csr-approve`).
// kubelet restarts both whenever they exit, with or without the API server.
func ClusterMirrorPod(m *agentapi.ClusterMirror) []byte {
	port := strconv.Itoa(int(m.Port))
	mirrorCmd := []string{"/appliance", "cluster-mirror",
		"--upstream", m.Upstream,
		"--ca-file", ClusterMirrorConfigDir + "/ca.crt",
		"--cert-file", ClusterMirrorConfigDir + "/tls.crt",
		"--key-file", ClusterMirrorConfigDir + "/tls.key",
		"--dir", ClusterMirrorDataDir,
		"--listen", ":" + port}
	if len(m.Images) > 0 { // the images no tag lists (writeClusterMirror writes the file)
		mirrorCmd = append(mirrorCmd, "--images-file", ClusterMirrorConfigDir+"/images.json")
	}
	pod := map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata": map[string]any{
			"name": ClusterMirrorPodName, "namespace": "kube-system",
			"labels": map[string]string{"app.kubernetes.io/name": ClusterMirrorPodName, "app.kubernetes.io/part-of": "airgap-appliance"},
		},
		"spec": map[string]any{
			"hostNetwork":       true,
			"priorityClassName": "system-node-critical",
			"containers": []any{map[string]any{
				"name":            "mirror",
				"image":           m.Image,
				"imagePullPolicy": "IfNotPresent",
				"command":         mirrorCmd,
				"volumeMounts": []any{
					map[string]any{"name": "config", "mountPath": ClusterMirrorConfigDir, "readOnly": true},
					map[string]any{"name": "data", "mountPath": ClusterMirrorDataDir},
				},
				"readinessProbe": map[string]any{
					"httpGet":       map[string]any{"scheme": "HTTPS", "host": "127.0.0.1", "port": m.Port, "path": "/healthz"},
					"periodSeconds": 5,
				},
				"resources": map[string]any{"requests": map[string]string{"cpu": "50m", "memory": "64Mi"}},
			}, map[string]any{
				// The kubelet serving CSR approver (pkg/csrapprove's rule) on the node's admin.conf
				// (kubeadm writes it on every control plane), with the inventory of the hand-off.
				"name":            "csr-approver",
				"image":           m.Image,
				"imagePullPolicy": "IfNotPresent",
				"command": []string{"/appliance", "csr-approve",
					"--kubeconfig", "/etc/kubernetes/admin.conf",
					"--inventory", ClusterMirrorConfigDir + "/inventory.json"},
				"volumeMounts": []any{
					map[string]any{"name": "config", "mountPath": ClusterMirrorConfigDir, "readOnly": true},
					map[string]any{"name": "kubeconfig", "mountPath": "/etc/kubernetes/admin.conf", "readOnly": true},
				},
				"resources": map[string]any{"requests": map[string]string{"cpu": "10m", "memory": "32Mi"}},
			}},
			"volumes": []any{
				map[string]any{"name": "kubeconfig", "hostPath": map[string]string{"path": "/etc/kubernetes/admin.conf", "type": "File"}},
				map[string]any{"name": "config", "hostPath": map[string]string{"path": ClusterMirrorConfigDir, "type": "Directory"}},
				map[string]any{"name": "data", "hostPath": map[string]string{"path": ClusterMirrorDataDir, "type": "DirectoryOrCreate"}},
			},
		},
	}
	b, _ := json.MarshalIndent(pod, "", "  ") // maps of strings and numbers: cannot fail
	return append(b, '\n')
}

// clusterMirrorHealth asks the local in-cluster mirror for /healthz (TLS, trusting only the appliance
// CA; its certificate names 127.0.0.1) and returns its answer when it says the copy is complete.
func (a *Agent) clusterMirrorHealth(ctx context.Context, caPEM string, port uint16) (string, error) {
	if ns := a.nsPath(); ns != "" {
		return "", errors.New("the hand-off step acts on the host itself, not in a network namespace")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(caPEM)) {
		return "", errors.New("no CA certificate in the node config")
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, Proxy: nil}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	url := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))) + "/healthz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s answered %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return strings.TrimSpace(string(body)), nil
}
