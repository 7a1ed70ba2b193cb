package firewall

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/test/labns"
)

// TestRedirectRealTCP proves the API VIP's redirect with real connections between two namespaces: a
// listener on the node's APILoadBalancerPort only (nothing on 6443), so a dial of VIP:6443 is "open" only
// when the redirect took it there. Output: the node's own traffic for the VIP goes to its local port
// even while another host (here: nobody) holds the VIP. Prerouting: with the VIP on the node, the peer's
// traffic for VIP:6443 does too. Other ports of the VIP are not redirected; Remove ends it.
func TestRedirectRealTCP(t *testing.T) {
	node, peer, _ := packetLab(t)
	vip4, vip6 := "10.77.0.50", "fd00:77::50"
	labns.StartProbe(t, node, "listen", ":9445")
	rt := &RedirectTable{NetNSPath: node.Path()}
	dial := func(ns *labns.NS, src, dst string) bool { return labns.ProbeOnce(t, ns, "dial", src, dst) == "open" }

	for _, vip := range []string{vip4, vip6} {
		dst := netip.AddrPortFrom(netip.MustParseAddr(vip), 6443).String()
		if dial(node, nodeIP, dst) {
			t.Fatalf("before the redirect, the node reached %s: the checks below would be vacuous", dst)
		}
	}
	for i, vip := range []string{vip4, vip6} {
		r := Redirect{VIP: netip.MustParseAddr(vip), Port: 6443, ToPort: APILoadBalancerPort}
		if changed, err := rt.Apply(t.Context(), r); err != nil || !changed {
			t.Fatalf("Apply(%s) = %v, %v; want changed", vip, changed, err)
		}
		if changed, err := rt.Apply(t.Context(), r); err != nil || changed {
			t.Fatalf("second Apply(%s) = %v, %v; want unchanged", vip, changed, err)
		}
		src, peerSrc, plen := nodeIP, peerIP, "/32"
		if i == 1 {
			src, peerSrc, plen = nodeIP6, peerIP6, "/128"
		}
		at := func(port uint16) string { return netip.AddrPortFrom(r.VIP, port).String() }
		if !dial(node, src, at(6443)) {
			t.Errorf("output: the node's dial of %s (VIP held by nobody) did not reach its :%d", at(6443), APILoadBalancerPort)
		}
		if dial(node, src, at(6444)) {
			t.Errorf("output: %s was redirected too", at(6444))
		}
		nic := strings.Fields(node.MustRun("ip", "-o", "link", "show", "type", "veth"))[1]
		node.MustRun("ip", "addr", "add", vip+plen, "dev", strings.TrimSuffix(strings.SplitN(nic, "@", 2)[0], ":"), "nodad")
		if !dial(peer, peerSrc, at(6443)) {
			t.Errorf("prerouting: the peer's dial of %s (VIP on the node) did not reach the node's :%d", at(6443), APILoadBalancerPort)
		}
		if dial(peer, peerSrc, at(6444)) {
			t.Errorf("prerouting: %s was redirected too", at(6444))
		}
		out := node.MustRun("nft", "list", "table", "inet", DefaultRedirectTable)
		if n := strings.Count(out, "redirect to :9445"); n != 2 {
			t.Errorf("nft list shows %d redirects, want 2 (prerouting and output):\n%s", n, out)
		}
	}
	if err := rt.Remove(t.Context()); err != nil {
		t.Fatal(err)
	}
	if dial(peer, peerIP, vip4+":6443") {
		t.Error("after Remove, the peer still reached VIP:6443")
	}
	if err := rt.Remove(t.Context()); err != nil {
		t.Errorf("removing an absent table: %v", err)
	}
	if _, err := rt.Apply(t.Context(), Redirect{VIP: netip.MustParseAddr(vip4)}); err == nil {
		t.Error("Apply without ports: no error")
	}
}
