package bootstrap

import (
	"context"
	"fmt"
	"time"

	"github.com/airgap-appliance/appliance/pkg/escrow"
	"github.com/airgap-appliance/appliance/pkg/kubeapi"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// escrowTimeout bounds the phase's API calls (one read, at most one write).
const escrowTimeout = 30 * time.Second

// escrowPhase keeps the appliance's state escrowed in the cluster (bootstrap.yaml escrow,
// pkg/escrow, docs/design/state-escrow.md): the escrowed files of the state directory sealed to the
// configured recipients in the Secret kube-system/appliance-state-escrow, through the admin
// kubeconfig. It is the last phase, so the escrow holds what this run made (tokens, node records,
// the hand-off's record). It writes only when the escrowed content, the recipients or the
// passphrase changed (escrow.Refresh), so a rerun changes nothing. Without escrow in the
// configuration it does nothing and says where the state lives; when converge was skipped in this
// run and the nodes have not converged it skips itself (needsConverge). With Options.DryRun it reads
// the Secret and says whether it would write.
type escrowPhase struct{}

func (escrowPhase) Name() string { return "escrow" }

func (escrowPhase) Run(ctx context.Context, st *State) (Result, error) {
	if st.Config.Escrow.IsZero() {
		return Result{Detail: fmt.Sprintf("off (bootstrap.yaml escrow is not set): the state lives only in %s", st.StateDir)}, nil
	}
	if !st.Config.Kubernetes.IsEnabled() {
		return Result{}, fmt.Errorf("escrow: kubernetes is not enabled: there is no cluster to keep the escrow in")
	}
	if why := needsConverge(st, "escrow not refreshed"); why != "" {
		return Result{Skipped: why}, nil
	}
	recipients, err := st.Config.Escrow.EscrowRecipients()
	if err != nil {
		return Result{}, err
	}
	c, err := kubeapi.Load(statedir.AdminKubeconfig(st.StateDir))
	if err != nil {
		return Result{}, fmt.Errorf("escrow: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, escrowTimeout)
	defer cancel()
	info := escrow.Info{ClusterName: st.Config.ClusterName, Created: st.Options.Now()}
	refresh := escrow.Refresh
	if st.Options.DryRun {
		refresh = escrow.Check
	}
	res, err := refresh(ctx, c, st.StateDir, recipients, info)
	if err != nil {
		return Result{}, err
	}
	return Result{Changed: res.Changed, Detail: res.Detail}, nil
}
