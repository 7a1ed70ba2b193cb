package firewall

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// ErrInvalidSpec is wrapped by every error Spec.Validate returns.
var ErrInvalidSpec = errors.New("invalid firewall spec")

// Spec is the desired firewall of one host.
type Spec struct {
	// Roles of the host; the host gets the union of their ports. At least one, each a known Role.
	Roles []Role
	// NodeNetworks are the networks allowed to reach SourceNodeNetworks ports (IPv4 and/or IPv6; host bits
	// are ignored, overlapping prefixes merged). At least one. Include the pod CIDR if pods must reach
	// host-network ports such as the kubelet.
	NodeNetworks []netip.Prefix
	// VRRPPeers are the only addresses VRRP (IP protocol 112) is accepted from: keepalived's unicast peers.
	// IPv4-mapped IPv6 addresses are treated as IPv4. May be empty (no VRRP accepted).
	VRRPPeers []netip.Addr
	// HTTPSPort is the appliance HTTPS port; 0 means DefaultHTTPSPort.
	HTTPSPort uint16
	// APIPort is the kube-apiserver/VIP port; 0 means DefaultAPIPort.
	APIPort uint16
	// DNS opens the table's DNS rows (DNSPort, UDP and TCP) of the host's roles: only when the host
	// answers the cluster's zone (the appliance with dns.listenAddress set; a control plane running
	// the CoreDNS static pod, baseDomain set). Without it nothing listens there, so nothing is opened.
	DNS bool `json:",omitempty"`
	// Ingress opens the table's ingress rows of the host's roles (IngressHTTPPort and IngressHTTPSPort
	// on control planes, the routers' ports on every node): only in a cluster with an ingress VIP
	// (ingress.vip), where the control planes' HAProxy and the ingress routers answer there.
	Ingress bool `json:",omitempty"`
	// VXLAN opens the table's vxlan row (VXLANPort, UDP) of the host's roles: only on the nodes of a
	// cluster whose pod network is VXLAN between them (networks.cni flannel or calico).
	VXLAN bool `json:",omitempty"`
	// Boot opens the table's network-boot rows (DHCPPort, TFTPPort and the boot HTTP port): only when
	// the host serves network boot (the appliance with boot.dhcp proxy or server).
	Boot bool `json:",omitempty"`
	// BootProxy also opens PXEPort, where proxyDHCP clients send their REQUEST (boot.dhcp: proxy).
	// Requires Boot.
	BootProxy bool `json:",omitempty"`
	// BootHTTPPort is the plain-HTTP port of the boot artefacts (boot.httpPort); 0 means
	// DefaultBootHTTPPort.
	BootHTTPPort uint16 `json:",omitempty"`
}

// Validate returns every problem of s at once (errors.Join), each wrapping ErrInvalidSpec and naming its
// field path, e.g. `roles[1]: unknown role "master" (want bootstrap, control-plane, etcd or worker)`.
func (s Spec) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidSpec}, a...)...))
	}
	if len(s.Roles) == 0 {
		bad("roles: at least one role is required (bootstrap, control-plane, etcd or worker)")
	}
	for i, r := range s.Roles {
		if !r.Valid() {
			bad("roles[%d]: unknown role %q (want bootstrap, control-plane, etcd or worker)", i, r)
		}
	}
	if len(s.NodeNetworks) == 0 {
		bad("nodeNetworks: at least one network is required, else no node can reach the host")
	}
	for i, p := range s.NodeNetworks {
		if !p.IsValid() {
			bad("nodeNetworks[%d]: %q is not a CIDR", i, p)
		}
	}
	if s.BootProxy && !s.Boot {
		bad("bootProxy: set only with boot (the proxyDHCP port belongs to the network-boot service)")
	}
	for i, a := range s.VRRPPeers {
		if !a.IsValid() {
			bad("vrrpPeers[%d]: not an IP address", i)
		} else if a.Zone() != "" {
			bad("vrrpPeers[%d]: %q has a zone; give the address without %%zone", i, a)
		}
	}
	return errors.Join(errs...)
}

