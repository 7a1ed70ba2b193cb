// Package vipcheck is the pre-flight a host runs before it first claims the API VIP with keepalived:
// it listens on the VRRP interface for advertisements (RFC 3768 VRRPv2, RFC 5798 VRRPv3) and
// ARP-probes every VIP (RFC 5227 §2.1.1: sender IP 0.0.0.0), both for a few advertisement intervals,
// and refuses the claim when another VRRP group speaks for our VRID or another host answers for our
// VIP.
//
// What it can hear: an AF_PACKET socket on the interface sees every IPv4 packet of protocol 112 that
// reaches the host, before the host firewall (which accepts VRRP from the configured peers only) —
// multicast advertisements (the RFC default, 224.0.0.18: routers, keepalived without unicast_peer)
// and unicast advertisements addressed to this host (a cluster that still lists this host's address
// as a peer). Unicast VRRP between two other hosts never reaches this port of a switch, so a foreign
// unicast group whose peers are all elsewhere stays inaudible; such a group cannot disturb ours
// either (its advertisements never reach our keepalived), except through a shared VIP, which the ARP
// probe catches. With unicast VRRP the duplicate VIP is the real damage.
//
// Legitimate speakers pass: advertisements from our own source address or a configured peer, and
// ARP answers from a peer's MAC (peers are ARP-resolved during the same window), so a control plane
// joining while the appliance holds the VIP is not refused. Callers run the pre-flight only before
// the first claim: a rerun that adopts an already-running keepalived must not pay for it.
//
// This package is the only one that imports mdlayher/arp and mdlayher/packet.
package vipcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/airgap-appliance/appliance/pkg/keepalived"
)

// Config fields the refusals tell the user to change (pkg/config BootstrapConfiguration paths): the
// API VIP's (the default) and the ingress VIP's (Options.Ingress).
const (
	FieldVRID        = "apiServer.keepalived.virtualRouterID"
	FieldVIP         = "apiServer.vip"
	FieldIngressVRID = "ingress.virtualRouterID"
	FieldIngressVIP  = "ingress.vip"
)

// DefaultIntervals is how many advertisement intervals the pre-flight listens: a master sends one
// advertisement per interval, so three intervals hear at least two of any speaker advertising at our
// interval or faster.
const DefaultIntervals = 3

// probes is how many ARP probes are sent per VIP, spread over the window (RFC 5227 PROBE_NUM).
const probes = 3

// Sentinel errors.
var (
	// ErrConflict is matched (errors.Is) by every *ConflictError.
	ErrConflict = errors.New("VRRP pre-flight conflict")
	// ErrIPv6 is returned for an IPv6 source address or VIP: the pre-flight speaks ARP and VRRP over
	// IPv4 only (the configuration refuses IPv6 networks).
	ErrIPv6 = errors.New("the VRRP pre-flight checks IPv4 only")
)

// Options describe the VRRP instance about to claim its VIPs.
type Options struct {
	// NetNSPath is the network namespace to check in, e.g. /run/netns/NAME; "" is the caller's own.
	NetNSPath string
	// Interface carries SourceIP and will carry the VIPs.
	Interface string
	// SourceIP is this host's VRRP source address (keepalived unicast_src_ip).
	SourceIP netip.Addr
	// Peers are the other speakers of our group (keepalived unicast_peer).
	Peers []netip.Addr
	// VIPs are the addresses to probe.
	VIPs []netip.Addr
	// VRID is our virtual router ID.
	VRID uint8
	// AdvertInterval is the configured advertisement interval; 0 means
	// keepalived.DefaultAdvertInterval (1 s).
	AdvertInterval time.Duration
	// Intervals is how many advertisement intervals to listen; 0 means DefaultIntervals.
	Intervals int
	// Ingress marks the instance of the ingress VIP (issue 13): conflicts name FieldIngressVRID and
	// FieldIngressVIP, and "the ingress VIP", instead of the API VIP's fields.
	Ingress bool
	// Log receives one debug record per foreign VRID heard; nil discards.
	Log *slog.Logger
}

// FromInstance is Options for one keepalived instance, checked in the namespace at nsPath.
func FromInstance(nsPath string, in keepalived.Instance) Options {
	return Options{
		NetNSPath: nsPath, Interface: in.Interface, SourceIP: in.SourceIP, Peers: slices.Clone(in.Peers),
		VIPs: []netip.Addr{in.VIP.Addr()}, VRID: in.VirtualRouterID, AdvertInterval: in.AdvertInterval,
	}
}

