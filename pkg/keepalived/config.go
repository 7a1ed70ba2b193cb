// Package keepalived renders, validates and runs keepalived 2.2.x configurations for the Kubernetes API
// VIP in unicast mode: the appliance runs one instance on the bootstrap host and hostagent one on every
// control-plane node, each naming the others as unicast peers (keepalived.conf(5) `unicast_src_ip`,
// `unicast_peer`), so VRRP never depends on multicast and the firewall can accept it from exact peers.
//
// Protocol version follows the authentication choice, because keepalived 2.2.7 supports each only with
// the other:
//   - AuthPass set → VRRPv2 (RFC 3768) with PASS authentication; the advertisement interval is carried in
//     whole seconds (keepalived rounds anything else and `keepalived -t` fails).
//   - AuthPass empty → VRRPv3 (RFC 5798) without authentication (keepalived: "VRRP version 3 does not
//     support authentication"); the interval is carried in centiseconds, so sub-second failover works.
//
// The appliance's default (pkg/config) is VRRPv3 at 250 ms: a backup takes over about 0.9 s after the
// holder's last advertisement (BenchmarkFailover measures it against VRRPv2 at 1 s, about 3.6 s).
// PASS authentication travels in clear text in every advertisement, so it protects against
// misconfiguration, not attackers, and nothing that the firewall does not already: VRRP is accepted
// only from the configured peers (firewall.Spec.VRRPPeers), and a pre-flight check before a VIP is
// claimed looks for foreign speakers on the segment. That is why VRRPv2 + PASS is an option, not the
// default.
package keepalived

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrInvalidConfig is wrapped by every validation error of Render and by Check when keepalived rejects a
// configuration.
var ErrInvalidConfig = errors.New("invalid keepalived configuration")

// DefaultAdvertInterval is the VRRP advertisement interval when Instance.AdvertInterval is zero (RFC 3768
// §5.3.7 and RFC 5798 §5.2.7 default, 1 s; what every instance used before the interval became
// configurable, so a zero in an older record keeps its meaning). The appliance sets the interval
// explicitly (config.DefaultAdvertInterval, 250 ms). A backup declares the master dead after
// 3×interval + (256−priority)/256×interval (RFC 5798 §6.1 Master_Down_Interval).
const DefaultAdvertInterval = time.Second

// Config is one keepalived process: global settings and its VRRP instances.
type Config struct {
	// RouterID identifies this host in keepalived's logs (global_defs router_id); "" leaves keepalived's
	// default (the host name). Letters, digits, '.', '_', '-', at most 63 bytes.
	RouterID string
	// Instances are the VRRP instances, at least one. Names must be unique, and so must
	// (Interface, VirtualRouterID) pairs.
	Instances []Instance
	// ScriptUser is the user track scripts run as (global_defs script_user, with enable_script_security).
	// Required when any instance has a TrackScript, e.g. "nobody"; it must exist on the host that runs
	// keepalived.
	ScriptUser string
}

// Instance is one VRRP instance (keepalived vrrp_instance), always rendered with `state BACKUP` so the
// election, not the file, decides the master.
type Instance struct {
	// Name of the vrrp_instance, e.g. "api-vip": letters, digits, '.', '_', '-', at most 63 bytes.
	Name string
	// Interface is the network interface that holds SourceIP and receives the VIP (at most 15 bytes).
	Interface string
	// SourceIP is this host's address the advertisements come from (unicast_src_ip).
	SourceIP netip.Addr
	// Peers are the other speakers' addresses (unicast_peer): at least one, same family as SourceIP,
	// without SourceIP, the VIP or duplicates. Rendered sorted.
	Peers []netip.Addr
	// VIP is the virtual address with the prefix length of its network, e.g. 10.100.0.100/24; the
	// address must not be the network's first or (IPv4) last one.
	VIP netip.Prefix
	// VirtualRouterID is the VRID (1..255), the same on every speaker of this VIP and unique on the L2
	// segment.
	VirtualRouterID uint8
	// Priority of this speaker, 1..254 (255 is reserved for the address owner, RFC 5798 §5.2.4); the
	// highest live priority holds the VIP.
	Priority uint8
	// AuthPass is the VRRPv2 PASS secret, 1..8 bytes of printable ASCII without space, quotes,
	// backslash, '#' or '!' (keepalived comment characters). Empty selects VRRPv3 without
	// authentication. VRRPv2 is IPv4-only (RFC 3768), so an IPv6 VIP needs AuthPass empty. Secret: never
	// logged; the rendered file must be 0600.
	AuthPass string
	// AdvertInterval between advertisements; 0 means DefaultAdvertInterval. With AuthPass (VRRPv2) a
	// whole number of seconds 1..255; without (VRRPv3) a multiple of 10 ms from 10 ms to 40.95 s.
	AdvertInterval time.Duration
	// Nopreempt keeps a live master even when a higher-priority speaker appears (keepalived nopreempt).
	Nopreempt bool
	// TrackScript is an optional health check that changes the priority by its weight.
	TrackScript *Script
}

