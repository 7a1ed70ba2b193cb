package firewall

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/connlimit"
	"github.com/airgap-appliance/appliance/test/labns"
)

// TestConnsPerSourceAboveConnlimit pins the kernel's cap to connlimit's (which firewall cannot import): a
// little above the user-space cap, so connlimit's 429 still acts first, and far below the total.
func TestConnsPerSourceAboveConnlimit(t *testing.T) {
	if want := connlimit.DefaultMaxConnsPerSource + 16; ConnsPerSource != want {
		t.Errorf("ConnsPerSource = %d, want connlimit.DefaultMaxConnsPerSource (%d) + 16 = %d: change both, and the reasons in ConnsPerSource's comment",
			ConnsPerSource, connlimit.DefaultMaxConnsPerSource, want)
	}
	if ConnsPerSource >= connlimit.DefaultMaxConns {
		t.Errorf("ConnsPerSource %d is not below connlimit's total cap %d", ConnsPerSource, connlimit.DefaultMaxConns)
	}
}

// capLab is packetLab plus a second source address inside the node networks for each family.
const (
	peer2IP  = "10.77.0.3"
	peer2IP6 = "fd00:77::3"
)

func capLab(t *testing.T) (node, peer *labns.NS) {
	t.Helper()
	node, peer, _ = packetLab(t)
	dev := strings.Fields(peer.MustRun("ip", "-o", "addr", "show", "to", peerIP))[1]
	peer.MustRun("ip", "addr", "add", peer2IP+"/24", "dev", dev)
	peer.MustRun("ip", "addr", "add", peer2IP6+"/64", "dev", dev, "nodad")
	return node, peer
}

