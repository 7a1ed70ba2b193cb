//go:build e2e

package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// upgrade is issue 15's "upgrade of the appliance": a second build of appliance + hostagent replaces
// the first in binDir (as an operator upgrading the appliance would; the subtests after this one run
// it). Its dry run lists every node to upgrade and changes none. Then bootstrap runs; the first run
// is killed (SIGKILL) while a node is mid-upgrade, and the rerun finishes. The API through the VIP is
// polled from the bootstrap namespace (a client request, vipPoller) the whole time and not one poll may fail. Then every configured
// node reports the new build, the VIP holder and every control plane's keepalived PID are what they
// were (each new hostagent adopted its node's keepalived), the nodes were upgraded one at a time
// (each node's interval, from the appliance starting it to the node's ready with the new build,
// overlaps no other), `appliance status` shows "upgraded", etcd is healthy, and a further run changes
// nothing. The node list comes from the configuration (the day-2 subtests before this one change it).
func (k *k8sLab) upgrade(t *testing.T, ctx context.Context) {
	cfg, _, err := config.Load(k.config, config.ValidateOptions{})
	if err != nil {
		t.Fatalf("load %s: %v", k.config, err)
	}
	var nodes, controlPlanes []string
	for _, n := range cfg.Nodes {
		nodes = append(nodes, n.Name)
		if n.HasRole(config.RoleControlPlane) {
			controlPlanes = append(controlPlanes, n.Name)
		}
	}
	store := nodestate.Open(statedir.Nodes(k.state))
	ok := t.Run("a newer appliance upgrades every node's hostagent one at a time, a kill -9 mid-upgrade and a rerun finish it, the VIP never fails a poll", func(t *testing.T) {
		oldSum := fileSum(t, filepath.Join(binDir, "hostagent"))
		for _, n := range nodes {
			s, err := store.Get(n)
			if err != nil || s.State != agentapi.StateReady || s.AgentSHA256 != oldSum {
				t.Fatalf("before the upgrade %s is %s with hostagent %s, want ready with %s (%v)", n, s.State, s.AgentSHA256, oldSum, err)
			}
		}
		// keepalived on each control plane, and the VIP holder: the upgrade must move neither.
		holders := k.vipHolders()
		keepalivedPID := map[string]string{}
		for _, n := range controlPlanes {
			keepalivedPID[n] = strings.TrimSpace(k.ssh(t, n, "cat /etc/keepalived/keepalived.pid"))
		}
		newBins := buildUpgrade(t)
		for _, b := range []string{"appliance", "hostagent"} {
			if err := os.Rename(filepath.Join(binDir, b), filepath.Join(binDir, b+".old")); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(newBins, b), filepath.Join(binDir, b)); err != nil {
				t.Fatal(err)
			}
		}
		newSum := fileSum(t, filepath.Join(binDir, "hostagent"))
		t.Logf("hostagent %s → %s (version %s)", oldSum[:12], newSum[:12], upgradeVersion)

		// The dry run lists every node as one to upgrade and touches none.
		d := k.bootstrap(ctx, "", 0, "--dry-run")
		up, _ := d.phase("upgrade")
		if d.err != nil || !up.Changed || !strings.Contains(up.Detail, "would upgrade hostagent") {
			t.Fatalf("dry run of the new build: %v, upgrade phase %+v\n%s", d.err, up, d.stderr)
		}
		for _, n := range nodes {
			if !strings.Contains(up.Detail, n+" (from ") {
				t.Errorf("dry run: %s not listed: %s", n, up.Detail)
			}
			if s, _ := store.Get(n); s.State != agentapi.StateReady || s.AgentSHA256 != oldSum {
				t.Errorf("the dry run changed %s: %s %s", n, s.State, s.AgentSHA256)
			}
		}
		t.Logf("dry run: %s", up.Detail)

		poll := k.pollVIP(t, "boot", 200*time.Millisecond)
		start := time.Now()
		killedAt := k.bootstrapKilledMidUpgrade(t, store)
		t.Logf("first run SIGKILLed %.1fs in, while %s", time.Since(start).Seconds(), killedAt)
		r := k.bootstrap(ctx, "", 0, "--converge-timeout", "10m")
		total := time.Since(start)
		polls, failures := poll.stop()
		if r.err != nil {
			t.Fatalf("the rerun of the new build: %v\nevents: %+v\nstderr:\n%s", r.err, r.events, r.stderr)
		}
		up, _ = r.phase("upgrade")
		t.Logf("upgrade phase of the rerun (%.1fs): %s", up.Duration, up.Detail)
		t.Logf("the API through the VIP (a client request) polled %d times from the bootstrap namespace over %.1fs, %d failed",
			polls, total.Seconds(), len(failures))
		if len(failures) > 0 || polls == 0 {
			t.Errorf("the API through %s failed %d of %d polls during the upgrade: %s", apiVIPURL, len(failures), polls, strings.Join(failures, "; "))
		}

		// Every node now reports the new build and is ready.
		for _, n := range nodes {
			s, err := store.Get(n)
			if err != nil || s.State != agentapi.StateReady || s.AgentSHA256 != newSum || !strings.HasPrefix(s.AgentVersion, upgradeVersion) {
				t.Errorf("after the upgrade %s is %s with hostagent %s %s, want ready with %s %s (%v)", n, s.State, s.AgentVersion, s.AgentSHA256, upgradeVersion, newSum, err)
			}
		}

		// The VIP did not move and no keepalived was restarted: each new agent adopted its node's.
		if after := k.vipHolders(); strings.Join(after, ",") != strings.Join(holders, ",") {
			t.Errorf("VIP holders %v before the upgrade, %v after: the VIP moved", holders, after)
		}
		for _, n := range controlPlanes {
			if pid := strings.TrimSpace(k.ssh(t, n, "cat /etc/keepalived/keepalived.pid")); pid != keepalivedPID[n] {
				t.Errorf("%s: keepalived pid %s before the upgrade, %s after: restarted, not adopted", n, keepalivedPID[n], pid)
			}
			if s, _ := store.Get(n); !strings.HasPrefix(s.Steps[agentapi.StepKeepalived].Detail, "adopted") {
				t.Errorf("%s: the new hostagent's keepalived step: %q, want adopted", n, s.Steps[agentapi.StepKeepalived].Detail)
			}
		}
		t.Logf("VIP on %v throughout; keepalived adopted, same PIDs %v", holders, keepalivedPID)

		// One at a time: each node's interval, from the appliance setting it to booting for the
		// upgrade to its first ready after that, overlaps no other, and holds its upgraded entry.
		type span struct {
			node       string
			start, end time.Time
			upgraded   time.Time
		}
		var spans []span
		for _, n := range nodes {
			evs, err := store.Events(n)
			if err != nil {
				t.Fatalf("events of %s: %v", n, err)
			}
			var sp span
			sp.node = n
			for _, ev := range evs {
				if ev.Step == "" && ev.State == agentapi.StateBooting && strings.HasPrefix(ev.Reason, "upgrading hostagent") && ev.Time.After(start) {
					sp.start, sp.end = ev.Time, time.Time{} // the last start counts (a killed run's is redone)
				}
				if !sp.start.IsZero() && sp.end.IsZero() && ev.State == agentapi.StateReady && ev.Time.After(sp.start) {
					sp.end = ev.Time
				}
			}
			hist, err := store.History(n)
			if err != nil {
				t.Fatalf("history of %s: %v", n, err)
			}
			for _, h := range hist {
				if h.Kind == nodestate.Upgraded && h.To != nil && h.To.SHA256 == newSum {
					sp.upgraded = h.Time
				}
			}
			if sp.end.IsZero() || sp.upgraded.IsZero() {
				t.Errorf("%s: no upgrade interval (start %v, ready %v) or no upgraded entry to %s (%v)", n, sp.start, sp.end, newSum[:12], sp.upgraded)
				continue
			}
			if sp.upgraded.Before(sp.start) || sp.upgraded.After(sp.end) {
				t.Errorf("%s: upgraded entry at %v outside its upgrade %v → %v", n, sp.upgraded, sp.start, sp.end)
			}
			spans = append(spans, sp)
		}
		sort.Slice(spans, func(i, j int) bool { return spans[i].start.Before(spans[j].start) })
		var b strings.Builder
		for i, sp := range spans {
			fmt.Fprintf(&b, "  %-6s +%6.1fs → +%6.1fs  %5.1fs\n", sp.node, sp.start.Sub(start).Seconds(), sp.end.Sub(start).Seconds(), sp.end.Sub(sp.start).Seconds())
			if i > 0 && spans[i-1].end.After(sp.start) {
				t.Errorf("%s's upgrade started at +%.1fs before %s's ended at +%.1fs: not one at a time",
					sp.node, sp.start.Sub(start).Seconds(), spans[i-1].node, spans[i-1].end.Sub(start).Seconds())
			}
		}
		t.Logf("hostagent upgrade per node (from the first run's start; the appliance starting the node → its ready with the new build):\n%s", b.String())

		out, err := exec.Command(filepath.Join(binDir, "appliance"), append([]string{"status", "--config", k.config}, nodes...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("appliance status: %v\n%s", err, out)
		}
		if c := strings.Count(string(out), "upgraded from "); c < len(nodes) {
			t.Errorf("appliance status shows %d upgraded entries, want at least %d:\n%s", c, len(nodes), out)
		}
		if err := waitFor(2*time.Minute, func() error { return k.controlPlanePodsRunning() }); err != nil {
			t.Error(err)
		}
		k.etcdHealthy(t)
	})
	if !ok {
		return
	}
	t.Run("a second run of the new build changes nothing", func(t *testing.T) {
		d := k.bootstrap(ctx, "", 0, "--dry-run")
		if d.err != nil || d.report["changes"] != false {
			t.Errorf("dry run after the upgrade: %v, report %v\n%s", d.err, d.report, d.stderr)
		}
		if ev, _ := d.phase("upgrade"); ev.Changed || !strings.Contains(ev.Detail, "every node runs the served hostagent") {
			t.Errorf("dry run: upgrade phase %+v", ev)
		}
		r := k.mustBootstrap(ctx)
		for _, name := range k.phases() {
			if ev, _ := r.phase(name); ev.Changed {
				t.Errorf("phase %s changed something: %s", name, ev.Detail)
			}
		}
	})
}

