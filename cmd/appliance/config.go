package main

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/config"
)

func newConfigCommand(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Validate a BootstrapConfiguration or print the defaulted example",
	}
	cmd.AddCommand(newConfigValidateCommand(g), newConfigDefaultsCommand())
	return cmd
}

// validateResult is the `config validate -o json` document.
type validateResult struct {
	File  string `json:"file"`
	Valid bool   `json:"valid"`
	// ClusterName and the node counts are set when Valid.
	ClusterName       string `json:"clusterName,omitempty"`
	ControlPlaneNodes int    `json:"controlPlaneNodes"`
	WorkerNodes       int    `json:"workerNodes"`
	// Warnings and Errors are never null: each {"path", "line", "message"}; a file that cannot be
	// read is one error without a path.
	Warnings []*config.FieldError `json:"warnings"`
	Errors   []*config.FieldError `json:"errors"`
}

func newConfigValidateCommand(g *globalFlags) *cobra.Command {
	var offline bool
	cmd := &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a bootstrap.yaml: every error at once, each with its field path (a JSON document with -o json)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, warnings, err := config.Load(args[0], config.ValidateOptions{CheckFiles: !offline})
			if g.output == outputJSON {
				return printValidateJSON(cmd, args[0], cfg, warnings, err)
			}
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

// printValidateJSON prints config.Load's result as a validateResult on stdout and returns an error
// (for the exit status) when the file is not valid.
func printValidateJSON(cmd *cobra.Command, file string, cfg *config.BootstrapConfiguration, warnings []*config.FieldError, err error) error {
	r := validateResult{File: file, Valid: err == nil, Warnings: warnings, Errors: []*config.FieldError{}}
	if r.Warnings == nil {
		r.Warnings = []*config.FieldError{}
	}
	var list config.ErrorList
	switch {
	case errors.As(err, &list):
		r.Errors = list
	case err != nil:
		r.Errors = []*config.FieldError{{Msg: err.Error()}}
	default:
		r.ClusterName, r.ControlPlaneNodes, r.WorkerNodes = cfg.ClusterName, len(cfg.ControlPlaneNodes()), len(cfg.WorkerNodes())
	}
	enc := json.NewEncoder(cmd.OutOrStdout())
	enc.SetIndent("", "  ")
	if werr := enc.Encode(r); werr != nil {
		return werr
	}
	if err != nil {
		return fmt.Errorf("%s is not valid: %d errors (listed in the JSON output)", file, len(r.Errors))
	}
	return nil
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
