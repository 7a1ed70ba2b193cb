package netboot

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"golang.org/x/time/rate"
)

// optIPXEEncap is iPXE's encapsulated-options option (175), which every iPXE build sends.
const optIPXEEncap = 175

// pxeVendorOptions is option 43 for a proxyDHCP offer: PXE_DISCOVERY_CONTROL (6) = 8, "boot from the
// boot file name in this offer, skip boot-server discovery" (PXE 2.1 §2.4.2.4), then End.
var pxeVendorOptions = []byte{6, 1, 8, 255}

// Limits of the unknown-MAC log: the MACs are chosen by whoever sends on the provisioning network,
// so what is remembered of them, and how often they are logged, is bounded.
const (
	// MaxUnknownMACs is how many unknown MACs are remembered as logged (least recently seen
	// forgotten first): a real network has a handful of strangers (a BMC, a switch, a laptop); a
	// flood of random MACs costs at most this many entries (about 100 KiB).
	MaxUnknownMACs = 1024
	// UnknownMACLogEvery is how often one unknown MAC is logged again while it keeps asking: once
	// per ten minutes says it is still there without a line per DHCP retry (seconds apart).
	UnknownMACLogEvery = 10 * time.Minute
	// UnknownMACLogRate (lines per second) and UnknownMACLogBurst bound the unknown-MAC lines of
	// all MACs together: a flood of random MACs is logged at one line a second after a burst of
	// 20, each line saying how many were left out since the last.
	UnknownMACLogRate  = 1
	UnknownMACLogBurst = 20
)

// dhcpResponder decides the answers. It holds the leases of ModeServer (in memory, and in
// StateDir/LeasesFile when Config.StateDir is set, so a restart keeps every machine's address) and
// the unknown MACs logged lately (bounded: MaxUnknownMACs).
type dhcpResponder struct {
	cfg      Config
	machines map[string]Machine // by MAC string
	others   map[string]Machine // Config.Others by MAC string
	addrOnly map[string]Machine // Config.AddressOnly by MAC string

	mu     sync.Mutex
	leases map[string]netip.Addr // MAC → address
	leased map[netip.Addr]string // address → MAC
	// acked holds the MACs whose lease was acknowledged (or restored from the lease file): a
	// REQUEST naming another server frees only an offer nobody acknowledged.
	acked map[string]bool

	unknowns   *lru.Cache[string, time.Time] // unknown MAC → when it was last logged
	unknownLog *rate.Limiter                 // all unknown-MAC lines together
	unlogged   int                           // unknown-MAC lines left out since the last one (mu)
	releaseLog *rate.Limiter                 // refused DHCPRELEASE lines
}

func newDHCPResponder(cfg Config) *dhcpResponder {
	unknowns, _ := lru.New[string, time.Time](MaxUnknownMACs) // errors only for a size <= 0
	r := &dhcpResponder{cfg: cfg, machines: map[string]Machine{}, others: map[string]Machine{}, addrOnly: map[string]Machine{}, leases: map[string]netip.Addr{},
		leased: map[netip.Addr]string{}, acked: map[string]bool{}, unknowns: unknowns,
		unknownLog: rate.NewLimiter(UnknownMACLogRate, UnknownMACLogBurst), releaseLog: rate.NewLimiter(1, 1)}
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

// respond returns the reply to req, which came from the IPv4 address src (the UDP source; invalid
// when unknown), or nil to stay silent, and why (for the log).
func (r *dhcpResponder) respond(req *dhcpv4.DHCPv4, src netip.Addr) (*dhcpv4.DHCPv4, string) {
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
			return nil, r.releaseFrom(mac, req, src)
		}
		return nil, "message type " + mt.String()
	}
	if sid := req.ServerIdentifier(); mt == dhcpv4.MessageTypeRequest && sid != nil && !sid.Equal(r.cfg.ServerIP.AsSlice()) {
		if r.cfg.Mode == ModeServer {
			r.declineOffer(mac) // the client chose another server's offer
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
		if mt == dhcpv4.MessageTypeRequest {
			r.mu.Lock()
			r.acked[mac] = true
			r.mu.Unlock()
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

// releaseFrom frees mac's lease for a DHCPRELEASE (RFC 2131 §4.4.6) that came from src, only when
// both its ciaddr and its source address are the leased address: a release is sent by the lease's
// holder from that address (unicast to the server), and anyone else on the segment who copies a
// node's MAC into a release must not free the node's address (the next machine to ask would get
// it, and the node's next renewal a NAK). It returns what it did, for the log.
func (r *dhcpResponder) releaseFrom(mac string, req *dhcpv4.DHCPv4, src netip.Addr) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	have, ok := r.leases[mac]
	if !ok {
		return "RELEASE of no lease"
	}
	ci, _ := netip.AddrFromSlice(req.ClientIPAddr.To4())
	if ci != have || src.Unmap() != have {
		if r.releaseLog.Allow() {
			r.cfg.Logger.Warn("netboot: DHCPRELEASE refused: it did not come from the lease's own address (logged at most once a second)",
				"mac", mac, "leased", have.String(), "ciaddr", ci.String(), "source", src.String())
		}
		return fmt.Sprintf("RELEASE refused: from %s (ciaddr %s), the lease is %s", src, ci, have)
	}
	delete(r.leases, mac)
	delete(r.leased, have)
	delete(r.acked, mac)
	r.saveLeases()
	return "RELEASE of " + have.String()
}

// declineOffer frees mac's lease when the client took another server's offer (a REQUEST naming
// another server, RFC 2131 §4.3.2), but only an offer not yet acknowledged: such a REQUEST is a
// broadcast from no address, which anyone can send with any MAC, so an acknowledged lease is kept.
func (r *dhcpResponder) declineOffer(mac string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a, ok := r.leases[mac]; ok && !r.acked[mac] {
		delete(r.leases, mac)
		delete(r.leased, a)
		r.saveLeases()
	}
}

// logUnknown logs a MAC that gets no answer (outside the inventory, or a node in Config.Others, by
// name) once per MAC per UnknownMACLogEvery (not per packet); MaxUnknownMACs are remembered, and
// all such lines together are rate-limited (UnknownMACLogRate).
func (r *dhcpResponder) logUnknown(mac, via string) {
	now := time.Now()
	if last, ok := r.unknowns.Get(mac); ok && now.Sub(last) < UnknownMACLogEvery {
		return
	}
	r.unknowns.Add(mac, now)
	r.mu.Lock()
	if !r.unknownLog.AllowN(now, 1) {
		r.unlogged++
		r.mu.Unlock()
		return
	}
	left := r.unlogged
	r.unlogged = 0
	r.mu.Unlock()
	attrs := []any{"mac", mac, "via", via}
	if left > 0 {
		attrs = append(attrs, "unknownMACsNotLogged", left)
	}
	if m, ok := r.addrOnly[mac]; ok {
		r.cfg.Logger.Info("netboot: a node booted from virtual media asked for a network boot (logged once per MAC every 10 minutes); it gets an address only", append(attrs, "node", m.Name)...)
		return
	}
	if m, ok := r.others[mac]; ok {
		r.cfg.Logger.Info("netboot: ignoring a node that does not boot from the network (logged once per MAC every 10 minutes); give it power.kind ipmi or redfish and power.bootDevice pxe if it should", append(attrs, "node", m.Name)...)
		return
	}
	r.cfg.Logger.Info("netboot: ignoring a MAC not in the inventory (logged once per MAC every 10 minutes); add it as nodes[].mac if it should boot", attrs...)
}
