package hostagent

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/test/kubetest"
	"github.com/airgap-appliance/appliance/test/labns"
)

// TestRenewsJoinSecrets: the node that puts the join secrets into the cluster is the control plane
// that has run kubeadm and whose node config makes it the kubeadm leader (a control-plane action, no
// After node), whether it ran kubeadm init (the init node) or joined (the first remaining control
// plane after the init node's removal); never a worker, a control plane with an After node, a node
// that has not run kubeadm, or a leader the cluster already got the token from.
func TestRenewsJoinSecrets(t *testing.T) {
	const token = "abcdef.0123456789abcdef"
	for _, tc := range []struct {
		name          string
		local         kubeadmState
		action, after string
		want          bool
	}{
		{"init node, new token", kubeadmState{Action: agentapi.ActionInit, TokenID: "old000"}, agentapi.ActionInit, "", true},
		{"init node, token already renewed", kubeadmState{Action: agentapi.ActionInit, TokenID: "abcdef"}, agentapi.ActionInit, "", false},
		{"joined control plane, leader after the init node's removal", kubeadmState{Action: agentapi.ActionJoinControlPlane}, agentapi.ActionJoinControlPlane, "", true},
		{"joined control plane, leader, token already renewed", kubeadmState{Action: agentapi.ActionJoinControlPlane, TokenID: "abcdef"}, agentapi.ActionJoinControlPlane, "", false},
		{"joined control plane after another", kubeadmState{Action: agentapi.ActionJoinControlPlane}, agentapi.ActionJoinControlPlane, "cp1", false},
		{"init node moved behind another control plane", kubeadmState{Action: agentapi.ActionInit, TokenID: "old000"}, agentapi.ActionJoinControlPlane, "cp2", false},
		{"worker", kubeadmState{Action: agentapi.ActionJoin}, agentapi.ActionJoin, "cp1", false},
		{"leader that has not run kubeadm yet", kubeadmState{}, agentapi.ActionJoinControlPlane, "", false},
	} {
		k := &agentapi.KubernetesConfig{Action: tc.action, After: tc.after, BootstrapToken: token}
		if got := renewsJoinSecrets(tc.local, k); got != tc.want {
			t.Errorf("%s: renewsJoinSecrets = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRenewsWorkerTokens: the leader puts a worker's own token into the cluster when the cluster
// has not got it from it (a worker added), not again for a worker it already has, and not for a
// worker removed from its list.
func TestRenewsWorkerTokens(t *testing.T) {
	const token = "abcdef.0123456789abcdef"
	w := func(ids ...string) []agentapi.NodeBootstrapToken {
		var out []agentapi.NodeBootstrapToken
		for _, id := range ids {
			out = append(out, agentapi.NodeBootstrapToken{Node: "w-" + id, Token: id + ".0123456789abcdef"})
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		created []string
		listed  []agentapi.NodeBootstrapToken
		want    bool
	}{
		{"same workers", []string{"w1w1w1", "w2w2w2"}, w("w2w2w2", "w1w1w1"), false},
		{"worker added", []string{"w1w1w1"}, w("w1w1w1", "w2w2w2"), true},
		{"worker removed", []string{"w1w1w1", "w2w2w2"}, w("w1w1w1"), false},
		{"first worker tokens (a cluster made by an older hostagent)", nil, w("w1w1w1"), true},
	} {
		st := kubeadmState{Action: agentapi.ActionInit, TokenID: "abcdef", NodeTokenIDs: tc.created}
		k := &agentapi.KubernetesConfig{Action: agentapi.ActionInit, BootstrapToken: token, NodeBootstrapTokens: tc.listed}
		if got := renewsJoinSecrets(st, k); got != tc.want {
			t.Errorf("%s: renewsJoinSecrets = %v, want %v", tc.name, got, tc.want)
		}
		createdTokens(&st, k)
		if renewsJoinSecrets(st, k) {
			t.Errorf("%s: still renews after createdTokens", tc.name)
		}
	}
}

// TestRenewalConfigIsInit: a leader that joined renews with an InitConfiguration (kubeadm's init
// phases upload-certs and bootstrap-token read one) carrying the config's bootstrap token and
// certificate key; its own kubeadm join configuration would give upload-certs no certificate key.
func TestRenewalConfigIsInit(t *testing.T) {
	k := &agentapi.KubernetesConfig{
		Version: "v1.37.2", Action: agentapi.ActionJoinControlPlane, ControlPlaneEndpoint: "10.100.0.100:6443",
		ImageRepository: "registry.k8s.io", PodSubnet: netip.MustParsePrefix("10.244.0.0/16"),
		ServiceSubnet: netip.MustParsePrefix("10.96.0.0/16"), BootstrapToken: "abcdef.0123456789abcdef",
		BootstrapTokenExpires: time.Now().Add(time.Hour), CertificateKey: strings.Repeat("ab", 32),
		CACertHashes: []string{"sha256:" + strings.Repeat("0", 64)},
	}
	b, err := renewalConfig(agentapi.NodeConfig{Node: "cp2", ClusterName: "lab"}, k, netip.MustParseAddr("10.100.0.12"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: InitConfiguration", "certificateKey: " + k.CertificateKey, "token: " + k.BootstrapToken, "name: cp2"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("renewal config lacks %q:\n%s", want, b)
		}
	}
	if strings.Contains(string(b), "kind: JoinConfiguration") {
		t.Errorf("renewal config is a join configuration:\n%s", b)
	}
	if k.Action != agentapi.ActionJoinControlPlane {
		t.Errorf("renewalConfig changed the node config's Action to %q", k.Action)
	}
}

// TestJoinedLeaderRenewsWithRealKubeadm: what renewJoinSecrets runs on a leader that joined (cp2
// after the init node's removal: Action join-control-plane, no After), with the real kubeadm
// v1.37.2 against a real etcd and kube-apiserver on 127.0.0.1 (test/kubetest: the Kubernetes
// fixture, killed by PID at the end): `kubeadm init phase upload-certs` and `kubeadm init phase bootstrap-token` with
// its renewalConfig put the control-plane certificates (kubeadm-certs, under the node config's
// certificate key) and the node config's bootstrap token into the cluster, which is what a control
// plane or worker added afterwards joins with. The only differences from the hostagent's calls:
// --kubeconfig names the test's admin kubeconfig instead of /etc/kubernetes/admin.conf, and the
// ClusterConfiguration's certificatesDir a temporary directory instead of /etc/kubernetes/pki, where
// the cluster CA and the service-account key are the API server's and `kubeadm init phase certs`
// makes the other CAs, as a joined control plane holds them. Nothing is written outside temporary directories.
func TestJoinedLeaderRenewsWithRealKubeadm(t *testing.T) {
	kubeadm := labns.KubernetesBin(t, "kubeadm")
	kubectl := labns.KubernetesBin(t, "kubectl")
	_, etcBefore := os.Stat("/etc/kubernetes")
	dir := t.TempDir()
	now := time.Now()
	// etcd and kube-apiserver: bootstrap tokens authenticate, every authenticated request is
	// allowed. The cluster CA and the service-account key are in pkiDir, kubeadm's layout.
	pkiDir := filepath.Join(dir, "pki")
	api := kubetest.StartAPIServer(t, kubetest.Options{PKIDir: pkiDir, AuthorizationMode: "AlwaysAllow", BootstrapTokenAuth: true})
	ca, apiPort, kubeconfig := api.CA, api.Port, api.AdminKubeconfig
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute) // bounds a hang; nothing timed is asserted
	defer cancel()
	run := func(argv ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(argv[:min(len(argv), 5)], " "), err, out)
		}
		return string(out)
	}

	// The renewal configuration of cp2, a leader that joined.
	cfgFile := filepath.Join(dir, "kubeadm.yaml")
	k := &agentapi.KubernetesConfig{
		Version: labns.KubernetesVersion, Action: agentapi.ActionJoinControlPlane,
		ControlPlaneEndpoint: fmt.Sprintf("127.0.0.1:%d", apiPort), ImageRepository: "registry.k8s.io",
		PodSubnet: netip.MustParsePrefix("10.244.0.0/16"), ServiceSubnet: netip.MustParsePrefix("10.96.0.0/16"),
		BootstrapToken: "r3n3w2.0123456789abcdef", BootstrapTokenExpires: now.Add(time.Hour),
		CertificateKey: strings.Repeat("5a", 32), CACertHashes: []string{agentapi.PinOf(ca.Cert)},
	}
	// cp2's control-plane address (kubeadm refuses a loopback advertise address; nothing connects to it).
	cfg, err := renewalConfig(agentapi.NodeConfig{Node: "cp2", ClusterName: "lab"}, k, netip.MustParseAddr("10.100.0.12"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(cfg)
	if strings.Contains(text, "certificatesDir:") || !strings.Contains(text, "kind: ClusterConfiguration\n") {
		t.Fatalf("renewal config: want a ClusterConfiguration without certificatesDir:\n%s", text)
	}
	text = strings.Replace(text, "kind: ClusterConfiguration\n", "kind: ClusterConfiguration\ncertificatesDir: "+pkiDir+"\n", 1)
	if err := os.WriteFile(cfgFile, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	// The other CAs, and the service-account key as a joined control plane holds them: kubeadm
	// keeps the API server's sa.key it finds in pkiDir.
	for _, phase := range []string{"sa", "front-proxy-ca", "etcd-ca"} {
		out := run(kubeadm, "init", "phase", "certs", phase, "--config", cfgFile)
		if phase == "sa" && !strings.Contains(out, `Using the existing "sa" key`) {
			t.Fatalf("kubeadm init phase certs sa made a key of its own, not the API server's:\n%s", out)
		}
	}
	// kubeadm init makes cluster-info; the renewal finds it there.
	run(kubeadm, "init", "phase", "bootstrap-token", "--config", cfgFile, "--kubeconfig", kubeconfig, "--skip-token-print")
	run(kubectl, "--kubeconfig", kubeconfig, "delete", "secret", "-n", "kube-system", "bootstrap-token-r3n3w2")

	// The renewal: renewJoinSecrets' two kubeadm calls.
	run(kubeadm, "init", "phase", "upload-certs", "--upload-certs", "--config", cfgFile, "--kubeconfig", kubeconfig, "--skip-certificate-key-print")
	run(kubeadm, "init", "phase", "bootstrap-token", "--config", cfgFile, "--kubeconfig", kubeconfig, "--skip-token-print")

	out := run(kubectl, "--kubeconfig", kubeconfig, "get", "secret", "-n", "kube-system", "bootstrap-token-r3n3w2", "kubeadm-certs",
		"-o", `jsonpath={range .items[*]}{.metadata.name} {.type} {.data.token-id}{"\n"}{end}`)
	if want := "bootstrap-token-r3n3w2 bootstrap.kubernetes.io/token " + base64.StdEncoding.EncodeToString([]byte("r3n3w2")) + "\nkubeadm-certs Opaque \n"; out != want {
		t.Errorf("secrets after the renewal:\n%s\nwant\n%s", out, want)
	}
	// kubeadm-certs holds the control-plane CAs and keys, encrypted under the certificate key.
	keys := run(kubectl, "--kubeconfig", kubeconfig, "get", "secret", "-n", "kube-system", "kubeadm-certs", "-o", "go-template={{range $k, $v := .data}}{{$k}} {{end}}")
	for _, want := range []string{"ca.crt", "ca.key", "sa.key", "sa.pub", "front-proxy-ca.crt", "front-proxy-ca.key", "etcd-ca.crt", "etcd-ca.key"} {
		if !strings.Contains(" "+keys, " "+want+" ") {
			t.Errorf("kubeadm-certs lacks %s: %s", want, keys)
		}
	}
	if _, err := os.Stat("/etc/kubernetes"); (err == nil) != (etcBefore == nil) {
		t.Errorf("kubeadm changed /etc/kubernetes on the host (existed before: %v, now: %v)", etcBefore == nil, err == nil)
	}
}
