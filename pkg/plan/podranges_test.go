package plan

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// TestAllocatePodRangesFirstIsPositional: with nothing recorded every node gets the i-th range of
// networks.pods, exactly what pkg/plan gave before ranges were recorded, so the first run of an
// upgraded appliance changes no running node's range (IPv4 /24 and IPv6 /64, a pod network of
// exactly as many ranges as nodes).
func TestAllocatePodRangesFirstIsPositional(t *testing.T) {
	for _, pods := range []string{"10.244.0.0/16", "10.232.0.0/14", "10.244.0.0/22", "fd00:10::/48"} {
		nodes := []string{"cp1", "cp2", "cp3", "w1"}
		got, err := AllocatePodRanges(pfx(pods), nodes, nil)
		if err != nil {
			t.Fatalf("%s: %v", pods, err)
		}
		if len(got) != len(nodes) {
			t.Errorf("%s: %d ranges for %d nodes: %v", pods, len(got), len(nodes), got)
		}
		for i, n := range nodes {
			want, _ := nthSubnet(pfx(pods), i)
			if got[n] != want {
				t.Errorf("%s: %s got %s, want the positional %s", pods, n, got[n], want)
			}
		}
	}
}

// TestAllocatePodRangesStable: ranges follow node names, not positions. Removing a node in the
// middle of nodes[] leaves every other node's range as it was and frees the removed one's; a node
// inserted in the middle gets a free range and moves nobody; a node added later gets its positional
// range when free, else the lowest free one, never a range another node holds.
func TestAllocatePodRangesStable(t *testing.T) {
	pods := pfx("10.244.0.0/16")
	day1 := []string{"cp1", "cp2", "cp3", "w1", "w2"}
	rec, err := AllocatePodRanges(pods, day1, nil)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name  string
		nodes []string
		want  map[string]string // the ranges of the nodes whose range is asserted
	}{
		{"cp2 (a middle node) removed", []string{"cp1", "cp3", "w1", "w2"},
			map[string]string{"cp1": "10.244.0.0/24", "cp3": "10.244.2.0/24", "w1": "10.244.3.0/24", "w2": "10.244.4.0/24"}},
		// w3 is fifth: its positional range (.4) is w2's, so the lowest free one, cp2's old .1.
		{"w3 appended", []string{"cp1", "cp3", "w1", "w2", "w3"},
			map[string]string{"cp1": "10.244.0.0/24", "cp3": "10.244.2.0/24", "w1": "10.244.3.0/24", "w2": "10.244.4.0/24", "w3": "10.244.1.0/24"}},
		// cp4 inserted second: its positional range (.1) is w3's; the lowest free is .5. Nobody moves.
		{"cp4 inserted in the middle", []string{"cp1", "cp4", "cp3", "w1", "w2", "w3"},
			map[string]string{"cp1": "10.244.0.0/24", "cp4": "10.244.5.0/24", "cp3": "10.244.2.0/24", "w1": "10.244.3.0/24", "w2": "10.244.4.0/24", "w3": "10.244.1.0/24"}},
		// cp1 (the first node) removed and re-added at the end: a fresh range, its old one (.0)
		// being free by then, as the lowest free one.
		{"cp1 removed", []string{"cp4", "cp3", "w1", "w2", "w3"},
			map[string]string{"cp4": "10.244.5.0/24", "cp3": "10.244.2.0/24", "w1": "10.244.3.0/24", "w2": "10.244.4.0/24", "w3": "10.244.1.0/24"}},
		{"cp1 re-added", []string{"cp4", "cp3", "w1", "w2", "w3", "cp1"},
			map[string]string{"cp4": "10.244.5.0/24", "cp3": "10.244.2.0/24", "w1": "10.244.3.0/24", "w2": "10.244.4.0/24", "w3": "10.244.1.0/24", "cp1": "10.244.0.0/24"}},
	}
	for _, s := range steps {
		got, err := AllocatePodRanges(pods, s.nodes, rec)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		want := PodRanges{}
		for n, p := range s.want {
			want[n] = pfx(p)
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s: %s, want %s", s.name, DescribePodRanges(got), DescribePodRanges(want))
		}
		seen := map[netip.Prefix]string{}
		for n, p := range got {
			if other, dup := seen[p]; dup {
				t.Errorf("%s: %s and %s both hold %s", s.name, n, other, p)
			}
			seen[p] = n
		}
		// Pure: the same record and nodes give the same ranges (a run killed before it recorded
		// them allocates the same again).
		if again, _ := AllocatePodRanges(pods, s.nodes, rec); !maps.Equal(again, got) {
			t.Errorf("%s: a second allocation differs: %v vs %v", s.name, again, got)
		}
		rec = got
	}
}

