package dnsrecords

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"
)

// short renders records as "owner TYPE rdata" (no TTL, no class).
func short(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		f := strings.Split(rr.String(), "\t")
		out = append(out, f[0]+" "+strings.Join(f[3:], " "))
	}
	return out
}

func TestLookup(t *testing.T) {
	z, err := New(labConfig(t, nil), Options{})
	if err != nil {
		t.Fatal(err)
	}
	const soa = "lab.example.com. SOA ns.lab.example.com. hostmaster.lab.example.com. 1 3600 600 604800 300"
	cpA := func(owner string) []string {
		return []string{owner + " A 10.100.0.11", owner + " A 10.100.0.12", owner + " A 10.100.0.13"}
	}
	etcdA := []string{"etcd-0.lab.example.com. A 10.100.0.11", "etcd-1.lab.example.com. A 10.100.0.12", "etcd-2.lab.example.com. A 10.100.0.13"}
	tests := []struct {
		name, qname string
		qtype       uint16
		rcode       int
		aa          bool
		answer, ns  []string
		extra       []string
	}{
		{"api", "api.lab.example.com.", dns.TypeA, dns.RcodeSuccess, true, []string{"api.lab.example.com. A 10.100.0.100"}, nil, nil},
		{"api-int without the dot, in capitals", "API-INT.Lab.Example.COM", dns.TypeA, dns.RcodeSuccess, true, []string{"api-int.lab.example.com. A 10.100.0.100"}, nil, nil},
		{"no AAAA: NODATA", "api.lab.example.com.", dns.TypeAAAA, dns.RcodeSuccess, true, nil, []string{soa}, nil},
		{"ANY", "cp2.lab.example.com.", dns.TypeANY, dns.RcodeSuccess, true, []string{"cp2.lab.example.com. A 10.100.0.12"}, nil, nil},
		{"wildcard", "console.apps.lab.example.com.", dns.TypeA, dns.RcodeSuccess, true, cpA("console.apps.lab.example.com."), nil, nil},
		{"wildcard two labels down", "a.b.apps.lab.example.com.", dns.TypeA, dns.RcodeSuccess, true, cpA("a.b.apps.lab.example.com."), nil, nil},
		{"wildcard, other type: NODATA", "console.apps.lab.example.com.", dns.TypeTXT, dns.RcodeSuccess, true, nil, []string{soa}, nil},
		{"the wildcard itself", "*.apps.lab.example.com.", dns.TypeA, dns.RcodeSuccess, true, cpA("*.apps.lab.example.com."), nil, nil},
		{"apps is an empty non-terminal: NODATA", "apps.lab.example.com.", dns.TypeA, dns.RcodeSuccess, true, nil, []string{soa}, nil},
		{"_tcp is an empty non-terminal: NODATA", "_tcp.lab.example.com.", dns.TypeSRV, dns.RcodeSuccess, true, nil, []string{soa}, nil},
		{"etcd SRV with the targets' addresses", "_etcd-server-ssl._tcp.lab.example.com.", dns.TypeSRV, dns.RcodeSuccess, true, []string{
			"_etcd-server-ssl._tcp.lab.example.com. SRV 0 10 2380 etcd-0.lab.example.com.",
			"_etcd-server-ssl._tcp.lab.example.com. SRV 0 10 2380 etcd-1.lab.example.com.",
			"_etcd-server-ssl._tcp.lab.example.com. SRV 0 10 2380 etcd-2.lab.example.com.",
		}, nil, etcdA},
		{"etcd-1", "etcd-1.lab.example.com.", dns.TypeA, dns.RcodeSuccess, true, etcdA[1:2], nil, nil},
		{"apex NS with glue", "lab.example.com.", dns.TypeNS, dns.RcodeSuccess, true, []string{"lab.example.com. NS ns.lab.example.com."}, nil, []string{"ns.lab.example.com. A 10.100.0.2"}},
		{"apex SOA", "lab.example.com.", dns.TypeSOA, dns.RcodeSuccess, true, []string{soa}, nil, nil},
		{"no such name: NXDOMAIN", "cp9.lab.example.com.", dns.TypeA, dns.RcodeNameError, true, nil, []string{soa}, nil},
		{"below a name without a wildcard: NXDOMAIN", "x.api.lab.example.com.", dns.TypeA, dns.RcodeNameError, true, nil, []string{soa}, nil},
		{"etcd-3 does not exist", "etcd-3.lab.example.com.", dns.TypeA, dns.RcodeNameError, true, nil, []string{soa}, nil},
		{"the parent domain: REFUSED", "example.com.", dns.TypeA, dns.RcodeRefused, false, nil, nil, nil},
		{"a sibling zone: REFUSED", "api.lab2.example.com.", dns.TypeA, dns.RcodeRefused, false, nil, nil, nil},
		{"elsewhere: REFUSED", "www.example.org.", dns.TypeA, dns.RcodeRefused, false, nil, nil, nil},
		{"a suffix that is not a label boundary: REFUSED", "xlab.example.com.", dns.TypeA, dns.RcodeRefused, false, nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := z.Lookup(tt.qname, tt.qtype)
			if a.Rcode != tt.rcode || a.Authoritative != tt.aa {
				t.Errorf("rcode %s, AA %v; want %s, AA %v", dns.RcodeToString[a.Rcode], a.Authoritative, dns.RcodeToString[tt.rcode], tt.aa)
			}
			for _, s := range []struct {
				name      string
				got, want []string
			}{{"answer", short(a.Answer), tt.answer}, {"authority", short(a.Ns), tt.ns}, {"additional", short(a.Extra), tt.extra}} {
				if d := cmp.Diff(s.want, s.got); d != "" {
					t.Errorf("%s (-want +got):\n%s", s.name, d)
				}
			}
		})
	}
	// A synthesised answer does not change the zone's own wildcard records.
	if got := short(z.byName["*.apps.lab.example.com."]); got[0] != "*.apps.lab.example.com. A 10.100.0.11" {
		t.Errorf("wildcard records changed: %v", got)
	}
}
