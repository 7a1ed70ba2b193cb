package install

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// TestNetworkdFile: the installed system's static network becomes a networkd file that matches the
// boot NIC by MAC and carries no DHCP; without addresses DHCP on the boot NIC, without a boot MAC
// (virtual media) DHCP on every NIC.
func TestNetworkdFile(t *testing.T) {
	nw := agentapi.Network{Addresses: []netip.Prefix{netip.MustParsePrefix("10.83.0.21/24")}, Gateway: netip.MustParseAddr("10.83.0.1")}
	want := "# written by the node install: the NIC the machine booted from\n[Match]\nMACAddress=52:54:00:4e:49:21\n\n[Network]\n" +
		"# the node's nodes[].addresses, static: no DHCP server needed\nAddress=10.83.0.21/24\nGateway=10.83.0.1\n"
	if got := string(NetworkdFile("52-54-00-4E-49-21", nw)); got != want {
		t.Errorf("static networkd file:\n%s\nwant:\n%s", got, want)
	}
	if got := string(NetworkdFile("52:54:00:4e:49:21", agentapi.Network{})); !strings.Contains(got, "MACAddress=52:54:00:4e:49:21\n") || !strings.Contains(got, "DHCP=ipv4") {
		t.Errorf("networkd file without addresses should take DHCP on the boot NIC:\n%s", got)
	}
	if got := string(NetworkdFile("", nw)); !strings.Contains(got, "Name=en* eth*") || strings.Contains(got, "Address=") {
		t.Errorf("networkd file without a boot MAC (virtual media) should take DHCP on every NIC:\n%s", got)
	}
}
