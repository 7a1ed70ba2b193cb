package firewall

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/godbus/dbus/v5"
)

// The firewalld backend against a real firewalld runs in test/lab/firewalld_test.go (a node container with
// Debian's firewalld under systemd); these tests cover what needs no firewalld.

func TestFirewalldDesired(t *testing.T) {
	s := Spec{
		Roles: []Role{RoleBootstrap},
		NodeNetworks: []netip.Prefix{netip.MustParsePrefix("10.0.1.7/24"), netip.MustParsePrefix("10.0.0.0/16"),
			netip.MustParsePrefix("::ffff:192.168.0.0/112"), netip.MustParsePrefix("fd00::/64")},
		VRRPPeers: []netip.Addr{netip.MustParseAddr("10.0.0.12"), netip.MustParseAddr("::ffff:10.0.0.11"),
			netip.MustParseAddr("fd00::3"), netip.MustParseAddr("10.0.0.12")},
	}
	st := firewalldDesired(s)
	if got, want := st.zone["sources"], []string{"10.0.0.0/16", "192.168.0.0/16", "fd00::/64"}; !slices.Equal(got.([]string), want) {
		t.Errorf("sources = %v, want %v (masked, unmapped, covered ones dropped)", got, want)
	}
	if got, want := st.zone["ports"], []portProto{{"8443", "tcp"}}; !slices.Equal(got.([]portProto), want) {
		t.Errorf("zone ports = %v, want %v", got, want)
	}
	if got, want := st.policy["ports"], []portProto{{"22", "tcp"}, {"6443", "tcp"}}; !slices.Equal(got.([]portProto), want) {
		t.Errorf("policy ports = %v, want %v (no DNS port without Spec.DNS)", got, want)
	}
	withDNS := s
	withDNS.DNS = true
	if got, want := firewalldDesired(withDNS).policy["ports"], []portProto{{"22", "tcp"}, {"53", "udp"}, {"53", "tcp"}, {"6443", "tcp"}}; !slices.Equal(got.([]portProto), want) {
		t.Errorf("with Spec.DNS: policy ports = %v, want %v", got, want)
	}
	withBoot := s
	withBoot.Boot, withBoot.BootProxy, withBoot.BootHTTPPort = true, true, 8081
	if got, want := firewalldDesired(withBoot).policy["ports"], []portProto{{"22", "tcp"}, {"67", "udp"}, {"6443", "tcp"}}; !slices.Equal(got.([]portProto), want) {
		t.Errorf("with Spec.Boot: policy ports = %v, want %v (DHCP from anywhere)", got, want)
	}
	if got, want := firewalldDesired(withBoot).zone["ports"], []portProto{{"8443", "tcp"}, {"4011", "udp"}, {"69", "udp"}, {"8081", "tcp"}}; !slices.Equal(got.([]portProto), want) {
		t.Errorf("with Spec.Boot: zone ports = %v, want %v (proxyDHCP, TFTP, boot HTTP from the node networks)", got, want)
	}
	// The rule text must be firewalld's own rendering (rich.py Rich_Rule.__str__), or every Apply would differ.
	want := []string{
		`rule family="ipv4" source address="10.0.0.11" protocol value="112" accept`,
		`rule family="ipv4" source address="10.0.0.12" protocol value="112" accept`,
		`rule family="ipv6" source address="fd00::3" protocol value="112" accept`,
	}
	if got := st.policy["rich_rules"].([]string); !slices.Equal(got, want) {
		t.Errorf("rich rules =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.HasPrefix(st.zone["description"].(string), firewalldMark) || !strings.HasPrefix(st.policy["description"].(string), firewalldMark) {
		t.Error("descriptions must carry the ownership mark")
	}
	if st.policy["priority"] != firewalldPolicyPriority || !slices.Equal(st.policy["ingress_zones"].([]string), []string{"ANY"}) ||
		!slices.Equal(st.policy["egress_zones"].([]string), []string{"HOST"}) {
		t.Errorf("policy = %v", st.policy)
	}
	// Every value must be encodable as a D-Bus variant of the type firewalld expects.
	sigs := map[string]string{"ports": "a(ss)", "source_ports": "a(ss)", "forward_ports": "a(ssss)", "sources": "as",
		"rich_rules": "as", "masquerade": "b", "priority": "i", "target": "s"}
	for _, m := range []settings{st.zone, st.policy} {
		for k, v := range m.variants() {
			if want, ok := sigs[k]; ok && v.Signature().String() != want {
				t.Errorf("%s encodes as %s, want %s", k, v.Signature(), want)
			}
		}
	}
}

// TestDiffSettings: values as firewalld returns them (variants, a(ss) decoded as [][]any, empty lists omitted)
// compare equal to ours; a real difference is named by key.
func TestDiffSettings(t *testing.T) {
	want := settings{"ports": []portProto{{"22", "tcp"}, {"6443", "tcp"}}, "sources": []string{}, "target": "default",
		"masquerade": false, "priority": int32(-100), "short": "x"}
	live := map[string]dbus.Variant{
		"ports":      dbus.MakeVariant([][]any{{"6443", "tcp"}, {"22", "tcp"}}),
		"target":     dbus.MakeVariant("default"),
		"masquerade": dbus.MakeVariant(false),
		"priority":   dbus.MakeVariant(int32(-100)),
		"short":      dbus.MakeVariant("x"),
	}
	if d := diffSettings(want, live, nil); len(d) != 0 {
		t.Errorf("diff = %v, want none", d)
	}
	live["ports"] = dbus.MakeVariant([][]any{{"22", "tcp"}})
	live["sources"] = dbus.MakeVariant([]string{"10.0.0.0/8"})
	if d := diffSettings(want, live, nil); !slices.Equal(d, []string{"ports", "sources"}) {
		t.Errorf("diff = %v, want [ports sources]", d)
	}
	if d := diffSettings(want, live, []string{"target"}); len(d) != 0 {
		t.Errorf("diff restricted to target = %v", d)
	}
}

func TestBackendOfDetail(t *testing.T) {
	s := Spec{Roles: []Role{RoleWorker}, NodeNetworks: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	for _, c := range []struct{ detail, want string }{
		{"unchanged: " + Describe(&NFTables{}, s), "nftables"},
		{"replaced " + Describe(&Firewalld{}, s), "firewalld"},
		{"in place: " + Describe(&Firewalld{Zone: "x"}, s), "firewalld"},
		{"unchanged: table inet appliance: roles [worker], 1 node networks, 0 VRRP peers", "nftables"}, // before backends were named
		{"skipped: --no-firewall", ""},
		{"nft:\nno permission", ""},
		{"", ""},
	} {
		if got := BackendOfDetail(c.detail); got != c.want {
			t.Errorf("BackendOfDetail(%q) = %q, want %q", c.detail, got, c.want)
		}
	}
	if got := Describe(&Firewalld{}, s); got != "firewalld (zone appliance, policy appliance-host): roles [worker], 1 node networks, 0 VRRP peers" {
		t.Errorf("Describe = %q", got)
	}
}

// TestChooseWithoutBus: no system bus means no firewalld (the nftables backend); a forced backend is taken as
// given; an unknown one is refused; the firewalld backend without a bus says so.
func TestChooseWithoutBus(t *testing.T) {
	ctx := context.Background()
	nobus := "unix:path=" + filepath.Join(t.TempDir(), "system_bus_socket")
	b, why, err := Choose(ctx, ChooseOptions{BusAddress: nobus})
	if err != nil || b.Name() != BackendNFTables || !strings.Contains(why, "no D-Bus system bus") {
		t.Errorf("Choose without a bus = %v, %q, %v; want nftables", b, why, err)
	}
	if b, _, err := Choose(ctx, ChooseOptions{BusAddress: nobus, Backend: BackendFirewalld}); err != nil || b.Name() != BackendFirewalld {
		t.Errorf("forced firewalld = %v, %v", b, err)
	}
	if _, _, err := Choose(ctx, ChooseOptions{Backend: "iptables"}); err == nil || !strings.Contains(err.Error(), `"iptables"`) {
		t.Errorf("unknown backend = %v", err)
	}
	f := &Firewalld{BusAddress: nobus}
	if _, err := f.Apply(ctx, Spec{Roles: []Role{RoleWorker}, NodeNetworks: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}); !errors.Is(err, ErrFirewalldUnavailable) {
		t.Errorf("Apply without a bus = %v, want ErrFirewalldUnavailable", err)
	}
	if _, err := f.Apply(ctx, Spec{}); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("Apply of an invalid spec = %v, want ErrInvalidSpec first", err)
	}
}

// TestRetype: port lists come back from firewalld as a(ss) (decoded [][]any) or aas; sent back for an undo they
// must be arrays of structs again (firewalld refuses arrays of arrays: "not of type tuple").
func TestRetype(t *testing.T) {
	for _, v := range []dbus.Variant{
		dbus.MakeVariant([][]any{{"22", "tcp"}}),
		dbus.MakeVariant([][]string{{"22", "tcp"}}),
		dbus.MakeVariant([]portProto{{"22", "tcp"}}),
	} {
		got := retype("ports", v)
		if got.Signature().String() != "a(ss)" || canon(got) != "[22/tcp]" || canon(v) != "[22/tcp]" {
			t.Errorf("retype(%s %v) = %s %v", v.Signature(), v.Value(), got.Signature(), got.Value())
		}
	}
	if got := retype("forward_ports", dbus.MakeVariant([][]any{{"80", "tcp", "8080", ""}})); got.Signature().String() != "a(ssss)" {
		t.Errorf("forward_ports retyped as %s", got.Signature())
	}
	if got := retype("sources", dbus.MakeVariant([]string{"10.0.0.0/8"})); got.Signature().String() != "as" {
		t.Errorf("sources retyped as %s", got.Signature())
	}
	if got := retype("ports", dbus.MakeVariant([][]any{})); got.Signature().String() != "a(ss)" {
		t.Errorf("empty ports retyped as %s", got.Signature())
	}
	undo := restoreSettings(settings{"ports": []portProto{}, "sources": []string{}, "short": ""},
		map[string]dbus.Variant{"ports": dbus.MakeVariant([][]any{{"22", "tcp"}})}, nil)
	if undo["ports"].Signature().String() != "a(ss)" || undo["sources"].Signature().String() != "as" || undo["short"].Value() != "" {
		t.Errorf("restoreSettings = %v", undo)
	}
}
