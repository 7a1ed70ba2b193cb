package plan

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/k8sversion"
	"github.com/airgap-appliance/appliance/pkg/pki"
)

// Kubernetes packages every node installs from the appliance's repo (Debian names; the bundle carries
// them and their dependencies). kubelet pulls in iptables, conntrack, ethtool, socat, ebtables and the
// CNI plugins through its Depends.
var KubernetesPackages = []string{"containerd", "runc", "containernetworking-plugins", "kubelet", "kubeadm", "kubectl"}

// ImageRepository is where kubeadm pulls control-plane images from; nodes reach it through the
// appliance's mirror (containerd hosts.toml), never upstream.
const ImageRepository = k8sversion.DefaultImageRepository

// PauseImage is the sandbox image kubeadm of kubernetesVersion's minor expects (pkg/k8sversion's
// table, kubeadm constants.PauseVersion): "registry.k8s.io/pause:3.10.1" for v1.35.4,
// "registry.k8s.io/pause:3.10.2" for v1.37.2. containerd's CRI sandbox image (pinned_images.sandbox
// in config version 3) must match or kubeadm warns and kubelet pulls two pause images. The error (a
// minor outside the table, which config validation refuses) wraps k8sversion.ErrUnsupported or
// ErrNotAVersion.
func PauseImage(kubernetesVersion string) (string, error) {
	rel, err := k8sversion.Lookup(kubernetesVersion)
	if err != nil {
		return "", fmt.Errorf("kubernetesVersion: %w", err)
	}
	return rel.PauseImage(ImageRepository), nil
}

// ClusterSecrets is the cluster CA and kubeadm join secrets of the pki phase, with what the state
// directory records of the cluster's nodes (PodRanges, Joined).
type ClusterSecrets struct {
	CA      *pki.CA
	Kubeadm pki.KubeadmSecrets
	// PodRanges is every node's pod range (AllocatePodRanges over the recorded ranges). nil gives
	// what a first allocation gives: the i-th range of networks.pods to the i-th node of nodes[].
	PodRanges PodRanges
	// Joined maps each node that has run kubeadm in this cluster (it was reported ready since it
	// was last added, or its kubeadm step is done) to the kubeadm action it carried out: its previous
	// node config's Action, "" when that is unknown. nil or empty: no node has, the cluster is still
	// to be built.
	Joined map[string]string
}

// KubeadmLeader returns the control plane that runs kubeadm first and keeps the cluster's join
// secrets (see RenewsJoinSecrets), and whether it is told ActionInit. kubeadm has one init node per
// cluster: the first control plane of nodes[] when the cluster was built, which ran `kubeadm init`;
// every other control plane joined it. Position alone cannot say which node that is once nodes[]
// has changed, so the appliance reads it from its records (ClusterSecrets.Joined: the nodes that
// joined and the Action their rendered node config gave them), and hostagent from its own kubeadm
// record. The leader is, in this order:
//   - the control plane that carried out ActionInit (joined[name] == ActionInit), while nodes[] lists
//     it: the init node keeps Action init, so a running cluster's node configs do not change;
//   - when the init node is gone (removed with `appliance node remove` or --prune) and some control
//     plane of nodes[] has joined, the first such one in nodes[] order, told
//     ActionJoinControlPlane: it already joined and must never run `kubeadm init` (that would start
//     a second cluster); it takes over renewing the join secrets;
//   - when no control plane has joined (a cluster not built yet), the first control plane of
//     nodes[], told ActionInit: the rule before the cluster exists, reorders included.
//
// "" when cps is empty.
func KubeadmLeader(cps []config.Node, joined map[string]string) (leader string, init bool) {
	if len(cps) == 0 {
		return "", false
	}
	for _, cp := range cps {
		if a, ok := joined[cp.Name]; ok && a == agentapi.ActionInit {
			return cp.Name, true
		}
	}
	for _, cp := range cps {
		if _, ok := joined[cp.Name]; ok {
			return cp.Name, false
		}
	}
	return cps[0].Name, true
}

// RenewsJoinSecrets reports whether the node with Kubernetes config k is the one that keeps the
// cluster's join secrets (the bootstrap token and the certificates uploaded under the certificate
// key) in the cluster once it has run kubeadm: the kubeadm leader (KubeadmLeader), which is the
// one control plane whose config has no After node. This is "the first remaining control plane",
// not "Action init": after the init node's removal the leader is a control plane that joined.
// hostagent applies the same rule.
func RenewsJoinSecrets(k *agentapi.KubernetesConfig) bool { return k.RenewsJoinSecrets() }

