package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/bootstrap"
	"github.com/airgap-appliance/appliance/pkg/config"
)

func newHandoffCommand(g *globalFlags) *cobra.Command {
	f := &bootstrapFlags{handoff: true}
	cmd := &cobra.Command{
		Use:   "handoff --config FILE",
		Short: "Move the registry mirror and package repo into the cluster, so the bootstrap host can be switched off",
		Long: `Runs the bootstrap phases with the hand-off as the last one (as handoff.enabled in the
configuration does on every bootstrap). Refused, with nothing changed, unless every node of the
inventory is ready in Kubernetes' terms. Then:

  1. each control plane runs the in-cluster mirror (a kubelet static pod made of this appliance's
     own image) that copies the registry and the package repo to its disk;
  2. every manifest, blob and repo file is pulled back from at least two of those mirrors and
     hashed, and only then every node's containerd mirrors and apt source are switched to them;
  3. once every node confirmed the switch, the hand-off is recorded: the bootstrap host may be
     switched off. Adding nodes afterwards means booting the appliance again.

A hand-off interrupted at any point (even kill -9) resumes where it stopped when run again.
Running it after it finished is refused: there is nothing to do.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			state := f.stateDir
			if state == "" {
				c, _, err := config.Load(f.config, config.ValidateOptions{})
				if err == nil && c != nil {
					state = c.StateDir
				}
			}
			if state != "" {
				rec, err := bootstrap.ReadHandoff(state)
				if err != nil {
					return err
				}
				if rec != nil && rec.Stage == bootstrap.HandoffDone {
					return fmt.Errorf("%w at %s: every node already pulls from the control planes' mirrors; nothing to do (the bootstrap host may stay switched off)", bootstrap.ErrHandedOff, rec.Done.Format(time.RFC3339))
				}
			}
			return runBootstrap(cmd, g, f)
		},
	}
	cmd.Flags().StringVarP(&f.config, "config", "c", "", "BootstrapConfiguration file (required)")
	cmd.Flags().StringVarP(&f.stateDir, "state-dir", "s", "", "state directory (default: the configuration's stateDir)")
	cmd.Flags().StringVar(&f.hostagent, "hostagent-binary", "", "hostagent executable served to nodes (default: hostagent next to this program)")
	cmd.Flags().DurationVar(&f.convergeTimeout, "timeout", bootstrap.DefaultConvergeTimeout, "how long to wait for the nodes at each step (converge, mirrors copied, nodes switched)")
	cmd.Flags().DurationVar(&f.callbackTimeout, "callback-timeout", bootstrap.DefaultCallbackTimeout, "how long a machine powered on through its BMC may stay silent before converge fails it (as appliance bootstrap --callback-timeout)")
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "check and print what it would do; change nothing")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}
