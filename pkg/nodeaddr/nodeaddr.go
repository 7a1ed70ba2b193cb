// Package nodeaddr derives a node's addresses from bootstrap.yaml: which of its static addresses is
// its control-plane address (kubelet --node-ip, etcd, VRRP) and which its workload-plane address.
// It is the one place of that rule; pkg/plan (ControlPlaneAddress, …) and pkg/dnsrecords use it, so
// that the records and the node configs can never disagree, and pkg/plan can import pkg/dnsrecords.
package nodeaddr

import (
	"net/netip"
	"slices"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// ControlPlane is n's control-plane address: its first static address inside a control-plane CIDR,
// the CIDRs tried in order (as the node's hostagent resolves its own). ok is false for a node without
// one (BMC-booted nodes may get theirs by DHCP).
func ControlPlane(c *config.BootstrapConfiguration, n config.Node) (netip.Addr, bool) {
	return firstIn(c.Networks.ControlPlane.CIDRs, n.Addresses)
}

// WorkloadPlane is n's first static address inside a workload-plane CIDR (CIDRs in order).
func WorkloadPlane(c *config.BootstrapConfiguration, n config.Node) (netip.Addr, bool) {
	return firstIn(c.Networks.WorkloadPlane.CIDRs, n.Addresses)
}

// ControlPlanes are the control-plane addresses of every control-plane node that has one, in
// document order, without duplicates.
func ControlPlanes(c *config.BootstrapConfiguration) []netip.Addr {
	var out []netip.Addr
	for _, n := range c.ControlPlaneNodes() {
		if a, ok := ControlPlane(c, n); ok && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

func firstIn(cidrs []netip.Prefix, addrs []netip.Addr) (netip.Addr, bool) {
	for _, p := range cidrs {
		for _, a := range addrs {
			if p.Contains(a) {
				return a, true
			}
		}
	}
	return netip.Addr{}, false
}
