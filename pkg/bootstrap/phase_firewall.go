package bootstrap

import (
	"context"
	"fmt"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/pkg/plan"
)

// firewallPhase makes the bootstrap host's own nftables table hold exactly the plan's firewall spec
// (pkg/plan.ApplianceFirewall: the port table's bootstrap role, reachable from the node networks, VRRP
// accepted only from the control-plane nodes). Other tables are never touched.
type firewallPhase struct{}

func (firewallPhase) Name() string { return "firewall" }

func (firewallPhase) Run(ctx context.Context, st *State) (Result, error) {
	spec := plan.ApplianceFirewall(st.Config)
	if st.Plan != nil {
		spec = st.Plan.Firewall
	}
	fw := &firewall.NFTables{NetNSPath: st.Options.NetNSPath}
	summary := fmt.Sprintf("table inet %s %%s: role bootstrap, %d node networks, %d VRRP peers",
		firewall.DefaultTable, len(spec.NodeNetworks), len(spec.VRRPPeers))
	if st.Options.DryRun {
		same, err := fw.InPlace(spec)
		if err != nil {
			return Result{}, err
		}
		if same {
			return Result{Detail: fmt.Sprintf(summary, "in place")}, nil
		}
		return Result{Changed: true, Detail: fmt.Sprintf(summary, "would be replaced")}, nil
	}
	changed, err := fw.Apply(ctx, spec)
	if err != nil {
		return Result{}, err
	}
	verb := "in place"
	if changed {
		verb = "replaced"
	}
	return Result{Changed: changed, Detail: fmt.Sprintf(summary, verb)}, nil
}
