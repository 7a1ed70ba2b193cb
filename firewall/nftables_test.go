package firewall

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/airgap-appliance/appliance/test/labns"
)

// labSpec is a bootstrap+control-plane host on 10.77.0.0/29 with one VRRP peer.
func labSpec() Spec {
	return Spec{
		Roles:        []Role{RoleBootstrap, RoleControlPlane},
		NodeNetworks: []netip.Prefix{netip.MustParsePrefix("10.77.0.0/29"), netip.MustParsePrefix("fd00:77::/64")},
		VRRPPeers:    []netip.Addr{netip.MustParseAddr("10.77.0.2"), netip.MustParseAddr("fd00:77::2")},
	}
}

func newNSB(b *testing.B) (*labns.NS, *NFTables) {
	b.Helper()
	labns.RequireTool(b, "nft")
	ns := labns.New(b, "fwbn")
	return ns, &NFTables{NetNSPath: ns.Path()}
}

func newNS(t *testing.T, prefix string) (*labns.NS, *NFTables) {
	t.Helper()
	labns.RequireTool(t, "nft")
	ns := labns.New(t, prefix)
	return ns, &NFTables{NetNSPath: ns.Path()}
}

// listTable returns `nft list table inet NAME` inside ns.
func listTable(t *testing.T, ns *labns.NS, name string) string {
	t.Helper()
	return ns.MustRun("nft", "list", "table", "inet", name)
}

// expectedRuleLines derives, from the port table alone (not from the renderer), the rule lines nft must
// list for spec s.
func expectedRuleLines(s Spec) []*regexp.Regexp {
	var out []*regexp.Regexp
	q := regexp.QuoteMeta
	for _, p := range Ports(s.HTTPSPort, s.APIPort) {
		if !containsRole(s.Roles, p.Role) || p.From == DNSPort && !s.DNS || strings.HasPrefix(p.Name, "ingress-") && !s.Ingress ||
			p.Name == "vxlan" && !s.VXLAN || strings.HasPrefix(p.Name, "boot-") && !s.Boot || p.From == PXEPort && !s.BootProxy {
			continue
		}
		if p.Name == "boot-http" && s.BootHTTPPort != 0 {
			p.From, p.To = s.BootHTTPPort, s.BootHTTPPort
		}
		var match string
		switch p.Protocol {
		case ProtoVRRP:
			match = `meta l4proto (vrrp|112)`
		default:
			match = q(p.Protocol + " dport " + p.PortRange())
		}
		tail := ` accept comment "` + q(p.Name) + `"$`
		switch p.Source {
		case SourceAnywhere:
			out = append(out, regexp.MustCompile(`^\s*`+match+tail))
		case SourceNodeNetworks:
			out = append(out, regexp.MustCompile(`^\s*ip saddr @node_networks_v4 `+match+tail),
				regexp.MustCompile(`^\s*ip6 saddr @node_networks_v6 `+match+tail))
		case SourceVRRPPeers:
			out = append(out, regexp.MustCompile(`^\s*ip saddr @vrrp_peers_v4 `+match+tail),
				regexp.MustCompile(`^\s*ip6 saddr @vrrp_peers_v6 `+match+tail))
		}
	}
	return out
}

// expectedCapLines derives, from the spec's ports and their caps (not the rule text), the per-source cap lines
// nft must list for spec s: one per family for each capped port (every one is open from the node networks).
func expectedCapLines(s Spec) []*regexp.Regexp {
	var out []*regexp.Regexp
	q := regexp.QuoteMeta
	for _, p := range s.ports() {
		if p.ConnsPerSource == 0 {
			continue
		}
		set := "conns_" + strings.ReplaceAll(p.Name, "-", "_")
		for _, fam := range [][2]string{{"ip", "_v4"}, {"ip6", "_v6"}} {
			out = append(out, regexp.MustCompile(`^\s*`+fam[0]+` saddr @node_networks`+fam[1]+` `+q(p.Protocol+" dport "+p.PortRange())+
				` ct state new add @`+set+fam[1]+` \{ `+fam[0]+` saddr ct count over `+strconv.Itoa(p.ConnsPerSource)+
				` \} reject with tcp reset comment "`+q(p.Name)+`"$`))
		}
	}
	return out
}

