// Package netresolve maps the configured control-plane and workload-plane CIDR lists to this host's
// interface addresses, read over rtnetlink (github.com/vishvananda/netlink).
//
// A Resolver reads one network namespace through a netlink socket opened in it (netlink.NewHandleAt),
// so callers never move an OS thread between namespaces.
//
// Which addresses count ("usable"): global scope (RT_SCOPE_UNIVERSE: not loopback, not link-local), on
// an interface that is administratively up (IFF_UP), and for IPv6 not tentative (duplicate address
// detection still running) nor dadfailed (a duplicate exists on the link): the kernel refuses to bind
// tentative and dadfailed addresses, and an administratively down interface carries no traffic. An
// interface that is up without carrier (cable out, switch port down) still counts: carrier comes and
// goes, and the choice of serving address must not flap with it. Skipped addresses are still listed,
// with the reason, in ErrNoMatch messages so the operator sees why they were not chosen.
package netresolve

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// dumpAttempts bounds the retries of a netlink dump the kernel interrupted because the address or link
// table changed mid-dump (NLM_F_DUMP_INTR, reported as netlink.ErrDumpInterrupted).
const dumpAttempts = 5

// ErrNoMatch reports that no usable local address lies in any of the given CIDRs. The wrapping error
// lists the CIDRs and every global-scope address of the host, e.g. "no local address in the configured
// CIDRs [10.9.0.0/24]; this host has: eth0 10.100.0.2/24, eth1 10.200.0.2/24 (interface down)".
var ErrNoMatch = errors.New("no local address in the configured CIDRs")

// Address is one interface address.
type Address struct {
	// Interface is the interface name, e.g. "eth0".
	Interface string
	// Prefix is the address with its on-link prefix length, e.g. 10.100.0.2/24 (not masked).
	Prefix netip.Prefix
	// CIDR is the configured CIDR the address matched in Resolve; the zero Prefix from Addresses.
	CIDR netip.Prefix
}

// String returns "eth0 10.100.0.2/24".
func (a Address) String() string { return a.Interface + " " + a.Prefix.String() }

// Resolver reads the addresses of one network namespace. It is safe for concurrent use.
type Resolver struct {
	mu sync.Mutex
	h  *netlink.Handle
}

// New opens a rtnetlink socket in the network namespace at nsPath (e.g. /run/netns/NAME or
// /proc/PID/ns/net), or in the calling process's namespace when nsPath is "". The socket stays bound to
// that namespace for the Resolver's life, even if the path is unmounted. Close releases it.
func New(nsPath string) (*Resolver, error) {
	ns := netns.None()
	if nsPath != "" {
		h, err := netns.GetFromPath(nsPath)
		if err != nil {
			return nil, fmt.Errorf("open network namespace %s: %w", nsPath, err)
		}
		defer h.Close()
		ns = h
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		where := nsPath
		if where == "" {
			where = "the current network namespace"
		}
		return nil, fmt.Errorf("open rtnetlink socket in %s: %w", where, err)
	}
	return &Resolver{h: h}, nil
}

// Close releases the netlink socket. It is safe to call more than once.
func (r *Resolver) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h != nil {
		r.h.Close()
		r.h = nil
	}
	return nil
}

// hostAddr is one global-scope address with what decides whether it is usable.
type hostAddr struct {
	Address
	index int    // interface index
	skip  string // why it is not usable ("" when usable)
}

func (a hostAddr) describe() string {
	if a.skip != "" {
		return a.String() + " (" + a.skip + ")"
	}
	return a.String()
}

// Addresses returns every usable global-scope address (see the package comment), ordered by interface
// index (the order `ip address` shows) and then by address (IPv4 before IPv6). CIDR is zero.
func (r *Resolver) Addresses() ([]Address, error) {
	all, err := r.list()
	if err != nil {
		return nil, err
	}
	sortByInterfaceThenAddr(all)
	var out []Address
	for _, a := range all {
		if a.skip == "" {
			out = append(out, a.Address)
		}
	}
	return out, nil
}

