package plan

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// PodRanges maps a node name to its pod range: one /24 (IPv4) or /64 (IPv6) of networks.pods, the
// node's agentapi.KubernetesConfig.PodCIDR (its bridge CNI's host-local range) and the destination of
// every other node's route to it (PodRoutes).
type PodRanges map[string]netip.Prefix

// podRangesRecord is the file STATE/kubernetes/pod-ranges.json (statedir.PodRanges): networks.pods
// when it was written, and node name → pod range.
type podRangesRecord struct {
	Pods  netip.Prefix `json:"pods"`
	Nodes PodRanges    `json:"nodes"`
}

// nodeRangeBits is the prefix length of one node's pod range inside pods: /24 for IPv4, /64 for IPv6.
func nodeRangeBits(pods netip.Prefix) int {
	if pods.Addr().Is6() {
		return 64
	}
	return 24
}

// AllocatePodRanges gives every node of nodes (names, in nodes[] order) a pod range inside pods,
// stable for the node's lifetime in the inventory:
//   - a node recorded (recorded, from ReadPodRanges) keeps its range;
//   - a node without one gets the i-th range of pods (i its index in nodes) when no other node holds
//     it, else the lowest range no node holds. With nothing recorded every node gets exactly the
//     i-th range: the positional ranges every appliance before the record gave, so a running
//     cluster's first allocation changes nothing;
//   - a recorded node that nodes no longer lists (removed, pruned) loses its range: it is free for
//     a later node (a re-added node may get another one). A range held by a listed node is never
//     handed to another.
//
// The result holds exactly the nodes of nodes. It is pure: the caller records it (WritePodRanges)
// once the run is allowed to change the cluster. Errors, each under the field path networks.pods: a
// recorded range outside pods, not a node range, or held by two nodes (the record was edited, or
// networks.pods changed under a running cluster); pods smaller than one node range; and more nodes
// than pods holds node ranges (exhausted), each saying what to do.
func AllocatePodRanges(pods netip.Prefix, nodes []string, recorded PodRanges) (PodRanges, error) {
	bits := nodeRangeBits(pods)
	if !pods.IsValid() || pods.Bits() > bits {
		return nil, fmt.Errorf("networks.pods: %s is smaller than one node range (/%d): choose a larger pod network", pods, bits)
	}
	out := PodRanges{}
	holder := map[netip.Prefix]string{}
	for _, n := range nodes {
		r, ok := recorded[n]
		if !ok {
			continue
		}
		switch {
		case r.Bits() != bits || r.Masked() != r || !pods.Contains(r.Addr()):
			return nil, fmt.Errorf("networks.pods: node %s's recorded pod range %s is not a /%d inside %s: networks.pods cannot change under a running cluster; put it back (or, for a cluster not built yet, remove %s)",
				n, r, bits, pods, "the state directory's kubernetes/pod-ranges.json")
		case holder[r] != "":
			return nil, fmt.Errorf("networks.pods: nodes %s and %s are both recorded with pod range %s: the state directory's kubernetes/pod-ranges.json was edited; give one of them a free range there",
				holder[r], n, r)
		}
		out[n], holder[r] = r, n
	}
	capacity := -1 // unbounded for the loop below (more than 2^30 ranges)
	if sub := bits - pods.Bits(); sub < 31 {
		capacity = 1 << sub
	}
	lowest := 0
	for i, n := range nodes {
		if _, ok := out[n]; ok {
			continue
		}
		r, err := nthSubnet(pods, i)
		if err != nil || holder[r] != "" {
			// The positional range is held (or past the end): the lowest free one.
			for ; capacity < 0 || lowest < capacity; lowest++ {
				if r, _ = nthSubnet(pods, lowest); holder[r] == "" {
					break
				}
			}
			if capacity >= 0 && lowest >= capacity {
				return nil, fmt.Errorf("networks.pods: %s holds %d node ranges (/%d), all held by other nodes: node %s gets none; remove a node from nodes[] (appliance node remove) first, or, for a cluster not built yet, choose a larger networks.pods",
					pods, capacity, bits, n)
			}
		}
		out[n], holder[r] = r, n
	}
	return out, nil
}

// ReadPodRanges returns the pod ranges the state directory records (statedir.PodRanges). Without
// that file (a state directory from an appliance before it, or a first run) it returns the ranges
// of the node configs the previous render wrote (STATE/rendered/<node>/nodeconfig.json PodCIDR),
// which are the ranges running nodes use; nil when there are none. Errors: a record that does not
// parse (it names the file and what to do), an unreadable state directory.
func ReadPodRanges(stateDir string) (PodRanges, error) {
	path := statedir.PodRanges(stateDir)
	b, err := os.ReadFile(path)
	if err == nil {
		var rec podRangesRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("%s: %w (restore it from a backup; removing it makes the next run take the ranges of the rendered node configs)", path, err)
		}
		return rec.Nodes, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read the recorded pod ranges: %w", err)
	}
	ents, err := os.ReadDir(statedir.Rendered(stateDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("read the rendered node configs: %w", err)
	}
	var out PodRanges
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(statedir.RenderedNode(stateDir, e.Name()), statedir.NodeConfigFile))
		if err != nil {
			continue // not a node directory, or a node never rendered
		}
		var nc agentapi.NodeConfig
		if json.Unmarshal(b, &nc) != nil || nc.Kubernetes == nil || !nc.Kubernetes.PodCIDR.IsValid() {
			continue
		}
		if out == nil {
			out = PodRanges{}
		}
		out[e.Name()] = nc.Kubernetes.PodCIDR
	}
	return out, nil
}

// WritePodRanges records ranges (AllocatePodRanges' result for networks.pods pods) in
// statedir.PodRanges: one atomic write (pkg/atomicfile: temporary file, fsync, rename), so a kill
// leaves the old record or the new one, and a rerun allocates the same ranges again. 0600 like the
// rest of the state; only when its bytes change. It returns whether it wrote.
func WritePodRanges(stateDir string, pods netip.Prefix, ranges PodRanges) (bool, error) {
	b, err := json.MarshalIndent(podRangesRecord{Pods: pods, Nodes: ranges}, "", "  ")
	if err != nil {
		return false, err
	}
	changed, err := atomicfile.Write(statedir.PodRanges(stateDir), append(b, '\n'), 0o600)
	if err != nil {
		return false, fmt.Errorf("record the pod ranges: %w", err)
	}
	return changed, nil
}

// DescribePodRanges is "node range, …" in node name order, for details and messages.
func DescribePodRanges(ranges PodRanges) string {
	var parts []string
	for _, n := range slices.Sorted(maps.Keys(ranges)) {
		parts = append(parts, n+" "+ranges[n].String())
	}
	return strings.Join(parts, ", ")
}
