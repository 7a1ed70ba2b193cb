package netboot

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// TestLeasesSurviveRestart: in ModeServer with a StateDir, a restarted service (a new responder on
// the same directory) keeps each machine's address: the machine that asked second does not get the
// first one's address when it asks first after the restart. A release leaves the file; entries that
// no longer fit the configuration are dropped; a malformed file is logged and ignored.
func TestLeasesSurviveRestart(t *testing.T) {
	var log syncBuffer
	c := testConfig(t, ModeServer, &log)
	c.RangeEnd = netip.MustParseAddr("10.77.0.110")
	c.StateDir = filepath.Join(t.TempDir(), "netboot")
	c, err := c.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	ack := func(r *dhcpResponder, mac []byte) string {
		t.Helper()
		offer, why := r.respond(pxeDiscover(t, mac, iana.INTEL_X86PC), netip.Addr{})
		if offer == nil {
			t.Fatalf("no offer to %x: %s", mac, why)
		}
		a, why := r.respond(asRequest(t, offer), netip.Addr{})
		if a == nil || a.MessageType() != dhcpv4.MessageTypeAck {
			t.Fatalf("no ACK to %x: %s", mac, why)
		}
		return a.YourIPAddr.String()
	}
	r := newDHCPResponder(c)
	if a1, a2 := ack(r, macW1), ack(r, macW2); a1 != "10.77.0.100" || a2 != "10.77.0.101" {
		t.Fatalf("first leases: w1 %s, w2 %s", a1, a2)
	}
	path := filepath.Join(c.StateDir, LeasesFile)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("lease file %s: %v %v, want mode 0600", path, fi, err)
	}
	// Restart: w2 asks first (a fresh DISCOVER, no requested address) and keeps .101.
	r = newDHCPResponder(c)
	if a2, a1 := ack(r, macW2), ack(r, macW1); a2 != "10.77.0.101" || a1 != "10.77.0.100" {
		t.Fatalf("after a restart: w2 %s (want 10.77.0.101), w1 %s (want 10.77.0.100)", a2, a1)
	}
	// A release leaves the file.
	rel, err := dhcpv4.NewReleaseFromACK(mustACK(t, r, macW1))
	if err != nil {
		t.Fatal(err)
	}
	r.respond(rel, netip.MustParseAddr("10.77.0.100")) // from the lease's own address
	b, _ := os.ReadFile(path)
	if strings.Contains(string(b), macW1.String()) || !strings.Contains(string(b), macW2.String()) || !strings.Contains(string(b), `"node": "w2"`) {
		t.Fatalf("lease file after w1's release:\n%s", b)
	}

	// A MAC no longer in the inventory is dropped at start, and logged.
	c2 := c
	c2.Machines = []Machine{{Name: "w1", MAC: macW1}}
	r = newDHCPResponder(c2)
	if len(r.leases) != 0 || !strings.Contains(log.String(), "no longer a network-booted machine") {
		t.Fatalf("leases %v after w2 left the inventory; log:\n%s", r.leases, log.String())
	}
	// An address outside a narrowed range is dropped.
	c3 := c
	c3.RangeStart = netip.MustParseAddr("10.77.0.105")
	if r = newDHCPResponder(c3); len(r.leases) != 0 || !strings.Contains(log.String(), "outside boot.range") {
		t.Fatalf("leases %v after the range moved; log:\n%s", r.leases, log.String())
	}
	// A malformed file: logged, the service starts with no leases and answers.
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = newDHCPResponder(c)
	if !strings.Contains(log.String(), "DHCP leases not restored") {
		t.Fatalf("malformed lease file not logged:\n%s", log.String())
	}
	if a := ack(r, macW2); a != "10.77.0.100" {
		t.Fatalf("after a malformed lease file: w2 %s", a)
	}
	// ModeProxy keeps no file.
	p := c
	p.Mode, p.StateDir = ModeProxy, filepath.Join(t.TempDir(), "proxy")
	r = newDHCPResponder(p)
	r.respond(pxeDiscover(t, macW1, iana.INTEL_X86PC), netip.Addr{})
	if _, err := os.Stat(filepath.Join(p.StateDir, LeasesFile)); err == nil {
		t.Error("a proxy wrote a lease file")
	}
}