// Resolve returns the first usable address inside the CIDRs: for each CIDR in order, interfaces in
// index order, and on each interface the addresses in the kernel's order (IPv4 first; the primary
// address before secondaries), skipping every address equal to one in exclude (pass the VIP: it may
// already sit on this host and must never be chosen as the host's own address). The result's CIDR is
// the CIDR that matched.
//
// It returns an error wrapping ErrNoMatch, listing the CIDRs and all global-scope host addresses (with
// why any was skipped), when nothing matches; an error for an empty list or an invalid CIDR; and netlink
// errors wrapped.
func (r *Resolver) Resolve(cidrs []netip.Prefix, exclude ...netip.Addr) (Address, error) {
	if len(cidrs) == 0 {
		return Address{}, errors.New("resolve local address: no CIDRs given")
	}
	for i, c := range cidrs {
		if !c.IsValid() {
			return Address{}, fmt.Errorf("resolve local address: CIDR %d is invalid", i)
		}
	}
	all, err := r.list()
	if err != nil {
		return Address{}, err
	}
	excluded := func(a netip.Addr) bool {
		return slices.ContainsFunc(exclude, func(x netip.Addr) bool { return x.Unmap() == a })
	}
	for _, c := range cidrs {
		for _, a := range all {
			if a.skip == "" && c.Contains(a.Prefix.Addr()) && !excluded(a.Prefix.Addr()) {
				a.CIDR = c
				return a.Address, nil
			}
		}
	}
	// Report in the same order as Addresses, marking excluded ones.
	sortByInterfaceThenAddr(all)
	var have []string
	for _, a := range all {
		if a.skip == "" && excluded(a.Prefix.Addr()) {
			a.skip = "excluded"
		}
		have = append(have, a.describe())
	}
	host := "this host has no global-scope addresses"
	if len(have) > 0 {
		host = "this host has: " + strings.Join(have, ", ")
	}
	return Address{}, fmt.Errorf("%w %v; %s", ErrNoMatch, cidrs, host)
}

// list returns every global-scope address, interfaces in index order and each interface's addresses in
// kernel order, retrying dumps the kernel interrupted.
func (r *Resolver) list() ([]hostAddr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h == nil {
		return nil, errors.New("netresolve: resolver is closed")
	}
	var (
		links []netlink.Link
		addrs []netlink.Addr
	)
	err := retryInterrupted(dumpAttempts, func() error {
		var err error
		if links, err = r.h.LinkList(); err != nil {
			return fmt.Errorf("list interfaces: %w", err)
		}
		if addrs, err = r.h.AddrList(nil, netlink.FAMILY_ALL); err != nil {
			return fmt.Errorf("list addresses: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	byIndex := make(map[int]*netlink.LinkAttrs, len(links))
	for _, l := range links {
		byIndex[l.Attrs().Index] = l.Attrs()
	}
	var out []hostAddr
	for _, a := range addrs {
		if a.Scope != unix.RT_SCOPE_UNIVERSE || a.IPNet == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		ha := hostAddr{Address: Address{Prefix: netip.PrefixFrom(ip.Unmap(), ones)}, index: a.LinkIndex}
		attrs := byIndex[a.LinkIndex]
		switch {
		case attrs == nil: // the link appeared after the link dump; only a retry would name it
			ha.Interface = fmt.Sprintf("if%d", a.LinkIndex)
			ha.skip = "interface vanished"
		case attrs.Flags&net.FlagUp == 0:
			ha.Interface = attrs.Name
			ha.skip = "interface down"
		default:
			ha.Interface = attrs.Name
		}
		switch {
		case ha.skip != "":
		case a.Flags&unix.IFA_F_DADFAILED != 0:
			ha.skip = "duplicate address detected"
		case a.Flags&unix.IFA_F_TENTATIVE != 0:
			ha.skip = "tentative"
		}
		out = append(out, ha)
	}
	slices.SortStableFunc(out, func(x, y hostAddr) int { return cmp.Compare(x.index, y.index) })
	return out, nil
}

// sortByInterfaceThenAddr orders addresses by interface index, then by address.
func sortByInterfaceThenAddr(all []hostAddr) {
	slices.SortStableFunc(all, func(x, y hostAddr) int {
		return cmp.Or(cmp.Compare(x.index, y.index), x.Prefix.Addr().Compare(y.Prefix.Addr()))
	})
}

// retryInterrupted runs dump up to attempts times while it fails with netlink.ErrDumpInterrupted (its
// partial results are inconsistent and discarded), returning the last error otherwise.
func retryInterrupted(attempts int, dump func() error) error {
	var err error
	for range attempts {
		if err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return err
		}
	}
	return fmt.Errorf("address table kept changing during %d netlink dumps: %w", attempts, err)
}
