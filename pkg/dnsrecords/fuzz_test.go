package dnsrecords

import (
	"log/slog"
	"testing"

	"github.com/miekg/dns"
)

// FuzzAnswer: for any query the server accepts (one question), the answer packs, fits the UDP size
// the query allows (512 bytes, or its EDNS(0) size up to 1232), and is authoritative exactly for
// names inside the zone.
func FuzzAnswer(f *testing.F) {
	z, err := New(labConfig(f, nil), Options{})
	if err != nil {
		f.Fatal(err)
	}
	s := &Server{zone: z, log: slog.New(slog.DiscardHandler)}
	for _, q := range []struct {
		name  string
		qtype uint16
		edns  bool
	}{{"api.lab.example.com.", dns.TypeA, false}, {"x.apps.lab.example.com.", dns.TypeANY, true},
		{"_etcd-server-ssl._tcp.lab.example.com.", dns.TypeSRV, true}, {"example.org.", dns.TypeA, false}} {
		m := new(dns.Msg).SetQuestion(q.name, q.qtype)
		if q.edns {
			m.SetEdns0(4096, true)
		}
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := new(dns.Msg)
		if r.Unpack(data) != nil || len(r.Question) != 1 || r.Response {
			return
		}
		m := s.answer(r, false)
		b, err := m.Pack()
		if err != nil {
			t.Fatalf("answer does not pack: %v\n%v", err, m)
		}
		limit := dns.MinMsgSize
		if opt := r.IsEdns0(); opt != nil && opt.Version() == 0 {
			limit = max(limit, min(int(opt.UDPSize()), maxUDPSize))
		}
		if len(b) > limit {
			t.Errorf("answer of %d bytes exceeds the %d the query allows", len(b), limit)
		}
		inZone := dns.IsSubDomain(z.Origin, dns.CanonicalName(r.Question[0].Name))
		if m.Authoritative && !inZone {
			t.Errorf("AA set for %q outside the zone", r.Question[0].Name)
		}
	})
}
