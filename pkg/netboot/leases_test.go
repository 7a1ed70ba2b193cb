package netboot

import (
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
