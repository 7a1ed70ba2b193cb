package firewall

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/godbus/dbus/v5"
)

// firewalld's D-Bus API (firewalld.dbus(5), firewalld 1.3; interface revision 15).
const (
	// FirewalldBusName is the name firewalld owns on the system bus while it runs.
	FirewalldBusName = "org.fedoraproject.FirewallD1"

	fwdPath         = dbus.ObjectPath("/org/fedoraproject/FirewallD1")
	fwdPathConfig   = dbus.ObjectPath("/org/fedoraproject/FirewallD1/config")
	fwdIface        = "org.fedoraproject.FirewallD1"
	fwdIfaceZone    = fwdIface + ".zone"
	fwdIfacePolicy  = fwdIface + ".policy"
	fwdIfaceConfig  = fwdIface + ".config"
	fwdIfaceCfgZone = fwdIfaceConfig + ".zone"
	fwdIfaceCfgPol  = fwdIfaceConfig + ".policy"
)

// DefaultFirewalldZone is the zone the firewalld backend owns; its policy is DefaultFirewalldZone + "-host".
const DefaultFirewalldZone = "appliance"

// DefaultCallTimeout bounds one D-Bus call to firewalld (a reload of a large configuration takes seconds).
const DefaultCallTimeout = 30 * time.Second

// firewalldPolicyPriority places the policy before every zone (negative priorities run first, firewalld.policy(5)).
const firewalldPolicyPriority int32 = -100

// firewalldMark starts the description of every zone and policy the backend creates: Apply and Remove refuse to
// touch an object of the same name whose description does not start with it.
const firewalldMark = "Managed by the airgap appliance (github.com/airgap-appliance/appliance/firewall)"

var (
	// ErrFirewalldUnavailable is wrapped by every error that means firewalld did not answer on D-Bus: no bus,
	// firewalld not running (its name has no owner), or a call that timed out.
	ErrFirewalldUnavailable = errors.New("firewalld does not answer on D-Bus")
	// ErrNotOurs is wrapped when the zone or policy name is taken by an object the appliance did not create.
	ErrNotOurs = errors.New("firewalld object not created by the appliance")
	// ErrSourceConflict is wrapped when a node network is already a source of another firewalld zone (a source
	// belongs to one zone only).
	ErrSourceConflict = errors.New("node network bound to another firewalld zone")
)

// Firewalld installs a Spec into firewalld through its D-Bus API, for hosts where firewalld runs (firewalld owns
// nftables there: its own table drops what it does not allow, whatever another table accepts). It owns two
// firewalld objects, both marked with firewalldMark in their description, in the permanent configuration
// (surviving `firewall-cmd --reload` and restarts) and in the runtime one:
//
//   - zone Zone (default "appliance"), sources = the node networks, target default (reject), holding the
//     SourceNodeNetworks ports: firewalld classifies a packet from a node network into this zone only, so from
//     the node networks exactly the port table is open;
//   - policy Zone+"-host", ingress ANY, egress HOST, priority -100 (before every zone), target CONTINUE,
//     holding the SourceAnywhere ports and one rich rule per VRRP peer (`protocol value="112"`): these are
//     accepted whatever zone the packet was classified into; everything else falls through to the zones.
//
// firewalld has no per-source count of open connections, so the caps of the port table (Port.ConnsPerSource)
// go into an nftables table of the backend's own beside firewalld's, table inet appliance-conncap
// (connCapTable), holding nothing else; it is written after firewalld's objects, diffed first like them, and
// removed when the host's roles have no capped port.
//
// Apply reads both configurations (10 calls), writes only what differs — the permanent zone and policy as one
// whole settings dict each (config.addZone2/update2, config.addPolicy/update: firewalld checks the whole dict
// before writing the file), then the runtime ones (setZoneSettings2, setPolicySettings, each checked by
// firewalld as a whole first), or one reload when an object is new to the runtime (firewalld 1.3 makes a new
// zone or policy live only by reloading) — and undoes the writes already made when a later one fails.
// A second Apply with the same Spec makes no write. Calls and Writes count the D-Bus calls made.
//
// It needs root (firewalld allows uid 0 through polkit; the cap table CAP_NET_ADMIN) and a reachable
// firewalld; the zero value uses the system bus and the current network namespace.
type Firewalld struct {
	// BusAddress is the D-Bus address of the system bus firewalld is on, e.g.
	// "unix:path=/proc/1234/root/run/dbus/system_bus_socket"; "" = the system bus (DBUS_SYSTEM_BUS_ADDRESS,
	// else unix:path=/run/dbus/system_bus_socket).
	BusAddress string
	// NetNSPath is the network namespace firewalld filters, where the per-source connection caps go (table
	// inet DefaultConnCapTable), e.g. "/run/netns/node1"; "" means the current one. Set it whenever firewalld
	// runs in another namespace than the caller (a container reached through BusAddress).
	NetNSPath string
	// Zone is the zone to own (at most 12 characters: firewalld limits zone names to 17 and the policy adds
	// "-host"); "" means DefaultFirewalldZone.
	Zone string
	// CallTimeout bounds each D-Bus call, and the connection's authentication; 0 means DefaultCallTimeout.
	CallTimeout time.Duration
	// Log receives one record per change; nil discards.
	Log *slog.Logger

	calls, writes atomic.Int64
}

