package bootstrap

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/config/configtest"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestPhasesThatNeedConvergeSkipWithoutIt runs the real upgrade and hand-off phases through the runner
// after stand-ins for power and converge, on a state directory where cp1 reported ready on an old
// hostagent build (reachable by nobody: its SSH port refuses) and w1 never reported, as the fleet
// bench and an ISO's first boot leave it. With converge skipped, both phases skip themselves with
// the reason and the run succeeds, touching nothing; with converge run, nothing is skipped: a failed
// converge stops the run, and a converge that passed lets upgrade go on (and fail at cp1).
func TestPhasesThatNeedConvergeSkipWithoutIt(t *testing.T) {
	const (
		upgradeSkip = "[4/5] upgrade: skipped: needs converge, which --skip-phases skipped; 1 of 2 nodes not ready: w1 (pending); nothing upgraded (rerun without --skip-phases converge)\n"
		handoffSkip = "[5/5] handoff: skipped: needs converge, which --skip-phases skipped; 1 of 2 nodes not ready: w1 (pending); nothing handed off (rerun without --skip-phases converge)\n"
	)
	type run struct {
		dir, bin string
		out      bytes.Buffer
		err      error
		journal  []string // phase:status detail
		cp1      []byte   // cp1's record before the run
	}
	report := func(t *testing.T, dir, node, sum string) {
		t.Helper()
		store := nodestate.Open(statedir.Nodes(dir))
		for _, step := range []string{agentapi.StepConfig, agentapi.StepFirewall, agentapi.StepContainerd, agentapi.StepReady} {
			if _, _, err := store.Record(node, nil, agentapi.Report{Step: step, Status: agentapi.StatusDone, BootID: "b1", AgentVersion: "v1", AgentSHA256: sum}); err != nil {
				t.Fatal(err)
			}
		}
	}
	bootstrap := func(t *testing.T, o Options, convergeErr error, served bool) *run {
		t.Helper()
		r := &run{dir: t.TempDir()}
		r.bin = filepath.Join(r.dir, "hostagent")
		if err := os.WriteFile(r.bin, []byte("hostagent build 2"), 0o755); err != nil {
			t.Fatal(err)
		}
		sum, err := fileSHA256(r.bin)
		if err != nil {
			t.Fatal(err)
		}
		power := configtest.UnreachableSSH(t, r.dir)
		cfg := &config.BootstrapConfiguration{Nodes: []config.Node{ // Kubernetes enabled (the default)
			{Name: "cp1", Roles: []config.Role{config.RoleControlPlane}, Power: power},
			{Name: "w1", Roles: []config.Role{config.RoleWorker}, Power: power},
		}}
		if served { // both nodes converged in an earlier run, on the served build
			report(t, r.dir, "cp1", sum)
			report(t, r.dir, "w1", sum)
		} else {
			report(t, r.dir, "cp1", oldSum)
		}
		r.cp1, _ = os.ReadFile(filepath.Join(statedir.Nodes(r.dir), "cp1", nodestate.StatusFile))
		var log []string
		load := &fakePhase{name: "load", stateDir: r.dir, log: &log, check: func(st *State) { st.Config = cfg }}
		o.HostagentBinary, o.Progress = r.bin, &r.out
		_, r.err = runPhases(context.Background(), o, []Phase{load,
			&fakePhase{name: "power", log: &log}, &fakePhase{name: "converge", err: convergeErr, log: &log},
			upgradePhase{}, handoffPhase{}})
		evs, err := ReadJournal(r.dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			r.journal = append(r.journal, ev.Phase+":"+ev.Status+" "+ev.Detail)
		}
		return r
	}
	cp1Untouched := func(t *testing.T, r *run) {
		t.Helper()
		if after, _ := os.ReadFile(filepath.Join(statedir.Nodes(r.dir), "cp1", nodestate.StatusFile)); !bytes.Equal(r.cp1, after) {
			t.Errorf("cp1's record changed: the upgrade acted on it\n%s", after)
		}
	}

	t.Run("converge skipped: upgrade and handoff skip themselves with the reason", func(t *testing.T) {
		r := bootstrap(t, Options{SkipPhases: []string{"power", "converge"}, Handoff: true}, nil, false)
		if r.err != nil {
			t.Fatalf("run failed: %v\n%s", r.err, r.out.String())
		}
		for _, want := range []string{"[2/5] power: skipped (--skip-phases)\n", "[3/5] converge: skipped (--skip-phases)\n", upgradeSkip, handoffSkip} {
			if !strings.Contains(r.out.String(), want) {
				t.Errorf("progress does not say %q:\n%s", want, r.out.String())
			}
		}
		journal := strings.Join(r.journal, "\n")
		for _, want := range []string{"upgrade:skipped " + strings.TrimPrefix(strings.TrimSuffix(upgradeSkip, "\n"), "[4/5] upgrade: skipped: "), "handoff:skipped needs converge"} {
			if !strings.Contains(journal, want) {
				t.Errorf("journal has no %q:\n%s", want, journal)
			}
		}
		cp1Untouched(t, r)
		if rec, err := ReadHandoff(r.dir); rec != nil || err != nil {
			t.Errorf("hand-off record %+v, %v: the skipped hand-off started", rec, err)
		}
	})

	t.Run("converge ran and failed: the run fails there", func(t *testing.T) {
		r := bootstrap(t, Options{SkipPhases: []string{"power"}, Handoff: true}, errors.New("1 of 2 nodes failed"), false)
		if r.err == nil || !strings.Contains(r.err.Error(), "phase converge: 1 of 2 nodes failed") {
			t.Fatalf("err = %v, want converge's failure", r.err)
		}
		if strings.Contains(r.out.String(), "upgrade") || strings.Contains(r.out.String(), "handoff") {
			t.Errorf("phases after a failed converge reported:\n%s", r.out.String())
		}
		cp1Untouched(t, r)
	})

	t.Run("converge ran: upgrade does not skip itself", func(t *testing.T) {
		r := bootstrap(t, Options{SkipPhases: []string{"power"}}, nil, false)
		if r.err == nil || !strings.Contains(r.err.Error(), "phase upgrade: hostagent upgrade to") || !strings.Contains(r.err.Error(), "stopped at cp1") {
			t.Fatalf("err = %v, want the upgrade to try cp1 and fail there\n%s", r.err, r.out.String())
		}
		if strings.Contains(r.out.String(), "needs converge") {
			t.Errorf("upgrade skipped itself although converge ran:\n%s", r.out.String())
		}
	})

	t.Run("converge skipped, nodes converged earlier: the phases go on", func(t *testing.T) {
		r := bootstrap(t, Options{SkipPhases: []string{"power", "converge"}}, nil, true)
		if r.err != nil {
			t.Fatalf("run failed: %v\n%s", r.err, r.out.String())
		}
		for _, want := range []string{"[4/5] upgrade: every node runs the served hostagent", "[5/5] handoff: not asked"} {
			if !strings.Contains(r.out.String(), want) {
				t.Errorf("progress does not say %q:\n%s", want, r.out.String())
			}
		}
		if strings.Contains(r.out.String(), "needs converge") {
			t.Errorf("a phase skipped itself although every node is ready:\n%s", r.out.String())
		}
	})
}
