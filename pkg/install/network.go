package install

import (
	"fmt"
	"net"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// NetworkdPath is where the installed system's boot-NIC network file goes (systemd.network(5)).
const NetworkdPath = "/etc/systemd/network/10-node-boot.network"

// NetworkdFile is the systemd-networkd .network file (systemd.network(5)) for the installed system's
// boot NIC, matched by its MAC (names can change with the kernel). With addresses in nw: Address= for
// each and Gateway= when nw has one, and no DHCP (a DHCP lease would add another address, which the
// node might take for its own). Without: DHCPv4 with the MAC as client identifier, as the live
// system had. mac "" (a virtual-media boot: no boot NIC known): every Ethernet NIC (Name=en* eth*)
// takes DHCPv4, whatever nw says.
func NetworkdFile(mac string, nw agentapi.Network) []byte {
	var b strings.Builder
	b.WriteString("# written by the node install: the NIC the machine booted from\n[Match]\n")
	if mac == "" {
		b.WriteString("Name=en* eth*\n\n[Network]\nDHCP=ipv4\n")
		return []byte(b.String())
	}
	if hw, err := net.ParseMAC(mac); err == nil {
		mac = hw.String()
	}
	fmt.Fprintf(&b, "MACAddress=%s\n\n[Network]\n", mac)
	if len(nw.Addresses) == 0 {
		b.WriteString("DHCP=ipv4\n\n[DHCPv4]\nClientIdentifier=mac\n")
		return []byte(b.String())
	}
	b.WriteString("# the node's nodes[].addresses, static: no DHCP server needed\n")
	for _, a := range nw.Addresses {
		fmt.Fprintf(&b, "Address=%s\n", a)
	}
	if nw.Gateway.IsValid() {
		fmt.Fprintf(&b, "Gateway=%s\n", nw.Gateway)
	}
	return []byte(b.String())
}
