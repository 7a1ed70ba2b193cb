// Package noderemove takes a node out of the cluster (`appliance node remove NAME`, and
// `appliance bootstrap --prune` for a node dropped from nodes[]): the checks first, then the
// steps, each idempotent so a removal killed at any point finishes when run again.
//
//	check    the node is in nodes[] or known to the state; for a control plane: not the last one,
//	         etcd keeps quorum without it (CheckQuorum), and the appliance can reach it over SSH
//	         (kubeadm reset removes its etcd member; nothing else here can). Refusals change nothing.
//	drain    cordon the Node and evict its pods through the Kubernetes API (policy/v1 Evictions;
//	         DaemonSet and static pods stay), bounded wait. Pods no controller owns are refused in
//	         check unless Options.Force (as `kubectl drain` without --force).
//	reset    over SSH (power.kind ssh), when it answers: stop hostagent (so it does not join again),
//	         `kubeadm reset -f` (on a control plane its remove-etcd-member phase removes the node's
//	         etcd member, kubeadm cmd/kubeadm/app/cmd/phases/reset/removeetcdmember.go), disable
//	         kubelet. A worker that does not answer is skipped (it is wiped or powered off instead).
//	delete   delete the Node object.
//	record   "removed" in the node's day-2 history (pkg/nodestate), once.
//	power    power.kind ipmi or redfish: power it off through its BMC.
//
// The other nodes' VRRP peers, firewalls and pod routes derive from nodes[]: removing the node from
// the configuration and running `appliance bootstrap` re-renders their configs, which their
// hostagents fetch at their next resync. Any node may go, not only the last of nodes[]: pod ranges
// are recorded per node name (pkg/plan AllocatePodRanges), so the others keep theirs and the
// removed node's is freed; removing the control plane that ran kubeadm init makes the first
// remaining control plane that joined the kubeadm leader (pkg/plan KubeadmLeader), which renews the
// join secrets from then on. The quorum rules are the same for every control plane.
package noderemove

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/ignition"
	"github.com/airgap-appliance/appliance/pkg/kubeapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/power"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// DefaultDrainTimeout bounds the drain's wait for evicted pods to leave.
const DefaultDrainTimeout = 2 * time.Minute

// resetTimeout bounds `kubeadm reset` on the node (kubeadm waits minutes on some failures).
const resetTimeout = 4 * time.Minute

// Options are the inputs of one removal.
type Options struct {
	// Config is the (defaulted, validated) configuration; ConfigPath names it in messages.
	Config     *config.BootstrapConfiguration
	ConfigPath string
	// StateDir is the appliance's state directory (the admin kubeconfig, the node records).
	StateDir string
	// Node is the node to remove.
	Node string
	// DryRun runs the checks and says what the removal would do, changing nothing.
	DryRun bool
	// DrainTimeout bounds the drain (0: DefaultDrainTimeout).
	DrainTimeout time.Duration
	// Force evicts pods no controller owns (they are not recreated anywhere); without it a node
	// running such pods is refused, as `kubectl drain` refuses them without --force.
	Force bool
	// Reason goes into the history's "removed" entry ("appliance node remove", "bootstrap --prune with F").
	Reason string
	// PowerTarget converts a node of Config to its power target (bootstrap.PowerTarget: it reads
	// the key and password files).
	PowerTarget func(config.Node) (power.Target, error)
	// Log receives debug lines (never secrets); Progress receives one line per step.
	Log      *slog.Logger
	Progress func(step, detail string)
}

// Step is what one step did.
type Step struct {
	Name    string `json:"step"`
	Changed bool   `json:"changed"`
	Detail  string `json:"detail"`
}

// Result lists the steps in order.
type Result struct {
	Node         string `json:"node"`
	ControlPlane bool   `json:"controlPlane"`
	DryRun       bool   `json:"dryRun,omitempty"`
	Steps        []Step `json:"steps"`
}

