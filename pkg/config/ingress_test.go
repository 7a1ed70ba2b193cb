package config

import (
	"net/netip"
	"strings"
	"testing"
)

func TestIngressValid(t *testing.T) {
	c, warns, errs := labWith(t, "ingress:\n  vip: 10.100.0.101\n")
	if len(errs) > 0 || len(warns) > 0 {
		t.Fatalf("errors %v, warnings %v", errs, warns)
	}
	if c.Ingress.VIP != netip.MustParseAddr("10.100.0.101") {
		t.Errorf("ingress.vip = %s", c.Ingress.VIP)
	}
	if id := c.Ingress.VirtualRouterID; id == 0 || id == c.APIServer.Keepalived.VirtualRouterID {
		t.Errorf("derived ingress.virtualRouterID %d (API's %d): want one of its own", id, c.APIServer.Keepalived.VirtualRouterID)
	}
	if id := DefaultIngressVirtualRouterID("lab", c.Ingress.VIP, c.Ingress.VirtualRouterID); id == c.Ingress.VirtualRouterID {
		t.Errorf("DefaultIngressVirtualRouterID kept the API's VRID %d", id)
	}
	// Without an ingress VIP the ingress rows are not opened, so the API may use 443.
	if _, _, errs := labWith(t, "", "vip: 10.100.0.100", "vip: 10.100.0.100\n  port: 443"); len(errs) > 0 {
		t.Errorf("apiServer.port 443 without ingress: %v", errs)
	}
	c, _, errs = labWith(t, "")
	if len(errs) > 0 || !c.Ingress.IsZero() {
		t.Errorf("without ingress: %v, %+v", errs, c.Ingress)
	}
	b, err := Marshal(c)
	if err != nil || strings.Contains(string(b), "ingress:") {
		t.Errorf("Marshal without ingress: %v\n%s", err, b)
	}
}

// TestIngressInvalid asserts the exact set of error paths, each with what its message must say.
func TestIngressInvalid(t *testing.T) {
	type want = fieldWant
	tests := []struct {
		name  string
		extra string
		edits []string
		want  []want
	}{
		{"outside every control-plane CIDR", "ingress:\n  vip: 10.200.0.101\n", nil, []want{
			{"ingress.vip", "10.200.0.101 is outside every networks.controlPlane.cidrs ([10.100.0.0/24]): keepalived on the control planes carries it"}}},
		{"equal to the API VIP", "ingress:\n  vip: 10.100.0.100\n", nil, []want{
			{"ingress.vip", "10.100.0.100 is also apiServer.vip"}}},
		{"a node's address", "ingress:\n  vip: 10.100.0.12\n", nil, []want{
			{"ingress.vip", "10.100.0.12 is nodes[1] (cp2)'s address"}}},
		{"IPv6", "ingress:\n  vip: \"fd00::101\"\n", nil, []want{{"ingress.vip", "fd00::101 is IPv6"}}},
		{"network address", "ingress:\n  vip: 10.100.0.0\n", nil, []want{{"ingress.vip", "10.100.0.0 is the network address of 10.100.0.0/24"}}},
		{"broadcast address", "ingress:\n  vip: 10.100.0.255\n", nil, []want{{"ingress.vip", "10.100.0.255 is the broadcast address of 10.100.0.0/24"}}},
		{"the API's VRID", "ingress:\n  vip: 10.100.0.101\n  virtualRouterID: 179\n", nil, []want{
			{"ingress.virtualRouterID", "179 is also apiServer.keepalived.virtualRouterID"}}},
		{"VRID 0", "ingress:\n  vip: 10.100.0.101\n  virtualRouterID: 0\n", nil, []want{{"ingress.virtualRouterID", ""}}},
		{"VRID without a VIP", "ingress:\n  virtualRouterID: 7\n", nil, []want{
			{"ingress.virtualRouterID", "is set but ingress.vip is not"}}},
		{"without Kubernetes", "ingress:\n  vip: 10.100.0.101\nkubernetes:\n  enabled: false\n", nil, []want{
			{"ingress.vip", "kubernetes.enabled is false"}}},
		{"without the load balancer", "ingress:\n  vip: 10.100.0.101\n", []string{"vip: 10.100.0.100", "vip: 10.100.0.100\n  loadBalancer:\n    enabled: false"}, []want{
			{"ingress.vip", "apiServer.loadBalancer.enabled is false"}}},
		{"unknown key", "ingress:\n  vip: 10.100.0.101\n  port: 80\n", nil, []want{{"ingress.port", ""}}},
		{"API port is the ingress's", "ingress:\n  vip: 10.100.0.101\n", []string{"vip: 10.100.0.100", "vip: 10.100.0.100\n  port: 443"}, []want{
			{"apiServer.port", "443 is also the port of ingress-https (tcp 443) on control-plane nodes"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, errs := labWith(t, tt.extra, tt.edits...)
			requireExactly(t, errs, tt.want)
		})
	}
}
