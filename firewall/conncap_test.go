package firewall

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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

// TestConnCapTableBesideFirewalld: the firewalld backend's cap table (connCapTable) in a namespace whose
// filtering another table owns — a stand-in for firewalld's `table inet firewalld` that accepts everything
// at firewalld's priority (filter + 10) — still resets connections past the cap (a reject is final in any
// table), decides nothing else (a port outside the port table stays open), leaves the foreign table as it
// was, is rebuilt only when it differs, and goes away when the roles have no capped port, and at remove.
// The real firewalld (D-Bus, reloads) is test/lab/firewalld_test.go's.
func TestConnCapTableBesideFirewalld(t *testing.T) {
	node, peer := capLab(t)
	node.MustRun("nft", "add", "table", "inet", "firewalld")
	node.MustRun("nft", "add", "chain", "inet", "firewalld", "filter_INPUT",
		"{ type filter hook input priority filter + 10; policy accept; }")
	foreign := node.MustRun("nft", "list", "table", "inet", "firewalld")
	ct := &connCapTable{NetNSPath: node.Path()}
	s := labSpec()
	ctx := t.Context()
	if changed, _, err := ct.apply(ctx, s); err != nil || !changed {
		t.Fatalf("apply = %v, %v; want changed", changed, err)
	}
	if changed, _, err := ct.apply(ctx, s); err != nil || changed {
		t.Fatalf("second apply = %v, %v; want unchanged", changed, err)
	}
	if ok, err := ct.inPlace(s); err != nil || !ok {
		t.Fatalf("inPlace = %v, %v", ok, err)
	}
	srv := labns.StartHolder(t, node, ":8443", ":9999")
	checkCap(t, peer, srv, peerIP, peer2IP, net.JoinHostPort(nodeIP, "8443"), net.JoinHostPort(nodeIP, "9999"))
	if got := node.MustRun("nft", "list", "table", "inet", "firewalld"); got != foreign {
		t.Errorf("the foreign table changed:\n%s", cmp.Diff(foreign, got))
	}

	worker := labSpec()
	worker.Roles = []Role{RoleWorker}
	if ok, err := ct.inPlace(worker); err != nil || ok {
		t.Errorf("inPlace(worker) with the caps table present = %v, %v; want false", ok, err)
	}
	if changed, _, err := ct.apply(ctx, worker); err != nil || !changed {
		t.Errorf("apply(worker) = %v, %v; want the table removed", changed, err)
	}
	if out, err := node.Run("nft", "list", "table", "inet", DefaultConnCapTable); err == nil {
		t.Errorf("the caps table survived a spec without capped ports:\n%s", out)
	}
	if ok, err := ct.inPlace(worker); err != nil || !ok {
		t.Errorf("inPlace(worker) without the table = %v, %v; want true", ok, err)
	}
	if changed, _, err := ct.apply(ctx, worker); err != nil || changed {
		t.Errorf("apply(worker) again = %v, %v; want unchanged", changed, err)
	}
	if _, _, err := ct.apply(ctx, s); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		if removed, err := ct.remove(ctx); err != nil || removed != want {
			t.Errorf("remove #%d = %v, %v; want %v", i+1, removed, err, want)
		}
	}
	if got := node.MustRun("nft", "list", "table", "inet", "firewalld"); got != foreign {
		t.Errorf("the foreign table changed:\n%s", cmp.Diff(foreign, got))
	}
}

// TestConnCapTableRender: the caps table renders (golden) as the nft script equivalent to what connCapTable
// installs: `nft -f` of it lists byte-identically and is in place for inPlace.
func TestConnCapTableRender(t *testing.T) {
	for _, c := range renderSpecs {
		rs := connCapRuleset(DefaultConnCapTable, c.spec)
		if len(rs.rules) == 0 {
			continue // no capped port: no table
		}
		t.Run(c.name, func(t *testing.T) {
			got := rs.render(nil)
			if again := connCapRuleset(DefaultConnCapTable, c.spec).render(nil); again != got {
				t.Fatal("render is not deterministic")
			}
			golden(t, "conncap-"+c.name+".nft", got)
			if os.Geteuid() != 0 && !labns.InCI() {
				return // the golden check needs no root; the rest does
			}
			ns, _ := newNS(t, "fwcr")
			ct := &connCapTable{NetNSPath: ns.Path()}
			if _, _, err := ct.apply(t.Context(), c.spec); err != nil {
				t.Fatal(err)
			}
			applied := listTable(t, ns, DefaultConnCapTable)
			other := labns.New(t, "fwcx")
			script := filepath.Join(t.TempDir(), "caps.nft")
			if err := os.WriteFile(script, []byte(got), 0o600); err != nil {
				t.Fatal(err)
			}
			other.MustRun("nft", "-f", script)
			if d := cmp.Diff(listTable(t, other, DefaultConnCapTable), applied); d != "" {
				t.Errorf("netlink apply and `nft -f` of the render differ (-nft +apply):\n%s", d)
			}
			if ok, err := (&connCapTable{NetNSPath: other.Path()}).inPlace(c.spec); err != nil || !ok {
				t.Errorf("inPlace on the nft-installed table = %v, %v; want true", ok, err)
			}
		})
	}
}

// TestDescribeConnCaps: the report detail names the caps, and for firewalld the table holding them.
func TestDescribeConnCaps(t *testing.T) {
	s := Spec{Roles: []Role{RoleBootstrap}, NodeNetworks: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Boot: true}
	for _, c := range []struct {
		b    Backend
		want string
	}{
		{&NFTables{}, "nftables (table inet appliance): roles [bootstrap], 1 node networks, 0 VRRP peers, at most 80 connections per source to 8443/tcp, 8080/tcp"},
		{&Firewalld{}, "firewalld (zone appliance, policy appliance-host): roles [bootstrap], 1 node networks, 0 VRRP peers, at most 80 connections per source to 8443/tcp, 8080/tcp in table inet appliance-conncap"},
	} {
		if got := Describe(c.b, s); got != c.want {
			t.Errorf("Describe = %q\nwant       %q", got, c.want)
		}
		if got := BackendOfDetail("replaced " + Describe(c.b, s)); got != c.b.Name() {
			t.Errorf("BackendOfDetail = %q, want %q", got, c.b.Name())
		}
	}
}
