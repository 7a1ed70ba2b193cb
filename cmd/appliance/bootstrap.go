package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/bootstrap"
	"github.com/airgap-appliance/appliance/pkg/noderemove"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

type bootstrapFlags struct {
	config, stateDir, hostagent string
	skip                        []string
	convergeTimeout             time.Duration
	callbackTimeout             time.Duration
	dryRun, prune, handoff      bool
}

func newBootstrapCommand(g *globalFlags) *cobra.Command {
	f := &bootstrapFlags{}
	cmd := &cobra.Command{
		Use:   "bootstrap --config FILE",
		Short: "Serve the air-gap bundle and bring the cluster up (phases: " + strings.Join(bootstrap.PhaseNames(), ", ") + ")",
		Long: `Runs the bootstrap phases in order. Each phase checks the real world first and changes only
what differs, so running it again changes nothing, and a run that was killed finishes when run again.
The HTTPS services keep running after this command returns.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBootstrap(cmd, g, f)
		},
	}
	cmd.Flags().StringVarP(&f.config, "config", "c", "", "BootstrapConfiguration file (required)")
	cmd.Flags().StringVarP(&f.stateDir, "state-dir", "s", "", "state directory (default: the configuration's stateDir)")
	cmd.Flags().StringSliceVar(&f.skip, "skip-phases", nil, "phases to skip, comma-separated: "+strings.Join(bootstrap.PhaseNames()[1:], ", "))
	cmd.Flags().StringVar(&f.hostagent, "hostagent-binary", "", "hostagent executable served to nodes (default: hostagent next to this program)")
	cmd.Flags().DurationVar(&f.convergeTimeout, "converge-timeout", bootstrap.DefaultConvergeTimeout, "how long the converge phase waits for every node to be ready")
	cmd.Flags().DurationVar(&f.callbackTimeout, "callback-timeout", bootstrap.DefaultCallbackTimeout, "how long a machine powered on through its BMC may stay silent (before it enrols, between enrolling and its install notice, and after that until its first report) before converge fails it")
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "run every phase's check and print what it would change; change nothing")
	cmd.Flags().BoolVar(&f.prune, "prune", false, "remove from the cluster the nodes it has that nodes[] no longer lists (as appliance node remove does); without it such a run is refused")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

func defaultHostagent(flag string) string {
	if flag != "" {
		p, _ := filepath.Abs(flag)
		return p
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "hostagent")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// positiveDurations refuses a zero or negative value in any of cmd's duration flags (the timeouts
// of bootstrap and handoff), naming the flag as the command spells it and what to give instead.
func positiveDurations(cmd *cobra.Command) error {
	var err error
	cmd.Flags().VisitAll(func(fl *pflag.Flag) {
		if err != nil || fl.Value.Type() != "duration" {
			return
		}
		if d, derr := cmd.Flags().GetDuration(fl.Name); derr == nil && d <= 0 {
			err = fmt.Errorf("--%s %v: give a positive duration, e.g. --%s 20m", fl.Name, d, fl.Name)
		}
	})
	return err
}

func runBootstrap(cmd *cobra.Command, g *globalFlags, f *bootstrapFlags) error {
	if err := positiveDurations(cmd); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	jsonOut := g.output == "json"
	progress := cmd.ErrOrStderr()
	if jsonOut {
		progress = cmd.OutOrStdout()
	}
	var prune bootstrap.PruneFunc
	if f.prune {
		prune = func(ctx context.Context, st *bootstrap.State, node string) error {
			cfgPath := st.Options.ConfigPath
			if abs, err := filepath.Abs(cfgPath); err == nil {
				cfgPath = abs
			}
			o := nodeRemoveOptions(st.Config, cfgPath, st.StateDir, node, g, cmd, st.Options.DryRun, noderemove.DefaultDrainTimeout)
			o.Reason = "appliance bootstrap --prune with " + cfgPath
			_, err := noderemove.Remove(ctx, o)
			return err
		}
	}
	sum, err := bootstrap.Run(ctx, bootstrap.Options{
		Prune:           prune,
		ConfigPath:      f.config,
		StateDir:        f.stateDir,
		SkipPhases:      f.skip,
		HostagentBinary: defaultHostagent(f.hostagent),
		ConvergeTimeout: f.convergeTimeout,
		CallbackTimeout: f.callbackTimeout,
		Progress:        progress,
		JSONEvents:      jsonOut,
		Logger:          g.logger(cmd.ErrOrStderr()),
		DryRun:          f.dryRun,
		Handoff:         f.handoff,
	})
	if err != nil {
		return err
	}
	if f.dryRun {
		if jsonOut {
			return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]bool{"dryRun": true, "changes": sum.Changed})
		}
		if sum.Changed {
			fmt.Fprintln(cmd.ErrOrStderr(), "\ndry run: the phases above say what a run would change; nothing was changed")
		} else {
			fmt.Fprintln(cmd.ErrOrStderr(), "\ndry run: zero changes; everything is in place")
		}
		return nil
	}
	if jsonOut {
		return json.NewEncoder(cmd.OutOrStdout()).Encode(report(sum))
	}
	printReport(cmd.ErrOrStderr(), sum)
	return nil
}

// Report is the final `--output json` document of a bootstrap run. It holds no secrets.
type Report struct {
	Changed      bool     `json:"changed"`
	ApplianceURL string   `json:"applianceURL"`
	CAFile       string   `json:"caFile"`
	CAPin        string   `json:"caPin"`
	ServePID     int      `json:"servePID"`
	Images       []string `json:"images"`
	Registries   []string `json:"registries"`
	Nodes        []string `json:"nodes"`
	Warnings     []string `json:"warnings,omitempty"`
}

func report(sum *bootstrap.Summary) Report {
	st := sum.State
	r := Report{Changed: sum.Changed, ApplianceURL: st.ApplianceURL, ServePID: st.ServePID,
		Registries: st.Images.Registries, Warnings: st.Warnings}
	if st.CA != nil {
		r.CAFile = filepath.Join(statedir.PKI(st.StateDir), "ca.crt")
		r.CAPin = agentapi.PinOf(st.CA.Cert)
	}
	for _, im := range st.Images.Images {
		r.Images = append(r.Images, im.Ref)
	}
	for _, n := range st.Config.Nodes {
		r.Nodes = append(r.Nodes, n.Name)
	}
	return r
}

func printReport(w io.Writer, sum *bootstrap.Summary) {
	r := report(sum)
	u := r.ApplianceURL
	fmt.Fprintf(w, "\nappliance serving at %s (pid %d)\n", u, r.ServePID)
	fmt.Fprintf(w, "  CA            %s\n  CA pin        %s\n", r.CAFile, r.CAPin)
	fmt.Fprintf(w, "  registry      %s/v2/  %d images from %s\n", u, len(r.Images), strings.Join(r.Registries, ", "))
	for _, im := range r.Images {
		fmt.Fprintf(w, "                  %s\n", im)
	}
	fmt.Fprintf(w, "  packages      %s/repo/\n", u)
	fmt.Fprintf(w, "  ignition      %s/ignition/<node>  (token: %s/tokens/<node>) for %s\n", u, statedir.PKI(sum.State.StateDir), strings.Join(r.Nodes, ", "))
	fmt.Fprintf(w, "  health        %s/healthz   metrics %s/metrics\n", u, u)
	if !r.Changed {
		fmt.Fprintln(w, "nothing changed: everything was already in place")
	}
}
