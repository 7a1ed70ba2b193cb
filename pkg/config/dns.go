package config

import (
	"fmt"
	"net/netip"
	"strings"
)

// DNS configures the appliance's authoritative DNS server for the cluster's zone
// <clusterName>.<baseDomain> (pkg/dnsrecords lists the records). The same records are exported as a
// zone file by `appliance dns zone` for the datacenter's own DNS; serving them is optional.
type DNS struct {
	// ListenAddress is the bootstrap host's address `appliance serve` answers DNS queries on, UDP and
	// TCP port 53 (RFC 1035 §4.2), authoritatively and for the zone only (no recursion). It is also the
	// address of the zone's name server record (ns.<clusterName>.<baseDomain>), so it is one unicast
	// IPv4 address, not 0.0.0.0. Requires baseDomain. Optional: empty serves no DNS.
	ListenAddress netip.Addr `yaml:"listenAddress"`
}

// IsZero reports whether nothing is set (the YAML encoder leaves dns out then).
func (d DNS) IsZero() bool { return !d.ListenAddress.IsValid() }

// DNSZone is the cluster's DNS zone, "<clusterName>.<baseDomain>" (no trailing dot), or "" when
// baseDomain is not set (the cluster has no DNS records).
func (c *BootstrapConfiguration) DNSZone() string {
	if c == nil || c.BaseDomain == "" {
		return ""
	}
	return c.ClusterName + "." + c.BaseDomain
}

// DNS names the zone holds besides the node names (kcli's OpenShift on-prem list, pkg/dnsrecords).
const (
	// DNSNameAPI is the API server's name (apiServer.vip).
	DNSNameAPI = "api"
	// DNSNameAPIInternal is the name the nodes reach the API server by (apiServer.vip).
	DNSNameAPIInternal = "api-int"
	// DNSNameApps is the parent of the ingress wildcard *.apps.
	DNSNameApps = "apps"
	// DNSNameNameServer is the zone's name server (dns.listenAddress).
	DNSNameNameServer = "ns"
	// DNSNameEtcdPrefix + N (N = 0, 1, … in control-plane order) is each control plane's etcd name.
	DNSNameEtcdPrefix = "etcd-"
	// DNSNameEtcdSRV is the owner of the etcd SRV records, relative to the zone.
	DNSNameEtcdSRV = "_etcd-server-ssl._tcp"
)

// maxDNSName is the longest domain name in presentation form without the trailing dot: 255 octets in
// wire form (RFC 1035 §2.3.4) less the first length octet and the root label.
const maxDNSName = 253

// dns validates baseDomain, dns and the node names that become DNS names.
func (v *validator) dns() {
	base := v.c.BaseDomain
	ok := base != ""
	switch {
	case base == "":
	case strings.HasSuffix(base, "."):
		v.errorf("baseDomain", "%q ends with a dot: write the domain without it, e.g. %s", base, strings.TrimSuffix(base, "."))
		ok = false
	case base != strings.ToLower(base) && isDNS1123Subdomain(strings.ToLower(base)):
		v.errorf("baseDomain", "%q has capital letters: write it in lowercase, %s", base, strings.ToLower(base))
		ok = false
	case !isDNS1123Subdomain(base):
		v.errorf("baseDomain", "%q is not a DNS name: use %s, e.g. example.com", base, subdomainRule)
		ok = false
	}
	if ok && isDNS1123Label(v.c.ClusterName) {
		zone := v.c.DNSZone()
		if longest := DNSNameEtcdSRV + "." + zone; len(longest) > maxDNSName {
			v.errorf("baseDomain", "is %d characters long, which makes the zone's longest name (%s.<clusterName>.<baseDomain>) %d characters long: DNS names have at most %d; use a shorter baseDomain or clusterName", len(base), DNSNameEtcdSRV, len(longest), maxDNSName)
		}
		v.dnsNodeNames(zone)
	}
	if a := v.c.DNS.ListenAddress; a.IsValid() {
		const path = "dns.listenAddress"
		switch {
		case base == "":
			v.errorf(path, "is set but baseDomain is not: the appliance serves the zone <clusterName>.<baseDomain>; set baseDomain, or remove dns.listenAddress")
		case a.Is4In6():
			v.errorf(path, "%s is an IPv4-mapped IPv6 address: write it as %s", a, a.Unmap())
		case a.IsUnspecified():
			v.errorf(path, "%s is not one address: the zone's name server record (ns.%s) points at it, so give the bootstrap host's address the datacenter's resolvers query", a, v.c.DNSZone())
		case a.IsMulticast() || a.IsLoopback() || a == ipv4Broadcast:
			v.errorf(path, "%s is not a unicast address other hosts reach: give the bootstrap host's address the datacenter's resolvers query", a)
		case a.Is6():
			v.errorf(path, "%s is IPv6: "+ipv4Only, a)
		case v.c.APIServer.Keepalived.IsEnabled() && a == v.c.APIServer.VIP:
			v.errorf(path, "%s is the API server VIP (apiServer.vip): keepalived moves it to the control planes, so the DNS server would become unreachable; give the bootstrap host's own address", a)
		}
	}
}

// dnsNodeNames refuses node names whose DNS name <name>.<zone> is too long or is one of the zone's
// other names (api, api-int, ns, etcd-N, apps and what the *.apps wildcard covers).
func (v *validator) dnsNodeNames(zone string) {
	cps := len(v.c.ControlPlaneNodes())
	for i, n := range v.c.Nodes {
		if !isDNS1123Subdomain(n.Name) {
			continue // reported by nodes()
		}
		path := fmt.Sprintf("nodes[%d].name", i)
		if full := n.Name + "." + zone; len(full) > maxDNSName {
			v.errorf(path, "%q makes the node's DNS name (<name>.<clusterName>.<baseDomain>) %d characters long: DNS names have at most %d; use a shorter node name, clusterName or baseDomain", n.Name, len(full), maxDNSName)
			continue
		}
		var etcd int
		_, err := fmt.Sscanf(n.Name, DNSNameEtcdPrefix+"%d", &etcd)
		switch {
		case n.Name == DNSNameAPI || n.Name == DNSNameAPIInternal || n.Name == DNSNameNameServer:
			v.errorf(path, "%q is also the DNS name %s.%s of the zone's own records (baseDomain is set): rename the node", n.Name, n.Name, zone)
		case err == nil && n.Name == fmt.Sprintf("%s%d", DNSNameEtcdPrefix, etcd) && etcd >= 0 && etcd < cps:
			v.errorf(path, "%q is also the DNS name %s.%s of control plane number %d's etcd (baseDomain is set): rename the node", n.Name, n.Name, zone, etcd)
		case n.Name == DNSNameApps || strings.HasSuffix(n.Name, "."+DNSNameApps):
			v.errorf(path, "%q falls under %s.%s, the ingress wildcard's domain (baseDomain is set): rename the node", n.Name, DNSNameApps, zone)
		}
	}
}
