package netresolve

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/airgap-appliance/appliance/test/labns"
)

const vip = "10.100.0.10"

// hostNS builds a namespace laid out like a bootstrap host:
//
//	eth0 (index 10, up)   10.100.0.10/24 (the VIP, added first so it is the primary), 10.100.0.2/24, fd00:100::2/64
//	eth1 (index 11, up)   10.200.0.2/24, fd00:200::2/64, fd00:50::2/64 (lower than eth0's, higher index)
//	tent0 (index 20, up, no carrier) fd00:300::2/64, left tentative (DAD waits for carrier)
//	down0 (index 21, administratively down) 10.250.0.2/24
//
// plus lo's 127.0.0.1/8 and ::1 and the fe80:: link-local addresses, which are not global scope.
func hostNS(t *testing.T) *labns.NS {
	t.Helper()
	ns := labns.New(t, "nres")
	for _, argv := range [][]string{
		{"ip", "link", "add", "eth0", "index", "10", "type", "veth", "peer", "name", "eth1", "index", "11"},
		{"ip", "addr", "add", vip + "/24", "dev", "eth0"},
		{"ip", "addr", "add", "10.100.0.2/24", "dev", "eth0"},
		{"ip", "addr", "add", "fd00:100::2/64", "dev", "eth0", "nodad"},
		{"ip", "addr", "add", "10.200.0.2/24", "dev", "eth1"},
		{"ip", "addr", "add", "fd00:200::2/64", "dev", "eth1", "nodad"},
		{"ip", "addr", "add", "fd00:50::2/64", "dev", "eth1", "nodad"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "link", "set", "eth1", "up"},
		{"ip", "link", "add", "tent0", "index", "20", "type", "veth", "peer", "name", "down0", "index", "21"},
		{"ip", "link", "set", "tent0", "up"},
		{"ip", "addr", "add", "fd00:300::2/64", "dev", "tent0"},
		{"ip", "addr", "add", "10.250.0.2/24", "dev", "down0"},
	} {
		ns.MustRun(argv...)
	}
	if out := ns.MustRun("ip", "addr", "show", "dev", "tent0"); !strings.Contains(out, "tentative") {
		t.Fatalf("fixture: fd00:300::2 is not tentative:\n%s", out)
	}
	return ns
}

