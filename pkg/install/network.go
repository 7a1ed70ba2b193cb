package install

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// Network is the installed system's network on the NIC the machine network-booted from: static when
// the inventory gives the node addresses, so that the node keeps the address the plan expects with no
// DHCP server around (boot.dhcp proxy leaves the addresses to the datacenter's DHCP, which need not
// hand out that one, and the appliance's own DHCP leases from boot.range, which holds no node address).
type Network struct {
	// Addresses are the node's addresses on the boot network, each with the prefix length of the
	// networks.controlPlane.cidrs entry that holds it (nodes[].addresses[i] 10.83.0.21 in
	// 10.83.0.0/24: 10.83.0.21/24).
	Addresses []netip.Prefix
	// Gateway is the default route's next hop: boot.router when it lies on the boot network;
	// invalid when the configuration names none.
	Gateway netip.Addr
}

// IsZero reports whether nw configures nothing (the installed system then takes DHCP).
func (nw Network) IsZero() bool { return len(nw.Addresses) == 0 && !nw.Gateway.IsValid() }

// BootNetwork is n's Network in c: n's addresses that lie inside networks.controlPlane.cidrs (the
// network the appliance network-boots on: pkg/netboot serves on the control-plane interface), with
// that CIDR's prefix length, in nodes[].addresses order, and boot.router when one of those CIDRs holds
// it. Addresses only in networks.workloadPlane.cidrs are left out: they may be on another NIC, which
// the boot gives no MAC for.
func BootNetwork(c *config.BootstrapConfiguration, n config.Node) Network {
	var nw Network
	var nets []netip.Prefix
	for _, a := range n.Addresses {
		for _, p := range c.Networks.ControlPlane.CIDRs {
			if p.Contains(a) {
				nw.Addresses = append(nw.Addresses, netip.PrefixFrom(a, p.Bits()))
				nets = append(nets, p)
				break
			}
		}
	}
	if r := c.Boot.Router; r.IsValid() {
		for _, p := range nets {
			if p.Contains(r) {
				nw.Gateway = r
				break
			}
		}
	}
	return nw
}

// Kernel arguments of Network (the boot path is plain HTTP: addresses are public data).
const (
	// AddressArg is repeated, one per Network.Addresses entry: appliance.address=10.83.0.21/24.
	AddressArg = "appliance.address"
	// GatewayArg is Network.Gateway: appliance.gateway=10.83.0.1.
	GatewayArg = "appliance.gateway"
	// MACArg names the NIC the installed system's addresses go on when the boot named none (a
	// virtual-media boot): appliance.mac=52:54:00:02:64:00, nodes[].mac, in the enrolment answer.
	MACArg = "appliance.mac"
)

// NetworkKernelArgs turns nw into kernel arguments (AddressArg, GatewayArg) for the machine's iPXE
// script; NetworkFromKernelArgs reads them back.
func NetworkKernelArgs(nw Network) []string {
	var out []string
	for _, a := range nw.Addresses {
		out = append(out, AddressArg+"="+a.String())
	}
	if nw.Gateway.IsValid() {
		out = append(out, GatewayArg+"="+nw.Gateway.String())
	}
	return out
}

// NetworkFromKernelArgs reads AddressArg and GatewayArg from the words of a kernel command line.
// Errors name the argument: an address that is not ADDRESS/PREFIX, a gateway that is not an address.
func NetworkFromKernelArgs(words []string) (Network, error) {
	var nw Network
	for _, w := range words {
		k, v, _ := strings.Cut(w, "=")
		switch k {
		case AddressArg:
			p, err := netip.ParsePrefix(v)
			if err != nil {
				return Network{}, fmt.Errorf("%s=%q is not an address with its prefix length (10.83.0.21/24): %v", AddressArg, v, err)
			}
			nw.Addresses = append(nw.Addresses, p)
		case GatewayArg:
			a, err := netip.ParseAddr(v)
			if err != nil {
				return Network{}, fmt.Errorf("%s=%q is not an IP address: %v", GatewayArg, v, err)
			}
			nw.Gateway = a
		}
	}
	return nw, nil
}

// NetworkdPath is where the installed system's boot-NIC network file goes (systemd.network(5)).
const NetworkdPath = "/etc/systemd/network/10-node-boot.network"

// NetworkdFile is the systemd-networkd .network file (systemd.network(5)) for the installed system's
// boot NIC, matched by its MAC (names can change with the kernel). With addresses in nw: Address= for
// each and Gateway= when nw has one, and no DHCP (a DHCP lease would add another address, which the
// node might take for its own). Without: DHCPv4 with the MAC as client identifier, as the live
// system had. mac "" (a virtual-media boot: no boot NIC known): every Ethernet NIC (Name=en* eth*)
// takes DHCPv4, whatever nw says.
func NetworkdFile(mac string, nw Network) []byte {
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
