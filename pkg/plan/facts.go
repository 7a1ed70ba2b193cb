package plan

import (
	"net/netip"
	"slices"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodeaddr"
)

// The facts derived from bootstrap.yaml that more than one artefact needs, each in one place.

// ControlPlaneAddress is n's control-plane address (nodeaddr.ControlPlane: its first static address
// inside a control-plane CIDR, the CIDRs tried in order). ok is false for a node without one.
func ControlPlaneAddress(c *config.BootstrapConfiguration, n config.Node) (netip.Addr, bool) {
	return nodeaddr.ControlPlane(c, n)
}

// WorkloadPlaneAddress is n's first static address inside a workload-plane CIDR (nodeaddr.WorkloadPlane).
func WorkloadPlaneAddress(c *config.BootstrapConfiguration, n config.Node) (netip.Addr, bool) {
	return nodeaddr.WorkloadPlane(c, n)
}

// ControlPlaneAddresses are the control-plane addresses of every control-plane node that has one,
// in document order, without duplicates (nodeaddr.ControlPlanes): the VRRP speakers of the API VIP
// besides the bootstrap host.
func ControlPlaneAddresses(c *config.BootstrapConfiguration) []netip.Addr {
	return nodeaddr.ControlPlanes(c)
}

// NodeNetworks are the networks nodes live on: the control-plane CIDRs, then the workload-plane
// CIDRs, without duplicates. The bootstrap host's firewall accepts node traffic from these.
func NodeNetworks(c *config.BootstrapConfiguration) []netip.Prefix {
	var nets []netip.Prefix
	for _, p := range slices.Concat(c.Networks.ControlPlane.CIDRs, c.Networks.WorkloadPlane.CIDRs) {
		if p.IsValid() && !slices.Contains(nets, p) {
			nets = append(nets, p)
		}
	}
	return nets
}

// NodeFirewallSources are the sources a node's own firewall accepts cluster traffic from:
// NodeNetworks plus the pod CIDR, because pods reach host-network ports on nodes (the kubelet, the
// API server from in-cluster clients); the bootstrap host serves nodes, never pods.
func NodeFirewallSources(c *config.BootstrapConfiguration) []netip.Prefix {
	nets := NodeNetworks(c)
	if p := c.Networks.Pods; p.IsValid() && !slices.Contains(nets, p) {
		nets = append(nets, p)
	}
	return nets
}

// Roles are n's roles as the node↔appliance contract spells them (agentapi: "control-plane", "worker").
func Roles(n config.Node) []string {
	out := make([]string, 0, len(n.Roles))
	for _, r := range n.Roles {
		out = append(out, string(r))
	}
	return out
}

// ApplianceFirewall is the bootstrap host's firewall: the port table's bootstrap role, reachable
// from NodeNetworks, VRRP accepted from ControlPlaneAddresses, the DNS port only with
// dns.listenAddress, the network-boot ports only with boot.dhcp proxy or server (4011 only with proxy).
func ApplianceFirewall(c *config.BootstrapConfiguration) firewall.Spec {
	var bootHTTP uint16
	if c.Boot.Enabled() {
		bootHTTP = c.Boot.HTTPPort
	}
	return firewall.Spec{
		Roles:        []firewall.Role{firewall.RoleBootstrap},
		NodeNetworks: NodeNetworks(c),
		VRRPPeers:    ControlPlaneAddresses(c),
		HTTPSPort:    c.Server.Port,
		APIPort:      c.APIServer.Port,
		DNS:          c.DNS.ListenAddress.IsValid(),
		Boot:         c.Boot.Enabled(),
		BootProxy:    c.Boot.DHCP == config.BootDHCPProxy,
		BootHTTPPort: bootHTTP,
	}
}
