package nodestate

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

func kinds(h []LifecycleEntry) string {
	var out []string
	for _, e := range h {
		out = append(out, string(e.Kind))
	}
	return strings.Join(out, " ")
}

func history(t *testing.T, s *Store, node string) []LifecycleEntry {
	t.Helper()
	h, err := s.History(node)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// built is a report from a hostagent of build v/sum.
func built(r agentapi.Report, v, sum string) agentapi.Report {
	r.AgentVersion, r.AgentSHA256 = v, sum
	return r
}

// TestHistoryFromReports: the first ready records "ready" (with the kubeadm step's detail and the
// agent build), a resent report or a recovery in the same boot records nothing, ready in a new boot
// records "rebooted", and a report from another hostagent build records "upgraded from X to Y".
func TestHistoryFromReports(t *testing.T) {
	s := Open(t.TempDir())
	v1, h1 := "v0.1.0", strings.Repeat("a1", 32)
	v2, h2 := "v0.2.0", strings.Repeat("b2", 32)
	boot1 := func(step, status, detail string) {
		t.Helper()
		if _, _, err := s.Record("cp1", nil, built(rep("boot-1-0000-aaaa", step, status, detail), v1, h1)); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []string{"config", "firewall", "containerd"} {
		boot1(step, "done", "")
	}
	boot1("kubeadm", "done", "kubeadm init done in 14.2s")
	if h := history(t, s, "cp1"); len(h) != 0 {
		t.Fatalf("history before ready: %s", kinds(h))
	}
	boot1("ready", "done", "")
	h := history(t, s, "cp1")
	if kinds(h) != "ready" || h[0].BootID != "boot-1-0000-aaaa" || h[0].Detail != "first ready; kubeadm init done in 14.2s" ||
		h[0].To == nil || *h[0].To != (AgentBuild{v1, h1}) {
		t.Fatalf("after the first ready: %+v", h)
	}
	if st, _ := s.Get("cp1"); st.AgentVersion != v1 || st.AgentSHA256 != h1 || st.Steps["ready"].AgentVersion != "" {
		t.Errorf("status keeps the build once per node: %+v", st)
	}
	// Resent, then a failure and recovery in the same boot: no lifecycle change.
	boot1("ready", "done", "")
	boot1("firewall", "failed", "nft: no permission")
	boot1("firewall", "done", "")
	if st, _ := s.Get("cp1"); st.State != agentapi.StateReady {
		t.Fatalf("state %q, want ready", st.State)
	}
	if h := history(t, s, "cp1"); kinds(h) != "ready" {
		t.Fatalf("same boot added %s", kinds(h))
	}
	// A reboot: ready again in boot 2.
	for _, step := range []string{"config", "firewall", "containerd", "ready"} {
		if _, _, err := s.Record("cp1", nil, built(rep("boot-2-0000-bbbb", step, "done", ""), v1, h1)); err != nil {
			t.Fatal(err)
		}
	}
	h = history(t, s, "cp1")
	if kinds(h) != "ready rebooted" || h[1].BootID != "boot-2-0000-bbbb" || h[1].Detail != "ready again after a reboot (boot boot-1-0 → boot-2-0)" {
		t.Fatalf("after the reboot: %+v", h)
	}
	// A new hostagent in the same boot resends a report equal to the last one but for its build:
	// that is a change (status and history), and sending it again is not.
	for range 2 {
		st, _, err := s.Record("cp1", nil, built(rep("boot-2-0000-bbbb", "ready", "done", ""), v2, h2))
		if err != nil {
			t.Fatal(err)
		}
		if st.AgentVersion != v2 || st.AgentSHA256 != h2 {
			t.Errorf("status build %q %q, want %q %q", st.AgentVersion, st.AgentSHA256, v2, h2)
		}
	}
	h = history(t, s, "cp1")
	if kinds(h) != "ready rebooted upgraded" || *h[2].From != (AgentBuild{v1, h1}) || *h[2].To != (AgentBuild{v2, h2}) {
		t.Fatalf("after the upgrade: %+v", h)
	}
	want := "upgraded from v0.1.0 (sha256 a1a1a1a1a1a1) to v0.2.0 (sha256 b2b2b2b2b2b2) (hostagent in boot boot-2-0)"
	if line := h[2].Line(time.UTC); !strings.HasSuffix(line, "  "+want) {
		t.Errorf("line %q, want it to end with %q", line, want)
	}
	// A hostagent that reports no build (older than the field) changes nothing in the history.
	if _, _, err := s.Record("cp1", nil, rep("boot-2-0000-bbbb", "firewall", "done", "again")); err != nil {
		t.Fatal(err)
	}
	if h := history(t, s, "cp1"); len(h) != 3 {
		t.Errorf("a report without a build added %s", kinds(h))
	}
	fi, err := os.Stat(filepath.Join(s.Dir(), "cp1", HistoryFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("history file: %v %v, want mode 0600", fi.Mode(), err)
	}
}

// TestHistoryIdenticalBuildChangeIsNotANoop: the build-only change of the test above writes
// status.json (Record says changed) once, and the identical resend is a no-op.
func TestHistoryIdenticalBuildChangeIsNotANoop(t *testing.T) {
	s := Open(t.TempDir())
	r := rep("b", "config", "done", "")
	if _, _, err := s.Record("w1", nil, built(r, "v1", "")); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		_, changed, err := s.Record("w1", nil, built(r, "v2", ""))
		if err != nil || changed != want {
			t.Errorf("send %d: changed=%v err=%v, want changed=%v", i+1, changed, err, want)
		}
	}
	if h := history(t, s, "w1"); kinds(h) != "upgraded" || h[0].From.Version != "v1" || h[0].To.Version != "v2" {
		t.Errorf("history: %+v", h)
	}
}

// TestSyncMembership: a bootstrap run's node list records "added" once per node, a node with a
// record but missing from the list "removed" once, a node that comes back "added" again; and
// RecordLifecycle (what `appliance node remove` calls) follows the same once-only rule.
func TestSyncMembership(t *testing.T) {
	s := Open(t.TempDir())
	check := func(nodes []string, wantAdded, wantRemoved string) {
		t.Helper()
		added, removed, err := s.SyncMembership(nodes, "bootstrap run with bootstrap.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(added, ",") != wantAdded || strings.Join(removed, ",") != wantRemoved {
			t.Errorf("SyncMembership(%v) added %v removed %v, want [%s] [%s]", nodes, added, removed, wantAdded, wantRemoved)
		}
	}
	check([]string{"b", "a"}, "a,b", "")
	check([]string{"b", "a"}, "", "")
	// c has a status from before histories existed, and no history: it is known, so its absence counts.
	if _, err := s.Set("c", agentapi.StatePowering, ""); err != nil {
		t.Fatal(err)
	}
	check([]string{"a"}, "", "b,c")
	check([]string{"a"}, "", "")
	check([]string{"a", "b"}, "b", "")
	// d has a status from before histories existed: its "added" says so.
	if _, err := s.Set("d", agentapi.StateReady, ""); err != nil {
		t.Fatal(err)
	}
	check([]string{"a", "b", "d"}, "d", "")
	if h := history(t, s, "d"); kinds(h) != "added" || h[0].Detail != "recorded before histories were kept; bootstrap run with bootstrap.yaml" {
		t.Errorf("history of d: %+v", h)
	}
	if h := history(t, s, "b"); kinds(h) != "added removed added" || h[1].Detail != "removed from the configuration; bootstrap run with bootstrap.yaml" {
		t.Errorf("history of b: %+v", h)
	}
	for range 2 {
		if err := s.RecordLifecycle("b", Removed, "appliance node remove"); err != nil {
			t.Fatal(err)
		}
	}
	if h := history(t, s, "b"); kinds(h) != "added removed added removed" || h[3].Detail != "appliance node remove" {
		t.Errorf("history of b after node remove twice: %s", kinds(h))
	}
	if err := s.RecordLifecycle("b", "deleted", ""); !errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), "added, ready, rebooted, upgraded, removed, token-rotated, token-revoked, enrol-conflict, enrol-approved") {
		t.Errorf("unknown kind: %v", err)
	}
	if err := s.RecordLifecycle("../b", Added, ""); !errors.Is(err, ErrInvalidState) {
		t.Errorf("bad node name: %v", err)
	}
	if h, err := s.History("nobody"); err != nil || h != nil {
		t.Errorf("history of an unknown node: %v %v", h, err)
	}
}

