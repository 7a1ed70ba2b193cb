package hostagent

import (
	"slices"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// TestFirewallRolesAsConfig: the port-table roles the appliance's Validate assumes for a node
// (config.FirewallRoles) are those this agent installs (FirewallRoles). It lives here because
// pkg/hostagent imports pkg/config, so pkg/config's tests cannot import pkg/hostagent.
func TestFirewallRolesAsConfig(t *testing.T) {
	for _, roles := range [][]config.Role{{config.RoleControlPlane}, {config.RoleWorker}, {config.RoleControlPlane, config.RoleWorker}, {config.RoleWorker, config.RoleControlPlane}, nil} {
		var names []string
		for _, r := range roles {
			names = append(names, string(r))
		}
		if got, want := config.FirewallRoles(roles), FirewallRoles(names); !slices.Equal(got, want) {
			t.Errorf("%v: config.FirewallRoles = %v, FirewallRoles = %v", roles, got, want)
		}
	}
}