// Remove removes o.Node (see the package documentation). Errors: a refusal wrapping ErrRefused
// (nothing changed), the API server unreachable (nothing changed), or the step that failed, named;
// rerunning finishes the job.
func Remove(ctx context.Context, o Options) (*Result, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	res := &Result{Node: o.Node, DryRun: o.DryRun}
	step := func(name string, changed bool, detail string) {
		res.Steps = append(res.Steps, Step{name, changed, detail})
		if o.Progress != nil {
			o.Progress(name, detail)
		}
	}
	store := nodestate.Open(statedir.Nodes(o.StateDir))
	n, inConfig := findNode(o.Config, o.Node)
	rendered, hasRendered := renderedConfig(o.StateDir, o.Node)
	known := inConfig || hasRendered || recorded(store, o.Node)
	if !known {
		var names []string
		for _, n := range o.Config.Nodes {
			names = append(names, n.Name)
		}
		return res, fmt.Errorf("%w: node %q is not in nodes[] of %s and the state directory %s has no record of it: name one of %s",
			ErrRefused, o.Node, o.ConfigPath, o.StateDir, strings.Join(names, ", "))
	}
	res.ControlPlane = inConfig && n.HasRole(config.RoleControlPlane) ||
		!inConfig && hasRendered && slices.Contains(rendered.Roles, string(config.RoleControlPlane))

	if res.ControlPlane {
		if err := lastControlPlane(o); err != nil {
			return res, err
		}
	}
	if inConfig {
		// The key or password files its power section names must be readable before anything changes.
		if _, err := o.PowerTarget(n); err != nil {
			return res, fmt.Errorf("%w: %w", ErrRefused, err)
		}
	}
	kc, err := kubeapi.Load(statedir.AdminKubeconfig(o.StateDir))
	if errors.Is(err, fs.ErrNotExist) {
		return res, fmt.Errorf("%w: no admin kubeconfig at %s: the cluster was never bootstrapped from this state directory (stateDir, --state-dir)",
			ErrRefused, statedir.AdminKubeconfig(o.StateDir))
	} else if err != nil {
		return res, err
	}
	k := kube{kc}
	kn, nodeExists, err := k.getNode(ctx, o.Node)
	if err != nil {
		return res, fmt.Errorf("the Kubernetes API at %s does not answer, nothing was changed: %w", kc.Server(), err)
	}
	members, err := k.etcdMembers(ctx)
	if err != nil {
		return res, err
	}
	isMember := slices.ContainsFunc(members, func(m Member) bool { return m.Node == o.Node })
	if isMember && !res.ControlPlane {
		res.ControlPlane = true
		if err := lastControlPlane(o); err != nil {
			return res, err
		}
	}

	// check: refusals before anything changes.
	var ssh *power.SSHClient
	canSSH := inConfig && n.Power.Kind == config.PowerSSH
	if res.ControlPlane {
		if err := CheckQuorum(members, o.Node); err != nil {
			return res, err
		}
		if isMember {
			why := ""
			switch {
			case !inConfig:
				why = "it is not in nodes[] of " + o.ConfigPath + ", so the appliance has no way to reach it"
			case !canSSH:
				why = fmt.Sprintf("it boots through its BMC (power.kind %s) and the appliance has no shell on it", n.Power.Kind)
			}
			if why == "" {
				if ssh, err = dialSSH(ctx, o, n); err != nil {
					why = "it does not answer over SSH: " + err.Error()
				} else {
					defer ssh.Close()
				}
			}
			if why != "" {
				return res, fmt.Errorf("%w: %s runs an etcd member, which only `kubeadm reset` on it removes here, and %s; put it back in nodes[] with its ssh power section (or bring it back) and rerun, or remove the member by hand (etcdctl member remove) and delete the Node",
					ErrRefused, o.Node, why)
			}
		}
	}
	if nodeExists && !o.Force {
		pods, err := k.evictablePods(ctx, o.Node)
		if err != nil {
			return res, err
		}
		var bare []string
		for _, p := range pods {
			if !p.managed() && p.Metadata.DeletionTimestamp == nil {
				bare = append(bare, p.key())
			}
		}
		if len(bare) > 0 {
			return res, fmt.Errorf("%w: %s runs %d pods no controller owns, which an eviction deletes for good: %s; move or delete them, or remove it with appliance node remove %s --force",
				ErrRefused, o.Node, len(bare), strings.Join(bare, ", "), o.Node)
		}
	}
	detail := "worker"
	if res.ControlPlane {
		detail = fmt.Sprintf("control plane; etcd %s", describeMembers(members))
	}
	if !nodeExists {
		detail += "; no Node object"
	}
	step("check", false, detail)

	if o.DryRun {
		var would []string
		if nodeExists {
			pods, err := k.evictablePods(ctx, o.Node)
			if err != nil {
				return res, err
			}
			would = append(would, fmt.Sprintf("cordon and drain (%d pods to evict)", len(pods)))
		}
		if canSSH {
			would = append(would, "kubeadm reset over SSH")
		}
		if nodeExists {
			would = append(would, "delete the Node")
		}
		would = append(would, "record it removed")
		if inConfig && (n.Power.Kind == config.PowerIPMI || n.Power.Kind == config.PowerRedfish) {
			would = append(would, "power it off through its BMC ("+string(n.Power.Kind)+")")
		}
		step("plan", true, "would "+strings.Join(would, ", "))
		return res, nil
	}

	// drain
	if nodeExists {
		changed := false
		if !kn.Spec.Unschedulable {
			if err := k.cordon(ctx, o.Node); err != nil {
				return res, fmt.Errorf("cordon %s: %w", o.Node, err)
			}
			changed = true
		}
		evicted, err := k.drain(ctx, o.Node, o.DrainTimeout)
		if err != nil {
			return res, err
		}
		d := fmt.Sprintf("cordoned, %d pods evicted", len(evicted))
		if len(evicted) > 0 {
			d += ": " + strings.Join(evicted, ", ")
		}
		step("drain", changed || len(evicted) > 0, d+" (DaemonSet and static pods stay)")
	} else {
		step("drain", false, "no Node object: nothing to drain")
	}

	// reset
	switch {
	case !inConfig:
		step("reset", false, "skipped: not in nodes[] of "+o.ConfigPath+", the appliance cannot reach it; wipe it or power it off")
	case !canSSH:
		step("reset", false, fmt.Sprintf("skipped: no shell on it (power.kind %s); powered off below", n.Power.Kind))
	default:
		if ssh == nil {
			if ssh, err = dialSSH(ctx, o, n); err != nil {
				if res.ControlPlane {
					return res, fmt.Errorf("reset %s: %w", o.Node, err)
				}
				step("reset", false, "skipped: it does not answer over SSH ("+oneLine(err.Error())+"); wipe it or power it off")
				break
			}
			defer ssh.Close()
		}
		d, err := reset(ctx, ssh)
		if err != nil {
			return res, fmt.Errorf("reset %s: %w", o.Node, err)
		}
		step("reset", true, d)
	}

	// delete
	deleted, err := k.deleteNode(ctx, o.Node)
	if err != nil {
		return res, fmt.Errorf("delete Node %s: %w", o.Node, err)
	}
	step("delete", deleted, map[bool]string{true: "deleted the Node", false: "no Node object"}[deleted])

	// record
	reason := o.Reason
	if reason == "" {
		reason = "appliance node remove"
	}
	before, _ := store.History(o.Node)
	if err := store.RecordLifecycle(o.Node, nodestate.Removed, reason); err != nil {
		return res, fmt.Errorf("record the removal of %s: %w", o.Node, err)
	}
	after, _ := store.History(o.Node)
	step("record", len(after) != len(before), "removed, in its day-2 history")

	// power
	if inConfig && (n.Power.Kind == config.PowerIPMI || n.Power.Kind == config.PowerRedfish) {
		d, ch, err := powerOff(ctx, o, n)
		if err != nil {
			return res, fmt.Errorf("power off %s through its BMC: %w", o.Node, err)
		}
		step("power", ch, d)
	}
	return res, nil
}

