package bootstrap

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/ignition"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/plan"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// renderPhase derives every artefact with pkg/plan (Build: pure, deterministic) and writes exactly
// what the plan holds, each file 0600 (several hold node tokens or the VRRP secret) and only when its
// bytes differ: per node under STATE/rendered/<node>/ (hostagent.yaml, nodeconfig.json,
// kernel-cmdline for BMC-booted nodes, ignition/<spec version>.json, handed out after negotiating the
// version), and the bootstrap host's own firewall.json and keepalived.json under STATE/appliance/.
// Files no longer in the plan (a removed node, an Ignition version a snippet rules out) are removed.
// The plan stays in State for the phases after it; when render is skipped they read it back
// (loadRendered).
type renderPhase struct{}

func (renderPhase) Name() string { return "render" }

func (renderPhase) Run(ctx context.Context, st *State) (Result, error) {
	if st.Options.HostagentBinary == "" {
		return Result{}, errors.New("no hostagent binary to serve: build it (`make build`) or pass --hostagent-binary")
	}
	// --prune's removals, then the membership history: after the plan's checks (below) when there
	// is a plan, so a refused plan removes and records nothing.
	members := func() (string, error) {
		pruned, err := pruneForgotten(ctx, st)
		if err != nil {
			return "", err
		}
		membership, err := recordMembership(st)
		if err != nil {
			return "", err
		}
		if pruned != "" {
			membership = strings.TrimSuffix(pruned+"; "+membership, "; ")
		}
		return membership, nil
	}
	if st.CA == nil {
		membership, err := members()
		if err != nil {
			return Result{}, err
		}
		// Dry run on a fresh state: the pki phase would create the CA first.
		detail := fmt.Sprintf("would write the artefacts of %d nodes once the CA exists", len(st.Config.Nodes))
		if membership != "" {
			detail += "; " + membership
		}
		return Result{Changed: true, Detail: detail}, nil
	}
	agentSum, err := st.hostagentSHA256()
	if err != nil {
		return Result{}, fmt.Errorf("hostagent binary: %w", err)
	}
	snippets := map[string][]ignition.Snippet{}
	for _, n := range st.Config.Nodes {
		if snippets[n.Name], err = readSnippets(st.Config, n); err != nil {
			return Result{}, err
		}
	}
	var cluster *plan.ClusterSecrets
	var record clusterRecord
	if st.ClusterCA != nil {
		// Pod ranges stable per node name, and the kubeadm leader from the nodes that joined.
		if record, err = readClusterRecord(st); err != nil {
			return Result{}, err
		}
		cluster = &plan.ClusterSecrets{CA: st.ClusterCA, Kubeadm: st.Kubeadm, PodRanges: record.Ranges, Joined: record.Joined}
	}
	// A running cluster keeps the VRID and VRRP version it was bootstrapped with (plan.VRRPFor).
	recorded, err := plan.ReadRecorded(st.StateDir)
	if err != nil {
		return Result{}, err
	}
	handoff, err := handoffInputs(st)
	if err != nil {
		return Result{}, err
	}
	p, err := plan.Build(plan.Inputs{
		Config: st.Config, ControlPlane: st.ControlPlane, ApplianceURL: st.ApplianceURL, CA: st.CA,
		Tokens: st.Tokens, VRRPAuth: st.VRRPAuth, RecordedVRRP: recorded, Cluster: cluster,
		Registries: st.Images.Registries, HostagentSHA256: agentSum, Snippets: snippets, Handoff: handoff,
		ApplianceImage: st.ApplianceImage.Pinned,
	})
	if err != nil {
		return Result{}, err
	}
	if err := podRangesKept(st.StateDir, p); err != nil {
		return Result{}, err
	}
	membership, err := members()
	if err != nil {
		return Result{}, err
	}
	if cluster != nil {
		ranges, err := recordPodRanges(st, record)
		if err != nil {
			return Result{}, err
		}
		if ranges != "" {
			membership = strings.TrimPrefix(membership+"; "+ranges, "; ")
		}
	}
	files, err := p.Files()
	if err != nil {
		return Result{}, err
	}
	notes := slices.Clone(p.VRRPNotes)
	for _, n := range p.Nodes {
		notes = append(notes, n.Notes...)
		for _, w := range n.Warnings {
			st.Options.Logger.Warn("ignition snippet warning", "warning", w)
		}
	}
	written, removed, err := writeRendered(st.StateDir, files, st.Options.DryRun)
	if err != nil {
		return Result{}, err
	}
	st.Plan = p
	verb := "wrote"
	if st.Options.DryRun {
		verb = "would write"
	}
	detail := fmt.Sprintf("%d nodes, %d files (Ignition %s, hostagent and node configs; appliance firewall and keepalived)",
		len(st.Config.Nodes), len(files), strings.Join(ignition.SupportedVersions, "/"))
	switch {
	case len(written) == 0 && len(removed) == 0:
		detail = "unchanged: " + detail
	default:
		detail += fmt.Sprintf("; %s %d", verb, len(written))
		if len(removed) > 0 {
			detail += fmt.Sprintf(", %s %s", map[bool]string{true: "would remove", false: "removed"}[st.Options.DryRun], strings.Join(removed, ", "))
		}
	}
	if len(notes) > 0 {
		detail += "; " + strings.Join(notes, "; ")
	}
	if membership != "" {
		detail += "; " + membership
	}
	return Result{Changed: len(written) > 0 || len(removed) > 0 || membership != "", Detail: detail}, nil
}

