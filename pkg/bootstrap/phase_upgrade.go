package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/applianced"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/pkg/version"
)

// upgradePhase re-provisions, one node at a time, the nodes whose hostagent reports a build other
// than the one this appliance serves (a newer `appliance` + `hostagent` rerunning bootstrap over a
// cluster an older one brought up): a node runs the hostagent of the appliance that serves it.
//
// It runs after converge, so every node is ready when it starts; when converge was skipped in this
// run and a node is not ready, it skips itself with the reason and upgrades nothing (needsConverge).
// Which nodes and in what order is planUpgrade's decision: workers first, then the control planes in
// reverse order of nodes[] (the first one, kubeadm's init node with the highest VRRP priority and
// normally the VIP holder, last of all). For each node in turn:
//
//   - ssh nodes: the node's record is set to booting ("upgrading hostagent from A to B": its step
//     reports start anew), then the same path that installed hostagent (pkg/provision over SSH)
//     writes the new executable and restarts hostagent.service. The agent's keepalived outlives the
//     restart and the new agent adopts it (hostagent.Options.DetachKeepalived, KillMode=process), and
//     every step of an already configured node finds nothing to change, so kube-apiserver, etcd and
//     the VIP stay where they are.
//   - BMC-booted (Ignition) nodes, which the appliance does not reach over SSH, upgrade themselves
//     by pull: the node's record is set to booting the same way, the phase records the node and the
//     build in STATE/agent-upgrade.json (applianced.WriteAgentUpgrade), and `appliance serve` adds
//     agentapi.NodeConfig.AgentUpgrade to that node's config alone; its hostagent, which watches
//     its config, downloads the served executable over the pinned HTTPS, checks its SHA-256 and
//     that it runs, replaces its own and restarts into it (hostagent.ErrRestart). Its keepalived
//     outlives the restart as above. The record is removed once the node is done; a run killed
//     before leaves it, so the node still upgrades and the next run finds it on the new build.
//
// The next node starts only after the previous one reported ready with the served build and, with
// Kubernetes, is ready in Kubernetes' terms again (kubeNotReady: Node Ready, kube-proxy, and on a
// control plane the four static pods Running and Ready: etcd's pod is Ready only while etcd's own
// health check passes) and, on a control plane, its own kube-apiserver answers /readyz (which checks
// etcd) at the Node's InternalIP. A node that fails (SSH, a failed step, no ready within
// Options.ConvergeTimeout) stops the rolling: the error names it and why, and the nodes after it keep
// the old build. A run killed mid-upgrade finishes on the next run: the node being upgraded is no
// longer ready, so the power phase provisions it with the new build (restarting a hostagent that
// still runs a replaced executable) and converge waits for it; this phase then goes on with the rest.
// With Options.DryRun it lists the nodes it would upgrade.
type upgradePhase struct{}

func (upgradePhase) Name() string { return "upgrade" }

func (upgradePhase) Run(ctx context.Context, st *State) (Result, error) {
	if st.Options.HostagentBinary == "" {
		return Result{Detail: "no hostagent binary served: nothing to compare nodes with"}, nil
	}
	if why := needsConverge(st, "nothing upgraded"); why != "" {
		return Result{Skipped: why}, nil
	}
	sum, err := st.hostagentSHA256()
	if err != nil {
		return Result{}, fmt.Errorf("hostagent binary: %w", err)
	}
	// The served build's version is this appliance's (`appliance` and `hostagent` are built together);
	// the hash is the served executable's own.
	served := nodestate.AgentBuild{Version: version.String(), SHA256: sum}
	store := nodestate.Open(statedir.Nodes(st.StateDir))
	status := map[string]agentapi.NodeStatus{}
	for _, n := range st.Config.Nodes {
		if s, err := store.Get(n.Name); err == nil {
			status[n.Name] = s
		}
	}
	p := planUpgrade(st.Config.Nodes, status, served)
	if len(p.NotReady) > 0 {
		return Result{}, fmt.Errorf("hostagent upgrade to %s: %s not ready; the upgrade re-provisions ready nodes only, one at a time: let converge finish (rerun without --skip-phases converge)",
			served, strings.Join(p.NotReady, ", "))
	}
	if len(p.Targets) == 0 {
		return Result{Detail: fmt.Sprintf("every node runs the served hostagent %s", served)}, nil
	}
	var names []string
	for _, t := range p.Targets {
		names = append(names, fmt.Sprintf("%s (from %s)", t.Node.Name, t.From))
	}
	if st.Options.DryRun {
		return Result{Changed: true, Detail: fmt.Sprintf("would upgrade hostagent to %s one node at a time: %s", served, strings.Join(names, ", "))}, nil
	}
	bin, err := os.ReadFile(st.Options.HostagentBinary)
	if err != nil {
		return Result{}, fmt.Errorf("hostagent binary: %w", err)
	}
	progress := st.Options.Progress
	if st.Options.JSONEvents || progress == nil {
		progress = io.Discard
	}
	fmt.Fprintf(progress, "      upgrading hostagent to %s one node at a time: %s\n", served, strings.Join(names, ", "))
	var done []string
	for i, t := range p.Targets {
		start := time.Now()
		fmt.Fprintf(progress, "      %-12s upgrading hostagent from %s\n", t.Node.Name, t.From)
		if err := upgradeNode(ctx, st, store, t, served, bin); err != nil {
			var rest []string
			for _, r := range p.Targets[i+1:] {
				rest = append(rest, r.Node.Name)
			}
			msg := fmt.Sprintf("hostagent upgrade to %s stopped at %s: %v", served, t.Node.Name, err)
			if len(done) > 0 {
				msg += "; upgraded: " + strings.Join(done, ", ")
			}
			if len(rest) > 0 {
				msg += "; still on their old build: " + strings.Join(rest, ", ")
			}
			return Result{Changed: true}, errors.New(msg + "; fix the node and rerun bootstrap to go on")
		}
		took := time.Since(start).Seconds()
		fmt.Fprintf(progress, "      %-12s upgraded in %.1fs\n", t.Node.Name, took)
		done = append(done, fmt.Sprintf("%s %.1fs", t.Node.Name, took))
	}
	return Result{Changed: true, Detail: fmt.Sprintf("upgraded hostagent to %s on %d nodes, one at a time: %s", served, len(done), strings.Join(done, ", "))}, nil
}

