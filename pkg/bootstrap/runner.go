package bootstrap

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/config"
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
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// Phases returns the bootstrap phases in order.
func Phases() []Phase {
	return []Phase{loadPhase{}, resolvePhase{}, pkiPhase{}, bundlePhase{}, servePhase{}, firewallPhase{}, renderPhase{}, powerPhase{}, convergePhase{}}
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

// Run executes the phases in order, stopping at the first failure. It returns the state the
// phases built (for the final report) even on failure.
func Run(ctx context.Context, o Options) (*Summary, error) {
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	phases := Phases()
	for _, s := range o.SkipPhases {
		if s == "load" {
			return nil, fmt.Errorf("--skip-phases: the load phase cannot be skipped")
		}
		if !slices.Contains(PhaseNames(), s) {
			return nil, fmt.Errorf("--skip-phases: unknown phase %q; phases are %s", s, strings.Join(PhaseNames(), ", "))
		}
	}
	st := &State{Options: o}
	sum := &Summary{State: st}
	var journal *Journal
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
				line += "skipped (--skip-phases)"
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
		if journal != nil && ev.Status != StatusStarted {
			if err := journal.Append(ev); err != nil {
				o.Logger.Warn("journal append failed", "error", err)
			}
		}
	}
	for i, p := range phases {
		ev := Event{Phase: p.Name(), Index: i + 1, Total: len(phases)}
		if slices.Contains(o.SkipPhases, p.Name()) {
			ev.Time, ev.Status = o.Now(), StatusSkipped
			emit(ev)
			continue
		}
		ev.Time, ev.Status = o.Now(), StatusStarted
		emit(ev)
		start := time.Now()
		res, err := p.Run(ctx, st)
		ev.Time, ev.Duration = o.Now(), time.Since(start).Seconds()
		if err != nil {
			ev.Status, ev.Error = StatusFailed, err.Error()
			emit(ev)
			return sum, fmt.Errorf("phase %s: %w", p.Name(), err)
		}
		ev.Status, ev.Changed, ev.Detail = StatusDone, res.Changed, res.Detail
		sum.Changed = sum.Changed || res.Changed
		if p.Name() == "load" {
			// The state directory is known only once the configuration is loaded.
			if err := os.MkdirAll(st.StateDir, 0o700); err != nil {
				return sum, fmt.Errorf("create state directory: %w", err)
			}
			unlock, err := lockStateDir(st.StateDir)
			if err != nil {
				return sum, err
			}
			st.unlock = unlock
			if journal, err = OpenJournal(st.StateDir); err != nil {
				return sum, err
			}
		}
		emit(ev)
	}
	return sum, nil
}

// loadPhase reads, defaults and validates the configuration.
type loadPhase struct{}

func (loadPhase) Name() string { return "load" }

func (loadPhase) Run(_ context.Context, st *State) (Result, error) {
	cfg, warnings, err := config.Load(st.Options.ConfigPath, config.ValidateOptions{CheckFiles: true})
	for _, w := range warnings {
		st.Options.Logger.Warn("configuration warning", "warning", w.Error())
		st.Warnings = append(st.Warnings, w.Error())
	}
	if err != nil {
		return Result{}, fmt.Errorf("%s is not valid:\n%w", st.Options.ConfigPath, err)
	}
	st.Config = cfg
	st.StateDir = cfg.StateDir
	if st.Options.StateDir != "" {
		st.StateDir = st.Options.StateDir
	}
	detail := fmt.Sprintf("cluster %q, %d control-plane and %d worker nodes", cfg.ClusterName, len(cfg.ControlPlaneNodes()), len(cfg.WorkerNodes()))
	if len(warnings) > 0 {
		detail += fmt.Sprintf(", %d warning(s): %s", len(warnings), warnings[0].Error())
	}
	return Result{Detail: detail}, nil
}