// JoinSecretsRenewer is the node of the plan for which RenewsJoinSecrets holds ("" without
// Kubernetes).
func (p *Plan) JoinSecretsRenewer() string {
	for _, n := range p.Nodes {
		if RenewsJoinSecrets(n.NodeConfig.Kubernetes) {
			return n.Name
		}
	}
	return ""
}

// kubernetesFor derives node n's KubernetesConfig:
//   - Action: for the kubeadm leader (KubeadmLeader: the init node, or after its removal the first
//     control plane that joined, or before the cluster exists the first control plane) ActionInit
//     or, once the init node is gone, ActionJoinControlPlane, without After; the other control
//     planes ActionJoinControlPlane, each After the control plane before it in the order leader,
//     then nodes[] order (etcd grows one member at a time); workers ActionJoin After the leader;
//   - SandboxImage: the pause image of the version's minor (PauseImage);
//   - ControlPlaneEndpoint VIP:port, the cluster networks, API certificate SANs (the VIP, every
//     control plane's static addresses, and with baseDomain api.<cluster>.<baseDomain> and api-int.…);
//   - the least secret per node (agentapi.WithholdSecrets' table; the agent API withholds more as it
//     serves): the control-plane bootstrap token and the certificate key for control planes; for
//     each worker its own token (pki.KubeadmSecrets.NodeBootstrapToken), which the leader gets
//     too, all of them (NodeBootstrapTokens), to create them in the cluster; the cluster CA key
//     only for an ActionInit leader of a cluster still to be built (no node has run kubeadm:
//     cluster.Joined empty): once the init node has, re-rendering never brings the key back;
//     re-initialising is explicit (`appliance node remove` of every node, which forgets that
//     they joined);
//   - PodCIDR: the node's range of cluster.PodRanges (AllocatePodRanges: stable per node name, the
//     i-th /24 or /64 of networks.pods for the i-th node on a first allocation), and PodRoutes to
//     every other node's range via its first workload-plane address (bridge CNI only);
//   - with networks.cni calico: CNI, and for control planes CNIManifest (cniFor); with flannel: CNI
//     and PodMTU (cniFor; the control planes' CNIManifest comes from overlayFor).
//
// Errors: no cluster secrets, a node without a workload-plane address (Validate refuses those), a
// node without a pod range in cluster.PodRanges, or (PodRanges nil) a pod network too small for the
// inventory.
func kubernetesFor(c *config.BootstrapConfiguration, n config.Node, cluster *ClusterSecrets) (*agentapi.KubernetesConfig, error) {
	if cluster == nil || cluster.CA == nil {
		return nil, errors.New("kubernetes enabled but no cluster CA and join secrets (pki phase)")
	}
	cps := c.ControlPlaneNodes()
	if len(cps) == 0 {
		return nil, errors.New("no control-plane node")
	}
	pause, err := PauseImage(c.KubernetesVersion)
	if err != nil {
		return nil, err
	}
	ranges := cluster.PodRanges
	if ranges == nil {
		var err error
		if ranges, err = AllocatePodRanges(c.Networks.Pods, nodeNames(c), nil); err != nil {
			return nil, err
		}
	}
	k := &agentapi.KubernetesConfig{
		Version:               c.KubernetesVersion,
		Packages:              slices.Clone(KubernetesPackages),
		SandboxImage:          pause,
		ControlPlaneEndpoint:  net.JoinHostPort(c.APIServer.VIP.String(), strconv.Itoa(int(c.APIServer.Port))),
		ImageRepository:       ImageRepository,
		PodSubnet:             c.Networks.Pods,
		ServiceSubnet:         c.Networks.Services,
		BootstrapTokenExpires: cluster.Kubeadm.Expires(pki.BootstrapTokenTTL),
		CACertHashes:          []string{agentapi.PinOf(cluster.CA.Cert)},
		CACertPEM:             string(cluster.CA.CertPEM),
		IgnorePreflightErrors: slices.Clone(c.Kubernetes.IgnorePreflightErrors),
	}
	sans := []string{c.APIServer.VIP.String()}
	for _, cp := range cps {
		for _, a := range cp.Addresses {
			if !slices.Contains(sans, a.String()) {
				sans = append(sans, a.String())
			}
		}
	}
	// With a DNS zone (baseDomain), the API's names from pkg/dnsrecords: api and api-int.
	if zone := c.DNSZone(); zone != "" {
		sans = append(sans, "api."+zone, "api-int."+zone)
	}
	k.APIServerCertSANs = sans
	k.EtcdMembers = ControlPlaneAddresses(c)
	leader, init := KubeadmLeader(cps, cluster.Joined)
	order := []string{leader}
	for _, cp := range cps {
		if cp.Name != leader {
			order = append(order, cp.Name)
		}
	}
	switch idx := slices.Index(order, n.Name); {
	case idx == 0 && init:
		k.Action = agentapi.ActionInit
		if len(cluster.Joined) == 0 {
			key, err := cluster.CA.KeyPEM()
			if err != nil {
				return nil, err
			}
			k.CAKeyPEM = string(key)
		}
	case idx == 0:
		k.Action = agentapi.ActionJoinControlPlane
	case idx > 0:
		k.Action, k.After = agentapi.ActionJoinControlPlane, order[idx-1]
	default:
		k.Action, k.After = agentapi.ActionJoin, leader
	}
	if k.Action == agentapi.ActionJoin {
		k.BootstrapToken = cluster.Kubeadm.NodeBootstrapToken(n.Name)
	} else {
		k.BootstrapToken, k.CertificateKey = cluster.Kubeadm.BootstrapToken, cluster.Kubeadm.CertificateKey
	}
	if k.RenewsJoinSecrets() {
		for _, w := range c.Nodes {
			if !w.HasRole(config.RoleControlPlane) {
				k.NodeBootstrapTokens = append(k.NodeBootstrapTokens, agentapi.NodeBootstrapToken{Node: w.Name, Token: cluster.Kubeadm.NodeBootstrapToken(w.Name)})
			}
		}
	}
	if err := cniFor(c, n, k); err != nil {
		return nil, err
	}
	for i, node := range c.Nodes {
		p, ok := ranges[node.Name]
		if !ok {
			return nil, fmt.Errorf("networks.pods: node %s has no pod range (AllocatePodRanges covers every node of nodes[])", node.Name)
		}
		if node.Name == n.Name {
			k.PodCIDR = p
			continue
		}
		if k.CNI == config.CNICalico || k.CNI == config.CNIFlannel {
			continue // calico-node, or the flannel overlay, routes the pods
		}
		via, ok := WorkloadPlaneAddress(c, node)
		if !ok {
			return nil, fmt.Errorf("nodes[%d] (%s) has no address inside networks.workloadPlane.cidrs", i, node.Name)
		}
		k.PodRoutes = append(k.PodRoutes, agentapi.PodRoute{Node: node.Name, Prefix: p, Via: via})
	}
	return k, nil
}