var _ Backend = (*Firewalld)(nil)

// Name returns "firewalld".
func (f *Firewalld) Name() string { return "firewalld" }

// Calls returns the number of D-Bus method calls to firewalld made so far by f (reads and writes).
func (f *Firewalld) Calls() int64 { return f.calls.Load() }

// Writes returns the number of D-Bus method calls so far that change firewalld's configuration (adds, updates,
// removals, reloads), rollbacks included.
func (f *Firewalld) Writes() int64 { return f.writes.Load() }

func (f *Firewalld) zone() string {
	if f.Zone == "" {
		return DefaultFirewalldZone
	}
	return f.Zone
}

func (f *Firewalld) policy() string { return f.zone() + "-host" }

// Objects describes what f owns, for reports: `zone appliance, policy appliance-host`.
func (f *Firewalld) Objects() string { return "zone " + f.zone() + ", policy " + f.policy() }

func (f *Firewalld) log() *slog.Logger {
	if f.Log == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return f.Log
}

func (f *Firewalld) timeout() time.Duration {
	if f.CallTimeout <= 0 {
		return DefaultCallTimeout
	}
	return f.CallTimeout
}

func (f *Firewalld) address() string {
	if f.BusAddress != "" {
		return f.BusAddress
	}
	return systemBusAddress()
}

// fwdConn is one connection to the bus, with f's counters.
type fwdConn struct {
	f    *Firewalld
	conn *dbus.Conn
}

// connect opens a private connection and authenticates within the call timeout (godbus's Auth has no deadline
// of its own: a bus that accepts but never answers would hang it).
func (f *Firewalld) connect(ctx context.Context) (*fwdConn, error) {
	conn, err := connectBus(ctx, f.address(), f.timeout())
	if err != nil {
		return nil, fmt.Errorf("%w: %w (is dbus running? the firewalld backend needs the system bus)", ErrFirewalldUnavailable, err)
	}
	return &fwdConn{f: f, conn: conn}, nil
}

// connectBus dials address and runs the D-Bus authentication and Hello, bounded by timeout.
func connectBus(ctx context.Context, address string, timeout time.Duration) (*dbus.Conn, error) {
	conn, err := dbus.Dial(address)
	if err != nil {
		return nil, fmt.Errorf("connect to the bus at %s: %w", address, err)
	}
	done := make(chan error, 1)
	go func() {
		if err := conn.Auth(nil); err != nil {
			done <- err
			return
		}
		done <- conn.Hello()
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err = <-done:
	case <-t.C:
		err = fmt.Errorf("no answer within %v", timeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("authenticate to the bus at %s: %w", address, err)
	}
	return conn, nil
}

func (c *fwdConn) close() { _ = c.conn.Close() }

// call invokes method on path (never starting firewalld through bus activation) and stores the reply in out.
func (c *fwdConn) call(ctx context.Context, write bool, path dbus.ObjectPath, method string, out []any, args ...any) error {
	c.f.calls.Add(1)
	if write {
		c.f.writes.Add(1)
	}
	ctx, cancel := context.WithTimeout(ctx, c.f.timeout())
	defer cancel()
	call := c.conn.Object(FirewalldBusName, path).CallWithContext(ctx, method, dbus.FlagNoAutoStart, args...)
	if call.Err != nil {
		return c.wrap(ctx, method, call.Err)
	}
	if len(out) > 0 {
		if err := call.Store(out...); err != nil {
			return fmt.Errorf("firewalld %s: unexpected reply: %w", method, err)
		}
	}
	return nil
}

// wrap names the method and marks "firewalld is not there" errors with ErrFirewalldUnavailable.
func (c *fwdConn) wrap(ctx context.Context, method string, err error) error {
	var de dbus.Error
	if errors.As(err, &de) {
		switch de.Name {
		case "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner",
			"org.freedesktop.DBus.Error.NoReply", "org.freedesktop.DBus.Error.Timeout":
			return fmt.Errorf("%w: %s: %s (is firewalld running? `systemctl status firewalld`)", ErrFirewalldUnavailable, method, err)
		}
		return fmt.Errorf("firewalld %s: %s", method, err)
	}
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %s: no answer within %v (is firewalld hung? `systemctl status firewalld`)", ErrFirewalldUnavailable, method, c.f.timeout())
	}
	return fmt.Errorf("%w: %s: %w", ErrFirewalldUnavailable, method, err)
}

