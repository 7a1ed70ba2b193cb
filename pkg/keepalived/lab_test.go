package keepalived

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/test/labns"
)

// The VRRP lab: a fabric namespace holding bridge br0, and one namespace per speaker ("node") whose
// eth0 is a veth into the bridge, addressed from 10.77.0.0/24. Nothing touches the root namespace.

const (
	labIface    = "eth0"
	sampleEvery = 50 * time.Millisecond
	// waitLimit bounds every wait for an election; it is a hang guard, not a speed assertion.
	waitLimit = 30 * time.Second
)

var labVIP = netip.MustParsePrefix("10.77.0.100/24")

type labNode struct {
	name string
	ns   *labns.NS
	addr netip.Addr
	proc *Process
}

// nodeSpec describes one speaker: its name, priority, and which of the others it accepts VRRP from
// (nil: every other node; used only with a firewall).
type nodeSpec struct {
	name      string
	priority  uint8
	fwPeers   func(others []netip.Addr) []netip.Addr
	authPass  string
	advertInt time.Duration
	// track, when set, is a track script (as hostagent's: 2 s interval and timeout, fall 2, rise 1,
	// weight +50) run as nobody.
	track []string
}

type vrrpLab struct {
	t      testing.TB
	fabric *labns.NS
	nodes  []*labNode
}

// newLab builds the fabric and the nodes, applies the firewall in each node first when withFirewall
// (fresh conntrack: nothing has been exchanged yet), then starts keepalived everywhere.
func newLab(t testing.TB, specs []nodeSpec, withFirewall bool) *vrrpLab {
	t.Helper()
	labns.RequireRoot(t)
	labns.RequireTool(t, "keepalived")
	labns.RequireTool(t, "ip")
	l := &vrrpLab{t: t, fabric: labns.New(t, "kafab")}
	l.fabric.MustRun("ip", "link", "add", "br0", "type", "bridge")
	l.fabric.MustRun("ip", "link", "set", "br0", "up")
	var all []netip.Addr
	for i, s := range specs {
		ns := labns.New(t, "kan")
		addr := netip.AddrFrom4([4]byte{10, 77, 0, byte(10 + i)})
		port := "p" + ns.Name[len(ns.Name)-6:]
		cmds := [][]string{
			{"ip", "link", "add", labIface, "netns", ns.Name, "type", "veth", "peer", "name", port, "netns", l.fabric.Name},
			{"ip", "-n", l.fabric.Name, "link", "set", port, "master", "br0"},
			{"ip", "-n", l.fabric.Name, "link", "set", port, "up"},
			{"ip", "-n", ns.Name, "addr", "add", netip.PrefixFrom(addr, 24).String(), "dev", labIface},
			{"ip", "-n", ns.Name, "link", "set", labIface, "up"},
		}
		for _, c := range cmds {
			if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v: %s", c, err, out)
			}
		}
		l.nodes = append(l.nodes, &labNode{name: s.name, ns: ns, addr: addr})
		all = append(all, addr)
	}
	for i, s := range specs {
		n := l.nodes[i]
		others := slices.DeleteFunc(slices.Clone(all), func(a netip.Addr) bool { return a == n.addr })
		if withFirewall {
			peers := others
			if s.fwPeers != nil {
				peers = s.fwPeers(others)
			}
			fw := &firewall.NFTables{NetNSPath: n.ns.Path()}
			spec := firewall.Spec{
				Roles:        []firewall.Role{firewall.RoleControlPlane},
				NodeNetworks: []netip.Prefix{netip.MustParsePrefix("10.77.0.0/24")},
				VRRPPeers:    peers,
			}
			if _, err := fw.Apply(context.Background(), spec); err != nil {
				t.Fatalf("firewall in %s: %v", n.name, err)
			}
		}
		cfg := Config{RouterID: s.name, Instances: []Instance{{
			Name: "api-vip", Interface: labIface, SourceIP: n.addr, Peers: others, VIP: labVIP,
			VirtualRouterID: 77, Priority: s.priority, AuthPass: s.authPass, AdvertInterval: s.advertInt,
		}}}
		if s.track != nil {
			cfg.ScriptUser = "nobody"
			cfg.Instances[0].TrackScript = &Script{Command: s.track, Interval: 2 * time.Second, Timeout: 2 * time.Second,
				Fall: 2, Rise: 1, Weight: 50}
		}
		n.proc = &Process{
			Config: cfg,
			Dir:    t.TempDir(),
			NetNS:  n.ns.Name,
			Log:    slog.New(slog.NewTextHandler(tWriter{t, s.name}, nil)),
		}
	}
	for _, n := range l.nodes {
		if err := n.proc.Start(context.Background()); err != nil {
			t.Fatalf("start keepalived on %s: %v", n.name, err)
		}
		proc := n.proc
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := proc.Stop(ctx); err != nil {
				t.Errorf("stop keepalived: %v", err)
			}
		})
	}
	return l
}

