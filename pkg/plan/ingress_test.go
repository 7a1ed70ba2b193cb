package plan

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
)

// TestIngressFor: with ingress.vip every Kubernetes node gets the ingress (VIP, VRID, ports), the routers
// are the workers by control-plane address; with no worker the control planes (kcli's rule); without
// ingress.vip nothing.
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
		if g == nil || g.VIP != c.Ingress.VIP || g.VirtualRouterID != c.Ingress.VirtualRouterID || len(g.Ports) != 2 ||
			g.Ports[0] != (agentapi.IngressPort{Port: 80, RouterPort: 10080}) || g.Ports[1] != (agentapi.IngressPort{Port: 443, RouterPort: 10443}) || g.RouterHealthPort != 1936 {
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
	if g := ingressFor(c); g == nil || len(g.Routers) != 3 || g.Routers[0] != (agentapi.RouterEndpoint{Node: "cp1", Address: netip.MustParseAddr("10.100.0.11")}) {
		t.Errorf("control planes only: %+v, want the routers on the three control planes", g)
	}
}

// TestIngressRouterManifest: control planes of a cluster with an ingress VIP get the routers' manifest
// with the appliance image by digest, on the workers (no control-plane toleration) when there are
// any, else on the control planes; workers, a cluster without ingress, or no image yet get none.
func TestIngressRouterManifest(t *testing.T) {
	in := labInputs(t)
	image := "appliance.local/airgap-appliance/appliance@sha256:" + strings.Repeat("ab", 32)
	in.ApplianceImage = image
	p, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range p.Nodes {
		if a.NodeConfig.Kubernetes.IngressRouterManifest != "" {
			t.Errorf("%s got a router manifest without ingress.vip", a.Name)
		}
	}
	in.Config.Ingress = config.Ingress{VIP: netip.MustParseAddr("10.100.0.101")}
	config.SetDefaults(in.Config)
	if p, err = Build(in); err != nil {
		t.Fatal(err)
	}
	for _, a := range p.Nodes {
		m := a.NodeConfig.Kubernetes.IngressRouterManifest
		switch cp := slices.Contains(a.NodeConfig.Roles, "control-plane"); {
		case cp && (!strings.Contains(m, "image: "+image) || !strings.Contains(m, "kind: DaemonSet") || strings.Contains(m, "tolerations") ||
			!strings.Contains(m, ":10080") || !strings.Contains(m, "DoesNotExist")):
			t.Errorf("%s: router manifest without the image, a DaemonSet, or with the control-plane toleration although w1 is a worker:\n%s", a.Name, m)
		case !cp && m != "":
			t.Errorf("worker %s got the router manifest", a.Name)
		}
	}
	var nc agentapi.NodeConfig
	nc.Kubernetes, nc.Ingress = &agentapi.KubernetesConfig{}, &agentapi.IngressConfig{VIP: in.Config.Ingress.VIP}
	in.Config.Nodes = in.Config.Nodes[:3] // control planes only
	if err := ingressRouterFor(in.Config, in.Config.Nodes[0], &nc, image); err != nil || !strings.Contains(nc.Kubernetes.IngressRouterManifest, "tolerations") {
		t.Errorf("no routers (control planes only): %v, want the control-plane toleration:\n%s", err, nc.Kubernetes.IngressRouterManifest)
	}
	nc.Kubernetes.IngressRouterManifest = ""
	if err := ingressRouterFor(in.Config, in.Config.Nodes[0], &nc, ""); err != nil || nc.Kubernetes.IngressRouterManifest != "" {
		t.Errorf("no appliance image yet: %v %q", err, nc.Kubernetes.IngressRouterManifest)
	}
}

// TestApplianceIngressCheck: the bootstrap host's pre-flight checks the ingress VIP as the control
// planes will claim it (VIP with the control-plane CIDR's length, the ingress VRID, the control planes
// as peers, from the bootstrap host's own address and interface), and nothing without ingress.vip.
func TestApplianceIngressCheck(t *testing.T) {
	in := labInputs(t)
	c := in.Config
	v := VRRP{VirtualRouterID: 179, AdvertInterval: 250e6}
	if got := ApplianceIngressCheck(c, in.ControlPlane, v); got != nil {
		t.Fatalf("without ingress.vip: %+v, want nil", got)
	}
	c.Ingress = config.Ingress{VIP: netip.MustParseAddr("10.100.0.101")}
	config.SetDefaults(c)
	got := ApplianceIngressCheck(c, in.ControlPlane, v)
	if got == nil {
		t.Fatal("with ingress.vip: nil")
	}
	if got.Name != agentapi.VRRPIngressInstanceName || got.Interface != "eth0" || got.SourceIP != netip.MustParseAddr("10.100.0.2") ||
		got.VIP != netip.MustParsePrefix("10.100.0.101/24") || got.VirtualRouterID != c.Ingress.VirtualRouterID ||
		got.VirtualRouterID == v.VirtualRouterID || got.AdvertInterval != v.AdvertInterval {
		t.Errorf("ingress check %+v", got)
	}
	if want := ControlPlaneAddresses(c); !slices.Equal(got.Peers, want) || len(want) != 3 {
		t.Errorf("peers %v, want the control planes %v", got.Peers, want)
	}
}
