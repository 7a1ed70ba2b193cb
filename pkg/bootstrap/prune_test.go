package bootstrap

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
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
