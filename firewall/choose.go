package firewall

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"time"
)

// Backend names, as Backend.Name returns them and ChooseOptions.Backend takes them.
const (
	BackendNFTables  = "nftables"
	BackendFirewalld = "firewalld"
)

// ChooseOptions say where the firewall is to be installed.
type ChooseOptions struct {
	// NetNSPath is the network namespace the firewall is for ("" = the caller's own), as NFTables.NetNSPath.
	NetNSPath string
	// BusAddress is the D-Bus address of the system bus to look for firewalld on; "" = the system bus
	// (DBUS_SYSTEM_BUS_ADDRESS, else unix:path=/run/dbus/system_bus_socket).
	BusAddress string
	// Backend forces a backend: BackendNFTables or BackendFirewalld; "" chooses automatically.
	Backend string
	// Timeout bounds the look-up on the bus; 0 means 5 s.
	Timeout time.Duration
	// Log is handed to the backend; nil discards.
	Log *slog.Logger
}

// Choose returns the backend for a host, and why: Firewalld when firewalld runs — its name
// org.fedoraproject.FirewallD1 has an owner on the system bus and, when its process is visible here, that process
// is in the target network namespace (a firewalld on this machine's bus manages its own namespace, not a lab
// namespace) — else NFTables. No system bus (socket absent or refusing connections) means no firewalld.
//
// Errors: an unknown opts.Backend; a bus that exists but does not answer within the timeout (wraps
// ErrFirewalldUnavailable: firewalld may run behind it, and the nftables backend would then be useless).
func Choose(ctx context.Context, opts ChooseOptions) (Backend, string, error) {
	nft := &NFTables{NetNSPath: opts.NetNSPath, Log: opts.Log}
	fwd := &Firewalld{BusAddress: opts.BusAddress, NetNSPath: opts.NetNSPath, Log: opts.Log}
	switch opts.Backend {
	case BackendNFTables:
		return nft, "forced", nil
	case BackendFirewalld:
		return fwd, "forced", nil
	case "":
	default:
		return nil, "", fmt.Errorf("firewall backend %q: want %q, %q or empty (automatic)", opts.Backend, BackendNFTables, BackendFirewalld)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	addr := fwd.address()
	conn, err := connectBus(ctx, addr, timeout)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nft, "no D-Bus system bus at " + addr, nil
		}
		return nil, "", fmt.Errorf("%w: cannot tell whether firewalld runs: %w", ErrFirewalldUnavailable, err)
	}
	defer func() { _ = conn.Close() }()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var has bool
	if err := conn.BusObject().CallWithContext(cctx, "org.freedesktop.DBus.NameHasOwner", 0, FirewalldBusName).Store(&has); err != nil {
		return nil, "", fmt.Errorf("%w: ask the bus at %s whether firewalld runs: %w", ErrFirewalldUnavailable, addr, err)
	}
	if !has {
		return nft, "firewalld not running (" + FirewalldBusName + " has no owner on " + addr + ")", nil
	}
	if opts.BusAddress == "" {
		var pid uint32
		err := conn.BusObject().CallWithContext(cctx, "org.freedesktop.DBus.GetConnectionUnixProcessID", 0, FirewalldBusName).Store(&pid)
		if err == nil {
			if same, known := sameNetNS(fmt.Sprintf("/proc/%d/ns/net", pid), opts.NetNSPath); known && !same {
				return nft, fmt.Sprintf("firewalld (pid %d) runs in another network namespace", pid), nil
			}
		}
	}
	return fwd, "firewalld runs (" + FirewalldBusName + " owned on " + addr + ")", nil
}

// sameNetNS compares the namespace file a with the target (path, or this process's namespace for "").
// known is false when either cannot be read.
func sameNetNS(a, target string) (same, known bool) {
	if target == "" {
		target = "/proc/self/ns/net"
	}
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(target)
	if err1 != nil || err2 != nil {
		return false, false
	}
	return os.SameFile(sa, sb), true
}

// systemBusAddress is godbus's choice of system bus: DBUS_SYSTEM_BUS_ADDRESS, else the well-known socket.
func systemBusAddress() string {
	if a := os.Getenv("DBUS_SYSTEM_BUS_ADDRESS"); a != "" {
		return a
	}
	return "unix:path=/run/dbus/system_bus_socket"
}

// BackendOfDetail returns the backend named in a firewall report detail ("nftables", "firewalld"), or "" when
// it names none (an older hostagent's detail, a skipped step). Details name it as their first word after an
// optional "unchanged: ", "replaced " or "would replace " (see Describe).
func BackendOfDetail(detail string) string {
	for _, w := range strings.Fields(detail) {
		switch strings.Trim(w, ":,;()") {
		case BackendNFTables:
			return BackendNFTables
		case BackendFirewalld:
			return BackendFirewalld
		}
	}
	// A detail written before backends were named: "unchanged: table inet appliance: ...".
	if strings.Contains(detail, "table inet ") {
		return BackendNFTables
	}
	return ""
}

// Describe is the report detail of a firewall install: "BACKEND (OBJECTS): roles R, N node networks, M VRRP
// peers", then, when the roles have ports capped per source (Port.ConnsPerSource), ", at most C connections
// per source to PORTS" and, for firewalld, where the caps are ("in table inet appliance-conncap"), e.g.
// "firewalld (zone appliance, policy appliance-host): roles [bootstrap], 1 node networks, 3 VRRP peers, at
// most 80 connections per source to 8443/tcp in table inet appliance-conncap".
func Describe(b Backend, s Spec) string {
	d := fmt.Sprintf("%s (%s): roles %v, %d node networks, %d VRRP peers", b.Name(), b.Objects(), s.Roles,
		len(s.NodeNetworks), len(s.VRRPPeers))
	var caps []int
	ports := map[int][]string{}
	for _, p := range s.ports() {
		if p.ConnsPerSource > 0 && p.Protocol == ProtoTCP {
			if _, ok := ports[p.ConnsPerSource]; !ok {
				caps = append(caps, p.ConnsPerSource)
			}
			ports[p.ConnsPerSource] = append(ports[p.ConnsPerSource], p.PortRange()+"/"+p.Protocol)
		}
	}
	for _, c := range caps {
		d += fmt.Sprintf(", at most %d connections per source to %s", c, strings.Join(ports[c], ", "))
	}
	if f, ok := b.(*Firewalld); ok && len(caps) > 0 {
		d += " in " + f.capTable().Objects()
	}
	return d
}