// tWriter sends keepalived's log to the test log (shown with -v or on failure).
type tWriter struct {
	t    testing.TB
	node string
}

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Logf("[%s] %s", w.node, b)
	return len(b), nil
}

// holders samples which nodes hold the VIP now (netlink, per namespace).
func (l *vrrpLab) holders() []int {
	var hs []int
	for i, n := range l.nodes {
		ok, err := Holds(n.ns.Path(), labIface, labVIP.Addr())
		if err != nil {
			l.t.Errorf("Holds(%s): %v", n.name, err)
			continue
		}
		if ok {
			hs = append(hs, i)
		}
	}
	return hs
}

// sampler records the holder set every 50 ms until stopped.
type sampler struct {
	mu      sync.Mutex
	once    sync.Once
	samples int
	doubles int // samples with two or more holders
	last    []int
	changed chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

func (l *vrrpLab) startSampler() *sampler {
	s := &sampler{changed: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tk := time.NewTicker(sampleEvery)
		defer tk.Stop()
		for {
			hs := l.holders()
			s.mu.Lock()
			s.samples++
			if len(hs) > 1 {
				s.doubles++
			}
			s.last = hs
			s.mu.Unlock()
			select {
			case s.changed <- struct{}{}:
			default:
			}
			select {
			case <-s.stop:
				return
			case <-tk.C:
			}
		}
	}()
	l.t.Cleanup(func() { s.Stop() }) // before the namespaces go, also when the test fails early
	return s
}

// Stop ends sampling (idempotent) and returns how many samples were taken and how many saw two or
// more holders.
func (s *sampler) Stop() (samples, doubles int) {
	s.once.Do(func() { close(s.stop) })
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples, s.doubles
}

// doublesSoFar is how many samples so far saw two or more holders.
func (s *sampler) doublesSoFar() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.doubles
}

// waitHolder waits until the sampled holder set is exactly {want}; it returns when it was first seen.
func (s *sampler) waitHolder(t testing.TB, want int) (time.Time, bool) {
	t.Helper()
	limit := time.After(waitLimit)
	for {
		select {
		case <-s.changed:
			s.mu.Lock()
			ok := slices.Equal(s.last, []int{want})
			s.mu.Unlock()
			if ok {
				return time.Now(), true
			}
		case <-limit:
			s.mu.Lock()
			defer s.mu.Unlock()
			t.Errorf("after %s the holders are %v, want only node %d", waitLimit, s.last, want)
			return time.Time{}, false
		}
	}
}

// claimWatcher follows address events in every node (netlink subscriptions), so even a VIP that is
// held for a few milliseconds is seen: most tells the largest number of simultaneous holders.
type claimWatcher struct {
	mu     sync.Mutex
	held   []bool
	claims []int // VIP additions per node
	most   int
	// overlap is how long two or more nodes held the VIP at once since the last resetMost, as the
	// events arrived here (approximate: each namespace's events come over their own socket);
	// overlapSince is when the current overlap began, zero when there is none.
	overlap      time.Duration
	overlapSince time.Time
	done         chan struct{}
}

