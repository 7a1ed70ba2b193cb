package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/config"
)

func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Validate a BootstrapConfiguration or print the defaulted example",
	}
	cmd.AddCommand(newConfigValidateCommand(), newConfigDefaultsCommand())
	return cmd
}

func newConfigValidateCommand() *cobra.Command {
	var offline bool
	cmd := &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a bootstrap.yaml: every error at once, each with its field path",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, warnings, err := config.Load(args[0], config.ValidateOptions{CheckFiles: !offline})
			for _, w := range warnings {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s\n", w)
			}
			if err != nil {
				return fmt.Errorf("%s is not valid:\n%w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s is valid: cluster %q, %d control-plane and %d worker nodes\n",
				args[0], cfg.ClusterName, len(cfg.ControlPlaneNodes()), len(cfg.WorkerNodes()))
			return nil
		},
	}
	cmd.Flags().BoolVar(&offline, "offline", false, "do not check that referenced files (bundle, credentials, snippets) exist")
	return cmd
}

func newConfigDefaultsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "defaults",
		Short: "Print a complete example BootstrapConfiguration with every default filled in",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := config.Marshal(config.Example())
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
}
