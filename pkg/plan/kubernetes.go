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
	"github.com/airgap-appliance/appliance/pkg/pki"
)

// Kubernetes packages every node installs from the appliance's repo (Debian names; the bundle carries
// them and their dependencies). kubelet pulls in iptables, conntrack, ethtool, socat, ebtables and the
// CNI plugins through its Depends.
var KubernetesPackages = []string{"containerd", "runc", "containernetworking-plugins", "kubelet", "kubeadm", "kubectl"}

// ImageRepository is where kubeadm pulls control-plane images from; nodes reach it through the
// appliance's mirror (containerd hosts.toml), never upstream.
const ImageRepository = "registry.k8s.io"

// PauseImage is the sandbox image kubeadm v1.34 expects (kubeadm constants.PauseVersion 3.10.1);
// containerd's CRI sandbox_image must match or kubeadm warns and kubelet pulls two pause images.
const PauseImage = ImageRepository + "/pause:3.10.1"

// ClusterSecrets is the cluster CA and kubeadm join secrets of the pki phase.
type ClusterSecrets struct {
	CA      *pki.CA
	Kubeadm pki.KubeadmSecrets
}

// kubernetesFor derives node n's KubernetesConfig:
//   - Action: ActionInit for the first control plane in document order, ActionJoinControlPlane for the
//     others (each After the control plane before it: etcd grows one member at a time), ActionJoin
//     for workers (After the first control plane);
//   - ControlPlaneEndpoint VIP:port, the cluster networks, API certificate SANs (the VIP, every
//     control plane's static addresses, and with baseDomain api.<cluster>.<baseDomain> and api-int.…);
//   - the bootstrap token for every node, the certificate key for control planes, and the cluster CA
//     key for the first control plane only;
//   - PodCIDR: the i-th /24 (IPv4) or /64 (IPv6) of networks.pods for the i-th node of the inventory,
//     and PodRoutes to every other node's range via its first workload-plane address.
//
// Errors: no cluster secrets, a node without a workload-plane address (Validate refuses those), or a
// pod network too small for the inventory.
func kubernetesFor(c *config.BootstrapConfiguration, n config.Node, cluster *ClusterSecrets) (*agentapi.KubernetesConfig, error) {
	if cluster == nil || cluster.CA == nil {
		return nil, errors.New("kubernetes enabled but no cluster CA and join secrets (pki phase)")
	}
	cps := c.ControlPlaneNodes()
	if len(cps) == 0 {
		return nil, errors.New("no control-plane node")
	}
	k := &agentapi.KubernetesConfig{
		Version:               c.KubernetesVersion,
		Packages:              slices.Clone(KubernetesPackages),
		SandboxImage:          PauseImage,
		ControlPlaneEndpoint:  net.JoinHostPort(c.APIServer.VIP.String(), strconv.Itoa(int(c.APIServer.Port))),
		ImageRepository:       ImageRepository,
		PodSubnet:             c.Networks.Pods,
		ServiceSubnet:         c.Networks.Services,
		BootstrapToken:        cluster.Kubeadm.BootstrapToken,
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
	switch idx := slices.IndexFunc(cps, func(cp config.Node) bool { return cp.Name == n.Name }); {
	case idx == 0:
		k.Action = agentapi.ActionInit
		key, err := cluster.CA.KeyPEM()
		if err != nil {
			return nil, err
		}
		k.CAKeyPEM = string(key)
		k.CertificateKey = cluster.Kubeadm.CertificateKey
	case idx > 0:
		k.Action, k.After = agentapi.ActionJoinControlPlane, cps[idx-1].Name
		k.CertificateKey = cluster.Kubeadm.CertificateKey
	default:
		k.Action, k.After = agentapi.ActionJoin, cps[0].Name
	}
	for i, node := range c.Nodes {
		p, err := nthSubnet(c.Networks.Pods, i)
		if err != nil {
			return nil, fmt.Errorf("networks.pods: %w", err)
		}
		if node.Name == n.Name {
			k.PodCIDR = p
			continue
		}
		via, ok := WorkloadPlaneAddress(c, node)
		if !ok {
			return nil, fmt.Errorf("nodes[%d] (%s) has no address inside networks.workloadPlane.cidrs", i, node.Name)
		}
		k.PodRoutes = append(k.PodRoutes, agentapi.PodRoute{Node: node.Name, Prefix: p, Via: via})
	}
	return k, nil
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
