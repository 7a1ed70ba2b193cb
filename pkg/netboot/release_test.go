package netboot

import (
	"crypto/rand"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/airgap-appliance/appliance/test/labns"
)

// loopbackDHCPServer runs the whole service in ModeServer on the loopback interface (DHCP bound to
// "lo" on a free port, TFTP and HTTP on 127.0.0.1), leasing 127.0.0.100-127.0.0.101 of 127.0.0.0/8:
// every address of that network is the loopback's, so a test can send from the leased address
// itself. Nothing leaves the machine. Binding to an interface needs root.
func loopbackDHCPServer(t *testing.T, log *syncBuffer) (*Server, *net.UDPAddr) {
	t.Helper()
	labns.RequireRoot(t)
	c := testConfig(t, ModeServer, log)
	c.Interface = "lo"
	c.ServerIP = netip.MustParseAddr("127.0.0.1")
	c.Subnet = netip.MustParsePrefix("127.0.0.0/8")
	c.RangeStart, c.RangeEnd = netip.MustParseAddr("127.0.0.100"), netip.MustParseAddr("127.0.0.101")
	c.Router = netip.Addr{}
	c.StateDir = filepath.Join(t.TempDir(), "netboot")
	c.HTTPPort = uint16(freePort(t, "tcp4"))
	c.TFTPPort = freePort(t, "udp4")
	c.DHCPPort = freePort(t, "udp4")
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: c.DHCPPort}
}

// dhcpFrom is a DHCP client socket bound to the address from (a port of its own).
func dhcpFrom(t *testing.T, from string) *net.UDPConn {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(from)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// exchange sends m to the server and returns its reply (nil when none came within a second).
func exchange(t *testing.T, conn *net.UDPConn, server *net.UDPAddr, m *dhcpv4.DHCPv4) *dhcpv4.DHCPv4 {
	t.Helper()
	if _, err := conn.WriteToUDP(m.ToBytes(), server); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 1500)
	for {
		n, _, err := conn.ReadFromUDP(buf)
		if err != nil {
			return nil
		}
		r, err := dhcpv4.FromBytes(buf[:n])
		if err == nil && r.TransactionID == m.TransactionID {
			return r
		}
	}
}

// leaseOf reads the lease file: the address leased to mac, if any.
func leaseOf(t *testing.T, s *Server, mac net.HardwareAddr) string {
	t.Helper()
	s.dhcp.mu.Lock()
	defer s.dhcp.mu.Unlock()
	return s.dhcp.leases[mac.String()].String()
}

