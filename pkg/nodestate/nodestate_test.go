package nodestate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

func rep(boot, step, status, detail string) agentapi.Report {
	return agentapi.Report{BootID: boot, Step: step, Status: status, Detail: detail, Time: time.Unix(1, 0)}
}

var cpPlan = agentapi.Plan(agentapi.NodeConfig{Roles: []string{"control-plane"}, Keepalived: &agentapi.KeepalivedConfig{}, Kubernetes: &agentapi.KubernetesConfig{}})

func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		nc   agentapi.NodeConfig
		want []string
	}{
		{agentapi.NodeConfig{Roles: []string{"worker"}}, []string{"config", "firewall", "containerd", "ready"}},
		{agentapi.NodeConfig{Roles: []string{"control-plane"}}, []string{"config", "firewall", "containerd", "ready"}},
		{agentapi.NodeConfig{Roles: []string{"control-plane", "worker"}, Keepalived: &agentapi.KeepalivedConfig{}},
			[]string{"config", "firewall", "containerd", "keepalived", "ready"}},
		{agentapi.NodeConfig{Roles: []string{"worker"}, Kubernetes: &agentapi.KubernetesConfig{}},
			[]string{"config", "firewall", "packages", "containerd", "cni", "kubeadm", "ready"}},
		{agentapi.NodeConfig{Roles: []string{"control-plane"}, Keepalived: &agentapi.KeepalivedConfig{}, Kubernetes: &agentapi.KubernetesConfig{}},
			[]string{"config", "firewall", "packages", "containerd", "cni", "keepalived", "kubeadm", "api", "ready"}},
	} {
		if got := agentapi.Plan(tc.nc); !equal(got, tc.want) {
			t.Errorf("agentapi.Plan(%v) = %v, want %v", tc.nc.Roles, got, tc.want)
		}
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestTransitions replays sequences of events and checks the state and reason after each.
func TestTransitions(t *testing.T) {
	type step struct {
		set    string // Set(state) instead of a report when not empty
		report agentapi.Report
		state  string
		reason string
	}
	for _, tc := range []struct {
		name  string
		plan  []string
		steps []step
	}{
		{"worker happy path", nil, []step{
			{set: agentapi.StatePowering, state: agentapi.StatePowering},
			{set: agentapi.StateBooting, state: agentapi.StateBooting},
			{report: rep("b1", "config", "running", ""), state: agentapi.StateBooting},
			{report: rep("b1", "config", "done", ""), state: agentapi.StateAgentConnected},
			{report: rep("b1", "firewall", "running", ""), state: agentapi.StateAgentConnected},
			{report: rep("b1", "firewall", "done", "skipped: --no-firewall"), state: agentapi.StateAgentConnected},
			{report: rep("b1", "containerd", "done", ""), state: agentapi.StateConfigured},
			{report: rep("b1", "ready", "done", ""), state: agentapi.StateReady},
		}},
		{"control plane waits for every step of its plan", cpPlan, []step{
			{report: rep("b1", "config", "done", ""), state: agentapi.StateAgentConnected},
			{report: rep("b1", "firewall", "done", ""), state: agentapi.StateAgentConnected},
			{report: rep("b1", "packages", "done", ""), state: agentapi.StateAgentConnected},
			{report: rep("b1", "containerd", "done", ""), state: agentapi.StateAgentConnected},
			{report: rep("b1", "cni", "done", ""), state: agentapi.StateAgentConnected},
			{report: rep("b1", "keepalived", "done", ""), state: agentapi.StateAgentConnected},
			{report: rep("b1", "kubeadm", "done", ""), state: agentapi.StateAgentConnected},
			{report: rep("b1", "api", "done", ""), state: agentapi.StateConfigured},
			{report: rep("b1", "ready", "done", ""), state: agentapi.StateReady},
		}},
		{"failure, retry keeps it, success clears it", nil, []step{
			{report: rep("b1", "config", "done", ""), state: agentapi.StateAgentConnected},
			{report: rep("b1", "firewall", "failed", "nft: permission denied"), state: agentapi.StateFailed, reason: "firewall: nft: permission denied"},
			{report: rep("b1", "firewall", "running", ""), state: agentapi.StateFailed, reason: "firewall: nft: permission denied"},
			{report: rep("b1", "firewall", "done", ""), state: agentapi.StateAgentConnected},
		}},
		{"new boot resets steps", nil, []step{
			{report: rep("b1", "config", "done", ""), state: agentapi.StateAgentConnected},
			{report: rep("b1", "firewall", "done", ""), state: agentapi.StateAgentConnected},
			{report: rep("b1", "containerd", "done", ""), state: agentapi.StateConfigured},
			{report: rep("b1", "ready", "done", ""), state: agentapi.StateReady},
			{report: rep("b2", "config", "done", ""), state: agentapi.StateAgentConnected},
		}},
		{"power cycle forgets steps", nil, []step{
			{report: rep("b1", "config", "done", ""), state: agentapi.StateAgentConnected},
			{set: agentapi.StatePowering, state: agentapi.StatePowering},
			{report: rep("b1", "firewall", "done", ""), state: agentapi.StatePowering},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Open(t.TempDir())
			for i, st := range tc.steps {
				var got agentapi.NodeStatus
				var err error
				switch {
				case st.set != "":
					got, err = s.Set("n1", st.set, "")
				default:
					got, _, err = s.Record("n1", tc.plan, st.report)
				}
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				if got.State != st.state || got.Reason != st.reason {
					t.Fatalf("event %d: state %q reason %q, want %q %q", i, got.State, got.Reason, st.state, st.reason)
				}
				onDisk, err := s.Get("n1")
				if err != nil || onDisk.State != got.State || onDisk.Reason != got.Reason {
					t.Fatalf("event %d: on disk %+v, %v; returned %+v", i, onDisk, err, got)
				}
			}
		})
	}
}

func TestRecordIdempotentAndBootReset(t *testing.T) {
	dir := t.TempDir()
	s := Open(dir)
	r := rep("b1", "config", "done", "")
	if _, changed, err := s.Record("n1", nil, r); err != nil || !changed {
		t.Fatalf("first Record: changed %v, %v", changed, err)
	}
	r.Time = r.Time.Add(time.Hour) // a resend carries a new time
	if _, changed, err := s.Record("n1", nil, r); err != nil || changed {
		t.Fatalf("repeated Record: changed %v, %v; want no change", changed, err)
	}
	if _, _, err := s.Record("n1", nil, rep("b1", "firewall", "done", "")); err != nil {
		t.Fatal(err)
	}
	st, _, err := s.Record("n1", nil, rep("b2", "config", "running", ""))
	if err != nil {
		t.Fatal(err)
	}
	if st.BootID != "b2" || len(st.Steps) != 1 || st.Steps["config"].Status != "running" {
		t.Errorf("after new boot: %+v, want only b2's config step", st)
	}
	evs, err := s.Events("n1")
	if err != nil || len(evs) != 3 {
		t.Fatalf("events = %d, %v; want 3 (the duplicate recorded once)", len(evs), err)
	}
	if evs[2].BootID != "b2" || evs[2].Step != "config" || evs[0].State != agentapi.StateAgentConnected {
		t.Errorf("events: %+v", evs)
	}
	// A ready node that reboots is not ready in its new boot until it says so (the first report of
	// boot b2 used to leave the old boot's "ready" in place while b2's steps ran).
	for _, step := range []string{"config", "firewall", "containerd", "ready"} {
		if _, _, err := s.Record("n2", nil, rep("b1", step, "done", "")); err != nil {
			t.Fatal(err)
		}
	}
	if st, _ := s.Get("n2"); st.State != agentapi.StateReady {
		t.Fatalf("n2 after b1: %s, want ready", st.State)
	}
	if st, _, _ := s.Record("n2", nil, rep("b2", "config", "running", "")); st.State != agentapi.StateBooting {
		t.Errorf("n2's first report of a new boot: state %s, want booting", st.State)
	}
	if st, _, _ := s.Record("n2", nil, rep("b2", "config", "done", "")); st.State != agentapi.StateAgentConnected {
		t.Errorf("n2 config done in the new boot: state %s, want agent-connected", st.State)
	}
	for _, f := range []string{StatusFile, EventsFile} {
		fi, err := os.Stat(filepath.Join(dir, "n1", f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v mode %v, want 0600", f, err, fi.Mode().Perm())
		}
	}
}

// TestRecordNewBuildForgetsOldSteps: an upgrade replaces the agent within one boot. The old agent,
// stopped mid-step, may report that step failed as it goes (CI saw "api: … kubectl … signal: killed"
// become the new build's failure); the new build's first report must start the node over.
func TestRecordNewBuildForgetsOldSteps(t *testing.T) {
	s := Open(t.TempDir())
	old, nu := strings.Repeat("a", 64), strings.Repeat("b", 64)
	send := func(sum, step, status, detail string) agentapi.NodeStatus {
		t.Helper()
		r := rep("b1", step, status, detail)
		r.AgentSHA256 = sum
		st, _, err := s.Record("cp2", cpPlan, r)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	for _, step := range cpPlan {
		send(old, step, "done", "")
	}
	if st, _ := s.Get("cp2"); st.State != agentapi.StateReady {
		t.Fatalf("before the upgrade: %s, want ready", st.State)
	}
	if _, err := s.Set("cp2", agentapi.StateBooting, "upgrading hostagent"); err != nil {
		t.Fatal(err)
	}
	st := send(old, "api", "failed", "apply the ingress router manifest: signal: killed")
	if st.State != agentapi.StateFailed || st.AgentSHA256 != old {
		t.Fatalf("the old agent's last report: state %s build %.8s, want failed with the old build", st.State, st.AgentSHA256)
	}
	st = send(nu, "config", "running", "")
	if st.State != agentapi.StateBooting || st.Reason != "" || len(st.Steps) != 1 || st.AgentSHA256 != nu {
		t.Fatalf("the new build's first report: state %s (%q), %d steps, build %.8s; want booting with only its own step", st.State, st.Reason, len(st.Steps), st.AgentSHA256)
	}
	// Reports of the new build in the same boot keep each other's steps.
	st = send(nu, "config", "done", "")
	if st.State != agentapi.StateAgentConnected || len(st.Steps) != 1 {
		t.Errorf("the new build's config done: state %s, %d steps; want agent-connected", st.State, len(st.Steps))
	}
	// A record that never had a build (agents that predate build reports) keeps its steps.
	r := rep("b1", "config", "done", "")
	if _, _, err := s.Record("w1", nil, r); err != nil {
		t.Fatal(err)
	}
	r = rep("b1", "firewall", "done", "")
	r.AgentVersion = "v1"
	if st, _, err := s.Record("w1", nil, r); err != nil || len(st.Steps) != 2 {
		t.Errorf("w1 after its first build report: %d steps, %v; want 2", len(st.Steps), err)
	}
}

func TestRecordRejects(t *testing.T) {
	s := Open(t.TempDir())
	for _, tc := range []struct {
		node string
		r    agentapi.Report
		err  error
	}{
		{"n1", rep("", "config", "done", ""), ErrInvalidReport},
		{"n1", rep("b", "reboot", "done", ""), ErrInvalidReport},
		{"n1", rep("b", "config", "ok", ""), ErrInvalidReport},
		{"../x", rep("b", "config", "done", ""), ErrInvalidState},
		{".hidden", rep("b", "config", "done", ""), ErrInvalidState},
		{"n1", agentapi.Report{BootID: "b", Step: "config", Status: "done", AgentSHA256: "ABCD"}, ErrInvalidReport},
		{"n1", agentapi.Report{BootID: "b", Step: "config", Status: "done", AgentVersion: "v1\n"}, ErrInvalidReport},
		{"n1", agentapi.Report{BootID: "b", Step: "config", Status: "done", AgentVersion: strings.Repeat("v", 129)}, ErrInvalidReport},
	} {
		if _, _, err := s.Record(tc.node, nil, tc.r); !errors.Is(err, tc.err) {
			t.Errorf("Record(%q, %+v) = %v, want %v", tc.node, tc.r, err, tc.err)
		}
	}
	if _, err := s.Set("n1", "exploded", ""); !errors.Is(err, ErrInvalidState) {
		t.Errorf("Set(unknown state) = %v", err)
	}
	if _, err := s.Get("n2"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(missing) = %v", err)
	}
}

func TestList(t *testing.T) {
	s := Open(t.TempDir())
	for _, n := range []string{"b", "a"} {
		if _, err := s.Set(n, agentapi.StateBooting, ""); err != nil {
			t.Fatal(err)
		}
	}
	l, err := s.List()
	if err != nil || len(l) != 2 || l[0].Node != "a" || l[1].State != agentapi.StateBooting {
		t.Fatalf("List = %+v, %v", l, err)
	}
}

// TestTwoWritersLoseNothing: `appliance bootstrap` and `appliance serve` write the same records
// from two processes; two Stores (two open file descriptions, like two processes) hammering one
// node must not lose each other's updates.
func TestTwoWritersLoseNothing(t *testing.T) {
	dir := t.TempDir()
	a, b := Open(dir), Open(dir)
	steps := []string{agentapi.StepConfig, agentapi.StepFirewall, agentapi.StepContainerd, agentapi.StepReady}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 200; i++ {
			if _, err := b.Set("n1", agentapi.StateAgentConnected, fmt.Sprint("pass ", i)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i := 0; i < 50; i++ {
		for _, step := range steps[:3] {
			r := agentapi.Report{BootID: "boot-1", Step: step, Status: agentapi.StatusDone, Detail: fmt.Sprint(i), Time: time.Now()}
			if _, _, err := a.Record("n1", nil, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	<-done
	st, err := Open(dir).Get("n1")
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range steps[:3] {
		if r, ok := st.Steps[step]; !ok || r.Detail != "49" {
			t.Errorf("step %s: %+v (ok=%v): an update was lost", step, r, ok)
		}
	}
}

// TestNodesDoNotWaitForEachOther holds node a's write lock (as a report of a between its two fsyncs
// does) and checks that a write of node b and a read of node a still finish. With one store-wide
// lock (before) both waited until a's writer let go, so every report and config fetch of a fleet
// queued behind one node's disk writes.
func TestNodesDoNotWaitForEachOther(t *testing.T) {
	s := Open(t.TempDir())
	if _, err := s.Set("a", agentapi.StatePowering, ""); err != nil {
		t.Fatal(err)
	}
	_, _, unlock, err := s.lockRead("a")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	done := make(chan error, 2)
	go func() { _, err := s.Set("b", agentapi.StatePowering, ""); done <- err }()
	go func() {
		st, err := s.Get("a")
		if err == nil && st.State != agentapi.StatePowering {
			err = fmt.Errorf("node a read as %q, want %q", st.State, agentapi.StatePowering)
		}
		done <- err
	}()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second): // a deadlock guard, not a speed check
			t.Fatal("a write of node b or a read of node a waited for node a's write lock")
		}
	}
}
