package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/applianced"
	"github.com/airgap-appliance/appliance/pkg/config"
)

func newStopCommand() *cobra.Command {
	var cfgPath, stateDir string
	cmd := &cobra.Command{
		Use:   "stop --config FILE",
		Short: "Stop the HTTPS services that `appliance bootstrap` started (the detached `appliance serve`)",
		Long: `Stops the appliance serve process recorded in the state directory (SIGTERM, then SIGKILL after
10 s), after checking that the PID really is that state directory's server. Nothing else is touched:
the state, certificates and firewall stay, and the next bootstrap starts the server again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if stateDir == "" {
				cfg, _, err := config.Load(cfgPath, config.ValidateOptions{})
				if err != nil {
					return fmt.Errorf("%s is not valid:\n%w", cfgPath, err)
				}
				stateDir = cfg.StateDir
			}
			stopped, err := applianced.Stop(stateDir)
			if err != nil {
				return err
			}
			if stopped {
				fmt.Fprintln(cmd.ErrOrStderr(), "stopped appliance serve of", stateDir)
			} else {
				fmt.Fprintln(cmd.ErrOrStderr(), "no appliance serve running for", stateDir)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&cfgPath, "config", "c", "", "BootstrapConfiguration file")
	cmd.Flags().StringVarP(&stateDir, "state-dir", "s", "", "state directory (default: the configuration's stateDir)")
	cmd.MarkFlagsOneRequired("config", "state-dir")
	return cmd
}
