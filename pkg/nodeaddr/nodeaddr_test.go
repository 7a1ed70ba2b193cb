package nodeaddr

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// TestAddresses: the control-plane address is the first static address inside a control-plane CIDR,
// the CIDRs tried in order (not the addresses' order); a node with none has none; ControlPlanes lists
// control planes only, in document order, without duplicates.
func TestAddresses(t *testing.T) {
	a := netip.MustParseAddr
	c := &config.BootstrapConfiguration{}
	c.Networks.ControlPlane.CIDRs = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24"), netip.MustParsePrefix("10.100.0.0/24")}
	c.Networks.WorkloadPlane.CIDRs = []netip.Prefix{netip.MustParsePrefix("10.200.0.0/24")}
	c.Nodes = []config.Node{
		{Name: "cp1", Roles: []config.Role{config.RoleControlPlane}, Addresses: []netip.Addr{a("10.200.0.11"), a("10.100.0.11"), a("10.1.0.11")}},
		{Name: "cp2", Roles: []config.Role{config.RoleControlPlane}, Addresses: []netip.Addr{a("10.100.0.12")}},
		{Name: "cp3", Roles: []config.Role{config.RoleControlPlane}}, // BMC-booted, DHCP: no static address
		{Name: "w1", Roles: []config.Role{config.RoleWorker}, Addresses: []netip.Addr{a("10.100.0.21"), a("10.200.0.21")}},
	}
	for _, tc := range []struct {
		node   int
		cp, wp string
	}{{0, "10.1.0.11", "10.200.0.11"}, {1, "10.100.0.12", ""}, {2, "", ""}, {3, "10.100.0.21", "10.200.0.21"}} {
		n := c.Nodes[tc.node]
		if got, ok := ControlPlane(c, n); ok != (tc.cp != "") || ok && got.String() != tc.cp {
			t.Errorf("%s: control-plane address %v %v, want %q", n.Name, got, ok, tc.cp)
		}
		if got, ok := WorkloadPlane(c, n); ok != (tc.wp != "") || ok && got.String() != tc.wp {
			t.Errorf("%s: workload-plane address %v %v, want %q", n.Name, got, ok, tc.wp)
		}
	}
	if got, want := ControlPlanes(c), []netip.Addr{a("10.1.0.11"), a("10.100.0.12")}; !slices.Equal(got, want) {
		t.Errorf("ControlPlanes = %v, want %v", got, want)
	}
}