// TestDHCPReleaseFromAnotherAddress is the attack of anyone on the provisioning segment who copies a
// node's MAC into a DHCPRELEASE (the MAC is in every broadcast the node sends): against the real
// service on the loopback, w1 takes 127.0.0.100 (DISCOVER, OFFER, REQUEST, ACK); releases of it
// from 127.0.0.1 (its ciaddr w1's address or not) and a REQUEST naming another server do not free
// it, so the next machine does not get w1's address; w1's own release, from 127.0.0.100, does.
func TestDHCPReleaseFromAnotherAddress(t *testing.T) {
	var log syncBuffer
	s, server := loopbackDHCPServer(t, &log)
	client := dhcpFrom(t, "127.0.0.1")
	offer := exchange(t, client, server, pxeDiscover(t, macW1, iana.INTEL_X86PC))
	if offer == nil || offer.YourIPAddr.String() != "127.0.0.100" {
		t.Fatalf("offer to w1: %v\n%s", offer, log.String())
	}
	ack := exchange(t, client, server, asRequest(t, offer))
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("ACK to w1: %v", ack)
	}
	release, err := dhcpv4.NewReleaseFromACK(ack)
	if err != nil {
		t.Fatal(err)
	}
	if !release.ClientIPAddr.Equal(net.ParseIP("127.0.0.100")) {
		t.Fatalf("release ciaddr %s", release.ClientIPAddr)
	}
	spoofed := []*dhcpv4.DHCPv4{release} // w1's own release, copied, from another address
	noCI, _ := dhcpv4.NewReleaseFromACK(ack)
	noCI.ClientIPAddr = net.IPv4zero // the address left out
	spoofed = append(spoofed, noCI)
	other := asRequest(t, offer) // "w1 took another server's offer"
	other.UpdateOption(dhcpv4.OptServerIdentifier(net.ParseIP("127.0.0.9")))
	spoofed = append(spoofed, other)
	attacker := dhcpFrom(t, "127.0.0.1")
	for _, m := range spoofed {
		if r := exchange(t, attacker, server, m); r != nil {
			t.Fatalf("%s answered: %s", m.MessageType(), r.Summary())
		}
	}
	if got := leaseOf(t, s, macW1); got != "127.0.0.100" {
		t.Fatalf("after releases from another address, w1's lease is %q, want 127.0.0.100\n%s", got, log.String())
	}
	if o := exchange(t, client, server, pxeDiscover(t, macW2, iana.INTEL_X86PC)); o == nil || o.YourIPAddr.String() != "127.0.0.101" {
		t.Fatalf("offer to w2 after the spoofed releases: %v, want 127.0.0.101 (w1 keeps .100)", o)
	}
	if !strings.Contains(log.String(), "DHCPRELEASE refused") {
		t.Errorf("the refused release is not logged:\n%s", log.String())
	}
	b, _ := os.ReadFile(filepath.Join(s.cfg.StateDir, LeasesFile))
	if !strings.Contains(string(b), macW1.String()) {
		t.Errorf("w1's lease left the lease file:\n%s", b)
	}

	// w1's own release, from its leased address, frees it.
	own := dhcpFrom(t, "127.0.0.100")
	if r := exchange(t, own, server, release); r != nil {
		t.Fatalf("release answered: %s", r.Summary())
	}
	if got := leaseOf(t, s, macW1); got != "invalid IP" {
		t.Fatalf("after w1's own release its lease is %q, want none", got)
	}
}

// TestUnknownMACFloodBounded is the attack of a sender of DISCOVERs from random MACs (one packet, one
// new MAC) against the real service: what the service remembers of unknown MACs stays within
// MaxUnknownMACs, and the log gains at most UnknownMACLogBurst lines plus one a second, the next
// line saying how many it left out (before: one map entry, kept for ever, and one log line per MAC).
func TestUnknownMACFloodBounded(t *testing.T) {
	var log syncBuffer
	s, server := loopbackDHCPServer(t, &log)
	attacker := dhcpFrom(t, "127.0.0.1")
	const flood = 3 * MaxUnknownMACs
	start := time.Now()
	for i := range flood {
		mac := make(net.HardwareAddr, 6)
		_, _ = rand.Read(mac)
		mac[0] = 0x02 // locally administered, unicast
		m, err := dhcpv4.NewDiscovery(mac, pxeOptions(iana.INTEL_X86PC)...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := attacker.WriteToUDP(m.ToBytes(), server); err != nil {
			t.Fatal(err)
		}
		if i%64 == 63 {
			time.Sleep(time.Millisecond) // let the server read: the loopback drops what its socket cannot hold
		}
	}
	// A known machine is still answered.
	if o := exchange(t, dhcpFrom(t, "127.0.0.1"), server, pxeDiscover(t, macW1, iana.INTEL_X86PC)); o == nil {
		t.Fatal("w1 not answered after the flood")
	}
	elapsed := time.Since(start)
	if n := s.dhcp.unknowns.Len(); n > MaxUnknownMACs || n < MaxUnknownMACs/2 {
		t.Errorf("%d unknown MACs remembered after %d sent, want at most %d (and the flood to have arrived)", n, flood, MaxUnknownMACs)
	}
	lines := strings.Count(log.String(), "not in the inventory")
	if max := UnknownMACLogBurst + int(elapsed.Seconds()*UnknownMACLogRate) + 1; lines > max {
		t.Errorf("%d unknown-MAC log lines in %s, want at most %d", lines, elapsed.Round(time.Millisecond), max)
	}
}