// lastControlPlane refuses removing the only control plane nodes[] lists (or any, when o.Node is
// not listed and none is).
func lastControlPlane(o Options) error {
	for _, c := range o.Config.ControlPlaneNodes() {
		if c.Name != o.Node {
			return nil
		}
	}
	return fmt.Errorf("%w: %s is the last control plane in nodes[] of %s: removing it would destroy the cluster; add another control plane first",
		ErrRefused, o.Node, o.ConfigPath)
}

// reset stops hostagent (so it does not join the node again) and the API VIP's keepalived it leaves
// running, runs `kubeadm reset -f` and disables kubelet, on the node over SSH. A node without kubeadm (never joined) is left as it is.
func reset(ctx context.Context, c *power.SSHClient) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, resetTimeout)
	defer cancel()
	script := "systemctl disable --now " + ignition.HostagentUnit + " >/dev/null 2>&1 || true\n" +
		// hostagent leaves the API VIP's keepalived running when it stops (KillMode=process, so an
		// upgrade never moves the VIP): end it here (SIGTERM: a priority-0 advertisement hands the VIP on).
		"[ -s /etc/keepalived/keepalived.pid ] && kill \"$(cat /etc/keepalived/keepalived.pid)\" 2>/dev/null || true\n" +
		"command -v kubeadm >/dev/null || { echo 'no kubeadm: nothing to reset'; exit 0; }\n" +
		"out=$(kubeadm reset -f 2>&1); rc=$?\n" +
		"[ $rc -eq 0 ] || { printf '%s\\n' \"$out\" | tail -n 20; exit $rc; }\n" +
		"systemctl disable --now kubelet.service >/dev/null 2>&1 || true\n" +
		"echo 'kubeadm reset done'\n"
	out, errOut, code, err := c.Run(ctx, "sh -c "+shellQuote(script), nil)
	if err != nil {
		return "", err
	}
	if code != 0 {
		return "", fmt.Errorf("kubeadm reset exited %d: %s", code, oneLine(string(out)+" "+string(errOut)))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return "hostagent stopped, " + lines[len(lines)-1] + ", kubelet disabled", nil
}

