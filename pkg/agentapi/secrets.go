package agentapi

// Least secret per node (issue 34, item 3). Which secrets a node's config (NodeConfig, served by
// the agent API; never Ignition, which carries only the node token) holds, by node class. "Joined"
// is the appliance's record that the node reported its kubeadm step done (pkg/nodestate
// RanKubeadm, kept across reboots until the node is removed); "its turn" is Proceed (the node it
// waits for, After, has joined).
//
//	secret                    first control plane          other control planes        workers
//	                          (kubeadm init)               (join --control-plane)      (join)
//	cluster CA key (ca.key)   until joined                 never from the appliance    never
//	front-proxy/etcd CA keys, never: kubeadm init          never from the appliance:   never
//	  service-account key     generates them on the node   kubeadm-certs (see below)
//	certificate key           always (it renews the        from its turn until joined  never
//	                          uploaded certificates)
//	control-plane join token  always (it renews it)        from its turn until joined  never
//	worker join tokens        every worker's, always       never                       its own only, from
//	                          (it creates and renews them)                             its turn until joined
//	node token (agent API)    its own                      its own                     its own
//	VRRP PASS (VRRPv2 only)   yes                          yes                         never
//
// Before this rule every config carried its secrets from the first render on, for ever: the first
// control plane the CA key, every control plane the certificate key, and every node, workers
// included, the one bootstrap token the control planes join with.
//
// The other control planes receive the cluster's keys (ca.key, front-proxy-ca.key, etcd/ca.key,
// sa.key) from kubeadm itself: `kubeadm join --control-plane` downloads the kubeadm-certs Secret,
// encrypted under the certificate key, which kubeadm deletes after 2 h (kubeadm
// phases/copycerts/copycerts.go createShortLivedBootstrapToken, constants.DefaultCertTokenDuration),
// the lifetime the appliance gives every join secret (pki.BootstrapTokenTTL).
//
// Kubernetes bootstrap tokens cannot be single use: the token Secret has no use count (kubeadm
// apis/bootstraptoken/v1/types.go BootstrapToken: token, description, ttl/expires, usages, groups;
// k8s.io/cluster-bootstrap token/api/types.go: the Secret's keys), and the token cleaner deletes a
// token only at its expiration. A worker's token is therefore per node (a leaked one names its
// node), expires with the join window, and is served only from the worker's turn until it joined.

// RenewsJoinSecrets reports whether the node with Kubernetes config k is the kubeadm leader, which
// keeps the cluster's join secrets (its bootstrap token, the workers' tokens and the certificates
// uploaded under the certificate key) in the cluster once it has run kubeadm: the one control
// plane whose config has no After node (the init node, or after its removal the first remaining
// control plane that joined). pkg/plan and pkg/hostagent apply the same rule.
func (k *KubernetesConfig) RenewsJoinSecrets() bool {
	return k != nil && k.Action != ActionJoin && k.After == ""
}

// WithholdSecrets removes from nc, as it is served, the kubeadm secrets the node does not need now
// (the table above); joined is whether the appliance records the node's kubeadm step done. Once
// joined, the cluster CA key goes; a node other than the kubeadm leader gets its join secrets
// (bootstrap token, certificate key) only from its turn (Proceed) until it has joined. The leader
// keeps its join secrets: it renews them in the cluster (RenewsJoinSecrets). Call it after
// Proceed is set. A config without Kubernetes is left alone.
func WithholdSecrets(nc *NodeConfig, joined bool) {
	k := nc.Kubernetes
	if k == nil {
		return
	}
	if joined {
		k.CAKeyPEM = ""
	}
	if k.RenewsJoinSecrets() {
		return
	}
	if joined || !k.Proceed {
		k.BootstrapToken, k.CertificateKey, k.NodeBootstrapTokens = "", "", nil
	}
}
