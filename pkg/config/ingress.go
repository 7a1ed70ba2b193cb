package config

import (
	"net/netip"
	"slices"
)

// Ingress is the cluster's ingress VIP, kcli's OpenShift on-prem layout: a second unicast VRRP
// instance on the control planes carries VIP; there, each control plane's HAProxy (the one of
// apiServer.loadBalancer) balances ports 80 and 443 to the ingress routers on the workers, or, with
// no worker, the routers run on the control planes themselves and answer on the VIP directly (kcli's
// rule: no HAProxy then). With baseDomain, *.apps.<clusterName>.<baseDomain> names VIP (pkg/dnsrecords).
type Ingress struct {
	// VIP is the ingress virtual IP: a free host address inside networks.controlPlane.cidrs (keepalived
	// on the control planes carries it), neither apiServer.vip nor a node's address. Optional: without
	// it there is no ingress VIP (and *.apps names the control planes).
	VIP netip.Addr `yaml:"vip"`
	// VirtualRouterID is the ingress instance's VRRP VRID, 1..255, not apiServer.keepalived's. Default
	// DefaultIngressVirtualRouterID.
	VirtualRouterID uint8 `yaml:"virtualRouterID" strictyaml:"nonzero"`
}

// IsZero reports whether nothing is set (the YAML encoder leaves ingress out then).
func (i Ingress) IsZero() bool { return !i.VIP.IsValid() && i.VirtualRouterID == 0 }

// DefaultIngressVirtualRouterID derives the ingress instance's VRID from the cluster name and the
// ingress VIP as DefaultVirtualRouterID does for the API's, moved to the next VRID (1..255, wrapping)
// when it would equal apiVRID.
func DefaultIngressVirtualRouterID(clusterName string, vip netip.Addr, apiVRID uint8) uint8 {
	id := DefaultVirtualRouterID(clusterName+"-ingress", vip)
	if id == apiVRID {
		id = id%255 + 1
	}
	return id
}

// setIngressDefaults derives ingress.virtualRouterID when the VIP is set.
func setIngressDefaults(c *BootstrapConfiguration) {
	if c.Ingress.VIP.IsValid() && c.Ingress.VirtualRouterID == 0 {
		c.Ingress.VirtualRouterID = DefaultIngressVirtualRouterID(c.ClusterName, c.Ingress.VIP, c.APIServer.Keepalived.VirtualRouterID)
	}
}

// ingress validates the ingress section: the VIP inside a control-plane CIDR, not the API VIP nor a
// node's address, with Kubernetes and keepalived enabled; a VRID of its own.
func (v *validator) ingress() {
	in := v.c.Ingress
	if !in.VIP.IsValid() {
		if in.VirtualRouterID != 0 {
			v.errorf("ingress.virtualRouterID", "is set but ingress.vip is not: give the ingress VIP, or remove virtualRouterID")
		}
		return
	}
	const path = "ingress.vip"
	switch {
	case !v.hostAddr(path, in.VIP):
		return
	case in.VIP.Is6():
		v.errorf(path, "%s is IPv6: "+ipv4Only, in.VIP)
		return
	case !v.c.Kubernetes.IsEnabled():
		v.errorf(path, "is set but kubernetes.enabled is false: the ingress routers run in the cluster; remove ingress or enable Kubernetes")
	case !v.c.APIServer.Keepalived.IsEnabled():
		v.errorf(path, "is set but apiServer.keepalived.enabled is false: keepalived on the control planes carries the ingress VIP; enable it or remove ingress")
	case !v.c.APIServer.LoadBalancer.IsEnabled():
		v.errorf(path, "is set but apiServer.loadBalancer.enabled is false: the control planes' HAProxy passes the ingress ports to the routers; enable it or remove ingress")
	case in.VIP == v.c.APIServer.VIP:
		v.errorf(path, "%s is also apiServer.vip: the ingress VIP moves on its own (another VRRP instance), so choose another free address", in.VIP)
	}
	for _, p := range v.c.Networks.ControlPlane.CIDRs {
		if p.IsValid() && p.Contains(in.VIP) && p.Addr().Is4() && p.Bits() < 31 {
			if in.VIP == p.Masked().Addr() {
				v.errorf(path, "%s is the network address of %s: choose a host address inside it", in.VIP, p)
			} else if in.VIP == lastAddr(p) {
				v.errorf(path, "%s is the broadcast address of %s: choose a host address inside it", in.VIP, p)
			}
		}
	}
	if !slices.ContainsFunc(v.c.Networks.ControlPlane.CIDRs, func(p netip.Prefix) bool { return p.IsValid() && p.Contains(in.VIP) }) {
		var cps []string
		for _, p := range v.c.Networks.ControlPlane.CIDRs {
			cps = append(cps, p.String())
		}
		v.errorf(path, "%s is outside every networks.controlPlane.cidrs (%v): keepalived on the control planes carries it, so choose a free address inside one", in.VIP, cps)
	}
	for i, n := range v.c.Nodes {
		if slices.Contains(n.Addresses, in.VIP) {
			v.errorf(path, "%s is nodes[%d] (%s)'s address: the VIP moves between control planes, so choose a free address", in.VIP, i, n.Name)
		}
	}
	if in.VirtualRouterID == v.c.APIServer.Keepalived.VirtualRouterID && in.VirtualRouterID != 0 {
		v.errorf("ingress.virtualRouterID", "%d is also apiServer.keepalived.virtualRouterID: two VRRP instances on one segment need their own VRIDs; choose another or omit it to derive one", in.VirtualRouterID)
	}
}