// checkCap opens ConnsPerSource+k connections from src to dst and expects the first ConnsPerSource to connect
// and the k others to be reset at their SYN (ECONNREFUSED: not dropped, not accepted by the server, so no TLS
// handshake could start); then src2, and the same source's connections to other (another capped port, an
// uncapped one), are unaffected; then closing some connections frees as many slots, and no more. srv listens
// on dst's and other's ports.
func checkCap(t *testing.T, peer *labns.NS, srv *labns.Holder, src, src2, dst string, other ...string) {
	t.Helper()
	const k = 5
	base := srv.Accepted()
	got := labns.DialN(t, peer, src, dst, ConnsPerSource+k)
	var open []net.Conn
	for i, d := range got {
		switch {
		case i < ConnsPerSource && d.Err != nil:
			t.Fatalf("%s -> %s: connection %d of %d failed under the cap: %v", src, dst, i+1, ConnsPerSource, d.Err)
		case i >= ConnsPerSource && !d.Refused():
			t.Fatalf("%s -> %s: connection %d (over the cap of %d) = %v, want refused with a reset (ECONNREFUSED)", src, dst, i+1, ConnsPerSource, d.Err)
		case d.Conn != nil:
			open = append(open, d.Conn)
		}
	}
	srv.WaitAccepted(t, base+ConnsPerSource) // the refused ones never reached the server
	base += ConnsPerSource

	for _, c := range labns.DialN(t, peer, src2, dst, k) {
		if c.Err != nil {
			t.Errorf("another source %s -> %s, with %s at its cap: %v", src2, dst, src, c.Err)
		}
	}
	base += k
	for _, o := range other {
		if d := labns.DialN(t, peer, src, o, 1)[0]; d.Err != nil {
			t.Errorf("%s -> %s, with %s at its cap: %v (the count is per port)", src, o, dst, d.Err)
		}
		base++
	}
	srv.WaitAccepted(t, base)

	// Close k: k slots free (conntrack stops counting a connection once closed; the kernel's count drops it
	// at the source's next new connection, so a reset shortly after the close is retried, within a bound).
	for _, c := range open[:k] {
		_ = c.Close()
	}
	deadline := time.Now().Add(5 * time.Second) // a bound on a hang, not a speed expectation
	for i := 0; i < k; {
		d := labns.DialN(t, peer, src, dst, 1)[0]
		if d.Err == nil {
			i++
			continue
		}
		if !d.Refused() || time.Now().After(deadline) {
			t.Fatalf("%s -> %s after closing %d connections: reopening #%d: %v", src, dst, k, i+1, d.Err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := labns.DialN(t, peer, src, dst, 1)[0]; !d.Refused() {
		t.Errorf("%s -> %s: back at the cap, one more = %v, want refused", src, dst, d.Err)
	}
	srv.WaitAccepted(t, base+k)
}

// TestConnCapReal: the nftables backend's per-source cap with real connections from a peer namespace, IPv4
// and IPv6: past ConnsPerSource the kernel resets, another source and another port are unaffected, closed
// connections free their slots; the live counts are no drift (Apply changes nothing, InPlace holds); once every
// connection is closed the counting sets are empty again.
func TestConnCapReal(t *testing.T) {
	node, peer := capLab(t)
	fw := &NFTables{NetNSPath: node.Path()}
	s := labSpec() // bootstrap + control-plane: 8443 and 5443 capped
	if _, err := fw.Apply(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	srv := labns.StartHolder(t, node, ":8443", ":5443", ":22")
	for _, c := range []struct{ name, src, src2, dst, set string }{
		{"IPv4", peerIP, peer2IP, nodeIP, "conns_appliance_https_v4"},
		{"IPv6", peerIP6, peer2IP6, nodeIP6, "conns_appliance_https_v6"},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkCap(t, peer, srv, c.src, c.src2, net.JoinHostPort(c.dst, "8443"),
				net.JoinHostPort(c.dst, "5443"), net.JoinHostPort(c.dst, "22"))
			if changed, err := fw.Apply(t.Context(), s); err != nil || changed {
				t.Errorf("Apply with live counts = %v, %v; want unchanged", changed, err)
			}
			if ok, err := fw.InPlace(s); err != nil || !ok {
				t.Errorf("InPlace with live counts = %v, %v; want true", ok, err)
			}
			if out := node.MustRun("nft", "list", "set", "inet", DefaultTable, c.set); !strings.Contains(out, c.src) {
				t.Errorf("the counting set lacks %s:\n%s", c.src, out)
			}
		})
	}
	// Every connection is closed now (each subtest's end): the kernel drops the sources from the counting
	// sets (its garbage collection, about once a second), so a set holds only sources with open connections.
	deadline := time.Now().Add(10 * time.Second) // a bound on a hang, not a speed expectation
	for _, set := range []string{"conns_appliance_https_v4", "conns_appliance_https_v6"} {
		for {
			out := node.MustRun("nft", "list", "set", "inet", DefaultTable, set)
			if !strings.Contains(out, "elements") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("set %s still holds sources 10 s after their connections closed:\n%s", set, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestDescribeConnCaps: the report detail names the caps.
func TestDescribeConnCaps(t *testing.T) {
	s := Spec{Roles: []Role{RoleBootstrap}, NodeNetworks: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Boot: true}
	for _, c := range []struct {
		b    Backend
		want string
	}{
		{&NFTables{}, "nftables (table inet appliance): roles [bootstrap], 1 node networks, 0 VRRP peers, at most 80 connections per source to 8443/tcp, 8080/tcp"},
		{&Firewalld{}, "firewalld (zone appliance, policy appliance-host): roles [bootstrap], 1 node networks, 0 VRRP peers, at most 80 connections per source to 8443/tcp, 8080/tcp"},
	} {
		if got := Describe(c.b, s); got != c.want {
			t.Errorf("Describe = %q\nwant       %q", got, c.want)
		}
		if got := BackendOfDetail("replaced " + Describe(c.b, s)); got != c.b.Name() {
			t.Errorf("BackendOfDetail = %q, want %q", got, c.b.Name())
		}
	}
}
