package firewall

import (
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden %s (run `go test ./firewall -run %s -update` to create it): %v", path, t.Name(), err)
	}
	if d := cmp.Diff(string(want), got); d != "" {
		t.Errorf("%s differs from golden (-want +got; rerun with -update if intended):\n%s", path, d)
	}
}

func TestPortsTableIsWellFormed(t *testing.T) {
	for _, p := range Ports(0, 0) {
		if !p.Role.Valid() || p.Name == "" || p.Description == "" || p.Reference == "" {
			t.Errorf("incomplete entry %+v", p)
		}
		switch p.Protocol {
		case ProtoTCP, ProtoUDP:
			if p.From == 0 || p.From > p.To || p.Source == SourceVRRPPeers {
				t.Errorf("bad tcp/udp entry %+v", p)
			}
			if p.ConnsPerSource < 0 || p.ConnsPerSource > 0 && p.Protocol != ProtoTCP {
				t.Errorf("a connection cap is for TCP ports only: %+v", p)
			}
		case ProtoVRRP:
			if p.From != 0 || p.To != 0 || p.Source != SourceVRRPPeers {
				t.Errorf("VRRP must be portless and only from VRRP peers: %+v", p)
			}
		default:
			t.Errorf("unknown protocol in %+v", p)
		}
	}
}