// recordMembership writes the run's node list into the nodes' day-2 history (nodestate.SyncMembership):
// "added" for a node the history does not have yet, "removed" for a recorded node the configuration
// no longer lists; each once, so a rerun records nothing. It returns what it recorded for the
// phase's detail ("" for nothing). A dry run records nothing, and neither does a run that skips
// render (--skip-phases render): the next run that renders records it.
func recordMembership(st *State) (string, error) {
	if st.Options.DryRun {
		return "", nil
	}
	names := make([]string, 0, len(st.Config.Nodes))
	for _, n := range st.Config.Nodes {
		names = append(names, n.Name)
	}
	cfgPath := st.Options.ConfigPath
	if abs, err := filepath.Abs(cfgPath); err == nil {
		cfgPath = abs
	}
	added, removed, err := nodestate.Open(statedir.Nodes(st.StateDir)).SyncMembership(names, "bootstrap run with "+cfgPath)
	if err != nil {
		return "", fmt.Errorf("record the nodes' history: %w", err)
	}
	var parts []string
	if len(added) > 0 {
		parts = append(parts, "history: added "+strings.Join(added, ", "))
	}
	if len(removed) > 0 {
		parts = append(parts, "history: removed from the configuration "+strings.Join(removed, ", "))
	}
	return strings.Join(parts, "; "), nil
}

// writeRendered makes STATE/rendered and STATE/appliance hold exactly files (paths as Plan.Files
// gives them): each written 0600 only when its bytes differ, every other file under those trees
// removed. With dryRun nothing is written or removed; the lists say what would be.
func writeRendered(stateDir string, files map[string][]byte, dryRun bool) (written, removed []string, err error) {
	roots := map[string]string{plan.ApplianceDirectory: statedir.Appliance(stateDir)}
	target := func(rel string) string {
		first, rest, _ := strings.Cut(rel, "/")
		if r, ok := roots[first]; ok {
			return filepath.Join(r, filepath.FromSlash(rest))
		}
		return filepath.Join(statedir.Rendered(stateDir), filepath.FromSlash(rel))
	}
	want := map[string]bool{}
	for _, rel := range slices.Sorted(maps.Keys(files)) {
		path := target(rel)
		want[path] = true
		old, err := os.ReadFile(path)
		if err == nil && bytes.Equal(old, files[rel]) {
			continue
		}
		written = append(written, rel)
		if dryRun {
			continue
		}
		if _, err := atomicfile.Write(path, files[rel], 0o600); err != nil {
			return nil, nil, err
		}
	}
	for _, root := range []string{statedir.Rendered(stateDir), statedir.Appliance(stateDir)} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil || d.IsDir() || want[path] {
				return err
			}
			rel, _ := filepath.Rel(stateDir, path)
			removed = append(removed, rel)
			if dryRun {
				return nil
			}
			return os.Remove(path)
		})
		if err != nil {
			return nil, nil, err
		}
	}
	if !dryRun {
		pruneEmptyDirs(statedir.Rendered(stateDir))
	}
	return written, removed, nil
}

