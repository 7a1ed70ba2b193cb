package applianced

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// kubeadmGate sets nc.Kubernetes.Proceed and WaitingFor at the moment the node fetches its config:
// it may run kubeadm when it has no After node or that node reported its kubeadm step done.
func kubeadmGate(nodes *nodestate.Store) func(node string, nc *agentapi.NodeConfig) {
	return func(_ string, nc *agentapi.NodeConfig) {
		k := nc.Kubernetes
		if k == nil {
			return
		}
		k.Proceed, k.WaitingFor = true, ""
		if k.After == "" {
			return
		}
		st, err := nodes.Get(k.After)
		if err != nil || st.Steps[agentapi.StepKubeadm].Status != agentapi.StatusDone {
			k.Proceed, k.WaitingFor = false, k.After
		}
	}
}

// AgentUpgradeRecord is STATE/agent-upgrade.json (statedir.AgentUpgrade): the one node the upgrade
// phase is upgrading in place by pull, and the build it must run. `appliance serve` reads it at
// every config request of that node (agentUpgradeGate); the upgrade phase writes it before it waits
// for the node and removes it once the node runs the build.
type AgentUpgradeRecord struct {
	Node    string `json:"node"`
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
}

// WriteAgentUpgrade records rec (0644: no secret; one atomic write, so a kill leaves the old record
// or the new one).
func WriteAgentUpgrade(state string, rec AgentUpgradeRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = atomicfile.Write(statedir.AgentUpgrade(state), append(b, '\n'), 0o644)
	return err
}

// ClearAgentUpgrade removes the record; no record is not an error.
func ClearAgentUpgrade(state string) error {
	if err := os.Remove(statedir.AgentUpgrade(state)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// ReadAgentUpgrade returns the record; ok is false when there is none. Errors: unreadable or bad JSON.
func ReadAgentUpgrade(state string) (rec AgentUpgradeRecord, ok bool, err error) {
	b, err := os.ReadFile(statedir.AgentUpgrade(state))
	if errors.Is(err, fs.ErrNotExist) {
		return rec, false, nil
	} else if err != nil {
		return rec, false, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, false, fmt.Errorf("%s: %w", statedir.AgentUpgrade(state), err)
	}
	return rec, true, nil
}

// agentUpgradeGate sets nc.AgentUpgrade on the node the AgentUpgradeRecord names, when this serve
// serves the hostagent executable (served; the node downloads it from
// agentapi.HostagentArtifactPath). An unreadable record upgrades nobody.
func agentUpgradeGate(state string, served bool) func(node string, nc *agentapi.NodeConfig) {
	return func(node string, nc *agentapi.NodeConfig) {
		if !served {
			return
		}
		rec, ok, err := ReadAgentUpgrade(state)
		if err != nil || !ok || rec.Node != node {
			return
		}
		nc.AgentUpgrade = &agentapi.AgentUpgrade{Version: rec.Version, SHA256: rec.SHA256, Path: agentapi.HostagentArtifactPath}
	}
}
