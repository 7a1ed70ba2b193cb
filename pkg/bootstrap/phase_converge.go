package bootstrap

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
)

// DefaultConvergeTimeout bounds how long the converge phase waits for nodes.
const DefaultConvergeTimeout = 15 * time.Minute

// convergePhase waits until every node's hostagent has reported it ready, or it failed, printing
// each state change; with Kubernetes it then requires the API to answer /readyz through the VIP to
// the admin kubeconfig's client certificate, verified against the cluster CA. It fails, listing the nodes and their reasons, if a node failed or the wait
// (Options.ConvergeTimeout) ran out; nodes that made it stay as they are, and a rerun picks up the
// rest.
type convergePhase struct{}

func (convergePhase) Name() string { return "converge" }

func (convergePhase) Run(ctx context.Context, st *State) (Result, error) {
	store := nodestate.Open(NodesDir(st.StateDir))
	timeout := st.Options.ConvergeTimeout
	if timeout == 0 {
		timeout = DefaultConvergeTimeout
	}
	deadline := time.Now().Add(timeout)
	start := time.Now()
	seen := map[string]string{}
	readyAt := map[string]time.Duration{}
	for {
		var pending, failed []string
		for _, n := range st.Config.Nodes {
			s, err := store.Get(n.Name)
			state := agentapi.StatePending
			if err == nil {
				state = s.State
			}
			if seen[n.Name] != state {
				seen[n.Name] = state
				if !st.Options.JSONEvents {
					line := fmt.Sprintf("      %-12s %s", n.Name, state)
					if s.Reason != "" {
						line += ": " + s.Reason
					}
					fmt.Fprintln(st.Options.Progress, line)
				}
				if state == agentapi.StateReady {
					readyAt[n.Name] = time.Since(start)
				}
			}
			switch state {
			case agentapi.StateReady:
			case agentapi.StateFailed:
				failed = append(failed, fmt.Sprintf("%s: %s", n.Name, s.Reason))
			default:
				pending = append(pending, n.Name+" ("+state+")")
			}
		}
		if len(pending) == 0 {
			if len(failed) > 0 {
				sort.Strings(failed)
				return Result{}, fmt.Errorf("%d of %d nodes failed:\n  %s", len(failed), len(st.Config.Nodes), strings.Join(failed, "\n  "))
			}
			detail := fmt.Sprintf("%d nodes ready", len(st.Config.Nodes))
			if st.Config.Kubernetes.IsEnabled() {
				url, err := waitClusterAPI(ctx, st, time.Until(deadline))
				if err != nil {
					return Result{}, err
				}
				detail += fmt.Sprintf("; %s/readyz ok with %s", url, AdminKubeconfigPath(st.StateDir))
			}
			return Result{Detail: detail}, nil
		}
		if time.Now().After(deadline) {
			return Result{}, fmt.Errorf("nodes not ready after %v: %s%s; `appliance status` shows each node, rerun bootstrap to keep waiting",
				timeout, strings.Join(pending, ", "), failedSuffix(failed))
		}
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func failedSuffix(failed []string) string {
	if len(failed) == 0 {
		return ""
	}
	return "; failed: " + strings.Join(failed, "; ")
}

// waitClusterAPI polls GET <server>/readyz of the admin kubeconfig (AdminKubeconfigPath: server
// https://VIP:port, cluster CA, admin client certificate) every second for up to limit (at least
// 10 s) and returns the server URL once it answers 200.
func waitClusterAPI(ctx context.Context, st *State, limit time.Duration) (string, error) {
	path := AdminKubeconfigPath(st.StateDir)
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("admin kubeconfig: %w (rerun bootstrap: the pki phase writes it)", err)
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(b, &kc); err != nil || len(kc.Clusters) != 1 || len(kc.Users) != 1 {
		return "", fmt.Errorf("%s: not a one-cluster kubeconfig (%v): move it away and rerun bootstrap", path, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(kc.Clusters[0].Cluster.CertificateAuthorityData) {
		return "", fmt.Errorf("%s: no CA certificate", path)
	}
	cert, err := tls.X509KeyPair(kc.Users[0].User.ClientCertificateData, kc.Users[0].User.ClientKeyData)
	if err != nil {
		return "", fmt.Errorf("%s: client certificate: %w", path, err)
	}
	tr := &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 3 * time.Second}
	server := kc.Clusters[0].Cluster.Server
	deadline := time.Now().Add(max(limit, 10*time.Second))
	var last error
	for {
		resp, err := client.Get(server + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return server, nil
			}
			err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
		}
		last = err
		if time.Now().After(deadline) {
			return "", fmt.Errorf("every node is ready but the API through the VIP is not: %s/readyz: %w", server, last)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
