package hostagent

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
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

// TestRenewalConfigIsInit: a leader that joined renews with an InitConfiguration (kubeadm's init
// phases upload-certs and bootstrap-token read one) carrying the config's bootstrap token and
// certificate key; its own kubeadm join configuration would give upload-certs no certificate key.
func TestRenewalConfigIsInit(t *testing.T) {
	k := &agentapi.KubernetesConfig{
		Version: "v1.34.4", Action: agentapi.ActionJoinControlPlane, ControlPlaneEndpoint: "10.100.0.100:6443",
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
