package applianced

import (
	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
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
