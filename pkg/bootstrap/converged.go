package bootstrap

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// needsConverge is the decision of a phase that needs converged nodes (upgrade, handoff, escrow) when it
// runs: the reason it must skip itself (Result.Skipped), or "" to go on.
//
// It skips only when converge was skipped in this run (--skip-phases converge, as the ISO's first
// boot and the fleet bench do) and a configured node's hostagent has not reported ready (its record
// in STATE/nodes, what converge waits for; a node without a record is pending). When converge ran,
// every node is ready or the run already stopped at converge's failure, so a converge that ran and
// failed stays a failure; when converge was skipped but the nodes converged in an earlier run, the
// phase goes on. nothing says what the phase left undone ("nothing upgraded").
func needsConverge(st *State, nothing string) string {
	if !slices.Contains(st.Options.SkipPhases, (convergePhase{}).Name()) {
		return ""
	}
	store := nodestate.Open(statedir.Nodes(st.StateDir))
	var notReady []string
	for _, n := range st.Config.Nodes {
		s, err := store.Get(n.Name)
		switch {
		case err != nil && !errors.Is(err, nodestate.ErrNotFound):
			notReady = append(notReady, n.Name+" (record unreadable)")
		case s.State != agentapi.StateReady:
			notReady = append(notReady, n.Name+" ("+s.State+")")
		}
	}
	if len(notReady) == 0 {
		return ""
	}
	const shown = 3
	list := strings.Join(notReady[:min(shown, len(notReady))], ", ")
	if len(notReady) > shown {
		list += fmt.Sprintf(" and %d more", len(notReady)-shown)
	}
	return fmt.Sprintf("needs converge, which --skip-phases skipped; %d of %d nodes not ready: %s; %s (rerun without --skip-phases converge)",
		len(notReady), len(st.Config.Nodes), list, nothing)
}
