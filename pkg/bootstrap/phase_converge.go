package bootstrap

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
)

// DefaultConvergeTimeout bounds how long the converge phase waits for nodes.
const DefaultConvergeTimeout = 15 * time.Minute

// convergePhase waits until every node's hostagent has reported it ready, or it failed, printing
// each state change. It fails, listing the nodes and their reasons, if a node failed or the wait
// (Options.ConvergeTimeout) ran out; nodes that made it stay as they are, and a rerun picks up the
// rest.
type convergePhase struct{}

func (convergePhase) Name() string { return "converge" }

func (convergePhase) Run(ctx context.Context, st *State) (Result, error) {
	store := nodestate.Open(NodesDir(st.StateDir))
	timeout := st.Options.ConvergeTimeout
	if timeout == 0 {
		timeout = DefaultConvergeTimeout
	}
	deadline := time.Now().Add(timeout)
	start := time.Now()
	seen := map[string]string{}
	readyAt := map[string]time.Duration{}
	for {
		var pending, failed []string
		for _, n := range st.Config.Nodes {
			s, err := store.Get(n.Name)
			state := agentapi.StatePending
			if err == nil {
				state = s.State
			}
			if seen[n.Name] != state {
				seen[n.Name] = state
				if !st.Options.JSONEvents {
					line := fmt.Sprintf("      %-12s %s", n.Name, state)
					if s.Reason != "" {
						line += ": " + s.Reason
					}
					fmt.Fprintln(st.Options.Progress, line)
				}
				if state == agentapi.StateReady {
					readyAt[n.Name] = time.Since(start)
				}
			}
			switch state {
			case agentapi.StateReady:
			case agentapi.StateFailed:
				failed = append(failed, fmt.Sprintf("%s: %s", n.Name, s.Reason))
			default:
				pending = append(pending, n.Name+" ("+state+")")
			}
		}
		if len(pending) == 0 {
			if len(failed) > 0 {
				sort.Strings(failed)
				return Result{}, fmt.Errorf("%d of %d nodes failed:\n  %s", len(failed), len(st.Config.Nodes), strings.Join(failed, "\n  "))
			}
			return Result{Detail: fmt.Sprintf("%d nodes ready", len(st.Config.Nodes))}, nil
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

func failedSuffix(failed []string) string {
	if len(failed) == 0 {
		return ""
	}
	return "; failed: " + strings.Join(failed, "; ")
}