func (l *vrrpLab) watchClaims() *claimWatcher {
	w := &claimWatcher{held: make([]bool, len(l.nodes)), claims: make([]int, len(l.nodes)), done: make(chan struct{})}
	l.t.Cleanup(func() { close(w.done) })
	for i, n := range l.nodes {
		h, err := netns.GetFromPath(n.ns.Path())
		if err != nil {
			l.t.Fatal(err)
		}
		l.t.Cleanup(func() { _ = h.Close() })
		ch := make(chan netlink.AddrUpdate, 64)
		if err := netlink.AddrSubscribeWithOptions(ch, w.done, netlink.AddrSubscribeOptions{
			Namespace: &h, ListExisting: true,
			ErrorCallback: func(err error) {
				select {
				case <-w.done: // the subscription's socket closing at teardown
				default:
					l.t.Errorf("address subscription in %s: %v", n.name, err)
				}
			},
		}); err != nil {
			l.t.Fatalf("subscribe to addresses in %s: %v", n.name, err)
		}
		go func() {
			for u := range ch {
				ip, ok := netip.AddrFromSlice(u.LinkAddress.IP)
				if !ok || ip.Unmap() != labVIP.Addr() {
					continue
				}
				w.mu.Lock()
				if u.NewAddr && !w.held[i] {
					w.claims[i]++
				}
				w.held[i] = u.NewAddr
				cur := 0
				for _, h := range w.held {
					if h {
						cur++
					}
				}
				w.most = max(w.most, cur)
				switch {
				case cur > 1 && w.overlapSince.IsZero():
					w.overlapSince = time.Now()
				case cur < 2 && !w.overlapSince.IsZero():
					w.overlap += time.Since(w.overlapSince)
					w.overlapSince = time.Time{}
				}
				w.mu.Unlock()
			}
		}()
	}
	return w
}

// resetMost starts counting the most simultaneous holders (and their overlap) anew from now.
func (w *claimWatcher) resetMost() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.most, w.overlap, w.overlapSince = 0, 0, time.Time{}
	for _, h := range w.held {
		if h {
			w.most++
		}
	}
	if w.most > 1 {
		w.overlapSince = time.Now()
	}
}

// overlapped is how long two or more nodes held the VIP at once since the last resetMost.
func (w *claimWatcher) overlapped() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.overlap
	if !w.overlapSince.IsZero() {
		d += time.Since(w.overlapSince)
	}
	return d
}

func (w *claimWatcher) snapshot() (most int, claims []int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.most, slices.Clone(w.claims)
}

// holdSteady samples for d and fails on any sample whose holder set is not exactly {want}.
func (s *sampler) holdSteady(t testing.TB, want int, d time.Duration) {
	t.Helper()
	end := time.After(d)
	for {
		select {
		case <-s.changed:
			s.mu.Lock()
			last := s.last
			s.mu.Unlock()
			if !slices.Equal(last, []int{want}) {
				t.Errorf("holders %v during a steady period, want exactly node %d", last, want)
				return
			}
		case <-end:
			return
		}
	}
}

func fourNodes(authPass string, advert time.Duration) []nodeSpec {
	return []nodeSpec{
		{name: "bootstrap", priority: 150, authPass: authPass, advertInt: advert},
		{name: "cp1", priority: 100, authPass: authPass, advertInt: advert},
		{name: "cp2", priority: 90, authPass: authPass, advertInt: advert},
		{name: "cp3", priority: 80, authPass: authPass, advertInt: advert},
	}
}

func masterDown(advert time.Duration, prio uint8) time.Duration {
	if advert == 0 {
		advert = DefaultAdvertInterval
	}
	return 3*advert + advert*time.Duration(256-int(prio))/256
}

