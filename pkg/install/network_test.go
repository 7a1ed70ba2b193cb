package install

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// TestBootNetwork: the installed system's static network comes from the node's addresses inside the
// control-plane CIDRs, with that CIDR's prefix length, and boot.router when it lies on one of those
// networks; it survives the kernel command line and becomes a networkd file that matches the boot NIC
// by MAC and carries no DHCP.
func TestBootNetwork(t *testing.T) {
	c := &config.BootstrapConfiguration{}
	c.Networks.ControlPlane.CIDRs = []netip.Prefix{netip.MustParsePrefix("10.80.0.0/16"), netip.MustParsePrefix("10.83.0.0/24")}
	c.Networks.WorkloadPlane.CIDRs = []netip.Prefix{netip.MustParsePrefix("10.90.0.0/24")}
	c.Boot.Router = netip.MustParseAddr("10.83.0.1")
	n := config.Node{Name: "w1", Addresses: []netip.Addr{netip.MustParseAddr("10.90.0.21"), netip.MustParseAddr("10.83.0.21")}}
	nw := BootNetwork(c, n)
	if got := NetworkKernelArgs(nw); strings.Join(got, " ") != "appliance.address=10.83.0.21/24 appliance.gateway=10.83.0.1" {
		t.Errorf("NetworkKernelArgs(BootNetwork) = %q, want the control-plane address with /24 and boot.router (the workload-plane address may be on another NIC)", got)
	}
	c.Boot.Router = netip.MustParseAddr("192.168.1.1")
	if nw2 := BootNetwork(c, n); nw2.Gateway.IsValid() {
		t.Errorf("boot.router %s off the node's networks became its gateway", c.Boot.Router)
	}
	if nw3 := BootNetwork(c, config.Node{Name: "w2"}); !nw3.IsZero() {
		t.Errorf("a node without addresses got %+v", nw3)
	}

	back, err := NetworkFromKernelArgs(append([]string{"console=ttyS0", "appliance.url=https://10.83.0.2:8443"}, NetworkKernelArgs(nw)...))
	if err != nil || len(back.Addresses) != 1 || back.Addresses[0] != nw.Addresses[0] || back.Gateway != nw.Gateway {
		t.Errorf("round trip: %+v, %v; want %+v", back, err, nw)
	}
	for _, bad := range []struct{ arg, want string }{
		{"appliance.address=10.83.0.21", "appliance.address=\"10.83.0.21\" is not an address with its prefix length"},
		{"appliance.gateway=router", "appliance.gateway=\"router\" is not an IP address"},
	} {
		if _, err := NetworkFromKernelArgs([]string{bad.arg}); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("NetworkFromKernelArgs(%q) = %v, want an error containing %q", bad.arg, err, bad.want)
		}
	}

	want := "# written by the node install: the NIC the machine booted from\n[Match]\nMACAddress=52:54:00:4e:49:21\n\n[Network]\n" +
		"# the node's nodes[].addresses, static: no DHCP server needed\nAddress=10.83.0.21/24\nGateway=10.83.0.1\n"
	if got := string(NetworkdFile("52-54-00-4E-49-21", nw)); got != want {
		t.Errorf("static networkd file:\n%s\nwant:\n%s", got, want)
	}
	if got := string(NetworkdFile("52:54:00:4e:49:21", Network{})); !strings.Contains(got, "MACAddress=52:54:00:4e:49:21\n") || !strings.Contains(got, "DHCP=ipv4") {
		t.Errorf("networkd file without addresses should take DHCP on the boot NIC:\n%s", got)
	}
	if got := string(NetworkdFile("", nw)); !strings.Contains(got, "Name=en* eth*") || strings.Contains(got, "Address=") {
		t.Errorf("networkd file without a boot MAC (virtual media) should take DHCP on every NIC:\n%s", got)
	}
}
