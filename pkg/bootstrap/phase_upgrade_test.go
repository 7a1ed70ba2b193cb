package bootstrap

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/config/configtest"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

const (
	oldSum = "1111111111111111111111111111111111111111111111111111111111111111"
	newSum = "2222222222222222222222222222222222222222222222222222222222222222"
)

func upgradeNodes() []config.Node {
	ssh := config.Power{Kind: config.PowerSSH}
	return []config.Node{
		{Name: "cp1", Roles: []config.Role{config.RoleControlPlane}, Power: ssh},
		{Name: "cp2", Roles: []config.Role{config.RoleControlPlane}, Power: ssh},
		{Name: "cp3", Roles: []config.Role{config.RoleControlPlane}, Power: ssh},
		{Name: "w1", Roles: []config.Role{config.RoleWorker}, Power: ssh},
		{Name: "w2", Roles: []config.Role{config.RoleWorker}, Power: ssh},
	}
}

func ready(sum, ver string) agentapi.NodeStatus {
	return agentapi.NodeStatus{State: agentapi.StateReady, BootID: "b1", AgentSHA256: sum, AgentVersion: ver}
}

func targetNames(p upgradePlan) string {
	var out []string
	for _, t := range p.Targets {
		out = append(out, t.Node.Name)
	}
	return strings.Join(out, " ")
}

// TestPlanUpgrade: which nodes the upgrade phase re-provisions and in what order (workers first in
// nodes[] order, then control planes in reverse, cp1 last), which it refuses to start over, and
// and that BMC-booted nodes take their turn like the others.
func TestPlanUpgrade(t *testing.T) {
	served := nodestate.AgentBuild{Version: "v2", SHA256: newSum}
	bmc := upgradeNodes()
	bmc[1].Power = config.Power{Kind: config.PowerIPMI}
	tests := []struct {
		name     string
		nodes    []config.Node
		status   map[string]agentapi.NodeStatus
		targets  string
		notReady []string
	}{
		{name: "all on the served build: nothing", nodes: upgradeNodes(), status: map[string]agentapi.NodeStatus{
			"cp1": ready(newSum, "v2"), "cp2": ready(newSum, "v2"), "cp3": ready(newSum, "v2"), "w1": ready(newSum, "v2"), "w2": ready(newSum, "v2")}},
		{name: "all old: workers first, then control planes in reverse", nodes: upgradeNodes(), status: map[string]agentapi.NodeStatus{
			"cp1": ready(oldSum, "v1"), "cp2": ready(oldSum, "v1"), "cp3": ready(oldSum, "v1"), "w1": ready(oldSum, "v1"), "w2": ready(oldSum, "v1")},
			targets: "w1 w2 cp3 cp2 cp1"},
		{name: "the hash decides, not the version", nodes: upgradeNodes(), status: map[string]agentapi.NodeStatus{
			"cp1": ready(newSum, "v1"), "cp2": ready(oldSum, "v2")},
			targets: "cp2"},
		{name: "no hash reported: the version decides", nodes: upgradeNodes(), status: map[string]agentapi.NodeStatus{
			"cp1": ready("", "v2"), "cp2": ready("", "v1")},
			targets: "cp2"},
		{name: "an agent that reports no build is upgraded", nodes: upgradeNodes(), status: map[string]agentapi.NodeStatus{
			"w1": ready("", "")},
			targets: "w1"},
		{name: "nodes without a record are the power phase's", nodes: upgradeNodes(), status: map[string]agentapi.NodeStatus{
			"w2": ready(oldSum, "v1"), "w1": {State: agentapi.StatePowering}},
			targets: "w2"},
		{name: "resumed: the node done before a kill is skipped", nodes: upgradeNodes(), status: map[string]agentapi.NodeStatus{
			"cp1": ready(oldSum, "v1"), "cp2": ready(oldSum, "v1"), "cp3": ready(newSum, "v2"), "w1": ready(newSum, "v2"), "w2": ready(newSum, "v2")},
			targets: "cp2 cp1"},
		{name: "an old node not ready refuses the rolling", nodes: upgradeNodes(), status: map[string]agentapi.NodeStatus{
			"cp1": ready(oldSum, "v1"), "w1": {State: agentapi.StateFailed, BootID: "b1", AgentSHA256: oldSum}},
			targets: "cp1", notReady: []string{"w1 (failed)"}},
		{name: "a BMC-booted node is upgraded in its turn (by pull)", nodes: bmc, status: map[string]agentapi.NodeStatus{
			"cp1": ready(oldSum, "v1"), "cp2": ready(oldSum, "v1")},
			targets: "cp2 cp1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := planUpgrade(tt.nodes, tt.status, served)
			if got := targetNames(p); got != tt.targets {
				t.Errorf("targets %q, want %q", got, tt.targets)
			}
			if strings.Join(p.NotReady, ";") != strings.Join(tt.notReady, ";") {
				t.Errorf("not ready %q, want %q", p.NotReady, tt.notReady)
			}
			for _, tg := range p.Targets {
				if s := tt.status[tg.Node.Name]; tg.From.SHA256 != s.AgentSHA256 || tg.From.Version != s.AgentVersion {
					t.Errorf("%s: from %v, want the reported build", tg.Node.Name, tg.From)
				}
			}
		})
	}
}