// settings is a firewalld settings dict (a{sv}) as built here: values are string, bool, int32, []string,
// []portProto or []forwardPort.
type settings map[string]any

type portProto struct{ Port, Protocol string }

type forwardPort struct{ Port, Protocol, ToPort, ToAddr string }

// variants converts s for the wire.
func (s settings) variants() map[string]dbus.Variant {
	out := make(map[string]dbus.Variant, len(s))
	for k, v := range s {
		out[k] = dbus.MakeVariant(v)
	}
	return out
}

// only returns the keys of s listed.
func (s settings) only(keys []string) settings {
	out := settings{}
	for _, k := range keys {
		if v, ok := s[k]; ok {
			out[k] = v
		}
	}
	return out
}

// Keys firewalld's runtime setZoneSettings2 / setPolicySettings accept (lists and booleans; firewalld 1.3
// fw_zone.py and fw_policy.py set_config_with_settings_dict).
var (
	runtimeZoneKeys = []string{"services", "ports", "icmp_blocks", "masquerade", "forward_ports", "interfaces",
		"sources", "rules_str", "protocols", "source_ports", "icmp_block_inversion", "forward"}
	runtimePolicyKeys = []string{"services", "ports", "icmp_blocks", "masquerade", "forward_ports", "rich_rules",
		"protocols", "source_ports", "ingress_zones", "egress_zones"}
)

// firewalldState is the desired zone and policy of a Spec.
type firewalldState struct {
	zone, policy settings
}

func firewalldDesired(s Spec) firewalldState {
	var nodePorts, anyPorts []portProto
	var rich []string
	vp4, vp6 := splitPeers(s.VRRPPeers)
	for _, p := range s.ports() {
		switch {
		case p.Protocol == ProtoVRRP:
			for _, a := range append(vp4, vp6...) {
				fam := "ipv4"
				if a.Is6() {
					fam = "ipv6"
				}
				// Numeric protocol: firewalld hands names to nft, which resolves them through /etc/protocols.
				rich = append(rich, fmt.Sprintf(`rule family="%s" source address="%s" protocol value="%d" accept`,
					fam, a, IPProtoVRRP))
			}
		case p.Source == SourceAnywhere:
			anyPorts = append(anyPorts, portProto{p.PortRange(), p.Protocol})
		default:
			nodePorts = append(nodePorts, portProto{p.PortRange(), p.Protocol})
		}
	}
	roles := make([]string, len(s.Roles))
	for i, r := range s.Roles {
		roles[i] = string(r)
	}
	desc := fmt.Sprintf("%s; roles %s. Edits are overwritten.", firewalldMark, strings.Join(roles, ", "))
	common := func(short string) settings {
		return settings{
			"short": short, "description": desc, "services": []string{}, "icmp_blocks": []string{},
			"masquerade": false, "forward_ports": []forwardPort{}, "protocols": []string{},
			"source_ports": []portProto{},
		}
	}
	z := common("appliance node networks")
	z["target"] = "default"
	z["ports"] = nonNil(nodePorts)
	z["interfaces"] = []string{}
	z["sources"] = firewalldSources(s.NodeNetworks)
	z["rules_str"] = []string{}
	z["icmp_block_inversion"] = false
	z["forward"] = true
	p := common("appliance host ports")
	p["target"] = "CONTINUE"
	p["priority"] = firewalldPolicyPriority
	p["ingress_zones"] = []string{"ANY"}
	p["egress_zones"] = []string{"HOST"}
	p["ports"] = nonNil(anyPorts)
	p["rich_rules"] = nonNil(rich)
	return firewalldState{zone: z, policy: p}
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// firewalldSources returns the node networks as firewalld zone sources: masked, IPv4-mapped ones as IPv4, sorted,
// without prefixes another one already covers.
func firewalldSources(ps []netip.Prefix) []string {
	var norm []netip.Prefix
	for _, p := range ps {
		if !p.IsValid() {
			continue
		}
		norm = append(norm, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p)).Masked())
	}
	slices.SortFunc(norm, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	out := []string{}
	var kept []netip.Prefix
	for _, p := range norm {
		if slices.ContainsFunc(kept, func(k netip.Prefix) bool { return k.Bits() <= p.Bits() && k.Contains(p.Addr()) }) {
			continue
		}
		kept = append(kept, p)
		out = append(out, p.String())
	}
	return out
}

