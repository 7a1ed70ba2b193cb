package config

import (
	"slices"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/hostagent"
)

// TestFirewallRolesAsHostagent: the port-table roles Validate assumes for a node are those the node's
// hostagent installs.
func TestFirewallRolesAsHostagent(t *testing.T) {
	for _, roles := range [][]Role{{RoleControlPlane}, {RoleWorker}, {RoleControlPlane, RoleWorker}, {RoleWorker, RoleControlPlane}, nil} {
		var names []string
		for _, r := range roles {
			names = append(names, string(r))
		}
		if got, want := firewallRoles(roles), hostagent.FirewallRoles(names); !slices.Equal(got, want) {
			t.Errorf("%v: firewallRoles = %v, hostagent.FirewallRoles = %v", roles, got, want)
		}
	}
}