// Script is a keepalived vrrp_script: a command run every Interval whose exit status (0 healthy) moves
// the instance priority by Weight.
type Script struct {
	// Command is the program and its arguments, e.g.
	// {"/usr/bin/curl", "-sfk", "https://127.0.0.1:6443/healthz"}. The program must be an absolute path
	// (script security); no argument may be empty or hold whitespace, quotes, backslashes, '#' or '!'.
	Command []string
	// Interval between runs: whole seconds, 0 means 1 s (keepalived accepts 1..4294 s only).
	Interval time.Duration
	// Timeout after which a run counts as failed: whole seconds, 0 means Interval.
	Timeout time.Duration
	// Fall is how many consecutive failures mark it failed; 0 means 1.
	Fall uint
	// Rise is how many consecutive successes mark it healthy again; 0 means 1.
	Rise uint
	// Weight is added to the priority while the script succeeds (positive) or fails (negative),
	// -253..253. 0 means a failed script puts the instance into FAULT (it releases the VIP).
	Weight int
}

var (
	tokenRe    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	userRe     = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
	ifaceRe    = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,15}$`)
	authPassRe = regexp.MustCompile(`^[\x24-\x26\x28-\x5b\x5d-\x7e]{1,8}$`) // printable ASCII except space ! " # ' and backslash
	scriptArgR = regexp.MustCompile(`^[^\s"'\\#!]+$`)
)

// Validate returns every problem of c at once (errors.Join), each wrapping ErrInvalidConfig and naming
// its field path, e.g. `instances[1].priority: 255 is reserved for the address owner; use 1..254`.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if c.RouterID != "" && !tokenRe.MatchString(c.RouterID) {
		bad("routerID: %q must be 1..63 letters, digits, '.', '_' or '-'", c.RouterID)
	}
	if c.ScriptUser != "" && !userRe.MatchString(c.ScriptUser) {
		bad("scriptUser: %q is not a user name (lower-case letters, digits, '_', '-')", c.ScriptUser)
	}
	if len(c.Instances) == 0 {
		bad("instances: at least one VRRP instance is required")
	}
	names := map[string]int{}
	vrids := map[string]int{}
	for i, in := range c.Instances {
		p := fmt.Sprintf("instances[%d]", i)
		if !tokenRe.MatchString(in.Name) {
			bad("%s.name: %q must be 1..63 letters, digits, '.', '_' or '-'", p, in.Name)
		} else if j, dup := names[in.Name]; dup {
			bad("%s.name: %q is already used by instances[%d]", p, in.Name, j)
		} else {
			names[in.Name] = i
		}
		if !ifaceRe.MatchString(in.Interface) {
			bad("%s.interface: %q is not an interface name (1..15 bytes, no '/', ':' or spaces)", p, in.Interface)
		}
		if in.VirtualRouterID == 0 {
			bad("%s.virtualRouterID: 0 is not a VRID; use 1..255", p)
		} else {
			k := in.Interface + "/" + strconv.Itoa(int(in.VirtualRouterID))
			if j, dup := vrids[k]; dup {
				bad("%s.virtualRouterID: %d is already used on %s by instances[%d]", p, in.VirtualRouterID, in.Interface, j)
			} else {
				vrids[k] = i
			}
		}
		switch in.Priority {
		case 0:
			bad("%s.priority: 0 is sent only by a master that resigns; use 1..254", p)
		case 255:
			bad("%s.priority: 255 is reserved for the address owner; use 1..254", p)
		}
		errs = append(errs, in.validateAddrs(p)...)
		errs = append(errs, in.validateTiming(p)...)
		if in.TrackScript != nil {
			if c.ScriptUser == "" {
				bad("scriptUser: required because %s.trackScript is set (e.g. \"nobody\")", p)
			}
			errs = append(errs, in.TrackScript.validate(p+".trackScript")...)
		}
	}
	return errors.Join(errs...)
}

