package bootstrap

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
)

func TestNodeConfigFor(t *testing.T) {
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	c := &config.BootstrapConfiguration{
		ClusterName: "lab",
		Networks: config.Networks{
			ControlPlane:  config.NetworkPlane{CIDRs: []netip.Prefix{p("10.0.0.0/24")}},
			WorkloadPlane: config.NetworkPlane{CIDRs: []netip.Prefix{p("10.0.0.0/24"), p("10.1.0.0/24")}},
			Pods:          p("10.244.0.0/16"),
		},
		APIServer: config.APIServer{VIP: a("10.0.0.100"), Port: 6443, Keepalived: config.Keepalived{VirtualRouterID: 7}},
		Nodes: []config.Node{
			{Name: "cp1", Roles: []config.Role{config.RoleControlPlane}, Addresses: []netip.Addr{a("10.1.0.11"), a("10.0.0.11")}},
			{Name: "cp2", Roles: []config.Role{config.RoleControlPlane}, Addresses: []netip.Addr{a("10.0.0.12")}},
			{Name: "cp3", Roles: []config.Role{config.RoleControlPlane}},
			{Name: "w1", Roles: []config.Role{config.RoleWorker}},
		},
	}
	mirrors := []agentapi.Mirror{{Registry: "docker.io", Endpoint: "https://10.0.0.1:8443/v2/docker.io"}}
	app := a("10.0.0.1")
	cp2 := NodeConfigFor(c, c.Nodes[1], app, []byte("PEM"), "pw", mirrors)
	wantNets := []netip.Prefix{p("10.0.0.0/24"), p("10.1.0.0/24"), p("10.244.0.0/16")}
	if !slices.Equal(cp2.NodeNetworks, wantNets) || cp2.CAPEM != "PEM" || cp2.APIServerVIP != a("10.0.0.100") || len(cp2.Mirrors) != 1 {
		t.Errorf("cp2: %+v", cp2)
	}
	k := cp2.Keepalived
	if k == nil || k.Priority != ControlPlaneBasePriority-1 || k.VirtualRouterID != 7 || k.AuthPass != "pw" ||
		!slices.Equal(k.Peers, []netip.Addr{a("10.0.0.11"), app}) {
		t.Errorf("cp2 keepalived: %+v (want priority %d, peers cp1's control-plane address and the appliance)", k, ControlPlaneBasePriority-1)
	}
	if w := NodeConfigFor(c, c.Nodes[3], app, nil, "pw", nil); w.Keepalived != nil || w.Mirrors == nil {
		t.Errorf("worker: %+v", w)
	}
	off := false
	c.APIServer.Keepalived.Enabled = &off
	if cp := NodeConfigFor(c, c.Nodes[0], app, nil, "pw", nil); cp.Keepalived != nil {
		t.Errorf("keepalived disabled, yet cp1 got %+v", cp.Keepalived)
	}
}