func newResolver(t *testing.T, nsPath string) *Resolver {
	t.Helper()
	r, err := New(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func addr(iface, prefix, cidr string) Address {
	a := Address{Interface: iface, Prefix: netip.MustParsePrefix(prefix)}
	if cidr != "" {
		a.CIDR = netip.MustParsePrefix(cidr)
	}
	return a
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestAddresses(t *testing.T) {
	ns := hostNS(t)
	got, err := newResolver(t, ns.Path()).Addresses()
	if err != nil {
		t.Fatal(err)
	}
	want := []Address{
		addr("eth0", "10.100.0.2/24", ""),
		addr("eth0", "10.100.0.10/24", ""),
		addr("eth0", "fd00:100::2/64", ""),
		addr("eth1", "10.200.0.2/24", ""),
		addr("eth1", "fd00:50::2/64", ""),
		addr("eth1", "fd00:200::2/64", ""),
	}
	if !slices.Equal(got, want) {
		t.Errorf("Addresses() =\n%v\nwant\n%v", got, want)
	}
}

func TestResolve(t *testing.T) {
	ns := hostNS(t)
	r := newResolver(t, ns.Path())
	v := netip.MustParseAddr(vip)
	const hostHas = "eth0 10.100.0.2/24, eth0 10.100.0.10/24, eth0 fd00:100::2/64, eth1 10.200.0.2/24, " +
		"eth1 fd00:50::2/64, eth1 fd00:200::2/64, tent0 fd00:300::2/64 (tentative), down0 10.250.0.2/24 (interface down)"
	tests := []struct {
		name    string
		cidrs   []netip.Prefix
		exclude []netip.Addr
		want    Address
		wantErr string // exact message when non-empty
	}{
		{"VIP is the first match without exclusion", prefixes("10.100.0.0/24"), nil,
			addr("eth0", "10.100.0.10/24", "10.100.0.0/24"), ""},
		{"VIP excluded although it is the primary address", prefixes("10.100.0.0/24"), []netip.Addr{v},
			addr("eth0", "10.100.0.2/24", "10.100.0.0/24"), ""},
		{"VIP excluded given as IPv4-mapped IPv6", prefixes("10.100.0.0/24"), []netip.Addr{netip.MustParseAddr("::ffff:" + vip)},
			addr("eth0", "10.100.0.2/24", "10.100.0.0/24"), ""},
		{"CIDR list order wins over interface order", prefixes("10.9.0.0/24", "10.200.0.0/16", "10.100.0.0/24"), []netip.Addr{v},
			addr("eth1", "10.200.0.2/24", "10.200.0.0/16"), ""},
		{"interfaces in index order, not address order", prefixes("fd00::/8"), nil,
			addr("eth0", "fd00:100::2/64", "fd00::/8"), ""},
		{"unmasked CIDR", prefixes("10.200.0.7/24"), nil,
			addr("eth1", "10.200.0.2/24", "10.200.0.7/24"), ""},
		{"no match lists every address", prefixes("10.9.0.0/24"), nil, Address{},
			"no local address in the configured CIDRs [10.9.0.0/24]; this host has: " + hostHas},
		{"only the VIP matches", prefixes(vip + "/32"), []netip.Addr{v}, Address{},
			"no local address in the configured CIDRs [10.100.0.10/32]; this host has: " +
				strings.Replace(hostHas, "10.100.0.10/24", "10.100.0.10/24 (excluded)", 1)},
		{"tentative IPv6 skipped", prefixes("fd00:300::/64"), nil, Address{},
			"no local address in the configured CIDRs [fd00:300::/64]; this host has: " + hostHas},
		{"down interface skipped", prefixes("10.250.0.0/24", "10.9.0.0/24"), nil, Address{},
			"no local address in the configured CIDRs [10.250.0.0/24 10.9.0.0/24]; this host has: " + hostHas},
		{"loopback is not global scope", prefixes("127.0.0.0/8", "::1/128"), nil, Address{},
			"no local address in the configured CIDRs [127.0.0.0/8 ::1/128]; this host has: " + hostHas},
		{"link-local is not global scope", prefixes("fe80::/10"), nil, Address{},
			"no local address in the configured CIDRs [fe80::/10]; this host has: " + hostHas},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.Resolve(tc.cidrs, tc.exclude...)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrNoMatch) || err.Error() != tc.wantErr {
					t.Fatalf("err =\n%v\nwant ErrNoMatch\n%s", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Resolve = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestResolveBadInput(t *testing.T) {
	r := newResolver(t, "")
	for _, tc := range []struct {
		name  string
		cidrs []netip.Prefix
		want  string
	}{
		{"empty list", nil, "no CIDRs given"},
		{"zero CIDR", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), {}}, "CIDR 1 is invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.Resolve(tc.cidrs)
			if err == nil || errors.Is(err, ErrNoMatch) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q (not ErrNoMatch)", err, tc.want)
			}
		})
	}
}

// TestNamespaceIsolation checks that a Resolver given nsPath reads that namespace only, and that
// neither New nor a query moves the calling thread into it.
func TestNamespaceIsolation(t *testing.T) {
	ns := hostNS(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()

	inNS, err := newResolver(t, ns.Path()).Addresses()
	if err != nil {
		t.Fatal(err)
	}
	after, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if !before.Equal(after) {
		t.Fatal("the test's thread was left in another network namespace")
	}

	root, err := newResolver(t, "").Addresses()
	if err != nil {
		t.Fatal(err)
	}
	// Cross-check the current namespace's view with iproute2, a real peer reading the same table.
	ipOut, err := exec.Command("ip", "-o", "addr", "show", "scope", "global").Output()
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(strings.TrimSpace(string(ipOut)), "\n") + 1; len(strings.TrimSpace(string(ipOut))) > 0 && len(root) > n {
		t.Errorf("current namespace: %d addresses, iproute2 lists only %d", len(root), n)
	}
	for _, a := range root {
		if !strings.Contains(string(ipOut), " "+a.Prefix.String()+" ") {
			t.Errorf("current namespace: %v not listed by iproute2:\n%s", a, ipOut)
		}
		if slices.Contains(inNS, a) {
			t.Errorf("namespace resolver returned the current namespace's %v", a)
		}
	}
	for _, a := range inNS {
		if slices.Contains(root, a) {
			t.Errorf("current-namespace resolver returned the lab namespace's %v", a)
		}
	}
	if len(inNS) != 6 {
		t.Errorf("namespace resolver: %d addresses, want 6: %v", len(inNS), inNS)
	}
}

// TestResolverOutlivesNamespaceMount checks that the socket stays bound to the namespace after its
// /run/netns mount is removed (the kernel keeps the namespace alive while the socket is open).
func TestResolverOutlivesNamespaceMount(t *testing.T) {
	ns := hostNS(t)
	r := newResolver(t, ns.Path())
	if out, err := exec.Command("ip", "netns", "del", ns.Name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v: %s", err, out)
	}
	got, err := r.Resolve(prefixes("10.200.0.0/24"))
	if err != nil || got != addr("eth1", "10.200.0.2/24", "10.200.0.0/24") {
		t.Fatalf("after unmount: %+v %v", got, err)
	}
	if _, err := New(ns.Path()); err == nil {
		t.Error("New on a removed namespace path succeeded")
	}
}

// TestAddressesWhileTableChanges reads addresses while iproute2 adds and removes 256 addresses on eth1,
// so dumps may be interrupted; every read must succeed and include the stable addresses.
func TestAddressesWhileTableChanges(t *testing.T) {
	ns := hostNS(t)
	r := newResolver(t, ns.Path())
	var batch strings.Builder
	for round := range 2 {
		for i := range 128 {
			fmt.Fprintf(&batch, "addr add 10.201.%d.%d/32 dev eth1\n", round, i+1)
		}
		for i := range 128 {
			fmt.Fprintf(&batch, "addr del 10.201.%d.%d/32 dev eth1\n", round, i+1)
		}
	}
	cmd := exec.Command("ip", "-n", ns.Name, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	var wg sync.WaitGroup
	var cmdErr error
	var cmdOut []byte
	wg.Go(func() { cmdOut, cmdErr = cmd.CombinedOutput() })
	stable := addr("eth0", "10.100.0.2/24", "")
	for range 200 {
		got, err := r.Addresses()
		if err != nil {
			t.Fatalf("Addresses during changes: %v", err)
		}
		if !slices.Contains(got, stable) {
			t.Fatalf("Addresses during changes lost %v: %v", stable, got)
		}
	}
	wg.Wait()
	if cmdErr != nil {
		t.Fatalf("ip -batch: %v\n%s", cmdErr, cmdOut)
	}
}

func TestRetryInterrupted(t *testing.T) {
	other := errors.New("other")
	tests := []struct {
		name      string
		results   []error
		wantCalls int
		wantErr   error
	}{
		{"success", []error{nil}, 1, nil},
		{"interrupted twice then success", []error{netlink.ErrDumpInterrupted, netlink.ErrDumpInterrupted, nil}, 3, nil},
		{"other error is not retried", []error{other}, 1, other},
		{"always interrupted gives up", slices.Repeat([]error{netlink.ErrDumpInterrupted}, dumpAttempts), dumpAttempts, netlink.ErrDumpInterrupted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := retryInterrupted(dumpAttempts, func() error {
				calls++
				if err := tc.results[calls-1]; err != nil {
					return fmt.Errorf("dump: %w", err)
				}
				return nil
			})
			if calls != tc.wantCalls {
				t.Errorf("calls = %d, want %d", calls, tc.wantCalls)
			}
			if tc.wantErr == nil && err != nil {
				t.Errorf("err = %v, want nil", err)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
		})
	}
}

func TestClosedResolver(t *testing.T) {
	r, err := New("")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := r.Addresses(); err == nil {
		t.Error("Addresses on a closed resolver succeeded")
	}
}

func BenchmarkResolve(b *testing.B) {
	r, err := New("")
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	cidrs := prefixes("10.9.0.0/24", "0.0.0.0/0", "::/0")
	for b.Loop() {
		if _, err := r.Resolve(cidrs); err != nil && !errors.Is(err, ErrNoMatch) {
			b.Fatal(err)
		}
	}
}