// TestPortsRequired pins the openings the cluster cannot work without (kubeadm "Ports and Protocols",
// RFC 5798): a change to the table must be deliberate.
func TestPortsRequired(t *testing.T) {
	type k struct {
		role     Role
		name     string
		proto    string
		from, to uint16
		src      Source
	}
	want := []k{
		{RoleBootstrap, "ssh", ProtoTCP, 22, 22, SourceAnywhere},
		{RoleControlPlane, "ssh", ProtoTCP, 22, 22, SourceAnywhere},
		{RoleEtcd, "ssh", ProtoTCP, 22, 22, SourceAnywhere},
		{RoleWorker, "ssh", ProtoTCP, 22, 22, SourceAnywhere},
		{RoleBootstrap, "appliance-https", ProtoTCP, 9443, 9443, SourceNodeNetworks},
		{RoleBootstrap, "dns-udp", ProtoUDP, 53, 53, SourceAnywhere},
		{RoleBootstrap, "dns-tcp", ProtoTCP, 53, 53, SourceAnywhere},
		{RoleControlPlane, "dns-udp", ProtoUDP, 53, 53, SourceNodeNetworks},
		{RoleControlPlane, "dns-tcp", ProtoTCP, 53, 53, SourceNodeNetworks},
		{RoleBootstrap, "boot-dhcp", ProtoUDP, 67, 67, SourceAnywhere},
		{RoleBootstrap, "boot-proxydhcp", ProtoUDP, 4011, 4011, SourceNodeNetworks},
		{RoleBootstrap, "boot-tftp", ProtoUDP, 69, 69, SourceNodeNetworks},
		{RoleBootstrap, "boot-http", ProtoTCP, 8080, 8080, SourceNodeNetworks},
		{RoleBootstrap, "vrrp", ProtoVRRP, 0, 0, SourceVRRPPeers},
		{RoleControlPlane, "vrrp", ProtoVRRP, 0, 0, SourceVRRPPeers},
		{RoleBootstrap, "kube-apiserver", ProtoTCP, 7443, 7443, SourceAnywhere},
		{RoleControlPlane, "kube-apiserver", ProtoTCP, 7443, 7443, SourceAnywhere},
		{RoleControlPlane, "apiserver-lb", ProtoTCP, 9445, 9445, SourceAnywhere},
		{RoleControlPlane, "ingress-http", ProtoTCP, 80, 80, SourceAnywhere},
		{RoleControlPlane, "ingress-https", ProtoTCP, 443, 443, SourceAnywhere},
		{RoleControlPlane, "ingress-router", ProtoTCP, 10080, 10080, SourceNodeNetworks},
		{RoleWorker, "ingress-router", ProtoTCP, 10080, 10080, SourceNodeNetworks},
		{RoleControlPlane, "ingress-router-tls", ProtoTCP, 10443, 10443, SourceNodeNetworks},
		{RoleWorker, "ingress-router-tls", ProtoTCP, 10443, 10443, SourceNodeNetworks},
		{RoleControlPlane, "ingress-router-health", ProtoTCP, 1936, 1936, SourceNodeNetworks},
		{RoleWorker, "ingress-router-health", ProtoTCP, 1936, 1936, SourceNodeNetworks},
		{RoleControlPlane, "vxlan", ProtoUDP, 4789, 4789, SourceNodeNetworks},
		{RoleWorker, "vxlan", ProtoUDP, 4789, 4789, SourceNodeNetworks},
		{RoleEtcd, "etcd", ProtoTCP, 2379, 2380, SourceNodeNetworks},
		{RoleControlPlane, "kubelet", ProtoTCP, 10250, 10250, SourceNodeNetworks},
		{RoleWorker, "kubelet", ProtoTCP, 10250, 10250, SourceNodeNetworks},
		{RoleControlPlane, "kube-scheduler", ProtoTCP, 10259, 10259, SourceNodeNetworks},
		{RoleControlPlane, "kube-controller-manager", ProtoTCP, 10257, 10257, SourceNodeNetworks},
		{RoleControlPlane, "cluster-mirror", ProtoTCP, 5443, 5443, SourceNodeNetworks},
		{RoleControlPlane, "kube-proxy-health", ProtoTCP, 10256, 10256, SourceNodeNetworks},
		{RoleWorker, "kube-proxy-health", ProtoTCP, 10256, 10256, SourceNodeNetworks},
		{RoleWorker, "nodeport-tcp", ProtoTCP, 30000, 32767, SourceAnywhere},
		{RoleWorker, "nodeport-udp", ProtoUDP, 30000, 32767, SourceAnywhere},
	}
	var got []k
	for _, p := range Ports(9443, 7443) {
		got = append(got, k{p.Role, p.Name, p.Protocol, p.From, p.To, p.Source})
		// The ports served behind pkg/connlimit, and only they, are capped per source in the kernel.
		if want := map[string]int{"appliance-https": ConnsPerSource, "boot-http": ConnsPerSource, "cluster-mirror": ConnsPerSource}[p.Name]; p.ConnsPerSource != want {
			t.Errorf("%s (%s): ConnsPerSource %d, want %d", p.Name, p.Role, p.ConnsPerSource, want)
		}
	}
	for _, w := range want {
		found := false
		for _, g := range got {
			found = found || g == w
		}
		if !found {
			t.Errorf("port table lacks %+v", w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("port table has %d entries, this test pins %d: add the new entry here", len(got), len(want))
	}
	if d := cmp.Diff(Ports(0, 0), Ports(DefaultHTTPSPort, DefaultAPIPort)); d != "" {
		t.Errorf("Ports(0, 0) is not the defaulted table:\n%s", d)
	}
}

func TestMarkdownTable(t *testing.T) {
	got := MarkdownTable(0, 0)
	if got != MarkdownTable(0, 0) {
		t.Fatal("MarkdownTable is not deterministic")
	}
	if rows := strings.Count(got, "\n") - 2; rows != len(Ports(0, 0)) {
		t.Errorf("markdown has %d rows, want one per port entry (%d)", rows, len(Ports(0, 0)))
	}
	golden(t, "porttable.md", got)
}

func TestValidate(t *testing.T) {
	nn := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}
	cases := []struct {
		name string
		spec Spec
		want []string
	}{
		{"ok", Spec{Roles: []Role{RoleWorker}, NodeNetworks: nn}, nil},
		{"no roles", Spec{NodeNetworks: nn}, []string{"roles: at least one role is required"}},
		{"unknown role", Spec{Roles: []Role{RoleWorker, "master"}, NodeNetworks: nn},
			[]string{`roles[1]: unknown role "master"`}},
		{"no networks", Spec{Roles: []Role{RoleWorker}}, []string{"nodeNetworks: at least one network is required"}},
		{"bootProxy without boot", Spec{Roles: []Role{RoleBootstrap}, NodeNetworks: nn, BootProxy: true},
			[]string{"bootProxy: set only with boot"}},
		{"bad network and peers, all reported", Spec{Roles: []Role{RoleWorker},
			NodeNetworks: []netip.Prefix{nn[0], {}},
			VRRPPeers:    []netip.Addr{{}, netip.MustParseAddr("fe80::1%eth0")}},
			[]string{"nodeNetworks[1]: ", "vrrpPeers[0]: not an IP address", `vrrpPeers[1]: "fe80::1%eth0" has a zone`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.spec.Validate()
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("Validate = %v, want ErrInvalidSpec", err)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(c.want) {
				t.Fatalf("got %d errors, want %d: %v", len(lines), len(c.want), err)
			}
			for i, w := range c.want {
				if !strings.Contains(lines[i], w) {
					t.Errorf("error %d = %q, want it to contain %q", i, lines[i], w)
				}
			}
		})
	}
}

// TestBootRows: the network-boot rows open only with Spec.Boot, 4011 only with BootProxy too, and
// the boot HTTP port is Spec.BootHTTPPort (DefaultBootHTTPPort when 0).
func TestBootRows(t *testing.T) {
	base := Spec{Roles: []Role{RoleBootstrap}, NodeNetworks: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}}
	open := func(s Spec) []string {
		var out []string
		for _, p := range s.ports() {
			if p.isBoot() {
				out = append(out, p.Name+" "+p.Protocol+"/"+p.PortRange())
			}
		}
		return out
	}
	server, proxy := base, base
	server.Boot = true
	proxy.Boot, proxy.BootProxy, proxy.BootHTTPPort = true, true, 8081
	for _, c := range []struct {
		name string
		spec Spec
		want []string
	}{
		{"off", base, nil},
		{"server", server, []string{"boot-dhcp udp/67", "boot-tftp udp/69", "boot-http tcp/8080"}},
		{"proxy, port 8081", proxy, []string{"boot-dhcp udp/67", "boot-proxydhcp udp/4011", "boot-tftp udp/69", "boot-http tcp/8081"}},
	} {
		if got := open(c.spec); !slices.Equal(got, c.want) {
			t.Errorf("%s: boot rows %v, want %v", c.name, got, c.want)
		}
	}
}