func (in Instance) validateAddrs(p string) []error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	checkAddr := func(field string, a netip.Addr) bool {
		switch {
		case !a.IsValid():
			bad("%s: not an IP address", field)
		case a.Zone() != "":
			bad("%s: %q has a zone; give the address without %%zone", field, a)
		case a.Is4In6():
			bad("%s: %q is IPv4-mapped; write it as %s", field, a, a.Unmap())
		case a.IsUnspecified() || a.IsMulticast() || a.IsLoopback():
			bad("%s: %s is not a unicast host address", field, a)
		default:
			return true
		}
		return false
	}
	srcOK := checkAddr(p+".sourceIP", in.SourceIP)
	vipOK := false
	if !in.VIP.IsValid() {
		bad("%s.vip: not an address with prefix length (e.g. 10.100.0.100/24)", p)
	} else if checkAddr(p+".vip", in.VIP.Addr()) {
		vipOK = true
		a, m := in.VIP.Addr(), in.VIP.Masked()
		if in.VIP.Bits() < a.BitLen() && a == m.Addr() {
			bad("%s.vip: %s is the network address of %s; pick a host address", p, a, m)
			vipOK = false
		} else if a.Is4() && in.VIP.Bits() < 31 && a == lastAddr(m) {
			bad("%s.vip: %s is the broadcast address of %s; pick a host address", p, a, m)
			vipOK = false
		}
	}
	if srcOK && vipOK {
		if in.SourceIP.Is4() != in.VIP.Addr().Is4() {
			bad("%s.vip: %s and sourceIP %s are of different IP families", p, in.VIP.Addr(), in.SourceIP)
		} else if in.SourceIP == in.VIP.Addr() {
			bad("%s.vip: %s is the sourceIP; the VIP must be an address no host owns", p, in.VIP.Addr())
		}
	}
	if len(in.Peers) == 0 {
		bad("%s.peers: at least one unicast peer is required", p)
	}
	seen := map[netip.Addr]int{}
	for j, a := range in.Peers {
		f := fmt.Sprintf("%s.peers[%d]", p, j)
		if !checkAddr(f, a) {
			continue
		}
		switch k, dup := seen[a]; {
		case dup:
			bad("%s: %s is already peers[%d]", f, a, k)
		case srcOK && a == in.SourceIP:
			bad("%s: %s is this host's sourceIP; list only the other speakers", f, a)
		case vipOK && a == in.VIP.Addr():
			bad("%s: %s is the VIP; list the speakers' own addresses", f, a)
		case srcOK && a.Is4() != in.SourceIP.Is4():
			bad("%s: %s is not of sourceIP %s's IP family", f, a, in.SourceIP)
		}
		seen[a] = j
	}
	return errs
}

func (in Instance) validateTiming(p string) []error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if in.AuthPass != "" && !authPassRe.MatchString(in.AuthPass) {
		// Never print the secret itself.
		bad("%s.authPass: must be 1..8 bytes of printable ASCII without space, quotes, backslash, '#' or '!' (got %d bytes)", p, len(in.AuthPass))
	}
	if in.AuthPass != "" && in.VIP.IsValid() && in.VIP.Addr().Is6() && !in.VIP.Addr().Is4In6() {
		bad("%s.authPass: VRRPv2 authentication is IPv4-only (RFC 3768); leave it empty for an IPv6 VIP (VRRPv3)", p)
	}
	iv := in.advertInterval()
	switch {
	case iv < 0:
		bad("%s.advertInterval: %s is negative", p, iv)
	case in.AuthPass != "" && (iv%time.Second != 0 || iv > 255*time.Second):
		bad("%s.advertInterval: %s is not a whole number of seconds in 1s..255s, as VRRPv2 (used with authPass) requires (RFC 3768 §5.3.7); clear authPass to use VRRPv3 (RFC 5798) with centisecond intervals", p, iv)
	case in.AuthPass == "" && (iv%(10*time.Millisecond) != 0 || iv > 4095*10*time.Millisecond):
		bad("%s.advertInterval: %s is not a multiple of 10ms in 10ms..40.95s, as VRRPv3 requires (RFC 5798 §5.2.7)", p, iv)
	}
	return errs
}

