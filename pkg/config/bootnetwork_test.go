package config

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// TestBootNetwork: the installed system's static network comes from the node's addresses inside the
// control-plane CIDRs, with that CIDR's prefix length, and boot.router when it lies on one of those
// networks; it survives the kernel command line (agentapi.BootArgs).
func TestBootNetwork(t *testing.T) {
	c := &BootstrapConfiguration{}
	c.Networks.ControlPlane.CIDRs = []netip.Prefix{netip.MustParsePrefix("10.80.0.0/16"), netip.MustParsePrefix("10.83.0.0/24")}
	c.Networks.WorkloadPlane.CIDRs = []netip.Prefix{netip.MustParsePrefix("10.90.0.0/24")}
	c.Boot.Router = netip.MustParseAddr("10.83.0.1")
	n := Node{Name: "w1", Addresses: []netip.Addr{netip.MustParseAddr("10.90.0.21"), netip.MustParseAddr("10.83.0.21")}}
	nw := c.BootNetwork(n)
	if got := (agentapi.BootArgs{Network: nw}).Words(); strings.Join(got, " ") != "appliance.address=10.83.0.21/24 appliance.gateway=10.83.0.1" {
		t.Errorf("BootArgs{Network: BootNetwork}.Words() = %q, want the control-plane address with /24 and boot.router (the workload-plane address may be on another NIC)", got)
	}
	c.Boot.Router = netip.MustParseAddr("192.168.1.1")
	if nw2 := c.BootNetwork(n); nw2.Gateway.IsValid() {
		t.Errorf("boot.router %s off the node's networks became its gateway", c.Boot.Router)
	}
	if nw3 := c.BootNetwork(Node{Name: "w2"}); !nw3.IsZero() {
		t.Errorf("a node without addresses got %+v", nw3)
	}

	back, err := agentapi.ParseBootArgs("console=ttyS0 appliance.url=https://10.83.0.2:8443 " + agentapi.BootArgs{Network: nw}.Format())
	if err != nil || len(back.Network.Addresses) != 1 || back.Network.Addresses[0] != nw.Addresses[0] || back.Network.Gateway != nw.Gateway {
		t.Errorf("round trip: %+v, %v; want %+v", back.Network, err, nw)
	}
}