// TestFailover: three control planes and a higher-priority bootstrap speaker. The VIP settles on the
// bootstrap node with exactly one holder; SIGTERM there (priority-0 release) hands it to cp1; SIGKILL of
// cp1 (plus Cleanup of what it leaves) hands it to cp2. No 50 ms sample ever sees two holders. The
// seconds are logged, not asserted (BenchmarkFailover measures them).
func TestFailover(t *testing.T) {
	for _, tc := range []struct {
		name     string
		authPass string
		advert   time.Duration
	}{
		{"vrrp2-pass-1s", "lab-pass", 0},
		{"vrrp3-250ms", "", 250 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLab(t, fourNodes(tc.authPass, tc.advert), false)
			s := l.startSampler()
			if _, ok := s.waitHolder(t, 0); !ok {
				t.FailNow()
			}
			// Steady state: exactly one holder, the bootstrap node, for two master-down intervals.
			s.holdSteady(t, 0, 2*masterDown(tc.advert, 80))

			t0 := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stopped := make(chan error, 1)
			go func() { stopped <- l.nodes[0].proc.Stop(ctx) }() // the handover may finish before the exit
			at, ok := s.waitHolder(t, 1)
			if err := <-stopped; err != nil {
				t.Fatalf("stop bootstrap keepalived: %v", err)
			}
			if !ok {
				t.FailNow()
			}
			t.Logf("SIGTERM of the bootstrap speaker: VIP on cp1 after %.2fs", at.Sub(t0).Seconds())
			if held, err := Holds(l.nodes[0].ns.Path(), labIface, labVIP.Addr()); err != nil || held {
				t.Errorf("after SIGTERM the bootstrap node still holds the VIP (held %v, err %v)", held, err)
			}

			t0 = time.Now()
			if err := l.nodes[1].proc.Kill(); err != nil {
				t.Fatal(err)
			}
			if held, _ := Holds(l.nodes[1].ns.Path(), labIface, labVIP.Addr()); !held {
				t.Errorf("after SIGKILL keepalived left no VIP behind; LAB.md says it does (Cleanup test is void)")
			}
			if err := l.nodes[1].proc.Cleanup(); err != nil {
				t.Fatalf("Cleanup after SIGKILL: %v", err)
			}
			at, ok = s.waitHolder(t, 2)
			if !ok {
				t.FailNow()
			}
			t.Logf("SIGKILL of cp1: VIP on cp2 after %.2fs (Master_Down_Interval %.2fs)", at.Sub(t0).Seconds(),
				masterDown(tc.advert, 90).Seconds())
			samples, doubles := s.Stop()
			if doubles != 0 {
				t.Errorf("%d of %d samples saw two or more holders", doubles, samples)
			}
			t.Logf("%d samples, %d with two holders", samples, doubles)
		})
	}
}

// TestFirewallVRRPPeers runs the four speakers behind the firewall package's nftables table, applied in
// every namespace before keepalived starts (fresh conntrack; see LAB.md). With every peer allowed, only
// the bootstrap node ever adds the VIP. With the bootstrap address missing from cp3's VRRPPeers, cp3
// hears no master, claims the VIP too, and the address-event watcher sees two holders at once.
//
// (Once cp3 advertises, its own outgoing VRRP creates a conntrack entry and the bootstrap's adverts then
// pass as "established": cp3 falls back to BACKUP within about one advert interval. That is exactly how
// a missing rule hides in a long-running cluster, which is why this test starts from fresh conntrack
// and watches address events rather than only 50 ms samples.)
func TestFirewallVRRPPeers(t *testing.T) {
	labns.RequireTool(t, "nft")
	missingBootstrap := func(others []netip.Addr) []netip.Addr {
		return slices.DeleteFunc(slices.Clone(others), func(a netip.Addr) bool { return a == netip.MustParseAddr("10.77.0.10") })
	}
	for _, tc := range []struct {
		name      string
		cp3Peers  func([]netip.Addr) []netip.Addr
		wantMost  int
		wantClaim []int // VIP additions per node
	}{
		{"all peers allowed", nil, 1, []int{1, 0, 0, 0}},
		{"cp3 misses the bootstrap peer", missingBootstrap, 2, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			specs := fourNodes("lab-pass", 0)
			specs[3].fwPeers = tc.cp3Peers
			l := newLab(t, specs, true)
			w := l.watchClaims()
			s := l.startSampler()
			if _, ok := s.waitHolder(t, 0); !ok {
				t.FailNow()
			}
			// cp3 has the lowest priority, so its Master_Down_Interval is the longest; wait two.
			time.Sleep(2 * masterDown(0, 80))
			samples, doubles := s.Stop()
			most, claims := w.snapshot()
			t.Logf("claims per node %v, most simultaneous holders %d, %d/%d samples with two holders", claims, most, doubles, samples)
			if most != tc.wantMost {
				t.Errorf("most simultaneous VIP holders = %d, want %d", most, tc.wantMost)
			}
			if tc.wantClaim != nil && !slices.Equal(claims, tc.wantClaim) {
				t.Errorf("VIP additions per node = %v, want %v", claims, tc.wantClaim)
			}
			if tc.wantClaim == nil && claims[3] == 0 {
				t.Errorf("cp3 never claimed the VIP although it cannot hear the master")
			}
		})
	}
}

