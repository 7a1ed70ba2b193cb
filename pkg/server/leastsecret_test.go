package server

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/pkg/plan"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// Least secret per node (issue 34, item 3): attacks on the real HTTPS front (Server.ServeListener
// over TLS, a client pinning the appliance CA as hostagent does), with node configs rendered by
// pkg/plan from real cluster secrets (pkg/pki), each node authenticated by its own token.

// clusterFront is the front serving a rendered three-node cluster (cp1 init, cp2 join-control-plane
// after cp1, worker w1 after cp1) not built yet, with the appliance's kubeadm order as its Gate (a
// node's turn comes when the node it waits for reported its kubeadm step done in its current boot:
// pkg/applianced kubeadmGate's rule).
type clusterFront struct {
	url     string
	hc      *http.Client
	store   *nodestate.Store
	secrets pki.KubeadmSecrets
	caKey   string
	tokens  map[string]string
}

func newClusterFront(t *testing.T) *clusterFront {
	t.Helper()
	p, a := netip.MustParsePrefix, netip.MustParseAddr
	dir := t.TempDir()
	now := time.Now()
	ca, _, err := pki.EnsureCA(filepath.Join(dir, "pki"), "kubernetes", now)
	if err != nil {
		t.Fatal(err)
	}
	secrets, _, err := pki.EnsureKubeadmSecrets(filepath.Join(dir, "pki"), pki.BootstrapTokenTTL, now)
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	c := &config.BootstrapConfiguration{
		ClusterName: "lab", KubernetesVersion: "v1.37.2",
		Networks: config.Networks{
			ControlPlane:  config.NetworkPlane{CIDRs: []netip.Prefix{p("10.100.0.0/24")}},
			WorkloadPlane: config.NetworkPlane{CIDRs: []netip.Prefix{p("10.100.0.0/24")}},
			Pods:          p("10.233.0.0/16"), Services: p("10.96.0.0/16"),
		},
		APIServer: config.APIServer{VIP: a("10.100.0.100"), Port: 6443},
		Nodes: []config.Node{
			{Name: "cp1", Roles: []config.Role{config.RoleControlPlane}, Addresses: []netip.Addr{a("10.100.0.11")}},
			{Name: "cp2", Roles: []config.Role{config.RoleControlPlane}, Addresses: []netip.Addr{a("10.100.0.12")}},
			{Name: "w1", Roles: []config.Role{config.RoleWorker}, Addresses: []netip.Addr{a("10.100.0.21")}},
		},
	}
	rendered := filepath.Join(dir, "rendered")
	cluster := &plan.ClusterSecrets{CA: ca, Kubeadm: secrets}
	for _, n := range c.Nodes {
		nc, err := plan.NodeConfigFor(c, n, a("10.100.0.1"), ca.CertPEM, plan.VRRP{}, nil, cluster)
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		b, err := json.MarshalIndent(nc, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(rendered, n.Name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(rendered, n.Name, statedir.NodeConfigFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tokens := map[string]string{"cp1": "tok-cp1-0123456789", "cp2": "tok-cp2-0123456789", "w1": "tok-w1-0123456789"}
	store := nodestate.Open(filepath.Join(dir, "nodes"))
	agent := NewAgentAPI(rendered, tokens, store, nil)
	agent.Gate = func(_ string, nc *agentapi.NodeConfig) {
		if k := nc.Kubernetes; k != nil {
			k.Proceed, k.WaitingFor = true, ""
			if st, err := store.Get(k.After); k.After != "" && (err != nil || st.Steps[agentapi.StepKubeadm].Status != agentapi.StatusDone) {
				k.Proceed, k.WaitingFor = false, k.After
			}
		}
	}
	caPEM, serving := pkitest.Issue(t)
	s, err := New(Options{Listen: "127.0.0.1:0", Certificate: serving, Agent: agent, CAPEM: caPEM})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	t.Cleanup(hc.CloseIdleConnections)
	return &clusterFront{url: "https://" + serveTLSFront(t, s), hc: hc, store: store, secrets: secrets, caKey: string(caKey), tokens: tokens}
}

// config fetches node's config over HTTPS with its own token, as its hostagent does.
func (f *clusterFront) config(t *testing.T, node string) (*agentapi.KubernetesConfig, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, f.url+agentapi.ConfigPathV1, nil)
	req.Header.Set("Authorization", "Bearer "+f.tokens[node])
	resp, err := f.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET config as %s: %s: %s", node, resp.Status, body)
	}
	var nc agentapi.NodeConfig
	if err := json.Unmarshal(body, &nc); err != nil || nc.Kubernetes == nil {
		t.Fatalf("config of %s: %v, kubernetes %v", node, err, nc.Kubernetes)
	}
	return nc.Kubernetes, string(body)
}

// report posts node's report of step over HTTPS with its own token.
func (f *clusterFront) report(t *testing.T, node, boot, step, status string) {
	t.Helper()
	b, _ := json.Marshal(agentapi.Report{BootID: boot, Step: step, Status: status, Time: time.Now()})
	req, _ := http.NewRequest(http.MethodPost, f.url+agentapi.ReportPathV1, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+f.tokens[node])
	resp, err := f.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("report %s %s %s as %s: %s", step, status, boot, node, resp.Status)
	}
}

// noControlPlaneSecret fails when body (a served config) holds any control-plane secret: the
// cluster CA key, the certificate key, the control planes' join token.
func (f *clusterFront) noControlPlaneSecret(t *testing.T, who, body string) {
	t.Helper()
	for name, secret := range map[string]string{
		"the cluster CA key":             strings.TrimSpace(strings.Split(f.caKey, "\n")[1]),
		"the certificate key":            f.secrets.CertificateKey,
		"the control planes' join token": f.secrets.BootstrapToken,
	} {
		if strings.Contains(body, secret) {
			t.Errorf("%s: the served config carries %s", who, name)
		}
	}
}

// TestWorkerConfigCarriesNoControlPlaneSecret: a worker's token fetching its config gets no cluster
// CA key, no certificate key and not the token the control planes join with (whose group may read
// the kubeadm-certs Secret); it gets its own bootstrap token only in its turn (the first control
// plane has run kubeadm) and until it has joined, and that token expires with the join window.
func TestWorkerConfigCarriesNoControlPlaneSecret(t *testing.T) {
	f := newClusterFront(t)
	k, body := f.config(t, "w1")
	f.noControlPlaneSecret(t, "w1 before its turn", body)
	if k.BootstrapToken != "" || k.CertificateKey != "" || k.CAKeyPEM != "" || len(k.NodeBootstrapTokens) > 0 {
		t.Errorf("w1 before its turn got join secrets: token %t, certificate key %t, CA key %t, others' tokens %d",
			k.BootstrapToken != "", k.CertificateKey != "", k.CAKeyPEM != "", len(k.NodeBootstrapTokens))
	}

	f.report(t, "cp1", "boot-cp1", agentapi.StepKubeadm, agentapi.StatusDone)
	k, body = f.config(t, "w1")
	f.noControlPlaneSecret(t, "w1 in its turn", body)
	if !k.Proceed || k.BootstrapToken != f.secrets.NodeBootstrapToken("w1") {
		t.Errorf("w1 in its turn: proceed %v, its own token %v", k.Proceed, k.BootstrapToken == f.secrets.NodeBootstrapToken("w1"))
	}
	if left := time.Until(k.BootstrapTokenExpires); left <= 0 || left > pki.BootstrapTokenTTL {
		t.Errorf("w1's token expires in %s, want within the join window (%s)", left, pki.BootstrapTokenTTL)
	}
	// The token cp1 creates for w1 in the cluster is the one w1 receives.
	lk, _ := f.config(t, "cp1")
	if len(lk.NodeBootstrapTokens) != 1 || lk.NodeBootstrapTokens[0] != (agentapi.NodeBootstrapToken{Node: "w1", Token: k.BootstrapToken}) {
		t.Errorf("the leader's worker tokens %d, want w1's", len(lk.NodeBootstrapTokens))
	}

	f.report(t, "w1", "boot-w1", agentapi.StepKubeadm, agentapi.StatusDone)
	k, body = f.config(t, "w1")
	f.noControlPlaneSecret(t, "w1 joined", body)
	if k.BootstrapToken != "" {
		t.Error("w1 has joined, yet is still served its bootstrap token")
	}
}

// TestInitNodeLosesCAKeyOnceInitDone: the first control plane is served the cluster CA key until it
// reports its kubeadm step done; from then on, also after a reboot that forgets its steps and
// before it was ever ready, its config carries no CA key. It keeps what it renews (the join
// token, the certificate key, the workers' tokens).
func TestInitNodeLosesCAKeyOnceInitDone(t *testing.T) {
	f := newClusterFront(t)
	k, _ := f.config(t, "cp1")
	if k.Action != agentapi.ActionInit || k.CAKeyPEM != f.caKey {
		t.Fatalf("cp1 before init: action %s, CA key served %v: want init with the key", k.Action, k.CAKeyPEM == f.caKey)
	}
	f.report(t, "cp1", "boot-1", agentapi.StepKubeadm, agentapi.StatusRunning)
	if k, _ = f.config(t, "cp1"); k.CAKeyPEM == "" {
		t.Fatal("cp1 while kubeadm init runs (or is retried after a reset): no CA key")
	}
	f.report(t, "cp1", "boot-1", agentapi.StepKubeadm, agentapi.StatusDone)
	k, body := f.config(t, "cp1")
	if k.CAKeyPEM != "" || strings.Contains(body, strings.Split(f.caKey, "\n")[1]) {
		t.Error("cp1 reported kubeadm init done, yet its config still carries the cluster CA key")
	}
	if k.BootstrapToken != f.secrets.BootstrapToken || k.CertificateKey != f.secrets.CertificateKey || len(k.NodeBootstrapTokens) != 1 {
		t.Error("cp1, the leader, lost the join secrets it renews")
	}
	f.report(t, "cp1", "boot-2", agentapi.StepConfig, agentapi.StatusDone) // rebooted
	if k, _ = f.config(t, "cp1"); k.CAKeyPEM != "" {
		t.Error("cp1 rebooted after kubeadm init: the CA key is served again")
	}
}

// TestJoiningControlPlaneGetsCertificateKeyInItsTurnOnly: cp2 is served the certificate key and
// the join token only from its turn (cp1 has run kubeadm init, so the certificates are uploaded)
// until it has joined; never the cluster CA key.
func TestJoiningControlPlaneGetsCertificateKeyInItsTurnOnly(t *testing.T) {
	f := newClusterFront(t)
	for i, step := range []struct {
		node, status string
		want         bool
	}{{"", "", false}, {"cp1", agentapi.StatusDone, true}, {"cp2", agentapi.StatusDone, false}} {
		if step.node != "" {
			f.report(t, step.node, "boot-"+step.node, agentapi.StepKubeadm, step.status)
		}
		k, _ := f.config(t, "cp2")
		got := k.CertificateKey == f.secrets.CertificateKey && k.BootstrapToken == f.secrets.BootstrapToken
		if got != step.want || (!step.want && (k.CertificateKey != "" || k.BootstrapToken != "")) || k.CAKeyPEM != "" {
			t.Errorf("step %d (%s kubeadm %s): cp2 served certificate key %v, join token %v, CA key %v; want the join secrets %v",
				i, step.node, step.status, k.CertificateKey != "", k.BootstrapToken != "", k.CAKeyPEM != "", step.want)
		}
	}
}
