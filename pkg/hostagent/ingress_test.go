package hostagent

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/haproxy"
	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/netresolve"
)

func ingressNodeConfig(routers ...agentapi.RouterEndpoint) agentapi.NodeConfig {
	return agentapi.NodeConfig{
		Node: "cp1", Roles: []string{"control-plane"},
		ControlPlaneCIDRs: []netip.Prefix{netip.MustParsePrefix("10.100.0.0/24")},
		ApplianceAddress:  netip.MustParseAddr("10.100.0.2"),
		APIServerVIP:      netip.MustParseAddr("10.100.0.100"), APIServerPort: 6443,
		Keepalived: &agentapi.KeepalivedConfig{VirtualRouterID: 179, Priority: 100, AdvertIntervalMS: 250,
			Peers: []netip.Addr{netip.MustParseAddr("10.100.0.12"), netip.MustParseAddr("10.100.0.13"), netip.MustParseAddr("10.100.0.2")}},
		APILoadBalancer: &agentapi.APILoadBalancerConfig{Port: 9445, Servers: []agentapi.APIServerEndpoint{
			{Node: "cp1", Address: netip.MustParseAddrPort("10.100.0.11:6443")},
			{Node: "cp2", Address: netip.MustParseAddrPort("10.100.0.12:6443")}}},
		Ingress: &agentapi.IngressConfig{VIP: netip.MustParseAddr("10.100.0.101"), VirtualRouterID: 42, Ports: []agentapi.IngressPort{{Port: 80, RouterPort: 10080}, {Port: 443, RouterPort: 10443}}, Routers: routers,
			RouterHealthPort: 1936, RouterHealthPath: "/healthz"},
	}
}

// TestIngressKeepalived: a control plane of a cluster with an ingress VIP runs a second VRRP instance
// for it (own VRID, same speakers but the bootstrap host, same priority and track script), and the real
// keepalived accepts the configuration (keepalived -t).
func TestIngressKeepalived(t *testing.T) {
	cp := netresolve.Address{Interface: "eth0", Prefix: netip.MustParsePrefix("10.100.0.11/24"), CIDR: netip.MustParsePrefix("10.100.0.0/24")}
	kc, err := KeepalivedConfig(ingressNodeConfig(), cp, []string{"/bin/true"}, "nobody")
	if err != nil {
		t.Fatal(err)
	}
	if len(kc.Instances) != 2 {
		t.Fatalf("%d instances, want the API's and the ingress's", len(kc.Instances))
	}
	api, ing := kc.Instances[0], kc.Instances[1]
	if ing.Name != agentapi.VRRPIngressInstanceName || ing.VIP != netip.MustParsePrefix("10.100.0.101/24") || ing.VirtualRouterID != 42 ||
		ing.Priority != api.Priority || ing.TrackScript == nil || ing.Interface != "eth0" {
		t.Errorf("ingress instance %+v", ing)
	}
	for _, p := range ing.Peers {
		if p == netip.MustParseAddr("10.100.0.2") {
			t.Errorf("the bootstrap host is a peer of the ingress instance: %v", ing.Peers)
		}
	}
	if len(ing.Peers) != 2 || len(api.Peers) != 3 {
		t.Errorf("peers: ingress %v, api %v", ing.Peers, api.Peers)
	}
	conf, err := keepalived.Render(kc)
	if err != nil {
		t.Fatal(err)
	}
	if err := keepalived.Check(t.Context(), conf); err != nil {
		t.Errorf("keepalived -t refused the configuration: %v\n%s", err, conf)
	}
	nc := ingressNodeConfig()
	nc.Ingress = nil
	if kc, _ := KeepalivedConfig(nc, cp, []string{"/bin/true"}, "nobody"); len(kc.Instances) != 1 {
		t.Errorf("without ingress: %d instances", len(kc.Instances))
	}
}

// TestIngressHAProxy: with routers on the workers, the control plane's HAProxy passes the ingress ports
// to them (the real haproxy -c accepts it); without routers (they run on the control planes) it binds
// nothing for the ingress.
func TestIngressHAProxy(t *testing.T) {
	_, conf, err := HAProxyConfig(ingressNodeConfig(agentapi.RouterEndpoint{Node: "w1", Address: netip.MustParseAddr("10.100.0.21")}))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"frontend ingress-80", "bind :80", "server w1 10.100.0.21:10080",
		"frontend ingress-443", "bind :443", "server w1 10.100.0.21:10443", "check port 1936", "uri /healthz"} {
		if !strings.Contains(string(conf), want) {
			t.Errorf("haproxy.cfg lacks %q:\n%s", want, conf)
		}
	}
	if err := haproxy.Check(t.Context(), "", t.TempDir(), conf); err != nil {
		t.Error(err)
	}
	_, conf, err = HAProxyConfig(ingressNodeConfig())
	if err != nil || strings.Contains(string(conf), "ingress") {
		t.Errorf("no routers: %v\n%s", err, conf)
	}
}