func mustACK(t *testing.T, r *dhcpResponder, mac []byte) *dhcpv4.DHCPv4 {
	t.Helper()
	offer, why := r.respond(pxeDiscover(t, mac, iana.INTEL_X86PC), netip.Addr{})
	if offer == nil {
		t.Fatal(why)
	}
	a, why := r.respond(asRequest(t, offer), netip.Addr{})
	if a == nil {
		t.Fatal(why)
	}
	return a
}

// TestLease: Server.Lease, what the enrolment endpoint asks, answers only an acknowledged lease of
// ModeServer: nothing before the machine asks, nothing for an offer it has not requested, its
// address after the ACK (for any spelling of the MAC), nothing after it released the address from
// it, the new address after it leased another, the same after a restart (the lease file); and
// never anything in ModeProxy, which gives no addresses.
func TestLease(t *testing.T) {
	c := testConfig(t, ModeServer, nil)
	c.StateDir = filepath.Join(t.TempDir(), "netboot")
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if a, ok := s.Lease(macW1.String()); ok {
		t.Fatalf("Lease before any DHCP: %s", a)
	}
	offer, why := s.dhcp.respond(pxeDiscover(t, macW1, iana.INTEL_X86PC), netip.Addr{})
	if offer == nil {
		t.Fatal(why)
	}
	if a, ok := s.Lease(macW1.String()); ok {
		t.Errorf("Lease after an offer only: %s, want none (not requested yet)", a)
	}
	ack, why := s.dhcp.respond(asRequest(t, offer), netip.Addr{})
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatal(why)
	}
	for _, spelling := range []string{"52:54:00:00:00:21", "52-54-00-00-00-21", "5254.0000.0021"} {
		if a, ok := s.Lease(spelling); !ok || a != netip.MustParseAddr("10.77.0.100") {
			t.Errorf("Lease(%s) after the ACK: %s %v, want 10.77.0.100", spelling, a, ok)
		}
	}
	if a, ok := s.Lease("52:54:00:00:00:22"); ok {
		t.Errorf("Lease of w2, which never asked: %s", a)
	}
	if _, ok := s.Lease("not a mac"); ok {
		t.Error("Lease of a malformed MAC answered")
	}
	rel, err := dhcpv4.NewReleaseFromACK(ack)
	if err != nil {
		t.Fatal(err)
	}
	s.dhcp.respond(rel, netip.MustParseAddr("10.77.0.100"))
	if a, ok := s.Lease(macW1.String()); ok {
		t.Errorf("Lease after the release: %s, want none", a)
	}
	// w1 asks for the other address of the range: that is its lease now.
	offer, _ = s.dhcp.respond(pxeDiscover(t, macW1, iana.INTEL_X86PC, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP("10.77.0.101")))), netip.Addr{})
	if offer == nil {
		t.Fatal("no second offer")
	}
	if a, _ := s.dhcp.respond(asRequest(t, offer), netip.Addr{}); a == nil || a.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatal("no second ACK")
	}
	if a, ok := s.Lease(macW1.String()); !ok || a != netip.MustParseAddr("10.77.0.101") {
		t.Errorf("Lease after the new lease: %s %v, want 10.77.0.101", a, ok)
	}
	restarted, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if a, ok := restarted.Lease(macW1.String()); !ok || a != netip.MustParseAddr("10.77.0.101") {
		t.Errorf("Lease after a restart: %s %v, want 10.77.0.101 (the lease file)", a, ok)
	}

	p := testConfig(t, ModeProxy, nil)
	ps, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	ps.dhcp.respond(pxeDiscover(t, macW1, iana.INTEL_X86PC), netip.Addr{})
	if a, ok := ps.Lease(macW1.String()); ok {
		t.Errorf("Lease in proxy mode: %s, want none", a)
	}
}