// upgradeTarget is a node the upgrade phase re-provisions, with the build it reported.
type upgradeTarget struct {
	Node config.Node
	From nodestate.AgentBuild
}

// upgradePlan is planUpgrade's decision.
type upgradePlan struct {
	// Targets are the nodes to upgrade, in order.
	Targets []upgradeTarget
	// NotReady names nodes on another build that are not ready ("w2 (booting)"): the upgrade refuses
	// to start while there are any.
	NotReady []string
}

// planUpgrade decides which of nodes (the configuration's, in order) run a hostagent build other
// than served, from their records (status; a node without one has never reported and is the power
// phase's business): a node differs when its reported SHA-256 differs from served's, or, when it
// reported no hash, its version differs, or when it reported neither (a hostagent older than build
// reports). Ready ssh nodes that differ are Targets, workers first in configuration order, then
// control planes in reverse configuration order (ssh and BMC-booted nodes alike: upgradeNode picks
// the way); any that is not ready goes to NotReady.
func planUpgrade(nodes []config.Node, status map[string]agentapi.NodeStatus, served nodestate.AgentBuild) upgradePlan {
	var p upgradePlan
	var workers, controlPlanes []upgradeTarget
	for _, n := range nodes {
		s, ok := status[n.Name]
		if !ok || s.BootID == "" && s.AgentSHA256 == "" && s.AgentVersion == "" {
			continue // never reported
		}
		from := nodestate.AgentBuild{Version: s.AgentVersion, SHA256: s.AgentSHA256}
		if runsBuild(from, served) {
			continue
		}
		switch {
		case s.State != agentapi.StateReady:
			p.NotReady = append(p.NotReady, fmt.Sprintf("%s (%s)", n.Name, s.State))
		case n.HasRole(config.RoleControlPlane):
			controlPlanes = append([]upgradeTarget{{Node: n, From: from}}, controlPlanes...)
		default:
			workers = append(workers, upgradeTarget{Node: n, From: from})
		}
	}
	p.Targets = append(workers, controlPlanes...)
	return p
}

// runsBuild reports whether a node that reported have runs served: the hashes decide when the node
// reported one, else the versions; a node that reported neither does not.
func runsBuild(have, served nodestate.AgentBuild) bool {
	switch {
	case have.SHA256 != "":
		return have.SHA256 == served.SHA256
	case have.Version != "":
		return have.Version == served.Version
	}
	return false
}

// upgradedYet is the wait's decision on a node's record after its upgrade began: done once the
// node is ready and reports the served build (its step reports started anew when the upgrade set
// it to booting, so ready here is the new agent's); failed (with the reason) when a step failed
// while it reports the served build, which is the new agent's failure.
func upgradedYet(s agentapi.NodeStatus, served nodestate.AgentBuild) (done bool, failed string) {
	have := nodestate.AgentBuild{Version: s.AgentVersion, SHA256: s.AgentSHA256}
	if !runsBuild(have, served) {
		return false, ""
	}
	switch s.State {
	case agentapi.StateReady:
		return true, ""
	case agentapi.StateFailed:
		return false, s.Reason
	}
	return false, ""
}