// Window is how long Run listens: Intervals × AdvertInterval after defaults, but never less than
// Intervals × keepalived.DefaultAdvertInterval (3 s by default). Our own interval says nothing about a
// foreign group's: VRRP's default is 1 s (RFC 3768 §5.3.7, RFC 5798 §5.2.7), so a 0.75 s window
// (3 × our 250 ms) could hear no advertisement at all from a group that kept it.
func (o Options) Window() time.Duration {
	iv, n := o.AdvertInterval, o.Intervals
	if iv <= 0 {
		iv = keepalived.DefaultAdvertInterval
	}
	if n <= 0 {
		n = DefaultIntervals
	}
	return time.Duration(n) * max(iv, keepalived.DefaultAdvertInterval)
}

// fields are the configuration fields a conflict names, and the VIP's name in messages.
func (o Options) fields() (vrid, vip, name string) {
	if o.Ingress {
		return FieldIngressVRID, FieldIngressVIP, "ingress VIP"
	}
	return FieldVRID, FieldVIP, "API VIP"
}

// ConflictError is one speaker that stops the claim.
type ConflictError struct {
	// Interface the speaker was heard on.
	Interface string
	// Field is the configuration field to change: FieldVRID or FieldVIP (FieldIngressVRID or
	// FieldIngressVIP for the ingress VIP's instance). VRID conflicts carry Advert, VIP conflicts MAC.
	Field string
	// Name is the VIP's name in the message: "API VIP" (also when empty) or "ingress VIP".
	Name string
	// Speaker is the address the speaker used: the advertisement's source (VRID conflicts), or the
	// host's own address when it is known from other ARP traffic or the neighbour table (VIP
	// conflicts; invalid when unknown).
	Speaker netip.Addr
	// MAC of the host that answered for the VIP (VIP conflicts only).
	MAC net.HardwareAddr
	// VRID conflicts: the advertisement heard (our VRID).
	Advert *Advert
	// VIP conflicts: the VIP answered for.
	VIP netip.Addr
	// Peers are our configured peers, for the message.
	Peers []netip.Addr
}

func (e *ConflictError) Error() string {
	var b strings.Builder
	peers := "none"
	if len(e.Peers) > 0 {
		ps := make([]string, len(e.Peers))
		for i, p := range e.Peers {
			ps[i] = p.String()
		}
		peers = strings.Join(ps, ", ")
	}
	if e.Advert != nil {
		a := e.Advert
		fmt.Fprintf(&b, "VRRP virtual router ID %d is already in use on %s: %s advertises it (VRRPv%d, priority %d",
			a.VRID, e.Interface, e.Speaker, a.Version, a.Priority)
		if len(a.Addresses) > 0 {
			fmt.Fprintf(&b, ", for %s", joinAddrs(a.Addresses))
		}
		fmt.Fprintf(&b, ") and is not one of this cluster's VRRP peers (%s); set %s to a VRID no other VRRP group on this segment uses (1..255)",
			peers, e.Field)
		return b.String()
	}
	name := e.Name
	if name == "" {
		name = "API VIP"
	}
	fmt.Fprintf(&b, "the %s %s is already in use on %s: the host with MAC %s", name, e.VIP, e.Interface, e.MAC)
	if e.Speaker.IsValid() {
		fmt.Fprintf(&b, " (%s)", e.Speaker)
	}
	fmt.Fprintf(&b, " answered an ARP probe for it and is not one of this cluster's VRRP peers (%s); set %s to an address no host uses, or free %s on that host",
		peers, e.Field, e.VIP)
	return b.String()
}

// Is makes every ConflictError match ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// Result is what Run heard.
type Result struct {
	// Window is how long Run listened; Took is the whole run (opening sockets included).
	Window, Took time.Duration
	// Adverts counts the advertisements for our VRID from ourselves or a peer.
	Adverts int
	// OtherVRIDs are the other VRIDs advertised on the segment (sorted): no conflict, but worth a log
	// line when choosing a VRID.
	OtherVRIDs []uint8
	// PeerMACs are the peers that answered our ARP requests.
	PeerMACs map[netip.Addr]net.HardwareAddr
	// Holders maps a VIP to the peer that answered for it (a peer holds it already), if any.
	Holders map[netip.Addr]netip.Addr
}

