package plan

import (
	"net/netip"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// TestIngressFor: with ingress.vip every Kubernetes node gets the ingress (VIP, VRID, ports), the routers
// are the workers by control-plane address; with no worker none are listed (they run on the control
// planes, kcli's rule); without ingress.vip nothing.
func TestIngressFor(t *testing.T) {
	in := labInputs(t)
	c := in.Config
	if ingressFor(c) != nil {
		t.Fatal("the lab without ingress.vip got an ingress")
	}
	c.Ingress = config.Ingress{VIP: netip.MustParseAddr("10.100.0.101")}
	config.SetDefaults(c)
	if _, errs := config.Validate(c, config.ValidateOptions{}); len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, n := range c.Nodes {
		nc, err := NodeConfigFor(c, n, netip.MustParseAddr("10.100.0.2"), nil, VRRP{VirtualRouterID: 179, AdvertInterval: 250e6}, nil, in.Cluster)
		if err != nil {
			t.Fatal(err)
		}
		g := nc.Ingress
		if g == nil || g.VIP != c.Ingress.VIP || g.VirtualRouterID != c.Ingress.VirtualRouterID || len(g.Ports) != 1 || g.Ports[0] != 80 {
			t.Fatalf("%s: ingress %+v", n.Name, g)
		}
		if len(g.Routers) != 1 || g.Routers[0].Node != "w1" || g.Routers[0].Address != netip.MustParseAddr("10.100.0.21") {
			t.Errorf("%s: routers %+v, want w1 at 10.100.0.21", n.Name, g.Routers)
		}
	}
	var cps []config.Node
	for _, n := range c.Nodes {
		if n.HasRole(config.RoleControlPlane) {
			cps = append(cps, n)
		}
	}
	c.Nodes = cps
	if g := ingressFor(c); g == nil || len(g.Routers) != 0 {
		t.Errorf("control planes only: %+v, want no routers listed", g)
	}
}