// nodeNames lists the names of nodes[] in order.
func nodeNames(c *config.BootstrapConfiguration) []string {
	names := make([]string, 0, len(c.Nodes))
	for _, n := range c.Nodes {
		names = append(names, n.Name)
	}
	return names
}

// nthSubnet is the i-th /24 (IPv4) or /64 (IPv6) inside pods.
func nthSubnet(pods netip.Prefix, i int) (netip.Prefix, error) {
	bits := 24
	if pods.Addr().Is6() {
		bits = 64
	}
	if pods.Bits() > bits {
		return netip.Prefix{}, fmt.Errorf("%s is smaller than one node range (/%d)", pods, bits)
	}
	if sub := bits - pods.Bits(); sub < 31 && i >= 1<<sub {
		return netip.Prefix{}, fmt.Errorf("%s holds %d node ranges (/%d), the inventory has more nodes", pods, 1<<sub, bits)
	}
	a := pods.Masked().Addr().AsSlice()
	// The node range index sits in the bytes just before bit `bits` (bytes 0..2 for IPv4 /24, 0..7
	// for IPv6 /64): add i there, big-endian, with carry.
	carry := uint64(i)
	for j := bits/8 - 1; j >= 0 && carry > 0; j-- {
		sum := uint64(a[j]) + carry&0xff
		a[j] = byte(sum)
		carry = carry>>8 + sum>>8
	}
	addr, _ := netip.AddrFromSlice(a)
	return netip.PrefixFrom(addr, bits), nil
}