// Run listens on o.Interface for o.Window() while ARP-probing every VIP (three probes spread over
// the window, RFC 5227 §2.1.1: sender IP 0.0.0.0, target hardware address zero) and ARP-resolving
// every peer. It returns what it heard and, when a speaker that is not ours was heard, every such
// speaker at once (errors.Join of *ConflictError, each matching ErrConflict). Other errors: the
// interface or namespace is missing, the sockets cannot be opened (CAP_NET_RAW is needed), ErrIPv6,
// or ctx ended.
func Run(ctx context.Context, o Options) (Result, error) {
	start := time.Now()
	res := Result{Window: o.Window(), PeerMACs: map[netip.Addr]net.HardwareAddr{}, Holders: map[netip.Addr]netip.Addr{}}
	if !o.SourceIP.Is4() {
		return res, fmt.Errorf("%w: source address %s", ErrIPv6, o.SourceIP)
	}
	for _, v := range o.VIPs {
		if !v.Is4() {
			return res, fmt.Errorf("%w: VIP %s", ErrIPv6, v)
		}
	}
	var (
		ifi  *net.Interface
		vrrp *packet.Conn
		arpc *arp.Client
	)
	err := inNetNS(o.NetNSPath, func() error {
		var err error
		if ifi, err = net.InterfaceByName(o.Interface); err != nil {
			return fmt.Errorf("interface %s: %w", o.Interface, err)
		}
		if vrrp, err = listenVRRP(ifi); err != nil {
			return err
		}
		p, err := packet.Listen(ifi, packet.Raw, unix.ETH_P_ARP, nil)
		if err != nil {
			_ = vrrp.Close()
			return fmt.Errorf("open an ARP socket on %s: %w", o.Interface, err)
		}
		if arpc, err = arp.New(ifi, p); err != nil { // reads the interface's addresses: in the namespace
			_ = vrrp.Close()
			_ = p.Close()
			return fmt.Errorf("ARP on %s: %w", o.Interface, err)
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("VRRP pre-flight in %s: %w", nsName(o.NetNSPath), err)
	}
	defer vrrp.Close()
	defer arpc.Close()
	deadline := time.Now().Add(res.Window)
	_ = vrrp.SetReadDeadline(deadline)
	_ = arpc.SetReadDeadline(deadline)
	stop := context.AfterFunc(ctx, func() {
		_ = vrrp.SetReadDeadline(time.Now())
		_ = arpc.SetReadDeadline(time.Now())
	})
	defer stop()

	var (
		wg      sync.WaitGroup
		adverts []Advert
		seen    []*arp.Packet
		rerr    [2]error
	)
	wg.Add(2)
	go func() { defer wg.Done(); adverts, rerr[0] = readAdverts(vrrp) }()
	go func() { defer wg.Done(); seen, rerr[1] = readARP(arpc, ifi.HardwareAddr) }()
	werr := sendProbes(ctx, arpc, ifi.HardwareAddr, o, res.Window)
	wg.Wait()
	res.Took = time.Since(start)
	if ctx.Err() != nil {
		return res, fmt.Errorf("VRRP pre-flight: %w", ctx.Err())
	}
	if err := errors.Join(werr, rerr[0], rerr[1]); err != nil {
		return res, fmt.Errorf("VRRP pre-flight on %s: %w", o.Interface, err)
	}
	return res, judge(&res, o, ifi.HardwareAddr, adverts, seen)
}

// judge fills res from what was heard and returns the conflicts.
func judge(res *Result, o Options, own net.HardwareAddr, adverts []Advert, seen []*arp.Packet) error {
	ours := func(a netip.Addr) bool { return a == o.SourceIP || slices.Contains(o.Peers, a) }
	var errs []error
	other := map[uint8]bool{}
	reported := map[netip.Addr]bool{}
	for _, a := range adverts {
		switch {
		case a.VRID != o.VRID:
			if !other[a.VRID] {
				other[a.VRID] = true
				o.log().Debug("VRRP pre-flight heard another VRID", "vrid", a.VRID, "speaker", a.Source)
			}
		case ours(a.Source):
			res.Adverts++
		case !reported[a.Source]:
			reported[a.Source] = true
			adv := a
			field, _, name := o.fields()
			errs = append(errs, &ConflictError{Interface: o.Interface, Field: field, Name: name, Speaker: a.Source, Advert: &adv, Peers: o.Peers})
		}
	}
	for v := range other {
		res.OtherVRIDs = append(res.OtherVRIDs, v)
	}
	slices.Sort(res.OtherVRIDs)

	// MACs by the addresses they spoke for: peers, and every host's own address (to name a speaker).
	ipOf := map[string]netip.Addr{}
	for _, p := range seen {
		ip := p.SenderIP
		if !ip.IsValid() || ip.IsUnspecified() || slices.Contains(o.VIPs, ip) {
			continue
		}
		if slices.Contains(o.Peers, ip) {
			res.PeerMACs[ip] = p.SenderHardwareAddr
		}
		ipOf[p.SenderHardwareAddr.String()] = ip
	}
	peerMAC := func(mac net.HardwareAddr) (netip.Addr, bool) {
		for ip, m := range res.PeerMACs {
			if bytes.Equal(m, mac) {
				return ip, true
			}
		}
		return netip.Addr{}, false
	}
	answered := map[string]bool{}
	for _, p := range seen {
		// A reply for a VIP, or a host announcing a VIP as its own (gratuitous ARP: a VRRP master
		// taking over).
		if !slices.Contains(o.VIPs, p.SenderIP) || bytes.Equal(p.SenderHardwareAddr, own) {
			continue
		}
		key := p.SenderIP.String() + "/" + p.SenderHardwareAddr.String()
		if answered[key] {
			continue
		}
		answered[key] = true
		if peer, ok := peerMAC(p.SenderHardwareAddr); ok {
			res.Holders[p.SenderIP] = peer
			continue
		}
		speaker, ok := ipOf[p.SenderHardwareAddr.String()]
		if !ok {
			speaker = neighbourOf(o.NetNSPath, o.Interface, p.SenderHardwareAddr)
		}
		if slices.Contains(o.Peers, speaker) { // a peer the neighbour table knows, silent to our requests
			res.Holders[p.SenderIP] = speaker
			continue
		}
		_, field, name := o.fields()
		errs = append(errs, &ConflictError{Interface: o.Interface, Field: field, Name: name, Speaker: speaker,
			MAC: slices.Clone(p.SenderHardwareAddr), VIP: p.SenderIP, Peers: o.Peers})
	}
	return errors.Join(errs...)
}

func (o Options) log() *slog.Logger {
	if o.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Log
}

// listenVRRP opens a cooked AF_PACKET socket for IPv4 on ifi that keeps only protocol 112 (a BPF
// filter in the kernel, so a busy interface costs nothing), and joins the VRRP Ethernet group so
// multicast advertisements reach it. It sees packets before the host firewall does.
func listenVRRP(ifi *net.Interface) (*packet.Conn, error) {
	filter, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 9, Size: 1}, // IPv4 header: protocol (cooked socket: no link header)
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: ProtocolVRRP, SkipFalse: 1},
		bpf.RetConstant{Val: 0xffff},
		bpf.RetConstant{Val: 0},
	})
	if err != nil {
		return nil, fmt.Errorf("assemble the VRRP filter: %w", err)
	}
	c, err := packet.Listen(ifi, packet.Datagram, unix.ETH_P_IP, &packet.Config{Filter: filter})
	if err != nil {
		return nil, fmt.Errorf("open a VRRP listening socket on %s: %w", ifi.Name, err)
	}
	rc, err := c.SyscallConn()
	if err == nil {
		cerr := rc.Control(func(fd uintptr) {
			err = unix.SetsockoptPacketMreq(int(fd), unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, &unix.PacketMreq{
				Ifindex: int32(ifi.Index), Type: unix.PACKET_MR_MULTICAST, Alen: 6, Address: vrrpGroupMAC,
			})
		})
		err = errors.Join(err, cerr)
	}
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("join the VRRP multicast group on %s: %w", ifi.Name, err)
	}
	return c, nil
}

