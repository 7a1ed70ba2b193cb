package firewall

import (
	"os"
	"testing"

	"github.com/airgap-appliance/appliance/test/labns"
)

// The packet tests send and receive real packets with labns's probe (test/labns/probe.go): the test
// binary run inside a lab namespace as a small peer program.
func TestMain(m *testing.M) {
	labns.ProbeMain(nil)
	os.Exit(m.Run())
}

// Lab topology of the packet tests: the firewalled node 10.77.0.1 and a peer namespace holding 10.77.0.2
// (inside the node networks 10.77.0.0/29, and the VRRP peer) and 10.77.0.100 (outside both).
const (
	nodeIP     = "10.77.0.1"
	peerIP     = "10.77.0.2"
	strangerIP = "10.77.0.100"
	// IPv6: fd00:77::/64 is a node network, fd00:78::/64 (on the same link) is not.
	nodeIP6     = "fd00:77::1"
	peerIP6     = "fd00:77::2"
	nodeIP6b    = "fd00:78::1"
	strangerIP6 = "fd00:78::2"
)

func packetLab(t *testing.T) (node, peer *labns.NS, fw *NFTables) {
	t.Helper()
	labns.RequireTool(t, "nft")
	node, peer = labns.New(t, "fwnd"), labns.New(t, "fwpr")
	ia, ib := labns.Link(t, node, nodeIP+"/24", peer, peerIP+"/24")
	peer.MustRun("ip", "addr", "add", strangerIP+"/24", "dev", ib)
	// nodad: usable at once, no duplicate-address-detection wait. Neighbour discovery still has to pass the
	// firewall (ICMPv6), so the IPv6 cases below also prove that rule.
	for _, a := range [][]string{{nodeIP6, ia}, {nodeIP6b, ia}} {
		node.MustRun("ip", "addr", "add", a[0]+"/64", "dev", a[1], "nodad")
	}
	for _, a := range [][]string{{peerIP6, ib}, {strangerIP6, ib}} {
		peer.MustRun("ip", "addr", "add", a[0]+"/64", "dev", a[1], "nodad")
	}
	return node, peer, &NFTables{NetNSPath: node.Path()}
}

// TestRealTCP: with the firewall of a bootstrap host applied, real connections from the peer namespace:
// the appliance HTTPS port is open from the node networks and closed from outside them; SSH is open from
// anywhere; a listening port not in the table is unreachable from the peer although it answers locally.
func TestRealTCP(t *testing.T) {
	node, peer, fw := packetLab(t)
	labns.StartProbe(t, node, "listen", ":22", ":8443", ":9999") // dual-stack

	// Without a firewall everything is reachable: the closed-port checks below are not vacuous.
	for _, c := range [][2]string{{strangerIP, nodeIP + ":9999"}, {strangerIP6, "[" + nodeIP6b + "]:8443"}} {
		if got := labns.ProbeOnce(t, peer, "dial", c[0], c[1]); got != "open" {
			t.Fatalf("before the firewall, %s -> %s: %s", c[0], c[1], got)
		}
	}
	if _, err := fw.Apply(t.Context(), labSpec()); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, ns, src, dst string
		open               bool
	}{
		{"https from node network", "peer", peerIP, nodeIP + ":8443", true},
		{"https from outside node networks", "peer", strangerIP, nodeIP + ":8443", false},
		{"https from node network, IPv6", "peer", peerIP6, "[" + nodeIP6 + "]:8443", true},
		{"https from outside node networks, IPv6", "peer", strangerIP6, "[" + nodeIP6b + "]:8443", false},
		{"ssh from anywhere, IPv6", "peer", strangerIP6, "[" + nodeIP6b + "]:22", true},
		{"ssh from anywhere", "peer", strangerIP, nodeIP + ":22", true},
		{"port not in the table", "peer", peerIP, nodeIP + ":9999", false},
		{"port not in the table, locally", "node", nodeIP, nodeIP + ":9999", true},
		{"loopback", "node", "127.0.0.1", "127.0.0.1:9999", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ns := peer
			if c.ns == "node" {
				ns = node
			}
			got := labns.ProbeOnce(t, ns, "dial", c.src, c.dst)
			if (got == "open") != c.open {
				t.Errorf("dial %s -> %s = %q, want open=%v", c.src, c.dst, got, c.open)
			}
		})
	}
}

// TestRealVRRP sends real IP-protocol-112 advertisements. Each case builds fresh namespaces, so conntrack
// is fresh (LAB.md: an established VRRP flow passes `ct state established` even without a VRRP rule), and
// the receiver — a raw socket, which only sees packets the input hook accepted — proves it is alive with a
// locally sent advertisement in every case. "rule deleted" shows the positive case depends on the VRRP
// rule: delete it by handle and the peer's advertisement is dropped.
func TestRealVRRP(t *testing.T) {
	cases := []struct {
		name     string
		mutate   func(t *testing.T, node *labns.NS)
		src      string
		received bool
	}{
		{"from the VRRP peer", nil, peerIP, true},
		{"from a non-peer inside the node networks' link", nil, strangerIP, false},
		{"from the VRRP peer, VRRP rule deleted", func(t *testing.T, node *labns.NS) {
			node.MustRun("nft", "delete", "rule", "inet", DefaultTable, "input", "handle", ruleHandle(t, node, DefaultTable, "vrrp"))
		}, peerIP, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			node, peer, fw := packetLab(t)
			if _, err := fw.Apply(t.Context(), labSpec()); err != nil {
				t.Fatal(err)
			}
			if c.mutate != nil {
				c.mutate(t, node)
			}
			rx := labns.StartProbe(t, node, "vrrp-recv")
			if got := labns.ProbeOnce(t, peer, "vrrp-send", c.src, nodeIP); got != "sent" {
				t.Fatalf("vrrp-send: %s", got)
			}
			if got := rx.Received(c.src); got != c.received {
				t.Errorf("advertisement from %s received=%v, want %v", c.src, got, c.received)
			}
			// Positive control: the receiver works (loopback is always accepted).
			labns.ProbeOnce(t, node, "vrrp-send", "127.0.0.1", "127.0.0.1")
			if !rx.Received("127.0.0.1") {
				t.Fatal("receiver did not see a local advertisement: the test proves nothing")
			}
			if c.mutate == nil {
				if ok, err := fw.InPlace(labSpec()); err != nil || !ok {
					t.Errorf("InPlace = %v, %v; want true", ok, err)
				}
			} else if ok, _ := fw.InPlace(labSpec()); ok {
				t.Error("InPlace = true with the VRRP rule deleted")
			}
		})
	}
}
