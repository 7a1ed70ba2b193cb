package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/version"
)

func newVersionCommand(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the appliance version ({\"version\": …} with -o json)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.output == outputJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]string{"version": version.String()})
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version.String())
			return err
		},
	}
}