// TestUpgradedYet: the wait for one node ends on ready with the served build only; the old build's
// ready (before its agent restarted) does not count, and a failure counts only from the new agent.
func TestUpgradedYet(t *testing.T) {
	served := nodestate.AgentBuild{Version: "v2", SHA256: newSum}
	tests := []struct {
		name   string
		s      agentapi.NodeStatus
		done   bool
		failed string
	}{
		{"old build still ready", ready(oldSum, "v1"), false, ""},
		{"new build reporting, not ready yet", agentapi.NodeStatus{State: agentapi.StateAgentConnected, AgentSHA256: newSum}, false, ""},
		{"new build ready", ready(newSum, "v2"), true, ""},
		{"old build failed (before its restart)", agentapi.NodeStatus{State: agentapi.StateFailed, Reason: "kubeadm: x", AgentSHA256: oldSum}, false, ""},
		{"new build failed", agentapi.NodeStatus{State: agentapi.StateFailed, Reason: "cni: no route", AgentSHA256: newSum}, false, "cni: no route"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			done, failed := upgradedYet(tt.s, served)
			if done != tt.done || failed != tt.failed {
				t.Errorf("upgradedYet = %v, %q; want %v, %q", done, failed, tt.done, tt.failed)
			}
		})
	}
}

// TestUpgradePhaseDryRunAndNothing runs the phase on a state directory whose records say w1 runs
// another build: the dry run lists it and changes nothing (no record touched); with every node on the
// served build the phase changes nothing.
func TestUpgradePhaseDryRunAndNothing(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "hostagent")
	if err := os.WriteFile(bin, []byte("hostagent build 2"), 0o755); err != nil {
		t.Fatal(err)
	}
	sum, err := fileSHA256(bin)
	if err != nil {
		t.Fatal(err)
	}
	store := nodestate.Open(statedir.Nodes(dir))
	report := func(node, build string) {
		t.Helper()
		for _, step := range []string{agentapi.StepConfig, agentapi.StepFirewall, agentapi.StepContainerd, agentapi.StepReady} {
			if _, _, err := store.Record(node, nil, agentapi.Report{Step: step, Status: agentapi.StatusDone, BootID: "b1", AgentVersion: "v", AgentSHA256: build}); err != nil {
				t.Fatal(err)
			}
		}
	}
	report("cp1", sum)
	report("w1", oldSum)
	nodes := upgradeNodes()[:1]
	nodes = append(nodes, upgradeNodes()[3])
	var progress bytes.Buffer
	st := &State{StateDir: dir, Config: &config.BootstrapConfiguration{Nodes: nodes},
		Options: Options{HostagentBinary: bin, DryRun: true, Progress: &progress}}
	before, _ := os.ReadFile(filepath.Join(statedir.Nodes(dir), "w1", nodestate.StatusFile))
	res, err := upgradePhase{}.Run(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Changed || !strings.Contains(res.Detail, "would upgrade hostagent") || !strings.Contains(res.Detail, "w1 (from v (sha256 111111111111))") || strings.Contains(res.Detail, "cp1") {
		t.Errorf("dry run: %+v", res)
	}
	if after, _ := os.ReadFile(filepath.Join(statedir.Nodes(dir), "w1", nodestate.StatusFile)); !bytes.Equal(before, after) {
		t.Errorf("the dry run changed w1's record")
	}

	report("w1", sum)
	st.Options.DryRun = false
	res, err = upgradePhase{}.Run(context.Background(), st)
	if err != nil || res.Changed || !strings.Contains(res.Detail, "every node runs the served hostagent") {
		t.Errorf("same build: %+v, %v", res, err)
	}
}

// TestUpgradePhaseStopsAtAFailingNode: the first node to upgrade (the worker w1) cannot be reached
// over SSH (a real refused TCP connection on loopback); the rolling stops there: the error names w1,
// why, and cp1 as left on its old build; w1's record is failed with the reason, cp1's untouched.
func TestUpgradePhaseStopsAtAFailingNode(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "hostagent")
	if err := os.WriteFile(bin, []byte("hostagent build 2"), 0o755); err != nil {
		t.Fatal(err)
	}
	power := configtest.UnreachableSSH(t, dir)
	off := false
	cfg := &config.BootstrapConfiguration{Kubernetes: config.Kubernetes{Enabled: &off}, Nodes: []config.Node{
		{Name: "cp1", Roles: []config.Role{config.RoleControlPlane}, Power: power},
		{Name: "w1", Roles: []config.Role{config.RoleWorker}, Power: power},
	}}
	store := nodestate.Open(statedir.Nodes(dir))
	for _, n := range []string{"cp1", "w1"} {
		for _, step := range []string{agentapi.StepConfig, agentapi.StepFirewall, agentapi.StepContainerd, agentapi.StepReady} {
			if _, _, err := store.Record(n, nil, agentapi.Report{Step: step, Status: agentapi.StatusDone, BootID: "b1", AgentVersion: "v1", AgentSHA256: oldSum}); err != nil {
				t.Fatal(err)
			}
		}
	}
	cp1Before, _ := os.ReadFile(filepath.Join(statedir.Nodes(dir), "cp1", nodestate.StatusFile))
	st := &State{StateDir: dir, Config: cfg, Options: Options{HostagentBinary: bin}}
	_, err := upgradePhase{}.Run(context.Background(), st)
	if err == nil {
		t.Fatal("the upgrade succeeded with w1 unreachable")
	}
	for _, want := range []string{"stopped at w1", "install the new hostagent over SSH", "still on their old build: cp1", "rerun bootstrap"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if s, _ := store.Get("w1"); s.State != agentapi.StateFailed || !strings.HasPrefix(s.Reason, "hostagent upgrade: ") {
		t.Errorf("w1 after its failed upgrade: %s %q, want failed with the reason", s.State, s.Reason)
	}
	if after, _ := os.ReadFile(filepath.Join(statedir.Nodes(dir), "cp1", nodestate.StatusFile)); !bytes.Equal(cp1Before, after) {
		t.Errorf("cp1's record changed although the rolling stopped before it")
	}
}
