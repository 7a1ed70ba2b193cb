package applianced

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/pkg/vipcheck"
	"github.com/airgap-appliance/appliance/test/labns"
)

// Two clusters on one segment (issue 14, item 5), hosts-only: no Kubernetes, only what claims the
// API VIPs. A fabric namespace ("tcfab-…") holds bridge br0; every host is a namespace ("tch-…")
// whose eth0 is a veth into it, addressed from 10.82.0.0/24. Each cluster has a bootstrap host running
// the VIP half of `appliance serve` (runVIP, the real code, as a child process: TestHelperVIPHolder)
// and one control plane running keepalived as hostagent does, after the same pre-flight.

const tcIface = "eth0"

type tcLab struct {
	t      *testing.T
	fabric *labns.NS
}

func (l *tcLab) host(addr string) *labns.NS {
	l.t.Helper()
	ns := labns.New(l.t, "tch")
	port := "p" + ns.Name[len(ns.Name)-6:]
	for _, c := range [][]string{
		{"ip", "link", "add", tcIface, "netns", ns.Name, "type", "veth", "peer", "name", port, "netns", l.fabric.Name},
		{"ip", "-n", l.fabric.Name, "link", "set", port, "master", "br0"},
		{"ip", "-n", l.fabric.Name, "link", "set", port, "up"},
		{"ip", "-n", ns.Name, "addr", "add", addr + "/24", "dev", tcIface},
		{"ip", "-n", ns.Name, "link", "set", tcIface, "up"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			l.t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	return ns
}

// tcCluster is one cluster's VRRP setting: VRID set explicitly (the derivation is not under test).
type tcCluster struct {
	name       string
	vip        netip.Prefix
	vrid       uint8
	advert     time.Duration
	bootstrap  string   // the bootstrap host's address
	cps        []string // control-plane addresses (all are peers; only the first one runs)
	bootstrapN *labns.NS
	cpN        *labns.NS
	state      string
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// bootstrapConfig is the bootstrap host's instance (as plan.ApplianceKeepalived renders it).
func (c *tcCluster) bootstrapConfig() keepalived.Config {
	return keepalived.Config{RouterID: "appliance-" + c.name, Instances: []keepalived.Instance{{
		Name: "api-vip", Interface: tcIface, SourceIP: netip.MustParseAddr(c.bootstrap), Peers: addrs(c.cps...),
		VIP: c.vip, VirtualRouterID: c.vrid, Priority: 150, AdvertInterval: c.advert,
	}}}
}

// writeState writes the bootstrap host's keepalived.json into a new state directory, and makes sure
// no keepalived outlives the test.
func writeState(t *testing.T, kc keepalived.Config) string {
	t.Helper()
	state := t.TempDir()
	b, err := json.Marshal(kc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(statedir.Appliance(state), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(statedir.Appliance(state), statedir.KeepalivedFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := Stop(state); err != nil {
			t.Errorf("Stop: %v", err)
		}
		if b, err := os.ReadFile(filepath.Join(statedir.Keepalived(state), "keepalived.pid")); err == nil {
			if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 1 && keepalivedAlive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return state
}

// startControlPlane runs the pre-flight for the control plane's instance, then its keepalived.
func (c *tcCluster) startControlPlane(t *testing.T) {
	t.Helper()
	src := c.cps[0]
	peers := append(addrs(c.bootstrap), addrs(c.cps[1:]...)...)
	in := keepalived.Instance{
		Name: "api-vip", Interface: tcIface, SourceIP: netip.MustParseAddr(src), Peers: peers,
		VIP: c.vip, VirtualRouterID: c.vrid, Priority: 100, AdvertInterval: c.advert,
	}
	res, err := vipcheck.Run(context.Background(), vipcheck.FromInstance(c.cpN.Path(), in))
	t.Logf("cluster %s control plane %s: pre-flight took %s, %d adverts from peers, holders %v, other VRIDs %v",
		c.name, src, res.Took.Round(time.Millisecond), res.Adverts, res.Holders, res.OtherVRIDs)
	if err != nil {
		t.Fatalf("cluster %s: the pre-flight refused a control plane joining its own cluster: %v", c.name, err)
	}
	p := &keepalived.Process{
		Config: keepalived.Config{RouterID: c.name + "-cp", Instances: []keepalived.Instance{in}},
		Dir:    t.TempDir(), NetNS: c.cpN.Name,
		Log: slog.New(slog.NewTextHandler(logWriter{t, c.name + "-cp"}, nil)),
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.Stop(ctx)
	})
}

type logWriter struct {
	t    *testing.T
	name string
}

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Logf("[%s] %s", w.name, strings.TrimSpace(string(b)))
	return len(b), nil
}

// holdersOf lists the hosts (by address) whose eth0 carries vip.
func holdersOf(t *testing.T, hosts map[string]*labns.NS, vip netip.Addr) []string {
	var hs []string
	for addr, ns := range hosts {
		held, err := keepalived.Holds(ns.Path(), tcIface, vip)
		if err != nil {
			t.Errorf("Holds in %s: %v", ns.Name, err)
			continue
		}
		if held {
			hs = append(hs, addr)
		}
	}
	slices.Sort(hs)
	return hs
}

// TestTwoClustersOneSegment: clusters a (VRID 31, 1 s adverts) and b (VRID 32, 250 ms) share the
// bridge. Both bootstrap hosts pass the pre-flight and claim their VIPs, both control planes join
// (their pre-flight passes while their own bootstrap host holds the VIP and advertises), and for 60 s
// of 50 ms samples each VIP is held by exactly its bootstrap host: no flap. Then a rerun of a's serve
// (kill -9 and restart) adopts the running keepalived without a pre-flight, and two third
// configurations are refused by the pre-flight, naming the speaker and the field: one forced onto a's
// VRID on a host whose address a still lists as a control plane (so a's advertisements reach it),
// and one forced onto a's VIP.
func TestTwoClustersOneSegment(t *testing.T) {
	labns.NotInShort(t, "holds two clusters' VIPs on one segment for 60 s")
	labns.RequireRoot(t)
	labns.RequireTool(t, "keepalived")
	l := &tcLab{t: t, fabric: labns.New(t, "tcfab")}
	l.fabric.MustRun("ip", "link", "add", "br0", "type", "bridge")
	l.fabric.MustRun("ip", "link", "set", "br0", "up")

	a := &tcCluster{name: "a", vip: netip.MustParsePrefix("10.82.0.100/24"), vrid: 31, bootstrap: "10.82.0.10",
		cps: []string{"10.82.0.11", "10.82.0.12"}}
	b := &tcCluster{name: "b", vip: netip.MustParsePrefix("10.82.0.200/24"), vrid: 32, advert: 250 * time.Millisecond,
		bootstrap: "10.82.0.20", cps: []string{"10.82.0.21", "10.82.0.22"}}
	hosts := map[string]*labns.NS{}
	for _, c := range []*tcCluster{a, b} {
		c.bootstrapN, c.cpN = l.host(c.bootstrap), l.host(c.cps[0])
		hosts[c.bootstrap], hosts[c.cps[0]] = c.bootstrapN, c.cpN
		c.state = writeState(t, c.bootstrapConfig())
	}
	ha, hb := startHolder(t, a.bootstrapN, a.state), startHolder(t, b.bootstrapN, b.state)
	for _, h := range []*holder{ha, hb} {
		if line := h.waitFor(t, "VRRP pre-flight"); !strings.Contains(line, "conflict=false") {
			t.Fatalf("a bootstrap host's pre-flight on a segment shared with another cluster: %s", line)
		}
		h.waitFor(t, "keepalived for the API VIP")
	}
	waitHeld := func(c *tcCluster) {
		limit := time.Now().Add(30 * time.Second) // hang guard
		for !slices.Equal(holdersOf(t, hosts, c.vip.Addr()), []string{c.bootstrap}) {
			if time.Now().After(limit) {
				t.Fatalf("cluster %s: VIP %s held by %v, want %s", c.name, c.vip.Addr(), holdersOf(t, hosts, c.vip.Addr()), c.bootstrap)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitHeld(a)
	waitHeld(b)
	a.startControlPlane(t)
	b.startControlPlane(t)

	// 60 s of observation: each VIP on exactly its bootstrap host in every sample.
	samples, flaps := 0, 0
	end := time.Now().Add(60 * time.Second)
	for time.Now().Before(end) {
		samples++
		for _, c := range []*tcCluster{a, b} {
			if hs := holdersOf(t, hosts, c.vip.Addr()); !slices.Equal(hs, []string{c.bootstrap}) {
				flaps++
				t.Errorf("sample %d: cluster %s's VIP held by %v, want only %s", samples, c.name, hs, c.bootstrap)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d samples over 60 s, %d with a VIP off its holder", samples, flaps)

	// A rerun of a's serve adopts its keepalived: no pre-flight.
	if err := ha.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = ha.cmd.Wait()
	ha2 := startHolder(t, a.bootstrapN, a.state)
	if line := ha2.waitFor(t, "VRRP pre-flight"); !strings.Contains(line, "no VRRP pre-flight") {
		t.Errorf("the rerun ran the pre-flight again: %s", line)
	}
	ha2.waitFor(t, "keepalived adopted")

	// A third configuration forced onto a's VRID, on the host a lists as its second control plane.
	c := &tcCluster{name: "c", vip: netip.MustParsePrefix("10.82.0.150/24"), vrid: a.vrid, bootstrap: a.cps[1], cps: []string{"10.82.0.13"}}
	c.bootstrapN = l.host(c.bootstrap)
	hosts[c.bootstrap] = c.bootstrapN
	c.state = writeState(t, c.bootstrapConfig())
	hc := startHolder(t, c.bootstrapN, c.state)
	line := hc.waitFor(t, "refused the claim")
	for _, want := range []string{"virtual router ID 31", a.bootstrap, vipcheck.FieldVRID} {
		if !strings.Contains(line, want) {
			t.Errorf("the refusal does not name %q: %s", want, line)
		}
	}
	// A fourth one forced onto a's VIP (another VRID).
	d := &tcCluster{name: "d", vip: a.vip, vrid: 33, bootstrap: "10.82.0.30", cps: []string{"10.82.0.31"}}
	d.bootstrapN = l.host(d.bootstrap)
	hosts[d.bootstrap] = d.bootstrapN
	d.state = writeState(t, d.bootstrapConfig())
	hd := startHolder(t, d.bootstrapN, d.state)
	line = hd.waitFor(t, "refused the claim")
	aMAC := strings.TrimSpace(a.bootstrapN.MustRun("cat", "/sys/class/net/"+tcIface+"/address"))
	for _, want := range []string{a.vip.Addr().String(), aMAC, vipcheck.FieldVIP} {
		if !strings.Contains(line, want) {
			t.Errorf("the refusal does not name %q: %s", want, line)
		}
	}
	for _, x := range []*tcCluster{c, d} {
		if _, err := os.Stat(filepath.Join(statedir.Keepalived(x.state), "running.json")); err == nil {
			t.Errorf("cluster %s: keepalived was started although the pre-flight refused the claim", x.name)
		}
	}
	if hs := holdersOf(t, hosts, a.vip.Addr()); !slices.Equal(hs, []string{a.bootstrap}) {
		t.Errorf("after the refusals a's VIP is held by %v, want %s", hs, a.bootstrap)
	}
}