// canon renders a settings value, ours or one decoded from D-Bus, so that equal settings render equally:
// lists as sorted sets, structs as "a/b".
func canon(v any) string {
	switch x := v.(type) {
	case dbus.Variant:
		return canon(x.Value())
	case string:
		return fmt.Sprintf("%q", x)
	case bool:
		return fmt.Sprint(x)
	case int32:
		return fmt.Sprint(x)
	case []string:
		return canonList(x)
	case []portProto:
		l := make([]string, len(x))
		for i, p := range x {
			l[i] = p.Port + "/" + p.Protocol
		}
		return canonList(l)
	case []forwardPort:
		l := make([]string, len(x))
		for i, p := range x {
			l[i] = strings.Join([]string{p.Port, p.Protocol, p.ToPort, p.ToAddr}, "/")
		}
		return canonList(l)
	}
	// From D-Bus: a(ss) and a(ssss) decode as [][]any; firewalld sends some port lists as aas.
	if rows := rowsOf(v); rows != nil {
		l := make([]string, len(rows))
		for i, r := range rows {
			l[i] = strings.Join(r, "/")
		}
		return canonList(l)
	}
	if l, ok := v.([]any); ok {
		out := make([]string, len(l))
		for i, e := range l {
			out[i] = strings.Trim(canon(e), `"[]`)
		}
		return canonList(out)
	}
	return fmt.Sprintf("%T(%v)", v, v)
}

func canonList(l []string) string {
	l = slices.Clone(l)
	sort.Strings(l)
	return "[" + strings.Join(slices.Compact(l), " ") + "]"
}

// zeroCanon is canon of the zero value of want's type: firewalld omits empty lists and strings from its dicts.
func zeroCanon(want any) string {
	switch want.(type) {
	case string:
		return canon("")
	case bool:
		return canon(false)
	case int32:
		return canon(int32(0))
	}
	return "[]"
}

// diffSettings returns the keys (of keys, or of want when keys is nil) whose live value differs from want.
func diffSettings(want settings, live map[string]dbus.Variant, keys []string) []string {
	if keys == nil {
		for k := range want {
			keys = append(keys, k)
		}
		sort.Strings(keys)
	}
	var out []string
	for _, k := range keys {
		w, ok := want[k]
		if !ok {
			continue
		}
		l := zeroCanon(w)
		if v, ok := live[k]; ok {
			l = canon(v)
		}
		if canon(w) != l {
			out = append(out, k)
		}
	}
	return out
}

// liveObject is what firewalld holds for one of our names.
type liveObject struct {
	permPath dbus.ObjectPath         // "" when absent from the permanent configuration
	perm     map[string]dbus.Variant // permanent settings
	runtime  map[string]dbus.Variant // nil when absent from the runtime
}

func (o liveObject) description() (string, bool) {
	for _, m := range []map[string]dbus.Variant{o.perm, o.runtime} {
		if v, ok := m["description"]; ok {
			s, _ := v.Value().(string)
			return s, true
		}
		if m != nil {
			return "", true
		}
	}
	return "", false
}

// read fetches the zone and the policy from both configurations: 10 calls when both exist.
func (c *fwdConn) read(ctx context.Context) (zone, policy liveObject, err error) {
	f := c.f
	var names []string
	if err := c.call(ctx, false, fwdPathConfig, fwdIfaceConfig+".getZoneNames", []any{&names}); err != nil {
		return zone, policy, err
	}
	if slices.Contains(names, f.zone()) {
		if err := c.call(ctx, false, fwdPathConfig, fwdIfaceConfig+".getZoneByName", []any{&zone.permPath}, f.zone()); err != nil {
			return zone, policy, err
		}
		if err := c.call(ctx, false, zone.permPath, fwdIfaceCfgZone+".getSettings2", []any{&zone.perm}); err != nil {
			return zone, policy, err
		}
	}
	names = nil
	if err := c.call(ctx, false, fwdPathConfig, fwdIfaceConfig+".getPolicyNames", []any{&names}); err != nil {
		return zone, policy, err
	}
	if slices.Contains(names, f.policy()) {
		if err := c.call(ctx, false, fwdPathConfig, fwdIfaceConfig+".getPolicyByName", []any{&policy.permPath}, f.policy()); err != nil {
			return zone, policy, err
		}
		if err := c.call(ctx, false, policy.permPath, fwdIfaceCfgPol+".getSettings", []any{&policy.perm}); err != nil {
			return zone, policy, err
		}
	}
	zone.runtime, err = c.readRuntime(ctx, fwdIfaceZone+".getZones", fwdIfaceZone+".getZoneSettings2", f.zone())
	if err != nil {
		return zone, policy, err
	}
	policy.runtime, err = c.readRuntime(ctx, fwdIfacePolicy+".getPolicies", fwdIfacePolicy+".getPolicySettings", f.policy())
	return zone, policy, err
}

