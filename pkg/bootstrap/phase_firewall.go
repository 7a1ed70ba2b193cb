package bootstrap

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/pkg/config"
)

// firewallPhase makes the bootstrap host's own nftables table hold exactly the rules of the port
// table's bootstrap role, reachable from the node networks, with VRRP accepted only from the
// control-plane nodes. Other tables are never touched.
type firewallPhase struct{}

func (firewallPhase) Name() string { return "firewall" }

func (firewallPhase) Run(ctx context.Context, st *State) (Result, error) {
	spec := BootstrapFirewallSpec(st.Config)
	fw := &firewall.NFTables{NetNSPath: st.Options.NetNSPath}
	changed, err := fw.Apply(ctx, spec)
	if err != nil {
		return Result{}, err
	}
	verb := "in place"
	if changed {
		verb = "replaced"
	}
	return Result{Changed: changed, Detail: fmt.Sprintf("table inet %s %s: role bootstrap, %d node networks, %d VRRP peers",
		firewall.DefaultTable, verb, len(spec.NodeNetworks), len(spec.VRRPPeers))}, nil
}

// BootstrapFirewallSpec is the bootstrap host's firewall: node networks are the control-plane and
// workload-plane CIDRs; VRRP peers are the control-plane nodes' control-plane addresses.
func BootstrapFirewallSpec(c *config.BootstrapConfiguration) firewall.Spec {
	var nets []netip.Prefix
	seen := map[netip.Prefix]bool{}
	for _, p := range append(append([]netip.Prefix{}, c.Networks.ControlPlane.CIDRs...), c.Networks.WorkloadPlane.CIDRs...) {
		if !seen[p] {
			seen[p] = true
			nets = append(nets, p)
		}
	}
	var peers []netip.Addr
	for _, n := range c.ControlPlaneNodes() {
		for _, a := range n.Addresses {
			for _, p := range c.Networks.ControlPlane.CIDRs {
				if p.Contains(a) {
					peers = append(peers, a)
				}
			}
		}
	}
	return firewall.Spec{
		Roles:        []firewall.Role{firewall.RoleBootstrap},
		NodeNetworks: nets,
		VRRPPeers:    peers,
		HTTPSPort:    c.Server.Port,
		APIPort:      c.APIServer.Port,
	}
}