// bootstrapKilledMidUpgrade runs bootstrap and SIGKILLs it once a node's record says its upgrade
// began (set to booting "upgrading hostagent ..."), returning that record's line. The run must get
// there within 10 minutes.
func (k *k8sLab) bootstrapKilledMidUpgrade(t *testing.T, store *nodestate.Store) string {
	t.Helper()
	cmd := k.exec("boot", filepath.Join(binDir, "appliance"), "bootstrap", "--config", k.config, "-o", "json", "--converge-timeout", "10m")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(10 * time.Minute)
	for {
		all, _ := store.List()
		for _, s := range all {
			if s.State == agentapi.StateBooting && strings.HasPrefix(s.Reason, "upgrading hostagent") {
				_ = cmd.Process.Signal(syscall.SIGKILL)
				<-exited
				return s.Node + " was " + s.State + ": " + s.Reason
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("bootstrap ended (%v) before any node's upgrade began:\n%s", err, out.String())
		case <-deadline:
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-exited
			t.Fatalf("no node's upgrade began within 10 minutes:\n%s", out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// vipPoller makes a client's request through https://VIP:6443 from a lab namespace every interval
// until stop (kubectl get --raw /api/v1/namespaces/default with the admin kubeconfig, a fresh
// connection each time); a poll succeeds when the default namespace comes back within 5 s, and any
// other outcome is a failure, recorded with its time: no retry. Not /readyz: under load an
// apiserver's /readyz briefly reports "[-]etcd-readiness failed" while it still serves requests (CI:
// 2 of 46 polls), and a draining one rightly answers 500 "[-]shutdown failed" (CI: 1 of 263), which
// are health signals, not outages of the API. A stopping kube-apiserver keeps serving until the
// balancer has taken it out (kubeadm-manifests.APIServerShutdownDelay; pkg/haproxy
// TestStoppingAPIServerLosesNoRequest), so a control plane's reboot or restart costs no request.
type vipPoller struct {
	quit     chan struct{}
	once     sync.Once
	done     chan struct{}
	mu       sync.Mutex
	polls    int
	failures []string
}

// pollVIP starts a vipPoller from the lab namespace from ("boot", or a node) every interval; it
// fails the test when the first probe, before polling starts, does not answer.
func (k *k8sLab) pollVIP(t *testing.T, from string, interval time.Duration) *vipPoller {
	t.Helper()
	probe := func() (string, error) {
		argv := []string{k.kubectl, "--kubeconfig", statedir.AdminKubeconfig(k.state), "--server", apiVIPURL, "--request-timeout", "5s", "get", "--raw", "/api/v1/namespaces/default"}
		out, err := k.exec(from, argv...).CombinedOutput()
		if err == nil && !strings.Contains(string(out), `"name":"default"`) {
			err = fmt.Errorf("answer %q", out)
		}
		return string(out), err
	}
	if out, err := probe(); err != nil {
		t.Fatalf("the API through the VIP from %s before polling: %v %s", from, err, out)
	}
	p := &vipPoller{quit: make(chan struct{}), done: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.quit:
				return
			case <-time.After(interval):
			}
			at, sent := time.Since(start).Seconds(), time.Now()
			out, err := probe()
			p.mu.Lock()
			p.polls++
			if err != nil {
				p.failures = append(p.failures, fmt.Sprintf("+%.1fs (%s): %v %s", at, sent.Format("15:04:05.000"), err, strings.TrimSpace(out)))
			}
			p.mu.Unlock()
		}
	}()
	return p
}

// stop stops polling (again is a no-op) and returns the polls made and the failed ones.
func (p *vipPoller) stop() (polls int, failures []string) {
	p.once.Do(func() { close(p.quit) })
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.polls, p.failures
}
