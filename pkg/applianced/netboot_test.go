package applianced

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/netboot"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
)

// TestNetbootConfigRefusals: with boot.dhcp off serve starts nothing; with proxy, a control-plane
// network this host has no address in, or a CA that is not PEM, stops serve with the field or the
// repair to make (no listener is opened: netbootConfig runs before netboot.New).
func TestNetbootConfigRefusals(t *testing.T) {
	caPEM, _ := pkitest.Issue(t)
	log := slog.New(slog.DiscardHandler)
	cfg := config.Example()
	cfg.Boot.DHCP = config.BootDHCPOff
	if _, on, err := netbootConfig(cfg, caPEM, log); on || err != nil {
		t.Errorf("boot.dhcp off: on %t, %v; want nothing started", on, err)
	}
	cfg = config.Example()
	cfg.Networks.ControlPlane.CIDRs = []netip.Prefix{absentNetwork(t)}
	if _, _, err := netbootConfig(cfg, caPEM, log); err == nil || !strings.Contains(err.Error(), "boot.dhcp proxy serves on the control-plane network: networks.controlPlane.cidrs: ") {
		t.Errorf("no control-plane address: %v", err)
	}
	if _, err := caPin([]byte("not PEM")); err == nil || !strings.Contains(err.Error(), "run `appliance bootstrap` to repair the pki") {
		t.Errorf("CA not PEM: %v", err)
	}
}

// absentNetwork is a documentation network (RFC 5737) no interface of this host has an address in.
func absentNetwork(t *testing.T) netip.Prefix {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
next:
	for _, c := range []string{"198.51.100.0/24", "203.0.113.0/24", "192.0.2.0/24"} {
		p := netip.MustParsePrefix(c)
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(ipn.IP); ok && p.Contains(ip.Unmap()) {
					continue next
				}
			}
		}
		return p
	}
	t.Fatal("every RFC 5737 network is on an interface of this host")
	return netip.Prefix{}
}

// TestNetbootConfigMachines: which nodes the network boot answers, and how. A network-bootable node
// gets boot options; with boot.dhcp server a node booted from virtual media gets an address only
// (its live system takes DHCP where the appliance leases), with proxy it is ignored by name like a
// node that boots its disk. The control-plane network is the host's first IPv4 address, as a /32
// (read only: nothing is bound, netbootConfig only resolves it).
func TestNetbootConfigMachines(t *testing.T) {
	caPEM, _ := pkitest.Issue(t)
	log := slog.New(slog.DiscardHandler)
	var host netip.Prefix
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok && ip.Unmap().Is4() && !ip.IsLoopback() && !host.IsValid() {
				host = netip.PrefixFrom(ip.Unmap(), 32)
			}
		}
	}
	if !host.IsValid() {
		t.Fatalf("this host has no IPv4 address outside loopback: %v", addrs)
	}
	for _, mode := range []config.BootDHCP{config.BootDHCPServer, config.BootDHCPProxy} {
		cfg := config.Example()
		cfg.Networks.ControlPlane.CIDRs = []netip.Prefix{host}
		cfg.Boot.DHCP = mode
		cfg.Nodes = []config.Node{
			{Name: "cp1", MAC: "52:54:00:00:00:11", Power: config.Power{Kind: config.PowerSSH}},
			{Name: "n1", MAC: "52:54:00:00:00:21", Power: config.Power{Kind: config.PowerIPMI, BootDevice: config.BootPXE}},
			{Name: "n2", MAC: "52:54:00:00:00:22", Power: config.Power{Kind: config.PowerRedfish, BootDevice: config.BootCDROM, VirtualMediaImage: "https://appliance:8443/boot/node.iso"}},
		}
		nc, on, err := netbootConfig(cfg, caPEM, log)
		if err != nil || !on {
			t.Fatalf("%s: on %t, %v", mode, on, err)
		}
		names := func(ms []netboot.Machine) string {
			var out []string
			for _, m := range ms {
				out = append(out, m.Name)
			}
			return strings.Join(out, ",")
		}
		want := map[config.BootDHCP][3]string{config.BootDHCPServer: {"n1", "n2", "cp1"}, config.BootDHCPProxy: {"n1", "", "cp1,n2"}}[mode]
		if got := [3]string{names(nc.Machines), names(nc.AddressOnly), names(nc.Others)}; got != want {
			t.Errorf("%s: machines, address only, others = %q, want %q", mode, got, want)
		}
	}
}

// TestBootContactsNAKFloodNotedOnce is the attack of a sender of a node's MAC that asks for another
// address in every DHCPREQUEST: each NAK's text names the address asked for, and each used to be a
// new throttle key, so a new line in the node's events. All of a node's NAKs now share one key: one
// note a minute, while an OFFER is still noted beside it.
func TestBootContactsNAKFloodNotedOnce(t *testing.T) {
	store := nodestate.Open(t.TempDir())
	c := &bootContacts{store: store, log: slog.New(slog.DiscardHandler)}
	for i := range 200 {
		c.seen("w1", fmt.Sprintf("DHCP NAK: requested 10.77.%d.%d, leased 10.77.0.100", i/250, i%250))
	}
	c.seen("w1", "DHCP OFFER to w1 (undionly.kpxe)")
	evs, err := store.Events("w1")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || !strings.HasPrefix(evs[0].Detail, "network boot: DHCP NAK: requested 10.77.0.0,") || !strings.Contains(evs[1].Detail, "OFFER") {
		t.Fatalf("%d events after 200 NAKs and an OFFER, want 2 (the first NAK, the OFFER): %+v", len(evs), evs)
	}
}
