package agentapi

import "testing"

// TestWithholdSecrets: secrets.go's table, one row per node class and moment.
func TestWithholdSecrets(t *testing.T) {
	full := func(action, after string, proceed bool) *KubernetesConfig {
		return &KubernetesConfig{Action: action, After: after, Proceed: proceed, BootstrapToken: "tok", CertificateKey: "key",
			CAKeyPEM: "ca", NodeBootstrapTokens: []NodeBootstrapToken{{Node: "w1", Token: "w"}}}
	}
	for _, tc := range []struct {
		name                  string
		k                     *KubernetesConfig
		joined                bool
		token, certKey, caKey bool
		workers               bool
	}{
		{"init node before init", full(ActionInit, "", true), false, true, true, true, true},
		{"init node after init", full(ActionInit, "", true), true, true, true, false, true},
		{"leader that joined", full(ActionJoinControlPlane, "", true), true, true, true, false, true},
		{"control plane before its turn", full(ActionJoinControlPlane, "cp1", false), false, false, false, true, false},
		{"control plane in its turn", full(ActionJoinControlPlane, "cp1", true), false, true, true, true, true},
		{"control plane joined", full(ActionJoinControlPlane, "cp1", true), true, false, false, false, false},
		{"worker before its turn", full(ActionJoin, "cp1", false), false, false, false, true, false},
		{"worker in its turn", full(ActionJoin, "cp1", true), false, true, true, true, true},
		{"worker joined", full(ActionJoin, "cp1", true), true, false, false, false, false},
	} {
		nc := NodeConfig{Kubernetes: tc.k}
		WithholdSecrets(&nc, tc.joined)
		k := nc.Kubernetes
		if (k.BootstrapToken != "") != tc.token || (k.CertificateKey != "") != tc.certKey || (k.CAKeyPEM != "") != tc.caKey || (len(k.NodeBootstrapTokens) > 0) != tc.workers {
			t.Errorf("%s: token %v certificate key %v CA key %v workers' tokens %v; want %v %v %v %v", tc.name,
				k.BootstrapToken != "", k.CertificateKey != "", k.CAKeyPEM != "", len(k.NodeBootstrapTokens) > 0, tc.token, tc.certKey, tc.caKey, tc.workers)
		}
	}
	WithholdSecrets(&NodeConfig{}, true) // no Kubernetes: nothing to do, no panic
}
