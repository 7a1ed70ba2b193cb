package config

import (
	"hash/fnv"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Defaults applied by SetDefaults.
const (
	// DefaultKubernetesVersion is the Kubernetes version installed when kubernetesVersion is unset.
	DefaultKubernetesVersion = "v1.34.4"
	// DefaultPodsCIDR is networks.pods when unset (Kubespray's default, clear of 10.96.0.0/12).
	DefaultPodsCIDR = "10.233.0.0/16"
	// DefaultServicesCIDR is networks.services when unset (kubeadm's default serviceSubnet).
	DefaultServicesCIDR = "10.96.0.0/12"
	// DefaultAPIServerPort is apiServer.port when unset (kubeadm's default bindPort).
	DefaultAPIServerPort uint16 = 6443
	// DefaultServerListenAddress is server.listenAddress when unset: every IPv4 address.
	DefaultServerListenAddress = "0.0.0.0"
	// DefaultServerPort is server.port when unset.
	DefaultServerPort uint16 = 8443
	// DefaultStateDir is stateDir when unset.
	DefaultStateDir = "/var/lib/appliance"
	// DefaultSSHPort is added to an ssh power address without a port.
	DefaultSSHPort uint16 = 22
	// DefaultSSHUser is power.username for ssh when unset.
	DefaultSSHUser = "root"
	// DefaultIPMIPort is added to an ipmi power address without a port (RMCP+, IPMI v2.0 §13).
	DefaultIPMIPort uint16 = 623
	// DefaultBootDevice is power.bootDevice for ipmi and redfish when unset.
	DefaultBootDevice = BootPXE
)

// DefaultVirtualRouterID derives the VRRP virtual router ID (1..255) from the cluster name, so that
// two clusters on one L2 segment are unlikely to collide without anyone choosing IDs: the 32-bit
// FNV-1a hash of the name's bytes, mod 255, plus 1. It is stable across releases: changing it would
// change the VRID of running clusters on upgrade.
func DefaultVirtualRouterID(clusterName string) uint8 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(clusterName)) // hash.Hash.Write never fails
	return uint8(h.Sum32()%255) + 1
}

// SetDefaults fills every unset field of c with its default, in place. It is idempotent, leaves set
// fields alone (except normalising: MACs are lowercased, ssh/ipmi power addresses get their default
// port), and leaves malformed values untouched so Validate reports them as written. A nil c is a no-op.
//
// Defaults: apiVersion/kind; kubernetesVersion DefaultKubernetesVersion; kubernetes.enabled true; networks.workloadPlane.cidrs
// a copy of networks.controlPlane.cidrs; networks.pods DefaultPodsCIDR; networks.services
// DefaultServicesCIDR; apiServer.port DefaultAPIServerPort; apiServer.keepalived.enabled true;
// apiServer.keepalived.virtualRouterID DefaultVirtualRouterID(clusterName); server.listenAddress
// 0.0.0.0; server.port DefaultServerPort; stateDir DefaultStateDir; per node: ssh username root,
// ssh address the node's first address, port 22 (ssh) or 623 (ipmi), bootDevice pxe (ipmi, redfish).
func SetDefaults(c *BootstrapConfiguration) {
	if c == nil {
		return
	}
	if c.APIVersion == "" {
		c.APIVersion = APIVersion
	}
	if c.Kind == "" {
		c.Kind = Kind
	}
	if c.KubernetesVersion == "" {
		c.KubernetesVersion = DefaultKubernetesVersion
	}
	if c.Kubernetes.Enabled == nil {
		enabled := true
		c.Kubernetes.Enabled = &enabled
	}
	n := &c.Networks
	if len(n.WorkloadPlane.CIDRs) == 0 && len(n.ControlPlane.CIDRs) > 0 {
		n.WorkloadPlane.CIDRs = slices.Clone(n.ControlPlane.CIDRs)
	}
	if !n.Pods.IsValid() {
		n.Pods = netip.MustParsePrefix(DefaultPodsCIDR)
	}
	if !n.Services.IsValid() {
		n.Services = netip.MustParsePrefix(DefaultServicesCIDR)
	}
	a := &c.APIServer
	if a.Port == 0 {
		a.Port = DefaultAPIServerPort
	}
	if a.Keepalived.Enabled == nil {
		enabled := true
		a.Keepalived.Enabled = &enabled
	}
	if a.Keepalived.VirtualRouterID == 0 {
		a.Keepalived.VirtualRouterID = DefaultVirtualRouterID(c.ClusterName)
	}
	if !c.Server.ListenAddress.IsValid() {
		c.Server.ListenAddress = netip.MustParseAddr(DefaultServerListenAddress)
	}
	if c.Server.Port == 0 {
		c.Server.Port = DefaultServerPort
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	for i := range c.Nodes {
		setNodeDefaults(&c.Nodes[i])
	}
}

func setNodeDefaults(n *Node) {
	if hw, err := net.ParseMAC(n.MAC); err == nil && len(hw) == 6 {
		n.MAC = hw.String() // lowercase, colon-separated
	}
	p := &n.Power
	switch p.Kind {
	case PowerSSH:
		if p.Username == "" {
			p.Username = DefaultSSHUser
		}
		if p.Address == "" && len(n.Addresses) > 0 && n.Addresses[0].IsValid() {
			p.Address = netip.AddrPortFrom(n.Addresses[0], DefaultSSHPort).String()
		} else {
			p.Address = withDefaultPort(p.Address, DefaultSSHPort)
		}
	case PowerIPMI:
		p.Address = withDefaultPort(p.Address, DefaultIPMIPort)
		if p.BootDevice == "" {
			p.BootDevice = DefaultBootDevice
		}
	case PowerRedfish:
		if p.BootDevice == "" {
			p.BootDevice = DefaultBootDevice
		}
	}
}

// withDefaultPort returns "host:port" for a bare host (IP, [IPv6] or DNS name), and addr unchanged
// when it already has a port or is not a valid host (Validate reports it as written).
func withDefaultPort(addr string, port uint16) string {
	if addr == "" {
		return ""
	}
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	host := addr
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	if !validHost(host) {
		return addr
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}