func (c *fwdConn) readRuntime(ctx context.Context, list, get, name string) (map[string]dbus.Variant, error) {
	var names []string
	if err := c.call(ctx, false, fwdPath, list, []any{&names}); err != nil {
		return nil, err
	}
	if !slices.Contains(names, name) {
		return nil, nil
	}
	var m map[string]dbus.Variant
	if err := c.call(ctx, false, fwdPath, get, []any{&m}, name); err != nil {
		return nil, err
	}
	if m == nil {
		m = map[string]dbus.Variant{}
	}
	return m, nil
}

// checkOurs refuses objects of our names that someone else made.
func (f *Firewalld) checkOurs(zone, policy liveObject) error {
	for _, o := range []struct {
		kind, name, del string
		live            liveObject
	}{
		{"zone", f.zone(), "--delete-zone", zone},
		{"policy", f.policy(), "--delete-policy", policy},
	} {
		if d, exists := o.live.description(); exists && !strings.HasPrefix(d, firewalldMark) {
			return fmt.Errorf("%w: firewalld %s %q exists and was not created by the appliance (its description does not start with %q): "+
				"remove or rename it (`firewall-cmd --permanent %s=%s && firewall-cmd --reload`) and run again",
				ErrNotOurs, o.kind, o.name, firewalldMark, o.del, o.name)
		}
	}
	return nil
}

// plan compares the live objects with want: which permanent objects to write and what the runtime needs.
type fwdPlan struct {
	permZone, permPolicy bool // write the permanent object
	reload               bool // an object is absent from the runtime or differs where only a reload changes it
	rtZone, rtPolicy     bool // set the runtime lists
	reasons              []string
}

func (f *Firewalld) plan(want firewalldState, zone, policy liveObject) fwdPlan {
	var p fwdPlan
	note := func(what string, keys []string) {
		p.reasons = append(p.reasons, what+" "+strings.Join(keys, ","))
	}
	if zone.permPath == "" {
		p.permZone = true
		p.reasons = append(p.reasons, "permanent zone absent")
	} else if d := diffSettings(want.zone, zone.perm, nil); len(d) > 0 {
		p.permZone = true
		note("permanent zone differs in", d)
	}
	if policy.permPath == "" {
		p.permPolicy = true
		p.reasons = append(p.reasons, "permanent policy absent")
	} else if d := diffSettings(want.policy, policy.perm, nil); len(d) > 0 {
		p.permPolicy = true
		note("permanent policy differs in", d)
	}
	switch {
	case zone.runtime == nil:
		p.reload = true
		p.reasons = append(p.reasons, "runtime zone absent")
	case len(diffSettings(want.zone, zone.runtime, []string{"target"})) > 0:
		p.reload = true
		p.reasons = append(p.reasons, "runtime zone target differs")
	default:
		if d := diffSettings(want.zone, zone.runtime, runtimeZoneKeys); len(d) > 0 {
			p.rtZone = true
			note("runtime zone differs in", d)
		}
	}
	switch {
	case policy.runtime == nil:
		p.reload = true
		p.reasons = append(p.reasons, "runtime policy absent")
	case len(diffSettings(want.policy, policy.runtime, []string{"target", "priority"})) > 0:
		p.reload = true
		p.reasons = append(p.reasons, "runtime policy target or priority differs")
	default:
		if d := diffSettings(want.policy, policy.runtime, runtimePolicyKeys); len(d) > 0 {
			p.rtPolicy = true
			note("runtime policy differs in", d)
		}
	}
	return p
}

func (p fwdPlan) empty() bool {
	return !p.permZone && !p.permPolicy && !p.reload && !p.rtZone && !p.rtPolicy
}