// TestHistoryCap: past HistoryCap entries the file keeps the newest HistoryCap plus the newest
// older entry of each kind missing among them, so the node's "added" survives and a later bootstrap
// run does not add it again.
func TestHistoryCap(t *testing.T) {
	s := Open(t.TempDir())
	if err := s.RecordLifecycle("n", Added, "run 1"); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordLifecycle("n", Ready, "first ready"); err != nil {
		t.Fatal(err)
	}
	total := HistoryCap + 50
	for i := range total {
		if err := s.RecordLifecycle("n", Upgraded, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	h := history(t, s, "n")
	if len(h) != HistoryCap+2 || h[0].Kind != Added || h[1].Kind != Ready {
		t.Fatalf("%d entries, first %v %v; want %d starting with added, ready", len(h), h[0].Kind, h[1].Kind, HistoryCap+2)
	}
	for i, e := range h[2:] {
		if want := fmt.Sprint(total - HistoryCap + i); e.Detail != want {
			t.Fatalf("entry %d: detail %q, want %q (the newest, in order)", i+2, e.Detail, want)
		}
	}
	if added, _, err := s.SyncMembership([]string{"n"}, "run 2"); err != nil || len(added) != 0 {
		t.Errorf("a rerun after compaction added %v (%v)", added, err)
	}
	fi, err := os.Stat(filepath.Join(s.Dir(), "n", HistoryFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("compacted history file: %v %v, want mode 0600", fi.Mode(), err)
	}
}

// TestHistoryTornLine cuts the file at every byte of its last line, as a kill mid-append would
// leave it: History returns the complete entries without error, and the next append cuts the torn
// rest off instead of gluing onto it. A corrupt line that is not the last is an error naming it.
func TestHistoryTornLine(t *testing.T) {
	s := Open(t.TempDir())
	for _, k := range []LifecycleKind{Added, Ready, Rebooted} {
		if err := s.RecordLifecycle("n", k, "detail of "+string(k)); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(s.Dir(), "n", HistoryFile)
	full, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lastStart := bytes.LastIndexByte(full[:len(full)-1], '\n') + 1
	for cut := lastStart; cut <= len(full); cut++ {
		if err := os.WriteFile(path, full[:cut], 0o600); err != nil {
			t.Fatal(err)
		}
		want := "added ready"
		if cut == len(full) {
			want = "added ready rebooted"
		}
		if h := history(t, s, "n"); kinds(h) != want {
			t.Fatalf("cut at %d of %d: %s, want %s", cut, len(full), kinds(h), want)
		}
		if cut == len(full)-1 || cut == lastStart+5 {
			if err := s.RecordLifecycle("n", Upgraded, "after the crash"); err != nil {
				t.Fatal(err)
			}
			if h := history(t, s, "n"); kinds(h) != "added ready upgraded" || h[2].Detail != "after the crash" {
				t.Fatalf("append after a cut at %d: %+v", cut, h)
			}
		}
	}
	if err := os.WriteFile(path, append([]byte("{not json\n"), full...), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.History("n"); err == nil || !strings.Contains(err.Error(), "line 1 is corrupt") {
		t.Errorf("corrupt first line: %v", err)
	}
}

// TestHistoryConcurrentWriters: two Stores (as `appliance bootstrap` and `appliance serve` are two
// processes), two goroutines each, append to one node's history through the per-node lock; no entry
// is lost or torn below the cap, and past it the file holds exactly the cap.
func TestHistoryConcurrentWriters(t *testing.T) {
	dir := t.TempDir()
	stores := []*Store{Open(dir), Open(dir)}
	write := func(round, per int) {
		var wg sync.WaitGroup
		for si, s := range stores {
			for g := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range per {
						if err := s.RecordLifecycle("n", Upgraded, fmt.Sprintf("%d/%d/%d/%d", round, si, g, i)); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
		}
		wg.Wait()
	}
	write(1, 20)
	h := history(t, stores[0], "n")
	seen := map[string]bool{}
	for _, e := range h {
		seen[e.Detail] = true
	}
	if len(h) != 80 || len(seen) != 80 {
		t.Fatalf("%d entries (%d distinct), want 80", len(h), len(seen))
	}
	write(2, 20)
	if h := history(t, stores[1], "n"); len(h) != HistoryCap {
		t.Fatalf("%d entries past the cap, want %d", len(h), HistoryCap)
	}
}

// TestCorruptHistoryDoesNotHoldUpState: a history with a corrupt line (not a torn last one) makes
// Record return an error naming it, but the node's state is committed all the same, so the agent's
// resend is a no-op instead of failing forever.
func TestCorruptHistoryDoesNotHoldUpState(t *testing.T) {
	s := Open(t.TempDir())
	if _, _, err := s.Record("n", nil, rep("b", "config", "done", "")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir(), "n", HistoryFile), []byte("{garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{"firewall", "containerd"} {
		if _, _, err := s.Record("n", nil, rep("b", step, "done", "")); err != nil {
			t.Fatal(err) // no lifecycle change: the history is not read
		}
	}
	st, changed, err := s.Record("n", nil, rep("b", "ready", "done", ""))
	if err == nil || !strings.Contains(err.Error(), "history not") || !strings.Contains(err.Error(), "line 1 is corrupt") || !changed {
		t.Errorf("ready with a corrupt history: changed=%v err=%v", changed, err)
	}
	if got, _ := s.Get("n"); got.State != agentapi.StateReady || st.State != agentapi.StateReady {
		t.Errorf("state %q, want ready committed", got.State)
	}
	if _, changed, err := s.Record("n", nil, rep("b", "ready", "done", "")); err != nil || changed {
		t.Errorf("resend: changed=%v err=%v, want a no-op", changed, err)
	}
}

// TestEnrolConflictOncePerPowerOn: RecordLifecycleOnce records the enrolment alarm once for a
// power-on, whatever the number of callers (also concurrent ones, or a restarted server reading the
// history), and again for a later power-on; ActiveEnrolConflict shows it until an approval, a token
// rotation or revocation after it settles it, and a later alarm is active again.
func TestEnrolConflictOncePerPowerOn(t *testing.T) {
	s := Open(t.TempDir())
	now := time.Date(2026, 11, 25, 6, 0, 0, 0, time.UTC)
	s.Now = func() time.Time { return now }
	powerOn := now.Add(-time.Minute)
	if _, ok := ActiveEnrolConflict(history(t, s, "w1")); ok {
		t.Fatal("an alarm without history")
	}
	if err := s.RecordLifecycle("w1", TokenRotated, "enrolled with key A"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var recorded atomic.Int32
	for range 8 {
		wg.Go(func() {
			ok, err := s.RecordLifecycleOnce("w1", EnrolConflict, powerOn, "second enrolment: key B")
			if err != nil {
				t.Error(err)
			}
			if ok {
				recorded.Add(1)
			}
		})
	}
	wg.Wait()
	if recorded.Load() != 1 || kinds(history(t, s, "w1")) != "token-rotated enrol-conflict" {
		t.Fatalf("%d recorded, history %s; want one alarm", recorded.Load(), kinds(history(t, s, "w1")))
	}
	alarm, ok := ActiveEnrolConflict(history(t, s, "w1"))
	if !ok || alarm.Detail != "second enrolment: key B" {
		t.Errorf("active alarm %+v %v", alarm, ok)
	}
	for _, settle := range []LifecycleKind{EnrolApproved, TokenRotated, TokenRevoked} {
		t.Run(string(settle), func(t *testing.T) {
			now = now.Add(time.Hour) // a new power-on
			powerOn = now.Add(-time.Minute)
			if ok, err := s.RecordLifecycleOnce("w1", EnrolConflict, powerOn, "again"); err != nil || !ok {
				t.Fatalf("the alarm of a later power-on: %v %v, want recorded", ok, err)
			}
			if _, ok := ActiveEnrolConflict(history(t, s, "w1")); !ok {
				t.Fatal("the new alarm is not active")
			}
			if err := s.RecordLifecycle("w1", settle, ""); err != nil {
				t.Fatal(err)
			}
			if a, ok := ActiveEnrolConflict(history(t, s, "w1")); ok {
				t.Errorf("alarm %+v still active after %s", a, settle)
			}
		})
	}
	if _, err := s.RecordLifecycleOnce("w1", Added, powerOn, ""); !errors.Is(err, ErrInvalidState) {
		t.Errorf("RecordLifecycleOnce(added): %v, want ErrInvalidState", err)
	}
}
