package bootstrap

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// Options are the inputs of one `appliance bootstrap` run.
type Options struct {
	// ConfigPath is the BootstrapConfiguration file.
	ConfigPath string
	// StateDir overrides the configuration's stateDir when not empty.
	StateDir string
	// SkipPhases names phases not to run (see PhaseNames); load cannot be skipped.
	SkipPhases []string
	// HostagentBinary is the hostagent executable served to nodes under /artifacts/hostagent.
	HostagentBinary string
	// ApplianceBinary is the executable started as `appliance serve` (default: this process).
	ApplianceBinary string
	// NetNSPath, when set, is the network namespace the resolve and firewall phases act on
	// (default: the caller's own namespace).
	NetNSPath string
	// Progress receives human progress lines (stderr) and JSONEvents selects JSON lines instead.
	Progress   io.Writer
	JSONEvents bool
	// Logger receives details for debugging; never secrets.
	Logger *slog.Logger
	// ConvergeTimeout bounds the converge phase's wait for nodes (default DefaultConvergeTimeout).
	ConvergeTimeout time.Duration
	// CallbackTimeout bounds how long converge waits for a BMC-powered machine's next step (enrolment,
	// install notice, first report) before it fails that node alone (default DefaultCallbackTimeout).
	CallbackTimeout time.Duration
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
	// DryRun runs every phase's check against the real world and reports what it would change,
	// changing nothing: no file, no firewall rule, no process, no node (kubeadm's `--dry-run`, k0sctl's
	// DryRun). The journal is not written.
	DryRun bool
	// Handoff runs the hand-off phase even when the configuration does not enable it (`appliance
	// handoff`).
	Handoff bool
	// Prune removes the nodes the state knows as cluster members but the configuration no longer
	// lists (--prune); nil refuses such a run with ErrForgotten before anything changes.
	Prune PruneFunc
}

// Phases returns the bootstrap phases in order.
func Phases() []Phase {
	// render comes before serve and firewall: `appliance serve` reads the bootstrap host's keepalived
	// instance render wrote, and the firewall phase applies the plan's spec.
	return []Phase{loadPhase{}, resolvePhase{}, pkiPhase{}, bundlePhase{}, renderPhase{}, firewallPhase{}, servePhase{}, powerPhase{}, convergePhase{}, upgradePhase{}, handoffPhase{}, escrowPhase{}}
}

// PhaseNames lists the phases' names in order.
func PhaseNames() []string {
	var out []string
	for _, p := range Phases() {
		out = append(out, p.Name())
	}
	return out
}

// Summary is the outcome of a run.
type Summary struct {
	Changed bool
	State   *State
}

// Loader is implemented by phases whose output later phases use: when such a phase is skipped
// (--skip-phases), the runner calls Load instead, which reads the phase's result back from the state
// directory (or the real world) without changing anything, so a skipped phase costs nothing downstream.
type Loader interface {
	Load(ctx context.Context, st *State) error
}

// Run executes the phases in order, stopping at the first failure. It returns the state the
// phases built (for the final report) even on failure.
//
// The load phase always runs first: it says where the state directory is. The runner then creates
// that directory, takes its lock (flock, held until Run returns, so two runs never interleave) and
// opens the journal, before any other phase runs. An unknown name in SkipPhases, or "load", is refused
// before anything runs. With DryRun the journal is not written and a missing state directory is not
// created (the lock is taken only when the directory exists).
func Run(ctx context.Context, o Options) (*Summary, error) {
	return runPhases(ctx, o, Phases())
}

