package vipcheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/test/labns"
)

// The pre-flight lab: a fabric namespace ("vcfab-…") holding bridge br0, and one namespace per host
// ("vch-…") whose eth0 is a veth into the bridge, addressed from 10.81.0.0/24. labns names every
// namespace with a random suffix and deletes it by name; nothing touches the root namespace. The
// speakers are real keepalived processes (pkg/keepalived for the unicast configurations the
// appliance renders, a hand-written multicast configuration for a foreign VRRP group as routers and
// keepalived's defaults speak it); the foreign ARP answerer is a real kernel holding the address.

const labIface = "eth0"

// hangGuard bounds waits for keepalived to become master; it is not a speed assertion.
const hangGuard = 30 * time.Second

type lab struct {
	t      *testing.T
	fabric *labns.NS
}

func newLab(t *testing.T) *lab {
	t.Helper()
	labns.RequireRoot(t)
	labns.RequireTool(t, "ip")
	l := &lab{t: t, fabric: labns.New(t, "vcfab")}
	l.fabric.MustRun("ip", "link", "add", "br0", "type", "bridge")
	l.fabric.MustRun("ip", "link", "set", "br0", "up")
	return l
}

// host adds a namespace on the bridge with eth0 at addr/24.
func (l *lab) host(addr string) *labns.NS {
	l.t.Helper()
	ns := labns.New(l.t, "vch")
	port := "p" + ns.Name[len(ns.Name)-6:]
	for _, c := range [][]string{
		{"ip", "link", "add", labIface, "netns", ns.Name, "type", "veth", "peer", "name", port, "netns", l.fabric.Name},
		{"ip", "-n", l.fabric.Name, "link", "set", port, "master", "br0"},
		{"ip", "-n", l.fabric.Name, "link", "set", port, "up"},
		{"ip", "-n", ns.Name, "addr", "add", addr + "/24", "dev", labIface},
		{"ip", "-n", ns.Name, "link", "set", labIface, "up"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			l.t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	return ns
}

// mac is the hardware address of ns's eth0.
func mac(t *testing.T, ns *labns.NS) net.HardwareAddr {
	t.Helper()
	out := ns.MustRun("cat", "/sys/class/net/"+labIface+"/address")
	m, err := net.ParseMAC(strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type tWriter struct {
	t    *testing.T
	name string
}

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Logf("[%s] %s", w.name, bytes.TrimSpace(b))
	return len(b), nil
}

// unicastSpeaker runs keepalived (pkg/keepalived, as the appliance and hostagent run it) in ns with
// one unicast instance, and waits until it holds vip.
func unicastSpeaker(t *testing.T, ns *labns.NS, src string, peers []string, vip string, vrid uint8, advert time.Duration) {
	t.Helper()
	labns.RequireTool(t, "keepalived")
	var ps []netip.Addr
	for _, p := range peers {
		ps = append(ps, netip.MustParseAddr(p))
	}
	p := &keepalived.Process{
		Config: keepalived.Config{RouterID: "speaker", Instances: []keepalived.Instance{{
			Name: "api-vip", Interface: labIface, SourceIP: netip.MustParseAddr(src), Peers: ps,
			VIP: netip.MustParsePrefix(vip + "/24"), VirtualRouterID: vrid, Priority: 150, AdvertInterval: advert,
		}}},
		Dir: t.TempDir(), NetNS: ns.Name,
		Log: slog.New(slog.NewTextHandler(tWriter{t, "keepalived " + src}, nil)),
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatalf("start keepalived in %s: %v", ns.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Stop(ctx); err != nil {
			t.Errorf("stop keepalived: %v", err)
		}
	})
	waitHolds(t, ns, vip)
}

// multicastSpeaker runs keepalived in ns with a configuration pkg/keepalived never renders: one
// VRRPv2 instance advertising to 224.0.0.18 (keepalived's default without unicast_peer), as a
// foreign VRRP group on the segment would.
func multicastSpeaker(t *testing.T, ns *labns.NS, vip string, vrid uint8) {
	t.Helper()
	bin := labns.RequireTool(t, "keepalived")
	dir := t.TempDir()
	conf := fmt.Sprintf(`global_defs {
    router_id foreign
}
vrrp_instance foreign {
    state BACKUP
    interface %s
    virtual_router_id %d
    priority 200
    advert_int 1
    virtual_ipaddress {
        %s/24 dev %s
    }
}
`, labIface, vrid, vip, labIface)
	path := filepath.Join(dir, "keepalived.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := ns.Command(bin, "--vrrp", "-f", path, "-p", filepath.Join(dir, "k.pid"), "-r", filepath.Join(dir, "v.pid"),
		"-c", filepath.Join(dir, "c.pid"), "--dont-fork", "--log-console")
	cmd.Stdout, cmd.Stderr = tWriter{t, "foreign keepalived"}, tWriter{t, "foreign keepalived"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Our own process group only (ip netns exec execs keepalived: the group is keepalived's).
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	waitHolds(t, ns, vip)
}

func waitHolds(t *testing.T, ns *labns.NS, vip string) {
	t.Helper()
	limit := time.Now().Add(hangGuard)
	for {
		held, err := keepalived.Holds(ns.Path(), labIface, netip.MustParseAddr(vip))
		if err != nil {
			t.Fatal(err)
		}
		if held {
			return
		}
		if time.Now().After(limit) {
			t.Fatalf("keepalived in %s never took %s", ns.Name, vip)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPreflight runs the pre-flight of a host at 10.81.0.11 (VRID 81, VIP 10.81.0.100, peer
// 10.81.0.10) against real speakers on the bridge: the passing cases (an empty segment; the peer
// holding the VIP and advertising to us, as when a control plane joins while the appliance holds the
// VIP), and the refusals (a foreign keepalived on our VRID, unicast to us and multicast; a foreign
// host holding our VIP), each naming the speaker and the field to change. The time the pre-flight
// took is logged, not asserted.
func TestPreflight(t *testing.T) {
	const (
		us   = "10.81.0.11"
		peer = "10.81.0.10"
		vip  = "10.81.0.100"
	)
	type scenario struct {
		name   string
		advert time.Duration // our (and our peer's) interval; 0 = 1 s
		setup  func(t *testing.T, l *lab) (foreign *labns.NS)
		// want: "" passes; FieldVRID or FieldVIP is the conflict expected.
		want      string
		check     func(t *testing.T, res Result)
		speaker   string
		otherVRID uint8
		ingress   bool // the ingress VIP's instance (Options.Ingress): its own fields in the refusal
	}
	for _, tc := range []scenario{
		{name: "empty segment", check: func(t *testing.T, res Result) {
			if res.Adverts != 0 || len(res.Holders) != 0 {
				t.Errorf("heard %d adverts, holders %v on an empty segment", res.Adverts, res.Holders)
			}
		}},
		{name: "peer holds the VIP 1s", setup: func(t *testing.T, l *lab) *labns.NS {
			unicastSpeaker(t, l.host(peer), peer, []string{us}, vip, 81, 0)
			return nil
		}, check: peerHeard(peer, vip)},
		{name: "peer holds the VIP 250ms", advert: 250 * time.Millisecond, setup: func(t *testing.T, l *lab) *labns.NS {
			unicastSpeaker(t, l.host(peer), peer, []string{us}, vip, 81, 250*time.Millisecond)
			return nil
		}, check: peerHeard(peer, vip)},
		{name: "foreign unicast speaker on our VRID", want: FieldVRID, speaker: "10.81.0.20", setup: func(t *testing.T, l *lab) *labns.NS {
			// A group that still lists our address as a peer (an address reused from another cluster).
			unicastSpeaker(t, l.host("10.81.0.20"), "10.81.0.20", []string{us, "10.81.0.21"}, "10.81.0.200", 81, 0)
			return nil
		}},
		{name: "foreign 1s speaker while we advertise at 250ms", advert: 250 * time.Millisecond, want: FieldVRID, speaker: "10.81.0.20", setup: func(t *testing.T, l *lab) *labns.NS {
			// VRRP's default interval: our 250 ms says nothing about a foreign group's.
			unicastSpeaker(t, l.host("10.81.0.20"), "10.81.0.20", []string{us, "10.81.0.21"}, "10.81.0.200", 81, 0)
			return nil
		}},
		{name: "foreign multicast speaker on our VRID", want: FieldVRID, speaker: "10.81.0.20", setup: func(t *testing.T, l *lab) *labns.NS {
			multicastSpeaker(t, l.host("10.81.0.20"), "10.81.0.200", 81)
			return nil
		}},
		{name: "foreign multicast speaker on another VRID", otherVRID: 82, setup: func(t *testing.T, l *lab) *labns.NS {
			multicastSpeaker(t, l.host("10.81.0.20"), "10.81.0.200", 82)
			return nil
		}},
		{name: "foreign host holds our VIP", want: FieldVIP, setup: func(t *testing.T, l *lab) *labns.NS {
			ns := l.host("10.81.0.30")
			ns.MustRun("ip", "addr", "add", vip+"/24", "dev", labIface)
			return ns
		}},
		{name: "foreign host holds the ingress VIP", ingress: true, want: FieldIngressVIP, setup: func(t *testing.T, l *lab) *labns.NS {
			ns := l.host("10.81.0.30")
			ns.MustRun("ip", "addr", "add", vip+"/24", "dev", labIface)
			return ns
		}},
		{name: "foreign multicast speaker on the ingress VRID", ingress: true, want: FieldIngressVRID, speaker: "10.81.0.20", setup: func(t *testing.T, l *lab) *labns.NS {
			multicastSpeaker(t, l.host("10.81.0.20"), "10.81.0.200", 81)
			return nil
		}},
		{name: "peer holds the ingress VIP", ingress: true, setup: func(t *testing.T, l *lab) *labns.NS {
			unicastSpeaker(t, l.host(peer), peer, []string{us}, vip, 81, 0)
			return nil
		}, check: peerHeard(peer, vip)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLab(t)
			self := l.host(us)
			var foreign *labns.NS
			if tc.setup != nil {
				foreign = tc.setup(t, l)
			}
			o := Options{
				NetNSPath: self.Path(), Interface: labIface, SourceIP: netip.MustParseAddr(us),
				Peers: []netip.Addr{netip.MustParseAddr(peer)}, VIPs: []netip.Addr{netip.MustParseAddr(vip)},
				VRID: 81, AdvertInterval: tc.advert, Ingress: tc.ingress,
				Log: slog.New(slog.NewTextHandler(tWriter{t, "vipcheck"}, &slog.HandlerOptions{Level: slog.LevelDebug})),
			}
			res, err := Run(context.Background(), o)
			t.Logf("pre-flight took %s (window %s): %d adverts from us/peers, other VRIDs %v, peer MACs %v, holders %v; err: %v",
				res.Took.Round(time.Millisecond), res.Window, res.Adverts, res.OtherVRIDs, res.PeerMACs, res.Holders, err)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("pre-flight refused a legitimate segment: %v", err)
				}
				if tc.check != nil {
					tc.check(t, res)
				}
				if tc.otherVRID != 0 && (len(res.OtherVRIDs) != 1 || res.OtherVRIDs[0] != tc.otherVRID) {
					t.Errorf("other VRIDs heard %v, want [%d]", res.OtherVRIDs, tc.otherVRID)
				}
				return
			}
			var ce *ConflictError
			if !errors.As(err, &ce) || !errors.Is(err, ErrConflict) {
				t.Fatalf("pre-flight error = %v, want a *ConflictError", err)
			}
			if ce.Field != tc.want {
				t.Errorf("conflict field %q, want %q", ce.Field, tc.want)
			}
			msg := err.Error()
			for _, s := range []string{tc.speaker, tc.want} {
				if s != "" && !strings.Contains(msg, s) {
					t.Errorf("message %q does not name %q", msg, s)
				}
			}
			name := "API VIP"
			if tc.ingress {
				name = "ingress VIP"
			}
			switch tc.want {
			case FieldVRID, FieldIngressVRID:
				if ce.Speaker.String() != tc.speaker || ce.Advert == nil || ce.Advert.VRID != 81 || !strings.Contains(msg, "virtual router ID 81") {
					t.Errorf("VRID conflict %+v, want speaker %s on VRID 81", ce, tc.speaker)
				}
			case FieldVIP, FieldIngressVIP:
				want := mac(t, foreign)
				if !bytes.Equal(ce.MAC, want) || ce.VIP.String() != vip || !strings.Contains(msg, want.String()) || !strings.Contains(msg, vip) || !strings.Contains(msg, "the "+name+" ") {
					t.Errorf("VIP conflict %+v (%q), want MAC %s for %s", ce, msg, want, vip)
				}
			}
		})
	}
}

// peerHeard checks that the pre-flight really heard the peer: its advertisements, its MAC, and that
// it holds the VIP (so the pass is not for want of listening).
func peerHeard(peer, vip string) func(t *testing.T, res Result) {
	return func(t *testing.T, res Result) {
		if res.Adverts == 0 {
			t.Errorf("heard no advertisement from the peer that holds the VIP")
		}
		if _, ok := res.PeerMACs[netip.MustParseAddr(peer)]; !ok {
			t.Errorf("peer %s did not answer the ARP request", peer)
		}
		if h := res.Holders[netip.MustParseAddr(vip)]; h.String() != peer {
			t.Errorf("holder of %s = %v, want the peer %s", vip, h, peer)
		}
	}
}