// upgradeNode upgrades one node to served, over SSH with bin or, for a BMC-booted node, by pull
// (the phase's doc), and waits until it is ready again with it.
func upgradeNode(ctx context.Context, st *State, store *nodestate.Store, t upgradeTarget, served nodestate.AgentBuild, bin []byte) error {
	timeout := st.Options.ConvergeTimeout
	if timeout == 0 {
		timeout = DefaultConvergeTimeout
	}
	deadline := time.Now().Add(timeout)
	// Booting before the new executable goes in: the record's step reports start anew, so the ready
	// that ends the wait is the new agent's (the old one reports only changes, and is stopped next).
	if _, err := store.Set(t.Node.Name, agentapi.StateBooting, fmt.Sprintf("upgrading hostagent from %s to %s", t.From, served)); err != nil {
		return err
	}
	pull := t.Node.Power.Kind != config.PowerSSH
	if pull {
		// The node's agent pulls the build (NodeConfig.AgentUpgrade, set by serve from this record).
		if err := applianced.WriteAgentUpgrade(st.StateDir, applianced.AgentUpgradeRecord{Node: t.Node.Name, Version: served.Version, SHA256: served.SHA256}); err != nil {
			return fmt.Errorf("record the upgrade for serve: %w", err)
		}
	} else if _, _, err := provisionSSHRetried(ctx, st, nil, t.Node, bin); err != nil {
		_, _ = store.Set(t.Node.Name, agentapi.StateFailed, "hostagent upgrade: "+err.Error())
		return fmt.Errorf("install the new hostagent over SSH: %w", err)
	}
	var last agentapi.NodeStatus
	for {
		s, err := store.Get(t.Node.Name)
		if err == nil {
			last = s
			done, failed := upgradedYet(s, served)
			if failed == "" && pull && s.State == agentapi.StateFailed && strings.Contains(s.Reason, "hostagent upgrade") {
				failed = s.Reason // the old agent could not install the new build: it says why
			}
			if failed != "" {
				return fmt.Errorf("the new hostagent failed: %s", failed)
			}
			if done {
				break
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready with hostagent %s after %v (state %s, build %s); `appliance status %s` shows its steps",
				served, timeout, last.State, nodestate.AgentBuild{Version: last.AgentVersion, SHA256: last.AgentSHA256}, t.Node.Name)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	if pull {
		if err := applianced.ClearAgentUpgrade(st.StateDir); err != nil {
			return fmt.Errorf("remove the upgrade record: %w", err)
		}
	}
	if !st.Config.Kubernetes.IsEnabled() {
		return nil
	}
	api, err := openAdminAPI(st.StateDir)
	if err != nil {
		return err
	}
	defer api.close()
	limit := max(time.Until(deadline), 2*time.Minute)
	if err := waitKubeReady(ctx, api, []config.Node{t.Node}, limit, func(string, string) {}); err != nil {
		return err
	}
	if !t.Node.HasRole(config.RoleControlPlane) {
		return nil
	}
	return waitNodeAPIReady(ctx, api, t.Node.Name, limit)
}

// waitNodeAPIReady polls, every second for up to limit, GET /readyz of node's own kube-apiserver:
// at the Node's InternalIP (status.addresses) on the API port of the admin kubeconfig's server,
// verified against the cluster CA under the server's host name (the VIP, in every kube-apiserver's
// serving certificate), with the admin client certificate. kube-apiserver's /readyz includes its
// etcd check.
func waitNodeAPIReady(ctx context.Context, api *adminAPI, node string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var lastErr error
	for {
		if lastErr = nodeAPIReady(ctx, api, node); lastErr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("its kube-apiserver does not answer /readyz after %v: %w", limit.Round(time.Second), lastErr)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func nodeAPIReady(ctx context.Context, api *adminAPI, node string) error {
	var n struct {
		Status struct {
			Addresses []struct {
				Type    string `json:"type"`
				Address string `json:"address"`
			} `json:"addresses"`
		} `json:"status"`
	}
	if err := api.get(ctx, "/api/v1/nodes/"+url.PathEscape(node), &n); err != nil {
		return fmt.Errorf("get Node %s: %w", node, err)
	}
	ip := ""
	for _, a := range n.Status.Addresses {
		if a.Type == "InternalIP" {
			ip = a.Address
			break
		}
	}
	if ip == "" {
		return fmt.Errorf("Node %s has no InternalIP address", node)
	}
	u, err := url.Parse(api.server)
	if err != nil {
		return fmt.Errorf("admin kubeconfig server %q: %w", api.server, err)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	tr, ok := api.client.Transport.(*http.Transport)
	if !ok {
		return errors.New("admin client has no HTTP transport")
	}
	tr = tr.Clone()
	tr.TLSClientConfig = tr.TLSClientConfig.Clone()
	tr.TLSClientConfig.ServerName = u.Hostname()
	tr.DisableKeepAlives = true
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	target := "https://" + net.JoinHostPort(ip, port) + "/readyz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d: %s", target, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}
