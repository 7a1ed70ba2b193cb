package applianced

import (
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/config"
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