// readAdverts reads VRRP advertisements until the read deadline.
func readAdverts(c *packet.Conn) ([]Advert, error) {
	var out []Advert
	buf := make([]byte, 1500)
	for {
		n, _, err := c.ReadFrom(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out, nil
		} else if err != nil {
			return out, err
		}
		h, err := ipv4.ParseHeader(buf[:n])
		if err != nil || h.Protocol != ProtocolVRRP || h.Len > n {
			continue
		}
		end := min(max(h.TotalLen, h.Len), n)
		a, err := ParseAdvert(buf[h.Len:end], false)
		if err != nil {
			continue
		}
		a.Source, _ = netip.AddrFromSlice(h.Src.To4())
		out = append(out, a)
	}
}

// readARP reads ARP packets other hosts sent until the read deadline.
func readARP(c *arp.Client, own net.HardwareAddr) ([]*arp.Packet, error) {
	var out []*arp.Packet
	for {
		p, _, err := c.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out, nil
		} else if err != nil {
			return out, err
		}
		if !bytes.Equal(p.SenderHardwareAddr, own) {
			out = append(out, p)
		}
	}
}

// sendProbes sends, at the start and then evenly over the window, an RFC 5227 probe for every VIP
// and an ARP request (from SourceIP) for every peer.
func sendProbes(ctx context.Context, c *arp.Client, own net.HardwareAddr, o Options, window time.Duration) error {
	zero := make(net.HardwareAddr, 6)
	for i := range probes {
		for _, v := range o.VIPs {
			p, err := arp.NewPacket(arp.OperationRequest, own, netip.IPv4Unspecified(), zero, v)
			if err == nil {
				err = c.WriteTo(p, ethernet.Broadcast)
			}
			if err != nil {
				return fmt.Errorf("ARP probe for %s: %w", v, err)
			}
		}
		for _, peer := range o.Peers {
			if !peer.Is4() {
				continue
			}
			p, err := arp.NewPacket(arp.OperationRequest, own, o.SourceIP, zero, peer)
			if err == nil {
				err = c.WriteTo(p, ethernet.Broadcast)
			}
			if err != nil {
				return fmt.Errorf("ARP request for peer %s: %w", peer, err)
			}
		}
		if i == probes-1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil // Run reports ctx's error
		case <-time.After(window / probes):
		}
	}
	return nil
}