func TestMergePrefixes(t *testing.T) {
	cases := []struct {
		in     []string
		v4, v6 []string
	}{
		{[]string{"10.0.0.5/24"}, []string{"10.0.0.0/24"}, nil},
		{[]string{"10.0.1.0/24", "10.0.0.0/24"}, []string{"10.0.0.0/23"}, nil},                                   // adjacent
		{[]string{"10.0.0.0/8", "10.1.0.0/16", "192.168.0.0/16"}, []string{"10.0.0.0/8", "192.168.0.0/16"}, nil}, // contained
		{[]string{"10.0.0.0/24", "10.0.1.0/25"}, []string{"10.0.0.0-10.0.1.127"}, nil},                           // not a prefix
		{[]string{"0.0.0.0/0", "10.0.0.0/8"}, []string{"0.0.0.0/0"}, nil},
		{[]string{"::ffff:10.0.0.0/104", "fd00::/64", "fd00::/48"}, []string{"10.0.0.0/8"}, []string{"fd00::/48"}},
	}
	for _, c := range cases {
		var ps []netip.Prefix
		for _, s := range c.in {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		v4, v6 := mergePrefixes(ps)
		str := func(rs []addrRange) []string {
			var out []string
			for _, r := range rs {
				out = append(out, r.String())
			}
			return out
		}
		if d := cmp.Diff(c.v4, str(v4)); d != "" {
			t.Errorf("%v v4 (-want +got):\n%s", c.in, d)
		}
		if d := cmp.Diff(c.v6, str(v6)); d != "" {
			t.Errorf("%v v6 (-want +got):\n%s", c.in, d)
		}
	}
}

// FuzzMergePrefixes checks the invariants nftables interval sets need: ranges sorted, disjoint, not
// adjacent, and covering every input prefix.
func FuzzMergePrefixes(f *testing.F) {
	f.Add([]byte{10, 0, 0, 0, 24, 10, 0, 1, 0, 24, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var ps []netip.Prefix
		for ; len(b) >= 5 && len(ps) < 16; b = b[5:] {
			a := netip.AddrFrom4([4]byte(b[:4]))
			ps = append(ps, netip.PrefixFrom(a, int(b[4])%33))
		}
		v4, _ := mergePrefixes(ps)
		for i := 1; i < len(v4); i++ {
			if next := v4[i-1].last.Next(); !next.IsValid() || v4[i].first.Compare(next) <= 0 {
				t.Fatalf("ranges %v and %v overlap or touch", v4[i-1], v4[i])
			}
		}
		for _, p := range ps {
			p = p.Masked()
			covered := false
			for _, r := range v4 {
				covered = covered || (r.first.Compare(p.Addr()) <= 0 && r.last.Compare(lastAddr(p)) >= 0)
			}
			if !covered {
				t.Fatalf("%v not covered by %v", p, v4)
			}
		}
	})
}

var renderSpecs = []struct {
	name string
	spec Spec
}{
	{"bootstrap", Spec{Roles: []Role{RoleBootstrap},
		NodeNetworks: []netip.Prefix{netip.MustParsePrefix("10.77.0.0/24"), netip.MustParsePrefix("10.78.0.0/24")},
		VRRPPeers:    []netip.Addr{netip.MustParseAddr("10.77.0.12"), netip.MustParseAddr("10.77.0.11")}}},
	{"control-plane-etcd-dualstack", Spec{Roles: []Role{RoleControlPlane, RoleEtcd},
		NodeNetworks: []netip.Prefix{netip.MustParsePrefix("10.77.0.0/24"), netip.MustParsePrefix("fd00:77::/64")},
		VRRPPeers:    []netip.Addr{netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr("fd00:77::1")},
		HTTPSPort:    9443, APIPort: 7443}},
	{"bootstrap-netboot", Spec{Roles: []Role{RoleBootstrap},
		NodeNetworks: []netip.Prefix{netip.MustParsePrefix("10.77.0.0/24")},
		Boot:         true, BootProxy: true, BootHTTPPort: 8081}},
	{"worker", Spec{Roles: []Role{RoleWorker}, NodeNetworks: []netip.Prefix{netip.MustParsePrefix("192.168.10.0/23")}}},
	// A worker in a cluster with an ingress VIP: 80 and 443 for its ingress router.
	{"worker-ingress", Spec{Roles: []Role{RoleWorker}, NodeNetworks: []netip.Prefix{netip.MustParsePrefix("192.168.10.0/23")}, Ingress: true, VXLAN: true}},
	// A control plane running the cluster's CoreDNS (hostagent sets DNS from the node config): 53
	// from the node networks only; control-plane-etcd-dualstack, without DNS, has no 53.
	{"control-plane-dns", Spec{Roles: []Role{RoleControlPlane, RoleEtcd},
		NodeNetworks: []netip.Prefix{netip.MustParsePrefix("10.77.0.0/24"), netip.MustParsePrefix("10.244.0.0/16")},
		VRRPPeers:    []netip.Addr{netip.MustParseAddr("10.77.0.12")}, DNS: true}},
	{"all-roles", Spec{Roles: Roles(), NodeNetworks: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		VRRPPeers: []netip.Addr{netip.MustParseAddr("10.0.0.2")}, DNS: true, Ingress: true}},
}

func TestRenderGolden(t *testing.T) {
	for _, c := range renderSpecs {
		t.Run(c.name, func(t *testing.T) {
			got := Render(c.spec)
			if again := Render(c.spec); again != got {
				t.Fatal("Render is not deterministic")
			}
			golden(t, "render-"+c.name+".nft", got)
		})
	}
}

func TestRenderInvalidSpecSaysSo(t *testing.T) {
	got := Render(Spec{Roles: []Role{"master"}})
	for _, want := range []string{`# invalid: invalid firewall spec: roles[0]: unknown role "master"`,
		"# invalid: invalid firewall spec: nodeNetworks: at least one network"} {
		if !strings.Contains(got, want) {
			t.Errorf("Render of an invalid spec lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "dport") {
		t.Errorf("unknown role must open no port:\n%s", got)
	}
}

func TestApplyRejectsInvalidSpec(t *testing.T) {
	n := &NFTables{NetNSPath: "/nonexistent"}
	if _, err := n.Apply(t.Context(), Spec{}); !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("Apply(empty spec) = %v, want ErrInvalidSpec before touching any namespace", err)
	}
	if _, err := n.InPlace(Spec{}); !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("InPlace(empty spec) = %v, want ErrInvalidSpec", err)
	}
}

// TestNodeRoles: a node's roles become port-table roles, control planes with etcd (stacked), each
// once, in the order they first appear; unknown roles give nothing.
func TestNodeRoles(t *testing.T) {
	for _, tt := range []struct {
		roles []string
		want  []Role
	}{
		{[]string{"control-plane"}, []Role{RoleControlPlane, RoleEtcd}},
		{[]string{"worker"}, []Role{RoleWorker}},
		{[]string{"control-plane", "worker"}, []Role{RoleControlPlane, RoleEtcd, RoleWorker}},
		{[]string{"worker", "control-plane", "worker"}, []Role{RoleWorker, RoleControlPlane, RoleEtcd}},
		{[]string{"bootstrap", "etcd", "Worker"}, nil},
		{nil, nil},
	} {
		if got := NodeRoles(tt.roles); !slices.Equal(got, tt.want) {
			t.Errorf("NodeRoles(%q) = %v, want %v", tt.roles, got, tt.want)
		}
	}
}