func (s *Script) validate(p string) []error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if len(s.Command) == 0 {
		bad("%s.command: required, e.g. [/usr/bin/curl -sfk https://127.0.0.1:6443/healthz]", p)
	}
	for i, a := range s.Command {
		switch {
		case !scriptArgR.MatchString(a):
			bad("%s.command[%d]: %q must be non-empty without whitespace, quotes, backslashes, '#' or '!'", p, i, a)
		case i == 0 && !strings.HasPrefix(a, "/"):
			bad("%s.command[0]: %q must be an absolute path (keepalived script security)", p, a)
		}
	}
	wholeSec := func(field string, d time.Duration) {
		if d < 0 || d%time.Second != 0 || d > 4294*time.Second {
			bad("%s.%s: %s is not a whole number of seconds in 1s..4294s (keepalived vrrp_script)", p, field, d)
		}
	}
	wholeSec("interval", s.Interval)
	wholeSec("timeout", s.Timeout)
	if s.Weight < -253 || s.Weight > 253 {
		bad("%s.weight: %d is outside -253..253", p, s.Weight)
	}
	return errs
}

func (in Instance) advertInterval() time.Duration {
	if in.AdvertInterval == 0 {
		return DefaultAdvertInterval
	}
	return in.AdvertInterval
}

// version is the VRRP version the instance speaks: 2 with PASS authentication, else 3.
func (in Instance) version() int {
	if in.AuthPass != "" {
		return 2
	}
	return 3
}

// Render validates c and returns its keepalived.conf. The bytes depend only on c (peers sorted, fixed
// layout), so rendering twice gives identical output and an unchanged config needs no reload. The
// result holds AuthPass: write it 0600. Errors: every validation problem at once (see Validate).
func Render(c Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	w := func(indent int, format string, a ...any) {
		b.WriteString(strings.Repeat("    ", indent))
		fmt.Fprintf(&b, format, a...)
		b.WriteByte('\n')
	}
	w(0, "# Generated by the appliance (pkg/keepalived); do not edit. Holds secrets: mode 0600.")
	w(0, "global_defs {")
	if c.RouterID != "" {
		w(1, "router_id %s", c.RouterID)
	}
	w(1, "enable_script_security")
	if c.ScriptUser != "" {
		w(1, "script_user %s", c.ScriptUser)
	}
	w(0, "}")
	for _, in := range c.Instances {
		s := in.TrackScript
		if s == nil {
			continue
		}
		w(0, "")
		w(0, "vrrp_script %s {", scriptName(in))
		w(1, "script \"%s\"", strings.Join(s.Command, " "))
		iv := max(s.Interval, time.Second)
		to := s.Timeout
		if to == 0 {
			to = iv
		}
		w(1, "interval %d", iv/time.Second)
		w(1, "timeout %d", to/time.Second)
		w(1, "fall %d", max(s.Fall, 1))
		w(1, "rise %d", max(s.Rise, 1))
		w(1, "weight %d", s.Weight)
		w(0, "}")
	}
	for _, in := range c.Instances {
		w(0, "")
		w(0, "vrrp_instance %s {", in.Name)
		w(1, "state BACKUP")
		w(1, "interface %s", in.Interface)
		w(1, "version %d", in.version())
		w(1, "virtual_router_id %d", in.VirtualRouterID)
		w(1, "priority %d", in.Priority)
		w(1, "advert_int %s", formatInterval(in.advertInterval()))
		if in.Nopreempt {
			w(1, "nopreempt")
		}
		if in.AuthPass != "" {
			w(1, "authentication {")
			w(2, "auth_type PASS")
			w(2, "auth_pass %s", in.AuthPass)
			w(1, "}")
		}
		w(1, "unicast_src_ip %s", in.SourceIP)
		w(1, "unicast_peer {")
		peers := slices.Clone(in.Peers)
		slices.SortFunc(peers, netip.Addr.Compare)
		for _, a := range peers {
			w(2, "%s", a)
		}
		w(1, "}")
		w(1, "virtual_ipaddress {")
		w(2, "%s dev %s", in.VIP, in.Interface)
		w(1, "}")
		if in.TrackScript != nil {
			w(1, "track_script {")
			w(2, "%s", scriptName(in))
			w(1, "}")
		}
		w(0, "}")
	}
	return b.Bytes(), nil
}

func scriptName(in Instance) string { return in.Name + "-check" }

// formatInterval renders d (a multiple of 10 ms) as keepalived's decimal seconds: "1", "0.25", "1.5".
func formatInterval(d time.Duration) string {
	cs := int64(d / (10 * time.Millisecond))
	if cs%100 == 0 {
		return strconv.FormatInt(cs/100, 10)
	}
	return strings.TrimRight(fmt.Sprintf("%d.%02d", cs/100, cs%100), "0")
}

// lastAddr is the highest address of the masked prefix p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
