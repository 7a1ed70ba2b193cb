package dnsrecords

import (
	"github.com/miekg/dns"
)

// Answer is what an authoritative server answers for one question (RFC 1034 §4.3.2).
type Answer struct {
	// Rcode: dns.RcodeSuccess (records, or none of the type: NODATA), dns.RcodeNameError
	// (NXDOMAIN) or dns.RcodeRefused (a name outside the zone).
	Rcode int
	// Authoritative is the AA bit: set for every name inside the zone.
	Authoritative bool
	// Answer holds the records of the name and type (every type for ANY).
	Answer []dns.RR
	// Ns holds the zone's SOA for NXDOMAIN and NODATA (negative caching, RFC 2308 §3).
	Ns []dns.RR
	// Extra holds the addresses of in-zone SRV and NS targets (RFC 2782, RFC 1035 §3.3.11).
	Extra []dns.RR
}

// Lookup answers qname (any case, with or without the trailing dot) and qtype (dns.TypeANY for
// every type) from the zone. Names below an existing name are NXDOMAIN unless a wildcard covers
// them (RFC 4592: *.apps.<zone> answers every name under apps.<zone> that does not exist itself,
// with the question's name as owner); names that exist only as ancestors of others (apps.<zone>,
// _tcp.<zone>) are NODATA.
func (z *Zone) Lookup(qname string, qtype uint16) Answer {
	name := dns.CanonicalName(qname)
	if !dns.IsSubDomain(z.Origin, name) {
		return Answer{Rcode: dns.RcodeRefused}
	}
	ans := Answer{Rcode: dns.RcodeSuccess, Authoritative: true}
	rrs := z.byName[name]
	if !z.exists[name] {
		wild, ok := z.wildcard(name)
		if !ok {
			ans.Rcode = dns.RcodeNameError
			ans.Ns = []dns.RR{dns.Copy(z.soa)}
			return ans
		}
		rrs = nil
		for _, rr := range z.byName[wild] {
			c := dns.Copy(rr)
			c.Header().Name = dns.Fqdn(qname)
			rrs = append(rrs, c)
		}
	}
	for _, rr := range rrs {
		if qtype == dns.TypeANY || rr.Header().Rrtype == qtype {
			ans.Answer = append(ans.Answer, rr)
		}
	}
	if len(ans.Answer) == 0 {
		ans.Ns = []dns.RR{dns.Copy(z.soa)}
		return ans
	}
	for _, rr := range ans.Answer {
		var target string
		switch rr := rr.(type) {
		case *dns.SRV:
			target = rr.Target
		case *dns.NS:
			target = rr.Ns
		default:
			continue
		}
		for _, t := range z.byName[dns.CanonicalName(target)] {
			if t.Header().Rrtype == dns.TypeA {
				ans.Extra = append(ans.Extra, t)
			}
		}
	}
	return ans
}

// wildcard returns the owner "*.<closest encloser>" that synthesises records for name, which does
// not exist (RFC 4592 §3.3.1): the closest encloser is name's nearest existing ancestor.
func (z *Zone) wildcard(name string) (string, bool) {
	for n := name; ; {
		off, end := dns.NextLabel(n, 0)
		if end {
			return "", false
		}
		n = n[off:]
		if z.exists[n] {
			w := "*." + n
			_, ok := z.byName[w]
			return w, ok
		}
	}
}