// Apply makes firewalld's permanent and runtime configuration hold exactly s in the zone and policy f owns
// (see Firewalld), then the connection cap table s's caps; changed is false, and no write is made, when all
// already do.
//
// Errors: s invalid (wraps ErrInvalidSpec); firewalld not reachable (wraps ErrFirewalldUnavailable); the zone
// or policy name used by an object the appliance did not create (wraps ErrNotOurs, names it and how to free
// it); firewalld refusing a setting (its error, e.g. ZONE_CONFLICT when a node network is already a source
// of another zone). On an error after a write, the writes already made are undone (the error says when the
// undo failed too). A failure to write the cap table (netlink; EPERM wraps os.ErrPermission) leaves
// firewalld's objects in place, and says so.
func (f *Firewalld) Apply(ctx context.Context, s Spec) (bool, error) {
	if err := s.Validate(); err != nil {
		return false, err
	}
	c, zone, policy, err := f.open(ctx)
	if err != nil {
		return false, err
	}
	defer c.close()
	want := firewalldDesired(s)
	p := f.plan(want, zone, policy)
	if !p.empty() {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if err := c.write(ctx, want, zone, policy, p); err != nil {
			return false, err
		}
		f.log().Info("firewalld zone and policy updated", "zone", f.zone(), "policy", f.policy(),
			"reason", strings.Join(p.reasons, "; "))
	}
	// After firewalld's objects: a host whose firewalld does not answer gets no table either.
	capChanged, reason, err := f.capTable().apply(ctx, s)
	if err != nil {
		return false, fmt.Errorf("firewalld zone %q and policy %q are in place, the per-source connection caps beside them (%s) are not: %w",
			f.zone(), f.policy(), f.capTable().Objects(), err)
	}
	if capChanged {
		f.log().Info("connection cap table replaced", "table", f.capTable().table(), "netns", f.NetNSPath, "reason", reason)
	}
	return !p.empty() || capChanged, nil
}

// capTable is the nftables table holding the per-source connection caps beside firewalld's.
func (f *Firewalld) capTable() *connCapTable {
	return &connCapTable{NetNSPath: f.NetNSPath}
}

// open connects, reads our zone and policy (permanent and runtime) and refuses objects of our names the
// appliance did not create (checkOurs): the start of Apply, InPlace and Remove. On success the caller
// closes c.
func (f *Firewalld) open(ctx context.Context) (c *fwdConn, zone, policy liveObject, err error) {
	if c, err = f.connect(ctx); err != nil {
		return nil, zone, policy, err
	}
	if zone, policy, err = c.read(ctx); err == nil {
		err = f.checkOurs(zone, policy)
	}
	if err != nil {
		c.close()
		return nil, zone, policy, err
	}
	return c, zone, policy, nil
}

// undoStack runs the inverse of each write made, newest first.
type undoStack []func(context.Context) error

func (u undoStack) run(ctx context.Context, cause error) error {
	// The caller's context may be what ended: undo under a fresh bound.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*DefaultCallTimeout)
	defer cancel()
	var errs []error
	for i := len(u) - 1; i >= 0; i-- {
		if err := u[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w; undoing the changes already made failed too, firewalld may hold a partial configuration "+
			"(`firewall-cmd --info-zone` / `--info-policy`): %w", cause, errors.Join(errs...))
	}
	return fmt.Errorf("%w (changes already made were undone)", cause)
}

