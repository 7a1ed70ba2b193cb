package bootstrap

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// DefaultConvergeTimeout bounds how long the converge phase waits for nodes.
const DefaultConvergeTimeout = 15 * time.Minute

// convergePhase waits until every node's hostagent has reported it ready, or it failed, showing
// each node's current step on a live line (nodeBoard); with Kubernetes it then requires the API to
// answer /readyz through the VIP to the admin kubeconfig's client certificate, verified against the
// cluster CA, and every configured node to be ready in Kubernetes' own terms: its Node Ready and, on
// a control plane, its four static pods Running and Ready, and on every node kube-proxy (kubeNotReady). It fails, listing the nodes
// and their reasons, if a node failed or the wait (Options.ConvergeTimeout) ran out; nodes that made
// it stay as they are, and a rerun picks up the rest. A machine the power phase powered on through
// its BMC that stays silent for Options.CallbackTimeout after its last step of progress is failed
// alone, with what it got to and what to check (callbackOverdue), while the others go on.
type convergePhase struct{}

func (convergePhase) Name() string { return "converge" }

func (convergePhase) Run(ctx context.Context, st *State) (Result, error) {
	store := nodestate.Open(statedir.Nodes(st.StateDir))
	if st.Options.DryRun {
		return convergeCheck(st, store), nil
	}
	timeout := st.Options.ConvergeTimeout
	if timeout == 0 {
		timeout = DefaultConvergeTimeout
	}
	deadline := time.Now().Add(timeout)
	callbackTimeout := st.Options.CallbackTimeout
	if callbackTimeout == 0 {
		callbackTimeout = DefaultCallbackTimeout
	}
	recheck := map[string]time.Time{} // node → when its callback is next read (callbackOverdue)
	var names []string
	for _, n := range st.Config.Nodes {
		names = append(names, n.Name)
	}
	progress := st.Options.Progress
	if st.Options.JSONEvents {
		progress = io.Discard
	}
	board := newNodeBoard(progress, names)
	for {
		var pending, failed []string
		for _, n := range st.Config.Nodes {
			s, err := store.Get(n.Name)
			if err != nil {
				s = agentapi.NodeStatus{Node: n.Name, State: agentapi.StatePending}
			}
			if now := time.Now(); !now.Before(recheck[n.Name]) {
				why, next, err := callbackOverdue(store, n, s, now, callbackTimeout)
				recheck[n.Name] = next
				if err == nil && why != "" {
					if ns, err := store.Set(n.Name, agentapi.StateFailed, why); err == nil {
						s = ns
					}
				}
			}
			board.set(n.Name, nodeLine(s))
			switch s.State {
			case agentapi.StateReady:
			case agentapi.StateFailed:
				failed = append(failed, fmt.Sprintf("%s: %s", n.Name, s.Reason))
			default:
				pending = append(pending, n.Name+" ("+s.State+")")
			}
		}
		board.flush()
		if len(pending) == 0 {
			if len(failed) > 0 {
				sort.Strings(failed)
				return Result{}, fmt.Errorf("%d of %d nodes failed:\n  %s", len(failed), len(st.Config.Nodes), strings.Join(failed, "\n  "))
			}
			if !st.Config.Kubernetes.IsEnabled() {
				return Result{Detail: fmt.Sprintf("%d nodes ready", len(st.Config.Nodes))}, nil
			}
			res, err := convergeKubernetes(ctx, st, board, time.Until(deadline))
			if err != nil {
				return res, err
			}
			return renderAgain(ctx, st, res)
		}
		if time.Now().After(deadline) {
			return Result{}, fmt.Errorf("nodes not ready after %v: %s%s; `appliance status` shows each node, rerun bootstrap to keep waiting",
				timeout, strings.Join(pending, ", "), failedSuffix(failed))
		}
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// convergeKubernetes waits, once every hostagent is done, for the API through the VIP and then for
// every node to be ready in Kubernetes' terms, keeping the board up to date.
func convergeKubernetes(ctx context.Context, st *State, board *nodeBoard, limit time.Duration) (Result, error) {
	api, err := openAdminAPI(st.StateDir)
	if err != nil {
		return Result{}, err
	}
	defer api.close()
	if err := waitClusterAPI(ctx, api, limit); err != nil {
		return Result{}, err
	}
	err = waitKubeReady(ctx, api, st.Config.Nodes, max(limit, 2*time.Minute), func(node, missing string) {
		if missing == "" {
			board.set(node, "ready · Node Ready, "+map[bool]string{true: "static pods and kube-proxy", false: "kube-proxy"}[isControlPlane(st, node)]+" Running")
		} else {
			board.set(node, "ready (hostagent) · waiting for Kubernetes: "+missing)
		}
		board.flush()
	})
	if err != nil {
		return Result{}, err
	}
	return Result{Detail: fmt.Sprintf("%d nodes ready (Node Ready, kube-proxy and control-plane static pods Running); %s/readyz ok with %s",
		len(st.Config.Nodes), api.server, statedir.AdminKubeconfig(st.StateDir))}, nil
}

// convergeCheck is the dry run: which nodes are not ready yet, without waiting.
func convergeCheck(st *State, store *nodestate.Store) Result {
	var notReady []string
	for _, n := range st.Config.Nodes {
		s, err := store.Get(n.Name)
		if err != nil {
			s.State = agentapi.StatePending
		}
		if s.State != agentapi.StateReady {
			notReady = append(notReady, n.Name+" ("+s.State+")")
		}
	}
	if len(notReady) == 0 {
		return Result{Detail: fmt.Sprintf("%d nodes ready", len(st.Config.Nodes))}
	}
	return Result{Changed: true, Detail: "would wait for " + strings.Join(notReady, ", ")}
}

func isControlPlane(st *State, node string) bool {
	for _, n := range st.Config.ControlPlaneNodes() {
		if n.Name == node {
			return true
		}
	}
	return false
}

func failedSuffix(failed []string) string {
	if len(failed) == 0 {
		return ""
	}
	return "; failed: " + strings.Join(failed, "; ")
}

// waitClusterAPI polls GET <server>/readyz with the admin client every second for up to limit (at
// least 10 s) until it answers 200.
func waitClusterAPI(ctx context.Context, api *adminAPI, limit time.Duration) error {
	deadline := time.Now().Add(max(limit, 10*time.Second))
	for {
		err := api.get(ctx, "/readyz", nil)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("every node is ready but the API through the VIP is not: %s/readyz: %w", api.server, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// renderAgain runs the render phase again at the end of a converged run. The node configs rendered
// before the cluster existed carry what only building it needs: the init node's cluster CA key
// (plan.kubernetesFor gives it only while no node has run kubeadm; the agent API withholds it from the
// moment the init node's kubeadm is done). Once every node is ready they no longer need it, so the
// state directory keeps no more than a rerun would render, and a second run changes nothing.
func renderAgain(ctx context.Context, st *State, res Result) (Result, error) {
	r, err := (renderPhase{}).Run(ctx, st)
	if err != nil {
		return res, fmt.Errorf("every node is ready, but rendering the node configs again without the secrets only building the cluster needed failed: %w (a rerun of bootstrap renders them)", err)
	}
	if r.Changed {
		res.Changed = true
		res.Detail += "; rendered again now that every node has run kubeadm (no cluster CA key in any node config): " + r.Detail
	}
	return res, nil
}
