package main

import (
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/csrapprove"
)

// newCSRApproveCommand is what each control plane runs after the hand-off (a container of the
// in-cluster mirror's static pod): the kubelet serving CSR approver of `appliance serve`, with the
// inventory the hand-off wrote instead of the appliance's state.
func newCSRApproveCommand(g *globalFlags) *cobra.Command {
	var kubeconfig, inventory string
	cmd := &cobra.Command{
		Use:    "csr-approve --kubeconfig FILE --inventory FILE",
		Short:  "Approve kubelet serving CSRs of the inventory's nodes, deny the rest (runs in the cluster after the hand-off)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return csrapprove.RunWhenReady(ctx, kubeconfig, 5*time.Second, csrapprove.FromFile(inventory), g.logger(cmd.ErrOrStderr()))
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "/etc/kubernetes/admin.conf", "kubeconfig of the cluster")
	cmd.Flags().StringVar(&inventory, "inventory", "", "JSON array of the nodes (name, addresses) whose serving CSRs are approved")
	_ = cmd.MarkFlagRequired("inventory")
	return cmd
}
