package applianced

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

func TestKubeadmGate(t *testing.T) {
	store := nodestate.Open(t.TempDir())
	gate := kubeadmGate(store)
	k8sPlan := agentapi.Plan(agentapi.NodeConfig{Roles: []string{"control-plane"}, Kubernetes: &agentapi.KubernetesConfig{}})
	record := func(node, boot, step, status string) {
		t.Helper()
		if _, _, err := store.Record(node, k8sPlan, agentapi.Report{BootID: boot, Step: step, Status: status, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string, k *agentapi.KubernetesConfig, proceed bool, waitingFor string) {
		t.Helper()
		nc := agentapi.NodeConfig{Node: "cp2", Kubernetes: k}
		gate("cp2", &nc)
		if k.Proceed != proceed || k.WaitingFor != waitingFor {
			t.Errorf("%s: Proceed=%v WaitingFor=%q, want %v %q", what, k.Proceed, k.WaitingFor, proceed, waitingFor)
		}
	}

	// nil Kubernetes: untouched, no panic.
	nc := agentapi.NodeConfig{Node: "w1"}
	gate("w1", &nc)
	if nc.Kubernetes != nil {
		t.Error("gate created a Kubernetes section")
	}

	// The init node (After "") always proceeds, even with no record at all, and a stale
	// WaitingFor from the rendered file is cleared.
	initK := &agentapi.KubernetesConfig{Action: agentapi.ActionInit, WaitingFor: "stale"}
	check("init node", initK, true, "")

	k := &agentapi.KubernetesConfig{Action: agentapi.ActionJoinControlPlane, After: "cp1", Proceed: true}
	check("After has no record", k, false, "cp1")
	record("cp1", "boot-1", agentapi.StepConfig, agentapi.StatusDone)
	check("After connected, kubeadm not reported", k, false, "cp1")
	record("cp1", "boot-1", agentapi.StepKubeadm, agentapi.StatusRunning)
	check("After's kubeadm running", k, false, "cp1")
	record("cp1", "boot-1", agentapi.StepKubeadm, agentapi.StatusFailed)
	check("After's kubeadm failed", k, false, "cp1")
	record("cp1", "boot-1", agentapi.StepKubeadm, agentapi.StatusDone)
	check("After's kubeadm done", k, true, "")
	// Another node's progress does not open the gate for a node waiting on someone else.
	k3 := &agentapi.KubernetesConfig{Action: agentapi.ActionJoinControlPlane, After: "cp2"}
	check("After cp2 unknown while cp1 done", k3, false, "cp2")
	// Still open on the next fetch (the gate is evaluated per fetch, with fresh state).
	check("After's kubeadm still done", k, true, "")
	// After reboots: its steps start anew, so the gate closes until it reports kubeadm done again.
	record("cp1", "boot-2", agentapi.StepConfig, agentapi.StatusDone)
	check("After rebooted", k, false, "cp1")
	record("cp1", "boot-2", agentapi.StepKubeadm, agentapi.StatusDone)
	check("After done after reboot", k, true, "")
	// The init node is untouched by anyone's state.
	check("init node again", initK, true, "")
}

// TestAgentUpgradeGate: the node the upgrade record names, and only it, is served
// NodeConfig.AgentUpgrade with the record's build and the hostagent artifact path; nobody is when
// serve serves no hostagent executable, when there is no record (cleared), or when it is unreadable.
func TestAgentUpgradeGate(t *testing.T) {
	state := t.TempDir()
	served := agentUpgradeGate(state, true)
	get := func(gate func(string, *agentapi.NodeConfig), node string) *agentapi.AgentUpgrade {
		nc := agentapi.NodeConfig{Node: node}
		gate(node, &nc)
		return nc.AgentUpgrade
	}
	if up := get(served, "w1"); up != nil {
		t.Errorf("no record: w1 gets %+v", up)
	}
	rec := AgentUpgradeRecord{Node: "w1", Version: "v2", SHA256: strings.Repeat("ab", 32)}
	if err := WriteAgentUpgrade(state, rec); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := ReadAgentUpgrade(state); err != nil || !ok || got != rec {
		t.Fatalf("ReadAgentUpgrade: %+v %v %v, want %+v", got, ok, err, rec)
	}
	if up := get(served, "w1"); up == nil || up.Version != "v2" || up.SHA256 != rec.SHA256 || up.Path != agentapi.HostagentArtifactPath {
		t.Errorf("w1 gets %+v, want the record's build at %s", up, agentapi.HostagentArtifactPath)
	}
	if up := get(served, "cp1"); up != nil {
		t.Errorf("cp1, not named, gets %+v", up)
	}
	if up := get(agentUpgradeGate(state, false), "w1"); up != nil {
		t.Errorf("without a served hostagent, w1 gets %+v", up)
	}
	if err := os.WriteFile(statedir.AgentUpgrade(state), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if up := get(served, "w1"); up != nil {
		t.Errorf("an unreadable record: w1 gets %+v", up)
	}
	if err := ClearAgentUpgrade(state); err != nil {
		t.Fatal(err)
	}
	if err := ClearAgentUpgrade(state); err != nil {
		t.Errorf("clearing twice: %v", err)
	}
	if _, ok, err := ReadAgentUpgrade(state); ok || err != nil {
		t.Errorf("after Clear: ok %v err %v", ok, err)
	}
}
