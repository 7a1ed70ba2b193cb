package netboot

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// optIPXEEncap is iPXE's encapsulated-options option (175), which every iPXE build sends.
const optIPXEEncap = 175

// pxeVendorOptions is option 43 for a proxyDHCP offer: PXE_DISCOVERY_CONTROL (6) = 8, "boot from the
// boot file name in this offer, skip boot-server discovery" (PXE 2.1 §2.4.2.4), then End.
var pxeVendorOptions = []byte{6, 1, 8, 255}

// dhcpResponder decides the answers. It holds the leases of ModeServer (in memory, and in
// StateDir/LeasesFile when Config.StateDir is set, so a restart keeps every machine's address) and
// the set of unknown MACs already logged.
type dhcpResponder struct {
	cfg      Config
	machines map[string]Machine // by MAC string
	others   map[string]Machine // Config.Others by MAC string
	addrOnly map[string]Machine // Config.AddressOnly by MAC string

	mu       sync.Mutex
	leases   map[string]netip.Addr // MAC → address
	leased   map[netip.Addr]string // address → MAC
	unknowns map[string]bool       // MACs logged once
}

func newDHCPResponder(cfg Config) *dhcpResponder {
	r := &dhcpResponder{cfg: cfg, machines: map[string]Machine{}, others: map[string]Machine{}, addrOnly: map[string]Machine{}, leases: map[string]netip.Addr{},
		leased: map[netip.Addr]string{}, unknowns: map[string]bool{}}
	for _, m := range cfg.Machines {
		r.machines[m.MAC.String()] = m
	}
	for _, m := range cfg.Others {
		r.others[m.MAC.String()] = m
	}
	for _, m := range cfg.AddressOnly {
		r.addrOnly[m.MAC.String()] = m
	}
	r.loadLeases()
	return r
}

// isPXEClient: option 60 starts with "PXEClient" (PXE 2.1 §2.2.1; iPXE sends it too).
func isPXEClient(m *dhcpv4.DHCPv4) bool {
	return strings.HasPrefix(m.ClassIdentifier(), "PXEClient")
}

// isIPXE: the client is already iPXE: option 77 user class "iPXE" (raw or RFC 3004 form) or
// iPXE's option 175.
func isIPXE(m *dhcpv4.DHCPv4) bool {
	if m.Options.Has(dhcpv4.GenericOptionCode(optIPXEEncap)) {
		return true
	}
	if bytes.Contains(m.Options.Get(dhcpv4.OptionUserClassInformation), []byte("iPXE")) {
		return true
	}
	for _, uc := range m.UserClass() {
		if uc == "iPXE" {
			return true
		}
	}
	return false
}

// bootFile returns the boot file name for m from machine mc: the script URL for iPXE, else the
// iPXE binary for the client architecture (option 93; absent means BIOS, RFC 4578 §2.1). ok is
// false for an architecture we have no iPXE build for.
func (r *dhcpResponder) bootFile(m *dhcpv4.DHCPv4, mc Machine) (name string, ok bool) {
	if isIPXE(m) {
		return scriptURL(r.cfg, mc.MAC), true
	}
	arch := iana.INTEL_X86PC
	if a := m.ClientArch(); len(a) > 0 {
		arch = a[0]
	}
	switch arch {
	case iana.INTEL_X86PC:
		return BootFileBIOS, true
	case iana.EFI_X86_64, iana.EFI_BC:
		return BootFileUEFI, true
	}
	return "", false
}

// scriptURL is the HTTP URL of mac's iPXE script.
func scriptURL(c Config, mac net.HardwareAddr) string {
	return fmt.Sprintf("http://%s%s%s", netip.AddrPortFrom(c.ServerIP, c.HTTPPort), ScriptPath, mac)
}