func (c *fwdConn) write(ctx context.Context, want firewalldState, zone, policy liveObject, p fwdPlan) error {
	f := c.f
	if err := c.checkSources(ctx, want, zone, p.reload); err != nil {
		return err
	}
	var undo undoStack
	fail := func(err error) error {
		if len(undo) == 0 {
			return err
		}
		return undo.run(ctx, err)
	}
	// Permanent: the policy first, then the zone (the zone's sources are what firewalld refuses most often:
	// ZONE_CONFLICT), each as one whole settings dict.
	type permObj struct {
		do                       bool
		live                     liveObject
		want                     settings
		add, addArgName, iface   string
		update, remove, kind, nm string
	}
	for _, o := range []permObj{
		{p.permPolicy, policy, want.policy, "addPolicy", f.policy(), fwdIfaceCfgPol, "update", "remove", "policy", f.policy()},
		{p.permZone, zone, want.zone, "addZone2", f.zone(), fwdIfaceCfgZone, "update2", "remove", "zone", f.zone()},
	} {
		if !o.do {
			continue
		}
		if o.live.permPath == "" {
			var path dbus.ObjectPath
			if err := c.call(ctx, true, fwdPathConfig, fwdIfaceConfig+"."+o.add, []any{&path}, o.addArgName, o.want.variants()); err != nil {
				return fail(fmt.Errorf("create permanent firewalld %s %q: %w", o.kind, o.nm, err))
			}
			iface, remove := o.iface, o.remove
			undo = append(undo, func(ctx context.Context) error {
				return c.call(ctx, true, path, iface+"."+remove, nil)
			})
			continue
		}
		if err := c.call(ctx, true, o.live.permPath, o.iface+"."+o.update, nil, o.want.variants()); err != nil {
			return fail(fmt.Errorf("update permanent firewalld %s %q: %w", o.kind, o.nm, err))
		}
		old, path, iface, update := restoreSettings(o.want, o.live.perm, nil), o.live.permPath, o.iface, o.update
		undo = append(undo, func(ctx context.Context) error {
			return c.call(ctx, true, path, iface+"."+update, nil, old)
		})
	}
	// Runtime.
	if p.reload {
		// A zone or policy new to the runtime only becomes live through a reload, which loads the permanent
		// configuration (just written) as a whole.
		if err := c.call(ctx, true, fwdPath, fwdIface+".reload", nil); err != nil {
			return fail(fmt.Errorf("reload firewalld: %w", err))
		}
		// Undone last (the stack runs newest first): after the permanent objects are restored, a reload
		// makes the runtime match them again.
		undo = append(undoStack{func(ctx context.Context) error { return c.call(ctx, true, fwdPath, fwdIface+".reload", nil) }}, undo...)
		z, pol, err := c.read(ctx)
		if err != nil {
			return fail(err)
		}
		if d := diffSettings(want.zone, z.runtime, append([]string{"target"}, runtimeZoneKeys...)); z.runtime == nil || len(d) > 0 {
			return fail(fmt.Errorf("firewalld zone %q after reload does not hold the permanent settings (differs in %v)", f.zone(), d))
		}
		if d := diffSettings(want.policy, pol.runtime, append([]string{"target", "priority"}, runtimePolicyKeys...)); pol.runtime == nil || len(d) > 0 {
			return fail(fmt.Errorf("firewalld policy %q after reload does not hold the permanent settings (differs in %v)", f.policy(), d))
		}
		return nil
	}
	type rtObj struct {
		do                 bool
		live               liveObject
		want               settings
		keys               []string
		method, kind, name string
	}
	for _, o := range []rtObj{
		{p.rtPolicy, policy, want.policy, runtimePolicyKeys, fwdIfacePolicy + ".setPolicySettings", "policy", f.policy()},
		{p.rtZone, zone, want.zone, runtimeZoneKeys, fwdIfaceZone + ".setZoneSettings2", "zone", f.zone()},
	} {
		if !o.do {
			continue
		}
		// The undo is queued before the call: firewalld checks the whole dict first but then applies it item by
		// item, so a refused item can leave the ones before it applied; restoring the old lists covers both.
		old := restoreSettings(o.want, o.live.runtime, o.keys)
		method, name := o.method, o.name
		undo = append(undo, func(ctx context.Context) error {
			return c.call(ctx, true, fwdPath, method, nil, name, old)
		})
		if err := c.call(ctx, true, fwdPath, o.method, nil, o.name, o.want.only(o.keys).variants()); err != nil {
			return fail(fmt.Errorf("set runtime firewalld %s %q: %w", o.kind, o.name, err))
		}
	}
	return nil
}

// checkSources refuses, before any write, a node network that another zone already holds as a source: in the
// permanent configuration (config.addZone2 does not check it, and the next reload would fail), and in the runtime
// one when a reload is planned. Without a reload, setZoneSettings2 checks the runtime itself (and the writes
// made before are undone). Only sources new to our zone are asked about: 1 or 2 calls each.
func (c *fwdConn) checkSources(ctx context.Context, want firewalldState, zone liveObject, reload bool) error {
	srcs, _ := want.zone["sources"].([]string)
	has := func(m map[string]dbus.Variant, src string) bool {
		l, _ := m["sources"].Value().([]string)
		return slices.Contains(l, src)
	}
	for _, src := range srcs {
		type where struct {
			path         dbus.ObjectPath
			method, conf string
			flag         string
		}
		var ask []where
		if !has(zone.perm, src) {
			ask = append(ask, where{fwdPathConfig, fwdIfaceConfig + ".getZoneOfSource", "permanent", "--permanent "})
		}
		if reload && !has(zone.runtime, src) {
			ask = append(ask, where{fwdPath, fwdIfaceZone + ".getZoneOfSource", "runtime", ""})
		}
		for _, w := range ask {
			var other string
			if err := c.call(ctx, false, w.path, w.method, []any{&other}, src); err != nil {
				return err
			}
			if other != "" && other != c.f.zone() {
				return fmt.Errorf("%w: node network %s is already a source of firewalld zone %q (%s configuration), and a source "+
					"belongs to one zone only: remove it there (`firewall-cmd %s--zone=%s --remove-source=%s`) or leave it out of "+
					"the node networks; nothing was changed", ErrSourceConflict, src, other, w.conf, w.flag, other, src)
			}
		}
	}
	return nil
}