func powerOff(ctx context.Context, o Options, n config.Node) (string, bool, error) {
	t, err := o.PowerTarget(n)
	if err != nil {
		return "", false, err
	}
	c, err := power.New(ctx, t, o.Log)
	if err != nil {
		return "", false, err
	}
	defer c.Close()
	if s, err := c.PowerState(ctx); err == nil && s == power.StateOff {
		return "already off (" + string(n.Power.Kind) + ")", false, nil
	}
	if err := c.PowerOff(ctx); err != nil {
		return "", false, err
	}
	return "powered off (" + string(n.Power.Kind) + ")", true, nil
}

func dialSSH(ctx context.Context, o Options, n config.Node) (*power.SSHClient, error) {
	t, err := o.PowerTarget(n)
	if err != nil {
		return nil, err
	}
	so, err := power.SSHOptionsFor(t, o.Log)
	if err != nil {
		return nil, err
	}
	return power.DialSSH(ctx, so)
}

func findNode(c *config.BootstrapConfiguration, name string) (config.Node, bool) {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return config.Node{}, false
}

// renderedConfig reads the node config an earlier bootstrap rendered for the node
// (STATE/rendered/<node>/nodeconfig.json): its roles, when the node is gone from nodes[].
func renderedConfig(stateDir, name string) (agentapi.NodeConfig, bool) {
	if strings.ContainsAny(name, "/\\") || name == "." || name == ".." || name == "" {
		return agentapi.NodeConfig{}, false
	}
	b, err := os.ReadFile(filepath.Join(statedir.RenderedNode(stateDir, name), statedir.NodeConfigFile))
	if err != nil {
		return agentapi.NodeConfig{}, false
	}
	var nc agentapi.NodeConfig
	if json.Unmarshal(b, &nc) != nil {
		return agentapi.NodeConfig{}, false
	}
	return nc, true
}

// recorded reports whether the store holds a status or a history for the node.
func recorded(store *nodestate.Store, name string) bool {
	if _, err := store.Get(name); err == nil {
		return true
	}
	h, err := store.History(name)
	return err == nil && len(h) > 0
}

func describeMembers(ms []Member) string {
	var parts []string
	healthy := 0
	for _, m := range ms {
		s := m.Node
		if m.Healthy {
			healthy++
		} else {
			s += " (unhealthy)"
		}
		parts = append(parts, s)
	}
	return fmt.Sprintf("%d members, %d healthy: %s", len(ms), healthy, strings.Join(parts, ", "))
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