// respond returns the reply to req, or nil to stay silent, and why (for the log).
func (r *dhcpResponder) respond(req *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, string) {
	if req.OpCode != dhcpv4.OpcodeBootRequest || len(req.ClientHWAddr) != 6 {
		return nil, "not a BOOTREQUEST from an Ethernet client"
	}
	mac := req.ClientHWAddr.String()
	mc, known := r.machines[mac]
	addressOnly := false
	if ao, ok := r.addrOnly[mac]; ok && !known {
		mc, known, addressOnly = ao, true, true
	}
	if !known {
		r.logUnknown(mac, "DHCP")
		return nil, "unknown MAC"
	}
	mt := req.MessageType()
	if mt != dhcpv4.MessageTypeDiscover && mt != dhcpv4.MessageTypeRequest {
		if mt == dhcpv4.MessageTypeRelease && r.cfg.Mode == ModeServer {
			r.release(mac)
		}
		return nil, "message type " + mt.String()
	}
	if sid := req.ServerIdentifier(); mt == dhcpv4.MessageTypeRequest && sid != nil && !sid.Equal(r.cfg.ServerIP.AsSlice()) {
		if r.cfg.Mode == ModeServer {
			r.release(mac) // the client chose another server's offer
		}
		return nil, "REQUEST for another server " + sid.String()
	}
	pxe := isPXEClient(req) && !addressOnly // an address-only machine gets no boot options
	if r.cfg.Mode == ModeProxy && !pxe {
		return nil, "proxy mode answers PXE clients only"
	}
	var file string
	if pxe {
		f, ok := r.bootFile(req, mc)
		if !ok {
			return nil, fmt.Sprintf("no iPXE build for client architecture %v", req.ClientArch())
		}
		file = f
	}
	replyType := dhcpv4.MessageTypeOffer
	if mt == dhcpv4.MessageTypeRequest {
		replyType = dhcpv4.MessageTypeAck
	}
	sip := r.cfg.ServerIP.AsSlice()
	mods := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(replyType),
		dhcpv4.WithServerIP(sip),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(sip)),
	}
	if r.cfg.Mode == ModeServer {
		addr, why := r.lease(mac, req)
		if !addr.IsValid() {
			if mt == dhcpv4.MessageTypeRequest {
				nak, err := dhcpv4.NewReplyFromRequest(req, dhcpv4.WithMessageType(dhcpv4.MessageTypeNak),
					dhcpv4.WithOption(dhcpv4.OptServerIdentifier(sip)), dhcpv4.WithOption(dhcpv4.OptMessage(why)))
				if err != nil {
					return nil, err.Error()
				}
				return nak, "NAK: " + why
			}
			return nil, why
		}
		mods = append(mods,
			dhcpv4.WithYourIP(addr.AsSlice()),
			dhcpv4.WithNetmask(net.CIDRMask(r.cfg.Subnet.Bits(), 32)),
			dhcpv4.WithLeaseTime(uint32(r.cfg.LeaseTime.Seconds())),
		)
		if r.cfg.Router.IsValid() {
			mods = append(mods, dhcpv4.WithOption(dhcpv4.OptRouter(r.cfg.Router.AsSlice())))
		}
	}
	if pxe {
		// Option 60 PXEClient marks a PXE offer (PXE 2.1 §2.2.5); in server mode it also tells iPXE
		// that this offer is complete, so it does not wait for proxyDHCP offers.
		mods = append(mods,
			dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient")),
			dhcpv4.WithOption(dhcpv4.OptBootFileName(file)))
		if r.cfg.Mode == ModeProxy {
			mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionVendorSpecificInformation, pxeVendorOptions))
		}
		// Echo the client's UUID (option 97): PXE clients drop offers without it (PXE 2.1 §2.2.5).
		if uuid := req.Options.Get(dhcpv4.OptionClientMachineIdentifier); uuid != nil {
			mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, uuid))
		}
	}
	reply, err := dhcpv4.NewReplyFromRequest(req, mods...)
	if err != nil {
		return nil, err.Error()
	}
	if pxe {
		reply.BootFileName = file
		reply.ServerHostName = r.cfg.ServerIP.String()
	}
	if addressOnly {
		file = "address only"
	}
	return reply, fmt.Sprintf("%s to %s (%s)", replyType, mc.Name, file)
}

// lease finds or allocates mac's address in ModeServer: its existing lease, else the address it
// requests (option 50 or ciaddr) when free and in range, else the lowest free address.
func (r *dhcpResponder) lease(mac string, req *dhcpv4.DHCPv4) (netip.Addr, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	want := req.RequestedIPAddress()
	if want == nil && !req.ClientIPAddr.IsUnspecified() {
		want = req.ClientIPAddr
	}
	wantAddr, _ := netip.AddrFromSlice(want.To4())
	if have, ok := r.leases[mac]; ok {
		if req.MessageType() == dhcpv4.MessageTypeRequest && wantAddr.IsValid() && wantAddr != have {
			return netip.Addr{}, fmt.Sprintf("requested %s, leased %s", wantAddr, have)
		}
		return have, ""
	}
	if r.inRange(wantAddr) && r.leased[wantAddr] == "" {
		r.leases[mac], r.leased[wantAddr] = wantAddr, mac
		r.saveLeases()
		return wantAddr, ""
	}
	if req.MessageType() == dhcpv4.MessageTypeRequest && wantAddr.IsValid() {
		return netip.Addr{}, fmt.Sprintf("requested %s is not ours to give", wantAddr)
	}
	for a := r.cfg.RangeStart; r.inRange(a); a = a.Next() {
		if r.leased[a] == "" {
			r.leases[mac], r.leased[a] = a, mac
			r.saveLeases()
			return a, ""
		}
	}
	return netip.Addr{}, fmt.Sprintf("range %s-%s is exhausted", r.cfg.RangeStart, r.cfg.RangeEnd)
}

func (r *dhcpResponder) release(mac string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a, ok := r.leases[mac]; ok {
		delete(r.leases, mac)
		delete(r.leased, a)
		r.saveLeases()
	}
}

// logUnknown logs a MAC that gets no answer (outside the inventory, or a node in Config.Others, by
// name) once per MAC (not per packet).
func (r *dhcpResponder) logUnknown(mac, via string) {
	r.mu.Lock()
	first := !r.unknowns[mac]
	r.unknowns[mac] = true
	r.mu.Unlock()
	if !first {
		return
	}
	if m, ok := r.addrOnly[mac]; ok {
		r.cfg.Logger.Info("netboot: a node booted from virtual media asked for a network boot (logged once per MAC); it gets an address only", "node", m.Name, "mac", mac, "via", via)
		return
	}
	if m, ok := r.others[mac]; ok {
		r.cfg.Logger.Info("netboot: ignoring a node that does not boot from the network (logged once per MAC); give it power.kind ipmi or redfish and power.bootDevice pxe if it should", "node", m.Name, "mac", mac, "via", via)
		return
	}
	r.cfg.Logger.Info("netboot: ignoring a MAC not in the inventory (logged once per MAC); add it as nodes[].mac if it should boot", "mac", mac, "via", via)
}