// retype makes a value decoded from firewalld sendable again under key k. firewalld wants its port lists as
// arrays of structs (a(ss), a(ssss): Python tuples; an array of arrays is refused as "not of type tuple"), but
// godbus decodes structs as []any and would encode those back as arrays of variants; typed structs encode right.
func retype(k string, v dbus.Variant) dbus.Variant {
	rows := rowsOf(v.Value())
	if rows == nil {
		return v
	}
	col := func(r []string, i int) string {
		if i < len(r) {
			return r[i]
		}
		return ""
	}
	switch k {
	case "ports", "source_ports":
		out := make([]portProto, len(rows))
		for i, r := range rows {
			out[i] = portProto{col(r, 0), col(r, 1)}
		}
		return dbus.MakeVariant(out)
	case "forward_ports":
		out := make([]forwardPort, len(rows))
		for i, r := range rows {
			out[i] = forwardPort{col(r, 0), col(r, 1), col(r, 2), col(r, 3)}
		}
		return dbus.MakeVariant(out)
	}
	return v
}

// rowsOf returns a list of lists (of any element types: [][]any, [][]string, []any of []any) as strings, or
// nil when v is not one.
func rowsOf(v any) [][]string {
	rv := reflect.ValueOf(v)
	if !rv.IsValid() || rv.Kind() != reflect.Slice {
		return nil
	}
	out := [][]string{}
	for i := 0; i < rv.Len(); i++ {
		e := rv.Index(i)
		for e.Kind() == reflect.Interface {
			e = e.Elem()
		}
		if e.Kind() != reflect.Slice {
			return nil
		}
		row := make([]string, e.Len())
		for j := range row {
			row[j] = fmt.Sprint(e.Index(j).Interface())
		}
		out = append(out, row)
	}
	if rv.Len() == 0 && rv.Type().Elem().Kind() != reflect.Slice {
		return nil
	}
	return out
}

func retyped(m map[string]dbus.Variant) map[string]dbus.Variant {
	out := make(map[string]dbus.Variant, len(m))
	for k, v := range m {
		out[k] = retype(k, v)
	}
	return out
}

// restoreSettings is the dict that puts back live's values of keys (all of want's keys when keys is nil):
// firewalld omits empty lists and strings from the dicts it returns, and its updates merge (a key left out keeps
// its value), so a missing key becomes the empty value of want's type.
func restoreSettings(want settings, live map[string]dbus.Variant, keys []string) map[string]dbus.Variant {
	out := map[string]dbus.Variant{}
	if keys == nil {
		out = retyped(live)
		for k := range want {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		if v, ok := live[k]; ok {
			out[k] = retype(k, v)
			continue
		}
		switch want[k].(type) {
		case []string:
			out[k] = dbus.MakeVariant([]string{})
		case []portProto:
			out[k] = dbus.MakeVariant([]portProto{})
		case []forwardPort:
			out[k] = dbus.MakeVariant([]forwardPort{})
		case bool:
			out[k] = dbus.MakeVariant(false)
		case string:
			out[k] = dbus.MakeVariant("")
		}
	}
	return out
}

// InPlace reports whether firewalld's permanent and runtime configuration already hold exactly s, and the
// connection cap table its caps (what Apply would leave), without writing. Errors: as Apply's reads.
func (f *Firewalld) InPlace(s Spec) (bool, error) {
	if err := s.Validate(); err != nil {
		return false, err
	}
	ctx := context.Background()
	c, zone, policy, err := f.open(ctx)
	if err != nil {
		return false, err
	}
	defer c.close()
	if !f.plan(firewalldDesired(s), zone, policy).empty() {
		return false, nil
	}
	return f.capTable().inPlace(s)
}

// Remove deletes the zone and policy Apply made from the permanent configuration and reloads firewalld so they
// leave the runtime too, and deletes the connection cap table; with none of them present it makes no write.
// It refuses (ErrNotOurs) to delete an object of our names that the appliance did not create.
func (f *Firewalld) Remove(ctx context.Context) error {
	c, zone, policy, err := f.open(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	if removed, err := f.capTable().remove(ctx); err != nil {
		return err
	} else if removed {
		f.log().Info("connection cap table removed", "table", f.capTable().table(), "netns", f.NetNSPath)
	}
	if zone.permPath == "" && policy.permPath == "" && zone.runtime == nil && policy.runtime == nil {
		return nil
	}
	for _, o := range []struct {
		path        dbus.ObjectPath
		iface, kind string
	}{{zone.permPath, fwdIfaceCfgZone, "zone"}, {policy.permPath, fwdIfaceCfgPol, "policy"}} {
		if o.path == "" {
			continue
		}
		if err := c.call(ctx, true, o.path, o.iface+".remove", nil); err != nil {
			return fmt.Errorf("remove permanent firewalld %s: %w", o.kind, err)
		}
	}
	if err := c.call(ctx, true, fwdPath, fwdIface+".reload", nil); err != nil {
		return fmt.Errorf("reload firewalld after removing zone %q and policy %q: %w", f.zone(), f.policy(), err)
	}
	f.log().Info("firewalld zone and policy removed", "zone", f.zone(), "policy", f.policy())
	return nil
}