// neighbourOf returns the IPv4 address the neighbour table of the namespace at nsPath knows mac by on
// iface, or the zero Addr.
func neighbourOf(nsPath, iface string, mac net.HardwareAddr) netip.Addr {
	var (
		h   *netlink.Handle
		err error
	)
	if nsPath == "" {
		h, err = netlink.NewHandle()
	} else {
		var ns netns.NsHandle
		if ns, err = netns.GetFromPath(nsPath); err != nil {
			return netip.Addr{}
		}
		defer ns.Close()
		h, err = netlink.NewHandleAt(ns)
	}
	if err != nil {
		return netip.Addr{}
	}
	defer h.Close()
	link, err := h.LinkByName(iface)
	if err != nil {
		return netip.Addr{}
	}
	neighs, err := h.NeighList(link.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}
	}
	for _, n := range neighs {
		if bytes.Equal(n.HardwareAddr, mac) {
			if ip, ok := netip.AddrFromSlice(n.IP.To4()); ok {
				return ip
			}
		}
	}
	return netip.Addr{}
}

// inNetNS runs fn on a goroutine whose OS thread entered the namespace at path ("" = run fn here).
// Sockets fn opens belong to that namespace for their whole life. The thread is never unlocked: it
// dies with the goroutine instead of going back to the pool in another namespace.
func inNetNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		h, err := netns.GetFromPath(path)
		if err != nil {
			errc <- fmt.Errorf("open network namespace %s: %w", path, err)
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter network namespace %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func nsName(path string) string {
	if path == "" {
		return "this network namespace"
	}
	return "network namespace " + path
}

// KeepalivedRunning reports whether a keepalived of ours already runs from dir (the directory
// keepalived.Process uses): the PID in dir/running.json (a Detached keepalived's record) or in
// dir/keepalived.pid is alive and is keepalived (/proc/PID/comm). Callers skip the pre-flight then:
// only the first claim is checked, and our own running keepalived is no conflict.
func KeepalivedRunning(dir string) (int, bool) {
	pids := []int{}
	if b, err := os.ReadFile(filepath.Join(dir, "running.json")); err == nil {
		var rec struct {
			PID int `json:"pid"`
		}
		if json.Unmarshal(b, &rec) == nil {
			pids = append(pids, rec.PID)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "keepalived.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			pids = append(pids, pid)
		}
	}
	for _, pid := range pids {
		if pid <= 1 {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err == nil && strings.TrimSpace(string(comm)) == "keepalived" {
			return pid, true
		}
	}
	return 0, false
}