// ports returns the deduplicated openings for the spec's roles, in table order. Two entries that differ only
// in role collapse into one (e.g. ssh for every role, kube-apiserver for bootstrap and control-plane).
func (s Spec) ports() []Port {
	type key struct {
		proto    string
		from, to uint16
		src      Source
	}
	seen := map[key]bool{}
	var out []Port
	for _, p := range Ports(s.HTTPSPort, s.APIPort) {
		if !slices.Contains(s.Roles, p.Role) || p.isDNS() && !s.DNS || p.isIngress() && !s.Ingress || p.Name == "vxlan" && !s.VXLAN || p.isBoot() && !s.Boot || p.Name == "boot-proxydhcp" && !s.BootProxy {
			continue
		}
		if p.Name == "boot-http" && s.BootHTTPPort != 0 {
			p.From, p.To = s.BootHTTPPort, s.BootHTTPPort
		}
		k := key{p.Protocol, p.From, p.To, p.Source}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, p)
	}
	return out
}

// addrRange is an inclusive range of addresses of one family.
type addrRange struct{ first, last netip.Addr }

// mergePrefixes splits valid prefixes by family and merges overlapping and adjacent ones into sorted,
// disjoint ranges (nftables interval sets reject overlapping elements).
func mergePrefixes(ps []netip.Prefix) (v4, v6 []addrRange) {
	var rs []addrRange
	for _, p := range ps {
		if !p.IsValid() {
			continue
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p)).Masked()
		rs = append(rs, addrRange{p.Addr(), lastAddr(p)})
	}
	slices.SortFunc(rs, func(a, b addrRange) int { return a.first.Compare(b.first) })
	var merged []addrRange
	for _, r := range rs {
		if n := len(merged); n > 0 && merged[n-1].last.Is4() == r.first.Is4() {
			cur := &merged[n-1]
			next := cur.last.Next()
			if !next.IsValid() || r.first.Compare(next) <= 0 { // overlapping, adjacent, or cur reaches the end
				if r.last.Compare(cur.last) > 0 {
					cur.last = r.last
				}
				continue
			}
		}
		merged = append(merged, r)
	}
	for _, r := range merged {
		if r.first.Is4() {
			v4 = append(v4, r)
		} else {
			v6 = append(v6, r)
		}
	}
	return v4, v6
}

// unmapBits is 96 for an IPv4-mapped IPv6 prefix (so ::ffff:10.0.0.0/104 becomes 10.0.0.0/8), else 0.
func unmapBits(p netip.Prefix) int {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return 96
	}
	return 0
}

// lastAddr is the highest address of p (all host bits set); p must be masked.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// String renders r as nft does: a prefix when r is exactly one, else "first-last", a single address bare.
func (r addrRange) String() string {
	if r.first == r.last {
		return r.first.String()
	}
	for bits := 0; bits <= r.first.BitLen(); bits++ {
		p := netip.PrefixFrom(r.first, bits)
		if p.Masked().Addr() == r.first && lastAddr(p) == r.last {
			return p.String()
		}
	}
	return r.first.String() + "-" + r.last.String()
}

// splitPeers dedups, sorts and splits VRRP peers by family (IPv4-mapped addresses count as IPv4).
func splitPeers(as []netip.Addr) (v4, v6 []netip.Addr) {
	for _, a := range as {
		if !a.IsValid() || a.Zone() != "" {
			continue
		}
		a = a.Unmap()
		if a.Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	sortUniq := func(s []netip.Addr) []netip.Addr {
		slices.SortFunc(s, netip.Addr.Compare)
		return slices.Compact(s)
	}
	return sortUniq(v4), sortUniq(v6)
}

// isIngress reports whether p is one of the table's ingress rows, opened only with Spec.Ingress.
func (p Port) isIngress() bool { return strings.HasPrefix(p.Name, "ingress-") }

// isBoot reports whether p is one of the table's network-boot rows, opened only with Spec.Boot.
func (p Port) isBoot() bool { return strings.HasPrefix(p.Name, "boot-") }

// isDNS reports whether p is one of the table's DNS rows, opened only with Spec.DNS.
func (p Port) isDNS() bool {
	return p.From == DNSPort && p.To == DNSPort && strings.HasPrefix(p.Name, "dns-")
}
