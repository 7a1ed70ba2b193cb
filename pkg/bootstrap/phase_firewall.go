package bootstrap

import (
	"context"
	"fmt"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/pkg/plan"
)

// firewallPhase makes the bootstrap host's firewall hold exactly the plan's firewall spec
// (pkg/plan.ApplianceFirewall: the port table's bootstrap role, reachable from the node networks, VRRP
// accepted only from the control-plane nodes), through the backend firewall.Choose picks for the host:
// firewalld's D-Bus API when firewalld runs there, else our own nftables table. Other tables, zones and
// policies are never touched. The detail names the backend ("firewalld (zone appliance, ...)").
type firewallPhase struct{}

func (firewallPhase) Name() string { return "firewall" }

func (firewallPhase) Run(ctx context.Context, st *State) (Result, error) {
	spec := plan.ApplianceFirewall(st.Config)
	if st.Plan != nil {
		spec = st.Plan.Firewall
	}
	fw, _, err := firewall.Choose(ctx, firewall.ChooseOptions{NetNSPath: st.Options.NetNSPath})
	if err != nil {
		return Result{}, err
	}
	summary := firewall.Describe(fw, spec)
	if st.Options.DryRun {
		same, err := fw.InPlace(spec)
		if err != nil {
			return Result{}, err
		}
		if same {
			return Result{Detail: "in place: " + summary}, nil
		}
		return Result{Changed: true, Detail: "would replace " + summary}, nil
	}
	changed, err := fw.Apply(ctx, spec)
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", fw.Name(), err)
	}
	if changed {
		return Result{Changed: true, Detail: "replaced " + summary}, nil
	}
	return Result{Detail: "in place: " + summary}, nil
}