// pruneEmptyDirs removes the empty directories below root (a removed node's), deepest first.
func pruneEmptyDirs(root string) {
	var dirs []string
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && path != root {
			dirs = append(dirs, path)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Remove(dirs[i]) // fails unless empty
	}
}

// Load, for a skipped render phase: the plan read back from disk (loadRendered).
func (renderPhase) Load(_ context.Context, st *State) error {
	p, err := loadRendered(st)
	if err != nil {
		return err
	}
	st.Plan = p
	return nil
}

// loadRendered reads back what render wrote, for the phases after a skipped render: the
// bootstrap host's firewall spec and each node's hostagent.yaml and node config.
func loadRendered(st *State) (*plan.Plan, error) {
	p := &plan.Plan{}
	b, err := os.ReadFile(filepath.Join(statedir.Appliance(st.StateDir), statedir.FirewallFile))
	if err != nil {
		return nil, fmt.Errorf("render skipped but its output is missing: %w (run without --skip-phases render)", err)
	}
	if err := json.Unmarshal(b, &p.Firewall); err != nil {
		return nil, fmt.Errorf("%s: %w", statedir.FirewallFile, err)
	}
	for _, n := range st.Config.Nodes {
		dir := statedir.RenderedNode(st.StateDir, n.Name)
		a := plan.NodeArtefacts{Name: n.Name}
		if a.AgentConfig, err = os.ReadFile(filepath.Join(dir, statedir.AgentConfigFile)); err != nil {
			return nil, fmt.Errorf("render skipped but its output is missing: %w (run without --skip-phases render)", err)
		}
		if a.NodeConfigJSON, err = os.ReadFile(filepath.Join(dir, statedir.NodeConfigFile)); err != nil {
			return nil, fmt.Errorf("render skipped but its output is missing: %w (run without --skip-phases render)", err)
		}
		if err := json.Unmarshal(a.NodeConfigJSON, &a.NodeConfig); err != nil {
			return nil, fmt.Errorf("%s/%s: %w", n.Name, statedir.NodeConfigFile, err)
		}
		p.Nodes = append(p.Nodes, a)
	}
	return p, nil
}

// readSnippets gathers the user's Ignition snippets for a node: ignition.all, then the role lists,
// then the node's own, in that order (later ones merge over earlier ones).
func readSnippets(c *config.BootstrapConfiguration, n config.Node) ([]ignition.Snippet, error) {
	files := slices.Clone(c.Ignition.All)
	if slices.Contains(n.Roles, config.RoleControlPlane) {
		files = append(files, c.Ignition.ControlPlane...)
	}
	if slices.Contains(n.Roles, config.RoleWorker) {
		files = append(files, c.Ignition.Worker...)
	}
	files = append(files, n.Ignition...)
	var out []ignition.Snippet
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("node %s: Ignition snippet: %w", n.Name, err)
		}
		out = append(out, ignition.Snippet{Name: f, Data: b})
	}
	return out, nil
}

// hostagentSHA256 is the hex SHA-256 of Options.HostagentBinary, hashed once per run while the file
// keeps its path, size and modification time (the render phase, each of the hand-off's re-renders
// and the upgrade phase all need it; under TCG each hash of the 40 MB executable took about a second).
func (st *State) hostagentSHA256() (string, error) {
	path := st.Options.HostagentBinary
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	key := fmt.Sprintf("%s\x00%d\x00%d", path, fi.Size(), fi.ModTime().UnixNano())
	if st.hostagentSum.key == key {
		return st.hostagentSum.sum, nil
	}
	sum, err := fileSHA256(path)
	if err != nil {
		return "", err
	}
	st.hostagentSum.key, st.hostagentSum.sum = key, sum
	return sum, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