// String names a node for messages.
func (n *labNode) String() string { return fmt.Sprintf("%s(%s)", n.name, n.addr) }

// TestTrackScriptWithSubsecondAdverts: the control planes' track script runs in whole seconds (2 s,
// fall 2, weight +50, as hostagent sets it) while VRRPv3 advertises every 250 ms. The healthy
// higher-priority speaker holds the VIP; when its check starts failing it loses the 50 and the other
// speaker preempts; when it passes again the VIP comes back. The seconds are logged, not asserted:
// detection takes fall × interval (2–4 s plus up to the timeout), the move after it one advert.
func TestTrackScriptWithSubsecondAdverts(t *testing.T) {
	// The check is `test -e FILE` run as nobody: the directory must be readable by nobody.
	dir, err := os.MkdirTemp("", "kv-track-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	health := []string{filepath.Join(dir, "cp1"), filepath.Join(dir, "cp2")}
	for _, f := range health {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	specs := []nodeSpec{
		{name: "cp1", priority: 100, advertInt: 250 * time.Millisecond, track: []string{"/usr/bin/test", "-e", health[0]}},
		{name: "cp2", priority: 90, advertInt: 250 * time.Millisecond, track: []string{"/usr/bin/test", "-e", health[1]}},
	}
	l := newLab(t, specs, false)
	s := l.startSampler()
	if _, ok := s.waitHolder(t, 0); !ok {
		t.FailNow()
	}
	t0 := time.Now()
	if err := os.Remove(health[0]); err != nil {
		t.Fatal(err)
	}
	at, ok := s.waitHolder(t, 1)
	if !ok {
		t.FailNow()
	}
	t.Logf("cp1's check failing: VIP on cp2 after %.2fs", at.Sub(t0).Seconds())
	t0 = time.Now()
	if err := os.WriteFile(health[0], nil, 0o644); err != nil {
		t.Fatal(err)
	}
	at, ok = s.waitHolder(t, 0)
	if !ok {
		t.FailNow()
	}
	t.Logf("cp1's check passing again: VIP back on cp1 after %.2fs", at.Sub(t0).Seconds())
}

// TestMixedAdvertIntervalsOneGroup: VRRPv3 speakers whose advert_int differ (1 s and 250 ms: a node
// whose hostagent predates agentapi.KeepalivedConfig.AdvertIntervalMS, beside upgraded ones) still
// form one group: keepalived 2.2.7 does not discard advertisements for their interval, so after the
// election exactly one speaker holds the VIP and keeps it.
func TestMixedAdvertIntervalsOneGroup(t *testing.T) {
	specs := []nodeSpec{
		{name: "cp1", priority: 100, advertInt: time.Second},
		{name: "cp2", priority: 90, advertInt: 250 * time.Millisecond},
		{name: "cp3", priority: 80, advertInt: 250 * time.Millisecond},
	}
	l := newLab(t, specs, false)
	s := l.startSampler()
	if _, ok := s.waitHolder(t, 0); !ok {
		t.FailNow()
	}
	s.holdSteady(t, 0, 2*masterDown(time.Second, 80))
}
