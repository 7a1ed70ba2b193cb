// Package dnsrecords builds the cluster's DNS records from the BootstrapConfiguration, renders them as
// an RFC 1035 zone file for the datacenter's own DNS (`appliance dns zone`) and answers queries for
// them authoritatively (Server, started by `appliance serve` when dns.listenAddress is set).
//
// The records are kcli's list for an OpenShift on-prem cluster, in the zone Z =
// <clusterName>.<baseDomain>:
//
//	api.Z, api-int.Z          A    apiServer.vip
//	*.apps.Z                  A    ingress.vip; without it every control plane's control-plane address
//	etcd-N.Z                  A    control plane N's control-plane address (N = 0, 1, … in document order)
//	_etcd-server-ssl._tcp.Z   SRV  0 10 2380 etcd-N.Z, one per control plane (RFC 2782)
//	<node>.Z                  A    each node's control-plane address (its kubelet --node-ip), else its
//	                               workload-plane address
//
// plus the zone's SOA and NS records, whose name server ns.Z has the address Options.NameServer
// (default dns.listenAddress). Records, zone file and answers are built from miekg/dns RR types and
// printed in their presentation format; nothing here formats zone-file text by hand.
package dnsrecords

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/miekg/dns"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodeaddr"
)

// Record timings, in seconds.
const (
	// TTL is every record's time to live: short enough that a day-2 inventory change reaches the
	// resolvers within minutes.
	TTL = 300
	// SOA timers (RFC 1035 §3.3.13) for secondaries of an imported zone: refresh hourly, retry every
	// 10 minutes, expire after a week; negative answers are cached for TTL (RFC 2308 §4).
	soaRefresh = 3600
	soaRetry   = 600
	soaExpire  = 604800
)

// EtcdPeerPort is the port of the etcd SRV records: etcd's peer port (kubeadm's --listen-peer-urls).
const EtcdPeerPort = 2380

// SRV priority and weight of every etcd record (RFC 2782): one priority, equal weights, so clients
// spread over all members as OpenShift's records do.
const (
	etcdSRVPriority = 0
	etcdSRVWeight   = 10
)

// Sentinel errors of New.
var (
	// ErrNoBaseDomain: the configuration sets no baseDomain, so the cluster has no DNS records.
	ErrNoBaseDomain = errors.New("baseDomain is not set: the cluster has no DNS records; set baseDomain (e.g. example.com) in the configuration")
	// ErrNoNameServer: neither Options.NameServer nor dns.listenAddress gives the name server's address.
	ErrNoNameServer = errors.New("the zone's name server address is unknown: set dns.listenAddress (the appliance then answers queries itself), or name the address of the server that will load the zone")
)

// Options tune New.
type Options struct {
	// NameServer is the address of ns.<zone>, the zone's SOA MNAME and NS target. Default
	// dns.listenAddress.
	NameServer netip.Addr
	// NameServers, when set, are every address of ns.<zone> (one A record each, in order) and
	// replace NameServer: the control planes, whose CoreDNS static pods serve the zone (ForCoreDNS).
	NameServers []netip.Addr
	// Serial is the SOA serial (RFC 1035 §3.3.13, compared with RFC 1982 serial arithmetic by
	// secondaries). 0 means 1. FileSerial derives one from the configuration file.
	Serial uint32
}

// FileSerial is a SOA serial for the zone built from the configuration file at path: its
// modification time in seconds since 1970 (it grows whenever the file is edited, and is the same on
// every render of one file, so `appliance dns zone` prints identical bytes twice).
func FileSerial(path string) (uint32, error) {
	st, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return uint32(st.ModTime().Unix()), nil
}

// Zone is the cluster's zone: its origin and records, SOA first, in a fixed order (the order of
// the package doc, nodes and control planes in document order).
type Zone struct {
	// Origin is the zone's fully qualified name, "<clusterName>.<baseDomain>.".
	Origin string
	// RRs are the records; callers must not modify them.
	RRs []dns.RR

	soa *dns.SOA
	// byName maps each owner name (lowercase, fully qualified) to its records.
	byName map[string][]dns.RR
	// exists holds every owner name and every empty non-terminal between an owner and Origin
	// (RFC 4592 §2.2.2): such names exist without records.
	exists map[string]bool
}

