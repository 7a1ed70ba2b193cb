package bootstrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/plan"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// PruneFunc removes a node that the state directory knows as a cluster member but the
// configuration no longer lists (`appliance bootstrap --prune`; cmd/appliance wires it to
// pkg/noderemove, the same removal as `appliance node remove`). It runs under the state
// directory's lock, which the run already holds.
type PruneFunc func(ctx context.Context, st *State, node string) error

// ErrForgotten is returned when the configuration dropped a node that is still in the cluster.
var ErrForgotten = errors.New("a node is in the cluster but not in nodes[]")

// LockStateDir takes the state directory's lock (the one a bootstrap run holds) for another
// command that changes the cluster (`appliance node remove`); the returned function releases it.
// Errors: ErrLocked when a bootstrap run or another such command holds it.
func LockStateDir(stateDir string) (func(), error) { return lockStateDir(stateDir) }

// ForgottenNodes lists, sorted, the nodes the state directory knows as cluster members (memberOf
// their history; without a history, a node with a status) that nodes []string does not list.
func ForgottenNodes(stateDir string, nodes []string) ([]string, error) {
	store := nodestate.Open(statedir.Nodes(stateDir))
	ents, err := os.ReadDir(store.Dir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("list node records: %w", err)
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if !e.IsDir() || slices.Contains(nodes, n) {
			continue
		}
		hist, err := store.History(n)
		if err != nil {
			return nil, err
		}
		member := memberOf(hist)
		if len(hist) == 0 {
			_, statErr := os.Stat(filepath.Join(store.Dir(), n, nodestate.StatusFile))
			member = statErr == nil
		}
		if member {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}

// memberOf reads a node's history (oldest first): it is in the cluster when, since it was last
// added, it became ready at least once (Ready, Rebooted or Upgraded, which hostagent reports only
// from a configured node) and it was not removed since. A node that was listed but never joined
// (powered on and failed, say with a wrong BMC password) is not: dropping it from nodes[] needs no
// removal. A history with reports but no membership entry (the node joined before histories were
// kept) counts as in the cluster.
func memberOf(hist []nodestate.LifecycleEntry) bool { return nodestate.InCluster(hist) }

// checkForgotten returns the nodes the configuration dropped while they are still in the cluster;
// without Options.Prune it refuses them (ErrForgotten, naming each and the two ways on). The runner
// calls it right after the load phase, so a refused run changes nothing at all.
func checkForgotten(st *State) ([]string, error) {
	if st.Config == nil { // a runner test's own first phase loads no configuration
		return nil, nil
	}
	names := make([]string, 0, len(st.Config.Nodes))
	for _, n := range st.Config.Nodes {
		names = append(names, n.Name)
	}
	gone, err := ForgottenNodes(st.StateDir, names)
	if err != nil || len(gone) == 0 || st.Options.Prune != nil {
		return gone, err
	}
	var hints []string
	for _, n := range gone {
		hints = append(hints, fmt.Sprintf("node %s is in the cluster but not in nodes[]: run `appliance node remove %s` or pass --prune", n, n))
	}
	return nil, fmt.Errorf("%w: %s (or put it back in nodes[] of %s)", ErrForgotten, strings.Join(hints, "; "), st.Options.ConfigPath)
}

// pruneForgotten refuses a run whose configuration dropped a node that is still in the cluster
// (ErrForgotten, naming it and the two ways on), or with Options.Prune removes each such node
// first. It runs before the render phase records the membership, so a refused run changes nothing.
// A dry run removes nothing: it says what --prune would remove.
func pruneForgotten(ctx context.Context, st *State) (string, error) {
	gone, err := checkForgotten(st)
	if err != nil || len(gone) == 0 {
		return "", err
	}
	if st.Options.DryRun {
		return "would remove " + strings.Join(gone, ", ") + " (--prune)", nil
	}
	for _, n := range gone {
		if err := st.Options.Prune(ctx, st, n); err != nil {
			return "", fmt.Errorf("--prune: remove %s: %w", n, err)
		}
	}
	return "removed " + strings.Join(gone, ", ") + " (--prune)", nil
}

// clusterRecord is what the state directory records of the cluster's nodes, for the plan
// (plan.ClusterSecrets PodRanges and Joined).
type clusterRecord struct {
	// Ranges is every node of nodes[]'s pod range: the recorded ones kept, new nodes' allocated
	// (plan.AllocatePodRanges); Recorded what the state directory held before (plan.ReadPodRanges).
	Ranges, Recorded plan.PodRanges
	// Joined maps the nodes of nodes[] that have run kubeadm (joinedCluster) to the action their
	// previous node config gave them (STATE/rendered/<node>/nodeconfig.json; "" if unreadable).
	Joined map[string]string
}

// readClusterRecord reads the pod ranges and allocates the new nodes' (nothing is written: see
// recordPodRanges) and which nodes joined with which kubeadm action. Errors: plan.AllocatePodRanges'
// refusals (field path networks.pods), unreadable records.
func readClusterRecord(st *State) (clusterRecord, error) {
	var r clusterRecord
	var err error
	if r.Recorded, err = plan.ReadPodRanges(st.StateDir); err != nil {
		return r, err
	}
	names := make([]string, 0, len(st.Config.Nodes))
	for _, n := range st.Config.Nodes {
		names = append(names, n.Name)
	}
	if r.Ranges, err = plan.AllocatePodRanges(st.Config.Networks.Pods, names, r.Recorded); err != nil {
		return r, err
	}
	store := nodestate.Open(statedir.Nodes(st.StateDir))
	for _, n := range names {
		joined, err := joinedCluster(store, n)
		if err != nil {
			return r, err
		}
		if !joined {
			continue
		}
		if r.Joined == nil {
			r.Joined = map[string]string{}
		}
		r.Joined[n] = ""
		b, err := os.ReadFile(filepath.Join(statedir.RenderedNode(st.StateDir, n), statedir.NodeConfigFile))
		var nc agentapi.NodeConfig
		if err == nil && json.Unmarshal(b, &nc) == nil && nc.Kubernetes != nil {
			r.Joined[n] = nc.Kubernetes.Action
		}
	}
	return r, nil
}

// joinedCluster reports whether node has run kubeadm in the cluster, from its records
// (nodestate.Store.RanKubeadm): not removed since it was last added, and since then its kubeadm step
// reported done (its kubeadm mark, kept across reboots) or ready at least once.
func joinedCluster(store *nodestate.Store, node string) (bool, error) {
	return store.RanKubeadm(node)
}

// recordPodRanges writes the allocation of r (plan.WritePodRanges: one atomic write) unless it is a
// dry run, and says what changed for the render phase's detail: the new nodes' ranges, the ranges
// freed by nodes nodes[] no longer lists, or the ranges a first record took from the rendered node
// configs ("" when nothing changed). It runs once --prune's removals
// are done, so a refused run frees no range of a node still in the cluster.
func recordPodRanges(st *State, r clusterRecord) (string, error) {
	added, freed := plan.PodRanges{}, plan.PodRanges{}
	for n, p := range r.Ranges {
		if old, ok := r.Recorded[n]; !ok || old != p {
			added[n] = p
		}
	}
	for n, p := range r.Recorded {
		if _, ok := r.Ranges[n]; !ok {
			freed[n] = p
		}
	}
	wrote := false
	if !st.Options.DryRun {
		var err error
		if wrote, err = plan.WritePodRanges(st.StateDir, st.Config.Networks.Pods, r.Ranges); err != nil {
			return "", err
		}
	}
	var parts []string
	if wrote && len(added) == 0 && len(freed) == 0 {
		// The first record of a state directory rendered before it: the rendered nodes' ranges.
		parts = append(parts, "pod ranges recorded: "+plan.DescribePodRanges(r.Ranges))
	}
	if len(added) > 0 {
		parts = append(parts, "pod ranges allocated: "+plan.DescribePodRanges(added))
	}
	if len(freed) > 0 {
		parts = append(parts, "pod ranges freed: "+plan.DescribePodRanges(freed))
	}
	return strings.Join(parts, "; "), nil
}

// podRangesKept refuses a plan that gives a node a pod range other than the one its rendered node
// config holds (STATE/rendered/<node>/nodeconfig.json): a running node's range must never change
// under its pods. The ranges come from the record (plan.AllocatePodRanges keeps them per node name),
// so this is a safety net for a record that disagrees with what the nodes were given.
func podRangesKept(stateDir string, p *plan.Plan) error {
	var moved []string
	for _, n := range p.Nodes {
		if n.NodeConfig.Kubernetes == nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(statedir.RenderedNode(stateDir, n.Name), statedir.NodeConfigFile))
		if err != nil {
			continue // a new node
		}
		var old agentapi.NodeConfig
		if json.Unmarshal(b, &old) != nil || old.Kubernetes == nil || !old.Kubernetes.PodCIDR.IsValid() {
			continue
		}
		if now := n.NodeConfig.Kubernetes.PodCIDR; now != old.Kubernetes.PodCIDR {
			moved = append(moved, fmt.Sprintf("%s from %s to %s", n.Name, old.Kubernetes.PodCIDR, now))
		}
	}
	if len(moved) == 0 {
		return nil
	}
	return fmt.Errorf("networks.pods: the pod ranges of running nodes would change (%s): %s disagrees with the rendered node configs; restore it from a backup, or remove it so the next run takes the rendered nodes' ranges",
		strings.Join(moved, "; "), statedir.PodRanges(stateDir))
}
