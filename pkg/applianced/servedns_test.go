package applianced

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/miekg/dns"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// TestServeDNS: serve's DNS hook answers the configuration's records authoritatively when
// dns.listenAddress is set (here on 127.0.0.1 with an ephemeral port instead of the address's port
// 53; miekg/dns's client asks), and starts nothing when it is not.
func TestServeDNS(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bootstrap.yaml")
	if err := os.WriteFile(path, []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := config.Example()
	c.BaseDomain = "example.com"
	log := slog.New(slog.DiscardHandler)

	srv, err := serveDNS(c, path, netip.MustParseAddrPort("127.0.0.1:0"), log)
	if srv != nil || err != nil {
		t.Fatalf("without dns.listenAddress: server %v, error %v; want neither", srv, err)
	}

	c.DNS.ListenAddress = netip.MustParseAddr("10.100.0.2")
	srv, err = serveDNS(c, path, netip.MustParseAddrPort("127.0.0.1:0"), log)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := srv.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	}()
	for _, network := range []string{"udp", "tcp"} {
		q := new(dns.Msg).SetQuestion("api.lab.example.com.", dns.TypeA)
		r, _, err := (&dns.Client{Net: network}).Exchange(q, srv.Addr().String())
		if err != nil {
			t.Fatalf("%s: %v", network, err)
		}
		if r.Rcode != dns.RcodeSuccess || !r.Authoritative || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "10.100.0.100" {
			t.Errorf("%s answer:\n%v\nwant an authoritative A 10.100.0.100", network, r)
		}
	}
}