// TestAllocatePodRangesRefusals: every refusal is under networks.pods and says what to do: the pod
// network exhausted, a recorded range outside networks.pods (changed under a running cluster) or
// held twice, a pod network smaller than one node range.
func TestAllocatePodRangesRefusals(t *testing.T) {
	for _, tc := range []struct {
		name     string
		pods     string
		nodes    []string
		recorded PodRanges
		want     []string
	}{
		{"exhausted", "10.244.0.0/23", []string{"a", "b", "c"}, nil,
			[]string{"10.244.0.0/23 holds 2 node ranges (/24), all held by other nodes: node c gets none", "remove a node from nodes[]", "choose a larger networks.pods"}},
		{"exhausted after removals", "10.244.0.0/23", []string{"b", "c", "d"}, PodRanges{"a": pfx("10.244.0.0/24"), "b": pfx("10.244.1.0/24"), "c": pfx("10.244.0.0/24")},
			[]string{"node d gets none"}},
		{"recorded outside networks.pods", "10.245.0.0/16", []string{"a"}, PodRanges{"a": pfx("10.244.0.0/24")},
			[]string{"node a's recorded pod range 10.244.0.0/24 is not a /24 inside 10.245.0.0/16", "put it back"}},
		{"recorded twice", "10.244.0.0/16", []string{"a", "b"}, PodRanges{"a": pfx("10.244.0.0/24"), "b": pfx("10.244.0.0/24")},
			[]string{"nodes a and b are both recorded with pod range 10.244.0.0/24"}},
		{"recorded, wrong size", "10.244.0.0/16", []string{"a"}, PodRanges{"a": pfx("10.244.0.0/25")},
			[]string{"is not a /24 inside"}},
		{"smaller than one range", "10.244.0.0/25", []string{"a"}, nil,
			[]string{"10.244.0.0/25 is smaller than one node range (/24)"}},
	} {
		_, err := AllocatePodRanges(pfx(tc.pods), tc.nodes, tc.recorded)
		if err == nil || !strings.HasPrefix(err.Error(), "networks.pods: ") {
			t.Errorf("%s: %v, want a networks.pods error", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to say %q", tc.name, err, w)
			}
		}
	}
	// "exhausted after removals" without the conflicting c: d takes a's freed range.
	got, err := AllocatePodRanges(pfx("10.244.0.0/23"), []string{"b", "d"}, PodRanges{"a": pfx("10.244.0.0/24"), "b": pfx("10.244.1.0/24")})
	if err != nil || got["d"] != pfx("10.244.0.0/24") {
		t.Errorf("d after a's removal: %v %v, want a's freed 10.244.0.0/24", got, err)
	}
}