// ruleHandle returns the handle of the first rule of table's input chain whose comment is comment.
func ruleHandle(t *testing.T, ns *labns.NS, table, comment string) string {
	t.Helper()
	out := ns.MustRun("nft", "-a", "list", "chain", "inet", table, "input")
	m := regexp.MustCompile(`comment "` + regexp.QuoteMeta(comment) + `" # handle (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no rule with comment %q:\n%s", comment, out)
	}
	return m[1]
}

func containsRole(rs []Role, r Role) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

// TestApplyMatchesPortTable applies each golden spec in a fresh namespace and reads it back with the real
// nft: every port of the table is listed with its sources and nothing else is accepted; the base policy is
// drop; the sets hold the spec's networks and peers; `nft -c -f` accepts Render's script; and applying
// Render's script with nft in a second namespace lists byte-identically to what Apply installed.
func TestApplyMatchesPortTable(t *testing.T) {
	for _, c := range append(renderSpecs, struct {
		name string
		spec Spec
	}{"lab", labSpec()}) {
		t.Run(c.name, func(t *testing.T) {
			ns, fw := newNS(t, "fwls")
			changed, err := fw.Apply(t.Context(), c.spec)
			if err != nil || !changed {
				t.Fatalf("Apply = %v, %v; want true, nil", changed, err)
			}
			got := listTable(t, ns, DefaultTable)
			if !strings.Contains(got, "type filter hook input priority filter; policy drop;") {
				t.Errorf("input chain is not a drop-policy input hook:\n%s", got)
			}
			var acceptLines []string
			for _, l := range strings.Split(got, "\n") {
				if strings.Contains(l, "accept comment") {
					acceptLines = append(acceptLines, l)
				}
			}
			want := expectedRuleLines(c.spec)
			for _, re := range want {
				n := 0
				for _, l := range acceptLines {
					if re.MatchString(l) {
						n++
					}
				}
				if n == 0 {
					t.Errorf("no rule matches %s", re)
				}
			}
			if len(acceptLines) > len(want) {
				t.Errorf("%d commented accept rules listed, the port table yields at most %d:\n%s", len(acceptLines), len(want), got)
			}
			var capLines []string
			for _, l := range strings.Split(got, "\n") {
				if strings.Contains(l, "reject") {
					capLines = append(capLines, l)
				}
			}
			wantCaps := expectedCapLines(c.spec)
			for _, re := range wantCaps {
				if !slices.ContainsFunc(capLines, re.MatchString) {
					t.Errorf("no rule matches %s", re)
				}
			}
			if len(capLines) != len(wantCaps) {
				t.Errorf("%d reject rules listed, the port table's connection caps yield %d:\n%s", len(capLines), len(wantCaps), got)
			}
			nn4, _ := mergePrefixes(c.spec.NodeNetworks)
			for _, r := range nn4 {
				if !strings.Contains(got, r.String()) {
					t.Errorf("node network %s not listed:\n%s", r, got)
				}
			}

			script := filepath.Join(t.TempDir(), "fw.nft")
			if err := os.WriteFile(script, []byte(Render(c.spec)), 0o600); err != nil {
				t.Fatal(err)
			}
			ns.MustRun("nft", "-c", "-f", script)
			other := labns.New(t, "fwtx")
			other.MustRun("nft", "-f", script)
			if d := cmp.Diff(listTable(t, other, DefaultTable), got); d != "" {
				t.Errorf("netlink Apply and `nft -f Render()` differ (-nft +Apply):\n%s", d)
			}
			// What nft -f installed is, for InPlace, exactly the desired table.
			if ok, err := (&NFTables{NetNSPath: other.Path()}).InPlace(c.spec); err != nil || !ok {
				t.Errorf("InPlace on the nft-installed table = %v, %v; want true", ok, err)
			}
		})
	}
}

// TestApplyIdempotentAndDetectsDrift: a second Apply changes nothing; InPlace notices a spec change, a rule
// added by hand, a set element removed by hand, and a deleted table; Apply repairs each.
func TestApplyIdempotentAndDetectsDrift(t *testing.T) {
	ns, fw := newNS(t, "fwid")
	s := labSpec()
	ctx := t.Context()
	if ok, err := fw.InPlace(s); err != nil || ok {
		t.Fatalf("InPlace before Apply = %v, %v; want false", ok, err)
	}
	if changed, err := fw.Apply(ctx, s); err != nil || !changed {
		t.Fatalf("first Apply = %v, %v; want true", changed, err)
	}
	before := listTable(t, ns, DefaultTable)
	if changed, err := fw.Apply(ctx, s); err != nil || changed {
		t.Fatalf("second Apply = %v, %v; want false, nil", changed, err)
	}
	if after := listTable(t, ns, DefaultTable); after != before {
		t.Fatalf("unchanged Apply altered the table:\n%s", cmp.Diff(before, after))
	}

	drifts := []struct {
		name  string
		drift func()
		spec  Spec
	}{
		{"spec gains a peer", func() {}, func() Spec {
			s2 := labSpec()
			s2.VRRPPeers = append(s2.VRRPPeers, netip.MustParseAddr("10.77.0.3"))
			return s2
		}()},
		{"spec changes https port", func() {}, func() Spec { s2 := labSpec(); s2.HTTPSPort = 9443; return s2 }()},
		{"rule added by hand", func() {
			ns.MustRun("nft", "add", "rule", "inet", DefaultTable, "input", "tcp", "dport", "9999", "accept")
		}, s},
		{"rule rewritten by hand, same count", func() {
			h := ruleHandle(t, ns, DefaultTable, "ssh")
			ns.MustRun("nft", "replace", "rule", "inet", DefaultTable, "input", "handle", h,
				"tcp", "dport", "23", "accept", "comment", `"ssh"`)
		}, s},
		{"set element removed by hand", func() {
			ns.MustRun("nft", "delete", "element", "inet", DefaultTable, setVRRPPeers4, "{", "10.77.0.2", "}")
		}, s},
		{"policy changed by hand", func() {
			ns.MustRun("nft", "add", "chain", "inet", DefaultTable, "input",
				"{ type filter hook input priority filter; policy accept; }")
		}, s},
		{"chain added by hand", func() { ns.MustRun("nft", "add", "chain", "inet", DefaultTable, "extra") }, s},
		{"table deleted", func() { ns.MustRun("nft", "delete", "table", "inet", DefaultTable) }, s},
	}
	for _, d := range drifts {
		t.Run(d.name, func(t *testing.T) {
			d.drift()
			if ok, err := fw.InPlace(d.spec); err != nil || ok {
				t.Fatalf("InPlace after drift = %v, %v; want false", ok, err)
			}
			if changed, err := fw.Apply(ctx, d.spec); err != nil || !changed {
				t.Fatalf("Apply after drift = %v, %v; want true", changed, err)
			}
			if ok, err := fw.InPlace(d.spec); err != nil || !ok {
				t.Fatalf("InPlace after repair = %v, %v; want true", ok, err)
			}
			// back to the base spec for the next case
			if _, err := fw.Apply(ctx, s); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestForeignTableUntouched: another owner's table with a rule and a set survives Apply, re-Apply and
// Remove byte for byte; Remove deletes only our table and is a no-op when repeated.
func TestForeignTableUntouched(t *testing.T) {
	ns, fw := newNS(t, "fwfo")
	ns.MustRun("nft", "add", "table", "inet", "other")
	ns.MustRun("nft", "add", "set", "inet", "other", "blocked", "{ type ipv4_addr; elements = { 192.0.2.1 } }")
	ns.MustRun("nft", "add", "chain", "inet", "other", "fwdchain", "{ type filter hook forward priority 10; policy accept; }")
	ns.MustRun("nft", "add", "rule", "inet", "other", "fwdchain", "ip", "saddr", "@blocked", "counter", "drop", "comment", `"theirs"`)
	ns.MustRun("nft", "add", "table", "ip", DefaultTable) // same name, other family: not ours either
	want := ns.MustRun("nft", "list", "table", "inet", "other") + ns.MustRun("nft", "list", "table", "ip", DefaultTable)
	foreign := func() string {
		return ns.MustRun("nft", "list", "table", "inet", "other") + ns.MustRun("nft", "list", "table", "ip", DefaultTable)
	}

	ctx := t.Context()
	if _, err := fw.Apply(ctx, labSpec()); err != nil {
		t.Fatal(err)
	}
	s2 := labSpec()
	s2.Roles = []Role{RoleWorker}
	if _, err := fw.Apply(ctx, s2); err != nil {
		t.Fatal(err)
	}
	if got := foreign(); got != want {
		t.Fatalf("Apply changed foreign tables:\n%s", cmp.Diff(want, got))
	}
	for i := range 2 {
		if err := fw.Remove(ctx); err != nil {
			t.Fatalf("Remove #%d: %v", i+1, err)
		}
	}
	if got := foreign(); got != want {
		t.Fatalf("Remove changed foreign tables:\n%s", cmp.Diff(want, got))
	}
	if out, err := ns.Run("nft", "list", "table", "inet", DefaultTable); err == nil {
		t.Fatalf("our table survived Remove:\n%s", out)
	}
}

func TestCustomTableName(t *testing.T) {
	ns, _ := newNS(t, "fwtn")
	fw := &NFTables{NetNSPath: ns.Path(), Table: "appliance_test"}
	if _, err := fw.Apply(t.Context(), labSpec()); err != nil {
		t.Fatal(err)
	}
	got := listTable(t, ns, "appliance_test")
	if !strings.Contains(got, `tcp dport 22 accept comment "ssh"`) {
		t.Errorf("custom table lacks the ssh rule:\n%s", got)
	}
	if out, err := ns.Run("nft", "list", "table", "inet", DefaultTable); err == nil {
		t.Errorf("default table created although Table is set:\n%s", out)
	}
}

func TestMissingNamespace(t *testing.T) {
	labns.RequireRoot(t)
	fw := &NFTables{NetNSPath: "/run/netns/does-not-exist-fw"}
	_, err := fw.Apply(context.Background(), labSpec())
	if err == nil || !strings.Contains(err.Error(), "open network namespace /run/netns/does-not-exist-fw") {
		t.Fatalf("Apply in a missing namespace = %v, want an error naming the path", err)
	}
}