// New builds the zone of c (after SetDefaults and Validate). It returns ErrNoBaseDomain when c sets
// no baseDomain and ErrNoNameServer when the name server's address is unknown.
func New(c *config.BootstrapConfiguration, o Options) (*Zone, error) {
	if c.BaseDomain == "" {
		return nil, ErrNoBaseDomain
	}
	nss := o.NameServers
	if len(nss) == 0 {
		ns := o.NameServer
		if !ns.IsValid() {
			ns = c.DNS.ListenAddress
		}
		if !ns.IsValid() {
			return nil, ErrNoNameServer
		}
		nss = []netip.Addr{ns}
	}
	for _, ns := range nss {
		if !ns.Is4() {
			return nil, fmt.Errorf("name server address %s is not IPv4: the cluster's networks are IPv4", ns)
		}
	}
	origin := dns.Fqdn(strings.ToLower(c.DNSZone()))
	if _, ok := dns.IsDomainName(origin); !ok {
		return nil, fmt.Errorf("zone %q is not a domain name: check clusterName and baseDomain", origin)
	}
	name := func(rel string) string { return rel + "." + origin }
	hdr := func(owner string, t uint16) dns.RR_Header {
		return dns.RR_Header{Name: owner, Rrtype: t, Class: dns.ClassINET, Ttl: TTL}
	}
	a := func(owner string, addr netip.Addr) dns.RR {
		return &dns.A{Hdr: hdr(owner, dns.TypeA), A: addr.AsSlice()}
	}
	serial := o.Serial
	if serial == 0 {
		serial = 1
	}
	soa := &dns.SOA{Hdr: hdr(origin, dns.TypeSOA), Ns: name(config.DNSNameNameServer), Mbox: name("hostmaster"),
		Serial: serial, Refresh: soaRefresh, Retry: soaRetry, Expire: soaExpire, Minttl: TTL}
	rrs := []dns.RR{
		soa,
		&dns.NS{Hdr: hdr(origin, dns.TypeNS), Ns: name(config.DNSNameNameServer)},
	}
	for _, ns := range nss {
		rrs = append(rrs, a(name(config.DNSNameNameServer), ns))
	}
	if vip := c.APIServer.VIP; vip.IsValid() {
		rrs = append(rrs, a(name(config.DNSNameAPI), vip), a(name(config.DNSNameAPIInternal), vip))
	}
	// *.apps names the ingress VIP (kcli's layout); without one, every control plane.
	if vip := c.Ingress.VIP; vip.IsValid() {
		rrs = append(rrs, a(name("*."+config.DNSNameApps), vip))
	} else {
		for _, addr := range nodeaddr.ControlPlanes(c) {
			rrs = append(rrs, a(name("*."+config.DNSNameApps), addr))
		}
	}
	var srv []dns.RR
	for i, n := range c.ControlPlaneNodes() {
		addr, ok := nodeaddr.ControlPlane(c, n)
		if !ok {
			continue
		}
		etcd := name(fmt.Sprintf("%s%d", config.DNSNameEtcdPrefix, i))
		rrs = append(rrs, a(etcd, addr))
		srv = append(srv, &dns.SRV{Hdr: hdr(name(config.DNSNameEtcdSRV), dns.TypeSRV),
			Priority: etcdSRVPriority, Weight: etcdSRVWeight, Port: EtcdPeerPort, Target: etcd})
	}
	rrs = append(rrs, srv...)
	for _, n := range c.Nodes {
		addr, ok := nodeaddr.ControlPlane(c, n)
		if !ok {
			addr, ok = nodeaddr.WorkloadPlane(c, n)
		}
		if ok {
			rrs = append(rrs, a(name(strings.ToLower(n.Name)), addr))
		}
	}
	z := &Zone{Origin: origin, RRs: rrs, soa: soa, byName: map[string][]dns.RR{}, exists: map[string]bool{}}
	for _, rr := range rrs {
		owner := rr.Header().Name
		if slices.ContainsFunc(z.byName[owner], func(have dns.RR) bool { return dns.IsDuplicate(have, rr) }) {
			return nil, fmt.Errorf("record %s is built twice: two entries of the configuration give %s the same record", rr, owner)
		}
		z.byName[owner] = append(z.byName[owner], rr)
		for n := owner; dns.IsSubDomain(origin, n); {
			z.exists[n] = true
			off, end := dns.NextLabel(n, 0)
			if end {
				break
			}
			n = n[off:]
		}
	}
	return z, nil
}

// Record is one record of the zone for JSON output: owner name, TTL in seconds, type mnemonic (A,
// SRV, …) and RDATA in presentation format (RFC 1035 §5.1).
type Record struct {
	Name string `json:"name"`
	TTL  uint32 `json:"ttl"`
	Type string `json:"type"`
	Data string `json:"data"`
}

// Records returns the zone's records as Records, in the order of RRs.
func (z *Zone) Records() []Record {
	out := make([]Record, 0, len(z.RRs))
	for _, rr := range z.RRs {
		h := rr.Header()
		out = append(out, Record{Name: h.Name, TTL: h.Ttl, Type: dns.TypeToString[h.Rrtype],
			Data: strings.TrimPrefix(rr.String(), h.String())})
	}
	return out
}

// WriteTo writes the zone as an RFC 1035 master file: a comment naming the zone, then one record
// per line in miekg/dns's presentation format, with absolute names and explicit TTLs (so the file
// needs no $ORIGIN or $TTL). The output is deterministic.
func (z *Zone) WriteTo(w io.Writer) (int64, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "; zone %s: the cluster's DNS records, generated by `appliance dns zone` from bootstrap.yaml\n", z.Origin)
	for _, rr := range z.RRs {
		b.WriteString(rr.String())
		b.WriteByte('\n')
	}
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}