// TestPodRangesRecord: WritePodRanges and ReadPodRanges round-trip through one atomically replaced
// file (0600; a rewrite of the same ranges writes nothing), a temporary file a kill left beside it
// is not read, a record that does not parse is refused naming the file; without a record the
// ranges of the rendered node configs are read (a state directory from before the record).
func TestPodRangesRecord(t *testing.T) {
	dir := t.TempDir()
	if got, err := ReadPodRanges(dir); err != nil || got != nil {
		t.Fatalf("empty state: %v %v", got, err)
	}
	// An older appliance's state: rendered node configs only.
	for name, cidr := range map[string]string{"cp1": "10.244.0.0/24", "w1": "10.244.3.0/24"} {
		b, _ := json.Marshal(agentapi.NodeConfig{Node: name, Kubernetes: &agentapi.KubernetesConfig{PodCIDR: pfx(cidr)}})
		path := filepath.Join(statedir.RenderedNode(dir, name), statedir.NodeConfigFile)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want := PodRanges{"cp1": pfx("10.244.0.0/24"), "w1": pfx("10.244.3.0/24")}
	if got, err := ReadPodRanges(dir); err != nil || !maps.Equal(got, want) {
		t.Fatalf("from the rendered configs: %v %v, want %v", got, err, want)
	}

	ranges := PodRanges{"cp1": pfx("10.244.0.0/24"), "cp3": pfx("10.244.2.0/24")}
	if changed, err := WritePodRanges(dir, pfx("10.244.0.0/16"), ranges); err != nil || !changed {
		t.Fatalf("WritePodRanges: %v %v", changed, err)
	}
	if changed, err := WritePodRanges(dir, pfx("10.244.0.0/16"), ranges); err != nil || changed {
		t.Errorf("rewrite of the same ranges: changed %v %v", changed, err)
	}
	st, err := os.Stat(statedir.PodRanges(dir))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("record: %v %v, want mode 0600", st, err)
	}
	// A kill during a later write leaves at most a temporary file beside the record; the record is
	// the old one, whole.
	if err := os.WriteFile(filepath.Join(filepath.Dir(statedir.PodRanges(dir)), ".pod-ranges.json.tmp123"), []byte(`{"nodes":{"cp1":"10.2`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadPodRanges(dir); err != nil || !maps.Equal(got, ranges) {
		t.Errorf("read back: %v %v, want %v (the record wins over the rendered configs)", got, err, ranges)
	}
	if err := os.WriteFile(statedir.PodRanges(dir), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPodRanges(dir); err == nil || !strings.Contains(err.Error(), statedir.PodRanges(dir)) {
		t.Errorf("corrupt record: %v, want an error naming it", err)
	}
}

// kubeNodes builds a configuration with Kubernetes of the named nodes ("cp…" control planes, the
// rest workers), each with control-plane address 10.100.0.<10+i> and workload-plane 10.200.0.<10+i>
// where i is the node's number in all (stable across removals).
func kubeNodes(t *testing.T, names ...string) *config.BootstrapConfiguration {
	t.Helper()
	c := config.Example()
	c.Kubernetes.Enabled = new(true)
	c.Networks.Pods = pfx("10.233.0.0/16")
	c.Nodes = nil
	for _, name := range names {
		i := slices.Index([]string{"cp1", "cp2", "cp3", "cp4", "w1", "w2", "w3"}, name)
		if i < 0 {
			t.Fatalf("unknown node %s", name)
		}
		role := config.RoleWorker
		if strings.HasPrefix(name, "cp") {
			role = config.RoleControlPlane
		}
		c.Nodes = append(c.Nodes, config.Node{Name: name, Roles: []config.Role{role},
			Addresses: []netip.Addr{netip.MustParseAddr(fmt.Sprintf("10.100.0.%d", 11+i)), netip.MustParseAddr(fmt.Sprintf("10.200.0.%d", 11+i))}})
	}
	c.Networks.ControlPlane.CIDRs = []netip.Prefix{pfx("10.100.0.0/24")}
	c.Networks.WorkloadPlane.CIDRs = []netip.Prefix{pfx("10.200.0.0/24")}
	return c
}

// kubeConfigs builds every node's Kubernetes config through Build with the given pod ranges and
// joined nodes.
func kubeConfigs(t *testing.T, c *config.BootstrapConfiguration, ranges PodRanges, joined map[string]string) (map[string]*agentapi.KubernetesConfig, *Plan) {
	t.Helper()
	in := labInputs(t)
	in.Config = c
	in.Cluster.PodRanges, in.Cluster.Joined = ranges, joined
	p, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*agentapi.KubernetesConfig{}
	for _, n := range p.Nodes {
		out[n.Name] = n.NodeConfig.Kubernetes
	}
	return out, p
}

// TestMiddleRemovalKeepsPodRanges, on the render path (Build): removing cp2, the second of five
// nodes, leaves every other node's PodCIDR and its routes to the others exactly as they were and
// only drops the route to cp2's range. Numbered by position (no record), the same removal would
// move cp3, w1 and w2 to other ranges under their running pods.
func TestMiddleRemovalKeepsPodRanges(t *testing.T) {
	before := kubeNodes(t, "cp1", "cp2", "cp3", "w1", "w2")
	rec, err := AllocatePodRanges(before.Networks.Pods, nodeNames(before), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The first render records nothing but what positional numbering gives (golden files pin it).
	k1, _ := kubeConfigs(t, before, rec, nil)
	positional, _ := kubeConfigs(t, before, nil, nil)
	for n := range k1 {
		if k1[n].PodCIDR != positional[n].PodCIDR || !slices.Equal(k1[n].PodRoutes, positional[n].PodRoutes) {
			t.Errorf("%s: recorded ranges differ from the positional ones on a first allocation: %v vs %v", n, k1[n].PodCIDR, positional[n].PodCIDR)
		}
	}

	after := kubeNodes(t, "cp1", "cp3", "w1", "w2")
	rec2, err := AllocatePodRanges(after.Networks.Pods, nodeNames(after), rec)
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := kubeConfigs(t, after, rec2, nil)
	withoutCP2 := func(rs []agentapi.PodRoute) []agentapi.PodRoute {
		return slices.DeleteFunc(slices.Clone(rs), func(r agentapi.PodRoute) bool { return r.Node == "cp2" })
	}
	for _, n := range nodeNames(after) {
		if k2[n].PodCIDR != k1[n].PodCIDR {
			t.Errorf("%s: pod range %s after cp2's removal, was %s", n, k2[n].PodCIDR, k1[n].PodCIDR)
		}
		if !slices.Equal(k2[n].PodRoutes, withoutCP2(k1[n].PodRoutes)) {
			t.Errorf("%s: routes after cp2's removal\n %v\nwant\n %v", n, k2[n].PodRoutes, withoutCP2(k1[n].PodRoutes))
		}
	}
	// What the record prevents: positional numbering moves every node after cp2.
	shifted, _ := kubeConfigs(t, after, nil, nil)
	moved := 0
	for _, n := range nodeNames(after) {
		if shifted[n].PodCIDR != k1[n].PodCIDR {
			moved++
		}
	}
	if moved != 3 {
		t.Errorf("positional numbering moved %d nodes, want 3 (cp3, w1, w2): the test no longer shows the difference", moved)
	}
}

// TestKubeadmLeader, on the render path (Build): who runs kubeadm init, who joins after whom, and
// who renews the join secrets (RenewsJoinSecrets, Plan.JoinSecretsRenewer), as the cluster's
// kubeadm history (joined nodes and the actions they carried out) changes:
//   - a cluster not built yet: the first control plane inits (also after the first listed one was
//     dropped before it ever joined);
//   - a running cluster: exactly as before (cp1 init, the others after it), but without the CA key,
//     which only the init node of a cluster not built yet receives;
//   - the init node cp1 removed: cp2, the first control plane that joined, is told
//     join-control-plane without an After node, gets no CA key, renews; nobody is told init;
//     workers and a new control plane join after it;
//   - the init node moved behind another control plane: it stays the init node and the renewer.
func TestKubeadmLeader(t *testing.T) {
	type want struct{ action, after string }
	for _, tc := range []struct {
		name    string
		nodes   []string
		joined  map[string]string
		want    map[string]want
		renewer string
	}{
		{"not built yet", []string{"cp1", "cp2", "cp3", "w1"}, nil,
			map[string]want{"cp1": {"init", ""}, "cp2": {"join-control-plane", "cp1"}, "cp3": {"join-control-plane", "cp2"}, "w1": {"join", "cp1"}}, "cp1"},
		{"not built yet, cp1 dropped before it joined", []string{"cp2", "cp3", "w1"}, nil,
			map[string]want{"cp2": {"init", ""}, "cp3": {"join-control-plane", "cp2"}, "w1": {"join", "cp2"}}, "cp2"},
		{"running cluster", []string{"cp1", "cp2", "cp3", "w1"},
			map[string]string{"cp1": "init", "cp2": "join-control-plane", "cp3": "join-control-plane", "w1": "join"},
			map[string]want{"cp1": {"init", ""}, "cp2": {"join-control-plane", "cp1"}, "cp3": {"join-control-plane", "cp2"}, "w1": {"join", "cp1"}}, "cp1"},
		{"init node cp1 removed", []string{"cp2", "cp3", "w1"},
			map[string]string{"cp2": "join-control-plane", "cp3": "join-control-plane", "w1": "join"},
			map[string]want{"cp2": {"join-control-plane", ""}, "cp3": {"join-control-plane", "cp2"}, "w1": {"join", "cp2"}}, "cp2"},
		{"init node cp1 removed, cp4 and w2 added after, cp4 listed first", []string{"cp4", "cp2", "cp3", "w1", "w2"},
			map[string]string{"cp2": "join-control-plane", "cp3": "join-control-plane", "w1": "join"},
			map[string]want{"cp4": {"join-control-plane", "cp2"}, "cp2": {"join-control-plane", ""}, "cp3": {"join-control-plane", "cp4"}, "w1": {"join", "cp2"}, "w2": {"join", "cp2"}}, "cp2"},
		{"joined, action unknown", []string{"cp2", "cp3"}, map[string]string{"cp3": ""},
			map[string]want{"cp2": {"join-control-plane", "cp3"}, "cp3": {"join-control-plane", ""}}, "cp3"},
		{"init node listed after another control plane", []string{"cp2", "cp1", "cp3"},
			map[string]string{"cp1": "init", "cp2": "join-control-plane", "cp3": "join-control-plane"},
			map[string]want{"cp1": {"init", ""}, "cp2": {"join-control-plane", "cp1"}, "cp3": {"join-control-plane", "cp2"}}, "cp1"},
	} {
		c := kubeNodes(t, tc.nodes...)
		ks, p := kubeConfigs(t, c, nil, tc.joined)
		inits := 0
		for n, k := range ks {
			if w := tc.want[n]; k.Action != w.action || k.After != w.after {
				t.Errorf("%s: %s action %q after %q, want %q after %q", tc.name, n, k.Action, k.After, w.action, w.after)
			}
			if k.Action == agentapi.ActionInit {
				inits++
			}
			if wantKey := k.Action == agentapi.ActionInit && len(tc.joined) == 0; (k.CAKeyPEM != "") != wantKey {
				t.Errorf("%s: %s action %s, CA key handed out %v: want it for the init action of a cluster not built yet only", tc.name, n, k.Action, k.CAKeyPEM != "")
			}
			if (k.CertificateKey != "") != strings.HasPrefix(n, "cp") {
				t.Errorf("%s: %s certificate key handed out %v, want control planes only", tc.name, n, k.CertificateKey != "")
			}
			if RenewsJoinSecrets(k) != (n == tc.renewer) {
				t.Errorf("%s: %s renews the join secrets = %v, want only %s", tc.name, n, RenewsJoinSecrets(k), tc.renewer)
			}
		}
		if inits > 1 {
			t.Errorf("%s: %d nodes told kubeadm init", tc.name, inits)
		}
		if got := p.JoinSecretsRenewer(); got != tc.renewer {
			t.Errorf("%s: Plan.JoinSecretsRenewer = %q, want %q", tc.name, got, tc.renewer)
		}
	}
}

// FuzzAllocatePodRanges: for any inventory (names from the input, duplicates dropped) and any
// record (each listed node may carry any range of a /22, which holds four), AllocatePodRanges
// either refuses under networks.pods or gives every node exactly one /24 inside the pod network,
// no range to two nodes, and every valid recorded range back to its node; allocating again from
// its own result changes nothing.
func FuzzAllocatePodRanges(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3}, []byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{3, 1, 4, 1, 5}, []byte{2, 0xff, 0, 1})
	f.Add([]byte{7, 6}, []byte{1, 1})
	f.Fuzz(func(t *testing.T, names, record []byte) {
		pods := pfx("10.244.0.0/22")
		var nodes []string
		for _, b := range names {
			if n := fmt.Sprintf("n%d", b%8); !slices.Contains(nodes, n) {
				nodes = append(nodes, n)
			}
		}
		rec := PodRanges{}
		for i, b := range record {
			if i < len(nodes) && b != 0xff {
				rec[nodes[i]] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, b % 6, 0}), 24) // .4, .5: outside
			}
		}
		got, err := AllocatePodRanges(pods, nodes, rec)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "networks.pods: ") {
				t.Fatalf("refusal without its field path: %v", err)
			}
			return
		}
		if len(got) != len(nodes) {
			t.Fatalf("%d ranges for %d nodes", len(got), len(nodes))
		}
		held := map[netip.Prefix]bool{}
		for _, n := range nodes {
			p, ok := got[n]
			if !ok || p.Bits() != 24 || !pods.Contains(p.Addr()) || held[p] {
				t.Fatalf("node %s: %s (ok %v, already held %v)", n, p, ok, held[p])
			}
			held[p] = true
			if r, ok := rec[n]; ok && r != p {
				t.Fatalf("node %s: recorded %s, got %s", n, r, p)
			}
		}
		if again, err := AllocatePodRanges(pods, nodes, got); err != nil || !maps.Equal(again, got) {
			t.Fatalf("reallocating from the result: %v %v, want %v", again, err, got)
		}
	})
}
