package bootstrap

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/netresolve"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/plan"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestForgottenNodes: over a real node store, the members the configuration dropped are the nodes
// whose last membership entry is "added", or with reports but no history (recorded before histories
// were kept); a node recorded "removed" or still listed is not one.
func TestForgottenNodes(t *testing.T) {
	dir := t.TempDir()
	store := nodestate.Open(statedir.Nodes(dir))
	if got, err := ForgottenNodes(dir, nil); err != nil || got != nil {
		t.Fatalf("no store yet: %v %v", got, err)
	}
	for _, n := range []string{"cp1", "w1", "w2", "w3"} {
		if err := store.RecordLifecycle(n, nodestate.Added, "test"); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.RecordLifecycle("w2", nodestate.Removed, "appliance node remove"); err != nil {
		t.Fatal(err)
	}
	if err := store.RecordLifecycle("w3", nodestate.Ready, "first ready"); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Set("old", agentapi.StateReady, ""); err != nil { // a status, no history
		t.Fatal(err)
	}
	// w1 was added but never became ready (it never joined: TestNodesConverge's w2 with a wrong BMC
	// password), so dropping it needs no removal; w3 joined, "old" predates histories.
	got, err := ForgottenNodes(dir, []string{"cp1"})
	if want := []string{"old", "w3"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("ForgottenNodes = %v %v, want %v", got, err, want)
	}
}

// TestPodRangesKept: a plan that gives a rendered node another pod range (a record that disagrees
// with the rendered node configs) is refused naming the node, both ranges and the record; the same range, a new node, or a node
// without Kubernetes pass.
func TestPodRangesKept(t *testing.T) {
	dir := t.TempDir()
	k := func(cidr string) *agentapi.KubernetesConfig {
		return &agentapi.KubernetesConfig{PodCIDR: netip.MustParsePrefix(cidr)}
	}
	for name, cidr := range map[string]string{"cp3": "10.244.2.0/24", "w1": "10.244.3.0/24"} {
		b, err := json.Marshal(agentapi.NodeConfig{Node: name, Kubernetes: k(cidr)})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(statedir.RenderedNode(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(statedir.RenderedNode(dir, name), statedir.NodeConfigFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	node := func(name, cidr string) plan.NodeArtefacts {
		n := plan.NodeArtefacts{Name: name, NodeConfig: agentapi.NodeConfig{Node: name}}
		if cidr != "" {
			n.NodeConfig.Kubernetes = k(cidr)
		}
		return n
	}
	same := &plan.Plan{Nodes: []plan.NodeArtefacts{node("cp3", "10.244.2.0/24"), node("w1", "10.244.3.0/24"), node("w9", "10.244.4.0/24"), node("x", "")}}
	if err := podRangesKept(dir, same); err != nil {
		t.Errorf("unchanged ranges: %v", err)
	}
	shifted := &plan.Plan{Nodes: []plan.NodeArtefacts{node("cp3", "10.244.1.0/24"), node("w1", "10.244.2.0/24")}}
	err := podRangesKept(dir, shifted)
	if err == nil || !strings.Contains(err.Error(), "cp3 from 10.244.2.0/24 to 10.244.1.0/24; w1 from 10.244.3.0/24 to 10.244.2.0/24") ||
		!strings.HasPrefix(err.Error(), "networks.pods: ") || !strings.Contains(err.Error(), statedir.PodRanges(dir)) {
		t.Errorf("shifted ranges: %v", err)
	}
}

// TestRenderKeepsPodRangesAndLeader runs the real render phase over one state directory through a
// cluster's life, reading back what it wrote (STATE/rendered/<node>/nodeconfig.json and the record):
//   - an upgrade: a state an older appliance rendered (positional ranges, no record) is rendered
//     again without one byte of any node config changing, and the record holds those ranges;
//   - the removal of cp2, a middle node of nodes[]: every other node keeps its range and its routes
//     to the others, the route to cp2's range goes, cp2's range is freed in the record;
//   - the removal of cp1, the init node: cp3 is told join-control-plane (never init) without an After
//     node, gets no CA key, and is the one that renews the join secrets; w1 joins after it;
//   - a worker w2 added afterwards gets a range no other node holds (cp1's freed one) and joins
//     after cp3; a rerun changes nothing.
func TestRenderKeepsPodRangesAndLeader(t *testing.T) {
	cfg, _, err := config.Load(filepath.Join("..", "config", "testdata", "lab.yaml"), config.ValidateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	dir := t.TempDir()
	ca, _, err := pki.EnsureCA(filepath.Join(dir, "ca"), "render test CA", now)
	if err != nil {
		t.Fatal(err)
	}
	cca, _, err := pki.EnsureCA(filepath.Join(dir, "cluster-ca"), "kubernetes", now)
	if err != nil {
		t.Fatal(err)
	}
	secrets, _, err := pki.EnsureKubeadmSecrets(filepath.Join(dir, "cluster-ca"), pki.BootstrapTokenTTL, now)
	if err != nil {
		t.Fatal(err)
	}
	agent := filepath.Join(dir, "hostagent")
	if err := os.WriteFile(agent, []byte("hostagent binary"), 0o700); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{}
	for _, n := range []string{"cp1", "cp2", "cp3", "w1", "w2"} {
		tokens[n] = "token-of-" + n
	}
	st := &State{
		Options:  Options{ConfigPath: "bootstrap.yaml", HostagentBinary: agent, Logger: slog.New(slog.DiscardHandler)},
		Config:   cfg,
		StateDir: filepath.Join(dir, "state"),
		ControlPlane: netresolve.Address{Interface: "eth0", Prefix: netip.MustParsePrefix("10.100.0.2/24"),
			CIDR: netip.MustParsePrefix("10.100.0.0/24")},
		ApplianceURL: "https://10.100.0.2:8443", CA: ca, Tokens: tokens, VRRPAuth: "vrrppass",
		ClusterCA: cca, Kubeadm: secrets,
	}
	read := func() map[string]agentapi.NodeConfig {
		t.Helper()
		out := map[string]agentapi.NodeConfig{}
		for _, n := range st.Config.Nodes {
			b, err := os.ReadFile(filepath.Join(statedir.RenderedNode(st.StateDir, n.Name), statedir.NodeConfigFile))
			var nc agentapi.NodeConfig
			if err != nil || json.Unmarshal(b, &nc) != nil || nc.Kubernetes == nil {
				t.Fatalf("%s's rendered node config: %v", n.Name, err)
			}
			out[n.Name] = nc
		}
		return out
	}
	render := func() string {
		t.Helper()
		res, err := renderPhase{}.Run(context.Background(), st)
		if err != nil {
			t.Fatalf("render: %v", err)
		}
		return res.Detail
	}
	without := func(node string) {
		st.Config.Nodes = slices.DeleteFunc(slices.Clone(st.Config.Nodes), func(n config.Node) bool { return n.Name == node })
	}
	store := nodestate.Open(statedir.Nodes(st.StateDir))

	// An older appliance's state: the positional plan rendered, no record.
	old, err := plan.Build(plan.Inputs{Config: cfg, ControlPlane: st.ControlPlane, ApplianceURL: st.ApplianceURL, CA: ca,
		Tokens: tokens, VRRPAuth: st.VRRPAuth, Cluster: &plan.ClusterSecrets{CA: cca, Kubeadm: secrets}, HostagentSHA256: mustSHA256(t, agent)})
	if err != nil {
		t.Fatal(err)
	}
	files, err := old.Files()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := writeRendered(st.StateDir, files, false); err != nil {
		t.Fatal(err)
	}
	before := map[string][]byte{}
	for _, n := range cfg.Nodes {
		before[n.Name], _ = os.ReadFile(filepath.Join(statedir.RenderedNode(st.StateDir, n.Name), statedir.NodeConfigFile))
	}
	if d := render(); !strings.HasPrefix(d, "unchanged: ") || !strings.Contains(d, "pod ranges recorded: cp1 10.233.0.0/24, cp2 10.233.1.0/24, cp3 10.233.2.0/24, w1 10.233.3.0/24") {
		t.Errorf("the upgraded appliance's first render: %s", d)
	}
	for _, n := range cfg.Nodes {
		if after, _ := os.ReadFile(filepath.Join(statedir.RenderedNode(st.StateDir, n.Name), statedir.NodeConfigFile)); !bytes.Equal(after, before[n.Name]) {
			t.Errorf("%s: the upgraded appliance changed its node config", n.Name)
		}
	}
	day1 := read()
	rec, err := plan.ReadPodRanges(st.StateDir)
	if err != nil || len(rec) != 4 {
		t.Fatalf("record after the first render: %v %v", rec, err)
	}

	// Every node joined (reported ready).
	for _, n := range []string{"cp1", "cp2", "cp3", "w1"} {
		for _, k := range []nodestate.LifecycleKind{nodestate.Added, nodestate.Ready} {
			if err := store.RecordLifecycle(n, k, "test"); err != nil {
				t.Fatal(err)
			}
		}
	}
	// cp2 removed (appliance node remove records it), then dropped from nodes[].
	if err := store.RecordLifecycle("cp2", nodestate.Removed, "appliance node remove"); err != nil {
		t.Fatal(err)
	}
	without("cp2")
	if d := render(); !strings.Contains(d, "pod ranges freed: cp2 10.233.1.0/24") || strings.Contains(d, "allocated") {
		t.Errorf("render without cp2: %s", d)
	}
	noRouteTo := func(rs []agentapi.PodRoute, gone ...string) []agentapi.PodRoute {
		return slices.DeleteFunc(slices.Clone(rs), func(r agentapi.PodRoute) bool { return slices.Contains(gone, r.Node) })
	}
	afterCP2 := read()
	for n, nc := range afterCP2 {
		k, was := nc.Kubernetes, day1[n].Kubernetes
		if k.PodCIDR != was.PodCIDR || !slices.Equal(k.PodRoutes, noRouteTo(was.PodRoutes, "cp2")) || k.Action != was.Action || k.After != was.After && n != "cp3" {
			t.Errorf("%s after cp2's removal: range %s routes %v action %s after %s; was %s %v %s %s", n, k.PodCIDR, k.PodRoutes, k.Action, k.After, was.PodCIDR, was.PodRoutes, was.Action, was.After)
		}
	}
	if k := afterCP2["cp3"].Kubernetes; k.After != "cp1" {
		t.Errorf("cp3 joins after %q, want cp1 (cp2 is gone)", k.After)
	}
	if rec, _ := plan.ReadPodRanges(st.StateDir); len(rec) != 3 || rec["cp2"].IsValid() {
		t.Errorf("record after cp2's removal: %v", rec)
	}

	// cp1, the init node, removed.
	if err := store.RecordLifecycle("cp1", nodestate.Removed, "appliance node remove"); err != nil {
		t.Fatal(err)
	}
	without("cp1")
	render()
	afterCP1 := read()
	if k := afterCP1["cp3"].Kubernetes; k.Action != agentapi.ActionJoinControlPlane || k.After != "" || k.CAKeyPEM != "" || k.CertificateKey == "" || !plan.RenewsJoinSecrets(k) {
		t.Errorf("cp3 after the init node's removal: action %q after %q CA key %v certificate key %v: want join-control-plane, no After, no CA key, the certificate key, the renewer",
			k.Action, k.After, k.CAKeyPEM != "", k.CertificateKey != "")
	}
	if k := afterCP1["w1"].Kubernetes; k.Action != agentapi.ActionJoin || k.After != "cp3" || plan.RenewsJoinSecrets(k) {
		t.Errorf("w1 after the init node's removal: %q after %q", k.Action, k.After)
	}
	for n, nc := range afterCP1 {
		if k := nc.Kubernetes; k.PodCIDR != day1[n].Kubernetes.PodCIDR || !slices.Equal(k.PodRoutes, noRouteTo(day1[n].Kubernetes.PodRoutes, "cp1", "cp2")) {
			t.Errorf("%s after cp1's removal: range %s routes %v", n, k.PodCIDR, k.PodRoutes)
		}
	}

	// w2 added at the end.
	w2 := config.Node{Name: "w2", Roles: []config.Role{config.RoleWorker},
		Addresses: []netip.Addr{netip.MustParseAddr("10.100.0.22"), netip.MustParseAddr("10.200.0.22")}, Power: st.Config.Nodes[0].Power}
	st.Config.Nodes = append(st.Config.Nodes, w2)
	if d := render(); !strings.Contains(d, "pod ranges allocated: w2 10.233.0.0/24") {
		t.Errorf("render with w2: %s", d)
	}
	withW2 := read()
	if k := withW2["w2"].Kubernetes; k.Action != agentapi.ActionJoin || k.After != "cp3" || k.PodCIDR != netip.MustParsePrefix("10.233.0.0/24") {
		t.Errorf("w2: %q after %q range %s", k.Action, k.After, k.PodCIDR)
	}
	for _, n := range []string{"cp3", "w1"} {
		if k := withW2[n].Kubernetes; k.PodCIDR != day1[n].Kubernetes.PodCIDR || !slices.ContainsFunc(k.PodRoutes, func(r agentapi.PodRoute) bool {
			return r.Node == "w2" && r.Prefix == netip.MustParsePrefix("10.233.0.0/24") && r.Via == netip.MustParseAddr("10.200.0.22")
		}) {
			t.Errorf("%s with w2: range %s routes %v", n, k.PodCIDR, k.PodRoutes)
		}
	}
	if d := render(); !strings.HasPrefix(d, "unchanged: ") || strings.Contains(d, "pod ranges") {
		t.Errorf("rerun: %s", d)
	}
}

func mustSHA256(t *testing.T, path string) string {
	t.Helper()
	s, err := fileSHA256(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