// runPhases is Run over the given phases (tests pass their own); phases[0] must set st.StateDir.
func runPhases(ctx context.Context, o Options, phases []Phase) (*Summary, error) {
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	var names []string
	for _, p := range phases {
		names = append(names, p.Name())
	}
	for _, s := range o.SkipPhases {
		if s == names[0] {
			return nil, fmt.Errorf("--skip-phases: the %s phase cannot be skipped", s)
		}
		if !slices.Contains(names, s) {
			return nil, fmt.Errorf("--skip-phases: unknown phase %q; phases are %s", s, strings.Join(names, ", "))
		}
	}
	st := &State{Options: o}
	sum := &Summary{State: st}
	var journal *Journal
	var pending []Event
	defer func() {
		if journal != nil {
			journal.Close()
		}
		if st.unlock != nil {
			st.unlock()
		}
	}()
	emit := func(ev Event) {
		if o.JSONEvents {
			b, _ := json.Marshal(ev)
			fmt.Fprintf(o.Progress, "%s\n", b)
		} else if ev.Status != StatusStarted {
			line := fmt.Sprintf("[%d/%d] %s: ", ev.Index, ev.Total, ev.Phase)
			switch ev.Status {
			case StatusSkipped:
				if ev.Detail != "" {
					line += "skipped: " + ev.Detail // the phase skipped itself and says why
				} else {
					line += "skipped (--skip-phases)"
				}
			case StatusFailed:
				line += "FAILED: " + ev.Error
			default:
				line += ev.Detail
			}
			if ev.Status != StatusSkipped {
				line += fmt.Sprintf(" %.1fs", ev.Duration)
			}
			fmt.Fprintln(o.Progress, line)
		}
		if ev.Status != StatusStarted {
			pending = append(pending, ev) // journalled once the journal is open (after load)
		}
		if journal != nil {
			for _, e := range pending {
				if err := journal.Append(e); err != nil {
					o.Logger.Warn("journal append failed", "error", err)
				}
			}
			pending = nil
		}
	}
	run := func(i int, p Phase) error {
		ev := Event{Phase: p.Name(), Index: i + 1, Total: len(phases), Time: o.Now(), Status: StatusStarted}
		if slices.Contains(o.SkipPhases, p.Name()) {
			ev.Status = StatusSkipped
			if l, ok := p.(Loader); ok {
				if err := l.Load(ctx, st); err != nil {
					ev.Status, ev.Error = StatusFailed, err.Error()
					emit(ev)
					return fmt.Errorf("phase %s (skipped, reading its result back): %w", p.Name(), err)
				}
			}
			emit(ev)
			return nil
		}
		emit(ev)
		start := time.Now()
		res, err := p.Run(ctx, st)
		ev.Time, ev.Duration = o.Now(), time.Since(start).Seconds()
		if err != nil {
			ev.Status, ev.Error = StatusFailed, err.Error()
			emit(ev)
			return fmt.Errorf("phase %s: %w", p.Name(), err)
		}
		ev.Status, ev.Changed, ev.Detail = StatusDone, res.Changed, res.Detail
		if res.Skipped != "" {
			ev.Status, ev.Detail = StatusSkipped, res.Skipped
		}
		sum.Changed = sum.Changed || res.Changed
		emit(ev)
		return nil
	}
	if err := run(0, phases[0]); err != nil {
		return sum, err
	}
	if err := openStateDir(st); err != nil {
		return sum, err
	}
	if _, err := checkForgotten(st); err != nil {
		return sum, err
	}
	if !o.DryRun {
		var err error
		if journal, err = OpenJournal(st.StateDir); err != nil {
			return sum, err
		}
	}
	for i, p := range phases[1:] {
		if err := run(i+1, p); err != nil {
			return sum, err
		}
	}
	return sum, nil
}

// openStateDir creates the state directory (0700) and takes its lock; with DryRun it creates nothing
// and locks only an existing directory.
func openStateDir(st *State) error {
	if st.Options.DryRun {
		if _, err := os.Stat(st.StateDir); err != nil {
			return nil
		}
	} else if err := os.MkdirAll(st.StateDir, 0o700); err != nil {
		return fmt.Errorf("create state directory: %w", err)
	}
	unlock, err := lockStateDir(st.StateDir)
	if err != nil {
		return err
	}
	st.unlock = unlock
	if !st.Options.DryRun {
		removeLeftovers(st)
	}
	return nil
}

// removeLeftovers deletes what a run killed mid-write left in the state directory (the caller holds
// its lock): the atomic writers' temporary files whose writer is gone (atomicfile.CleanStale; a
// key's temporary file holds the key; in the registry's storage, the bundle import's links and blobs
// placed under atomicfile.TempName — distribution's own files never carry such names) and dry runs'
// scratch copies of the PKI (.dry-run-*, made only under the lock). Failures are logged, not fatal: the
// phases rewrite every file they own.
func removeLeftovers(st *State) {
	removed, err := atomicfile.CleanStale(st.StateDir)
	if err != nil {
		st.Options.Logger.Warn("remove temporary files a killed run left", "error", err)
	}
	scratch, _ := filepath.Glob(filepath.Join(st.StateDir, ".dry-run-*"))
	for _, d := range scratch {
		if err := os.RemoveAll(d); err != nil {
			st.Options.Logger.Warn("remove a killed dry run's scratch directory", "path", d, "error", err)
			continue
		}
		removed = append(removed, d)
	}
	if len(removed) > 0 {
		st.Options.Logger.Info("removed what a killed run left", "count", len(removed), "paths", removed)
	}
}
