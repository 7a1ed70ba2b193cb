package netboot

import (
	"encoding/json"
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"sort"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// LeasesFile, under Config.StateDir, keeps ModeServer's leases across restarts of the service (as
// dnsmasq's dhcp-leasefile and ISC dhcpd's dhcpd.leases do): without it a restarted appliance would
// give the lowest free address to the next machine that asks, which may be the address a machine
// still holds from before the restart (RFC 2131 §4.3.1 asks a server to keep a client's binding).
const LeasesFile = "dhcp-leases.json"

// leaseRecord is one entry of LeasesFile.
type leaseRecord struct {
	// Node is the machine's node name when the lease was given (for people reading the file).
	Node    string     `json:"node"`
	MAC     string     `json:"mac"`
	Address netip.Addr `json:"address"`
}

// leasesPath is the lease file, or "" when leases are not kept (no StateDir, or not ModeServer).
func (r *dhcpResponder) leasesPath() string {
	if r.cfg.Mode != ModeServer || r.cfg.StateDir == "" {
		return ""
	}
	return filepath.Join(r.cfg.StateDir, LeasesFile)
}

// loadLeases reads the lease file into r.leases. Entries that no longer fit the configuration (a
// MAC no longer in Machines or AddressOnly, an address outside the range, an address given twice)
// are dropped and logged; an unreadable or malformed file is logged and the service starts with no
// leases (the state before this file existed): a lease file never stops network boot.
func (r *dhcpResponder) loadLeases() {
	path := r.leasesPath()
	if path == "" {
		return
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var recs []leaseRecord
	if err == nil {
		err = json.Unmarshal(b, &recs)
	}
	if err != nil {
		r.cfg.Logger.Warn("netboot: DHCP leases not restored: starting with none", "file", path, "error", err)
		return
	}
	for _, l := range recs {
		_, machine := r.machines[l.MAC]
		_, addrOnly := r.addrOnly[l.MAC]
		switch {
		case !machine && !addrOnly:
			r.cfg.Logger.Info("netboot: DHCP lease dropped: the MAC is no longer a network-booted machine of the inventory", "mac", l.MAC, "address", l.Address.String(), "node", l.Node)
		case !r.inRange(l.Address):
			r.cfg.Logger.Info("netboot: DHCP lease dropped: the address is outside boot.range now", "mac", l.MAC, "address", l.Address.String(), "node", l.Node)
		case r.leased[l.Address] != "" || r.leases[l.MAC].IsValid():
			r.cfg.Logger.Warn("netboot: DHCP lease dropped: its MAC or address is in the file twice", "mac", l.MAC, "address", l.Address.String(), "node", l.Node)
		default:
			r.leases[l.MAC], r.leased[l.Address] = l.Address, l.MAC
			r.acked[l.MAC] = true // a lease the file kept: only its holder's own release frees it
		}
	}
}

// saveLeases writes r.leases to the lease file (atomically, 0600). Called with r.mu held after every
// change. A failure is logged: the lease stands in memory and the answer still goes out.
func (r *dhcpResponder) saveLeases() {
	path := r.leasesPath()
	if path == "" {
		return
	}
	recs := make([]leaseRecord, 0, len(r.leases))
	for mac, a := range r.leases {
		name := r.machines[mac].Name
		if name == "" {
			name = r.addrOnly[mac].Name
		}
		recs = append(recs, leaseRecord{Node: name, MAC: mac, Address: a})
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Address.Less(recs[j].Address) })
	b, _ := json.MarshalIndent(recs, "", "  ")
	if _, err := atomicfile.Write(path, append(b, '\n'), 0o600); err != nil {
		r.cfg.Logger.Error("netboot: DHCP leases not saved: a restart will forget them", "file", path, "error", err)
	}
}

// acknowledged returns the address mac holds by an acknowledged lease (ModeServer: a DHCPACK sent
// for it, or a lease the file kept across a restart); ok is false for no lease, or an offer the
// machine has not yet requested.
func (r *dhcpResponder) acknowledged(mac string) (netip.Addr, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.leases[mac]
	return a, ok && r.acked[mac]
}

// inRange reports whether a is in RangeStart..RangeEnd (inclusive).
func (r *dhcpResponder) inRange(a netip.Addr) bool {
	return a.IsValid() && !a.Less(r.cfg.RangeStart) && !r.cfg.RangeEnd.Less(a)
}
