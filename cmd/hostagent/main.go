// Command hostagent runs on every node: it fetches its configuration from the appliance, configures
// the node and drives kubeadm. This build only identifies itself; the agent's work arrives with the
// node-provisioning milestone.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/version"
)

func main() {
	root := &cobra.Command{
		Use:          "hostagent",
		Short:        "Node agent of the bootstrap appliance",
		SilenceUsage: true,
	}
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the hostagent version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version.String())
			return err
		},
	})
	if err := root.Execute(); err != nil {
		os.Exit(1)
	}
}
