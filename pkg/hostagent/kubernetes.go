package hostagent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/dbus"
	"github.com/vishvananda/netlink"

	kubeadmmanifests "github.com/airgap-appliance/appliance/kubeadm-manifests"
	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/containerd"
)

// Paths of the Kubernetes steps on the node.
const (
	// AptSourcePath is the appliance's apt source (written at provisioning, with signed-by); the
	// packages step uses it as the only source, so nothing is fetched from anywhere else.
	AptSourcePath = agentapi.AptSourcePath
	// ContainerdAppliedPath records the SHA-256 of the config.toml containerd was last restarted
	// with, so a crash between writing the file and the restart still ends in a restart.
	ContainerdAppliedPath = "/var/lib/hostagent/containerd-applied"
	// CNIConfigPath is the bridge CNI network (0644).
	CNIConfigPath = containerd.CNIConfDir + "/10-appliance-bridge.conflist"
	// KubeadmConfigPath is the kubeadm configuration hostagent renders (0600: bootstrap token,
	// certificate key).
	KubeadmConfigPath = "/etc/kubernetes/appliance/kubeadm.yaml"
	// KubeadmStatePath records a finished kubeadm init/join (JSON, 0600): its presence is what makes
	// the kubeadm step idempotent.
	KubeadmStatePath = "/var/lib/hostagent/kubeadm.json"
	// KubeadmLogPath collects the output of every kubeadm run (0600).
	KubeadmLogPath = "/var/log/hostagent/kubeadm.log"
)

// Timeouts of the commands the Kubernetes steps run.
const (
	aptTimeout     = 10 * time.Minute
	kubeadmTimeout = 8 * time.Minute // kubeadm itself waits up to 4 min for a control plane
	resetTimeout   = 3 * time.Minute
)

// waitError is a step that cannot run yet (another node must go first): reported as running, retried
// soon, never a failure.
type waitError struct{ reason string }

func (e *waitError) Error() string { return e.reason }

// onHost refuses the Kubernetes steps when the agent acts on another root or namespace (tests,
// initramfs): they install packages and run kubeadm on the host itself.
func (a *Agent) onHost(step string) error {
	if a.opts.Root != "" || a.opts.NetNS != "" {
		return fmt.Errorf("%s: Kubernetes steps run on the node itself; this agent runs with --root %q --netns %q (set kubernetes.enabled: false for nodes that cannot run kubelet)", step, a.opts.Root, a.opts.NetNS)
	}
	return nil
}

func (a *Agent) kube() (agentapi.NodeConfig, *agentapi.KubernetesConfig) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.nc, a.nc.Kubernetes
}

// run runs a command with a timeout, appending its output to logPath when set; on failure the error
// carries the last lines of output.
func run(ctx context.Context, timeout time.Duration, logPath string, env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	if logPath != "" {
		if err := os.MkdirAll(filepath.Dir(logPath), 0o700); err == nil {
			if f, ferr := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); ferr == nil {
				fmt.Fprintf(f, "==> %s %s %s (%.1fs, %v)\n", start.UTC().Format(time.RFC3339), name, strings.Join(args, " "), time.Since(start).Seconds(), err)
				_, _ = f.Write(out.Bytes())
				_ = f.Close()
			}
		}
	}
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			err = fmt.Errorf("timed out after %s", timeout)
		}
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, tail(out.String(), 6))
	}
	return out.String(), nil
}

// tail is the last n non-empty lines of s, joined with " | ".
func tail(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// stepPackages installs the node's Kubernetes packages (containerd, runc, CNI plugins, kubelet,
// kubeadm, kubectl and their dependencies) with apt from the appliance's repo only
// (Dir::Etc::SourceList = AptSourcePath, no sources.list.d parts). Installed packages are left alone.
func (a *Agent) stepPackages(ctx context.Context) (string, error) {
	if err := a.onHost("packages"); err != nil {
		return "", err
	}
	_, k := a.kube()
	missing, err := notInstalled(ctx, k.Packages)
	if err != nil {
		return "", err
	}
	if len(missing) == 0 {
		return fmt.Sprintf("unchanged: %d packages installed (%s)", len(k.Packages), strings.Join(k.Packages, ", ")), nil
	}
	if _, err := os.Stat(AptSourcePath); err != nil {
		return "", fmt.Errorf("no apt source for the appliance's repo (%w): the node was not provisioned by the appliance", err)
	}
	opts := []string{"-q", "-o", "Dir::Etc::SourceList=" + AptSourcePath, "-o", "Dir::Etc::SourceParts=-", "-o", "APT::Get::List-Cleanup=0"}
	env := []string{"DEBIAN_FRONTEND=noninteractive"}
	start := time.Now()
	if _, err := run(ctx, aptTimeout, "", env, "apt-get", append(opts, "update")...); err != nil {
		return "", err
	}
	args := append(opts, "install", "-y", "--no-install-recommends", "-o", "Dpkg::Options::=--force-confold")
	if _, err := run(ctx, aptTimeout, "", env, "apt-get", append(args, missing...)...); err != nil {
		return "", err
	}
	return fmt.Sprintf("installed %s from the appliance's repo in %.1fs", strings.Join(missing, ", "), time.Since(start).Seconds()), nil
}

// notInstalled lists the packages dpkg does not have installed.
func notInstalled(ctx context.Context, pkgs []string) ([]string, error) {
	if len(pkgs) == 0 {
		return nil, nil
	}
	// dpkg-query exits 1 when a package is unknown; its output still lists the others.
	out, _ := run(ctx, time.Minute, "", nil, "dpkg-query", append([]string{"-W", "-f", "${Package} ${db:Status-Status}\n"}, pkgs...)...)
	installed := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[1] == "installed" {
			installed[f[0]] = true
		}
	}
	var missing []string
	for _, p := range pkgs {
		if !installed[p] {
			missing = append(missing, p)
		}
	}
	return missing, nil
}

// criConfig writes the complete containerd config for kubeadm (containerd.CRIConfig) and restarts
// containerd (systemd, over D-Bus) when the running one has not been restarted with it yet. It first
// checks the installed containerd (containerd.CheckVersion): a containerd 1.x would take the version 3
// file without complaint and run the CRI without mirrors and with the wrong cgroup driver.
func (a *Agent) criConfig(ctx context.Context, sandboxImage string) (string, error) {
	if err := a.onHost("containerd"); err != nil {
		return "", err
	}
	out, err := run(ctx, time.Minute, "", nil, "containerd", "--version")
	if err != nil {
		return "", fmt.Errorf("is the containerd package installed? %w", err)
	}
	if _, err := containerd.CheckVersion(out); err != nil {
		return "", err
	}
	data := containerd.CRIConfig(sandboxImage)
	changed, err := atomicfile.Write(containerd.ConfigPath, data, 0o644)
	if err != nil {
		return "", fmt.Errorf("write %s: %w", containerd.ConfigPath, err)
	}
	sum := sha256.Sum256(data)
	want := hex.EncodeToString(sum[:])
	if b, err := os.ReadFile(ContainerdAppliedPath); err == nil && strings.TrimSpace(string(b)) == want && !changed {
		// Applied before, at an earlier boot maybe: containerd must run now too (the node image ships
		// it disabled until this step has configured it).
		did, err := ensureUnitRunning(ctx, "containerd.service")
		if err != nil {
			return "", err
		}
		if did != "" {
			return containerd.ConfigPath + " unchanged; " + did, nil
		}
		return "unchanged: " + containerd.ConfigPath, nil
	}
	if err := restartUnit(ctx, "containerd.service"); err != nil {
		return "", err
	}
	if _, err := ensureUnitRunning(ctx, "containerd.service"); err != nil {
		return "", err
	}
	if _, err := atomicfile.Write(ContainerdAppliedPath, []byte(want+"\n"), 0o600); err != nil {
		return "", err
	}
	return "wrote " + containerd.ConfigPath + " (CRI: systemd cgroups, sandbox " + sandboxImage + ") and restarted containerd", nil
}

// restartUnit restarts a systemd unit and waits for the job (go-systemd D-Bus).
func restartUnit(ctx context.Context, unit string) error {
	return unitJob(ctx, "restart", unit, func(c *dbus.Conn, done chan<- string) (int, error) {
		return c.RestartUnitContext(ctx, unit, "replace", done)
	})
}

// reloadOrRestartUnit reloads a running systemd unit (its ExecReload), or starts it when it is not
// running, and waits for the job (systemctl reload-or-restart).
func reloadOrRestartUnit(ctx context.Context, unit string) error {
	return unitJob(ctx, "reload", unit, func(c *dbus.Conn, done chan<- string) (int, error) {
		return c.ReloadOrRestartUnitContext(ctx, unit, "replace", done)
	})
}

// ensureUnitRunning enables a systemd unit (so that it starts at every boot, as kubeadm's install
// guide has it for kubelet: `systemctl enable --now`) and starts it unless it is active or
// activating (kubelet restarting itself counts as running). It returns what it did, "" for nothing.
// The node image (iso/build-node-image.sh) ships containerd and kubelet disabled, so that they start
// only once this agent has configured them; kubeadm starts kubelet but never enables it, so without
// this an installed node's reboot came back without kubelet (and without containerd).
func ensureUnitRunning(ctx context.Context, unit string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	conn, err := dbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return "", fmt.Errorf("connect to systemd: %w", err)
	}
	defer conn.Close()
	var did []string
	if p, err := conn.GetUnitPropertyContext(ctx, unit, "UnitFileState"); err != nil {
		return "", fmt.Errorf("read %s's unit file state: %w", unit, err)
	} else if p.Value.Value() != "enabled" {
		if _, _, err := conn.EnableUnitFilesContext(ctx, []string{unit}, false, false); err != nil {
			return "", fmt.Errorf("enable %s: %w", unit, err)
		}
		if err := conn.ReloadContext(ctx); err != nil { // what systemctl enable does after linking
			return "", fmt.Errorf("reload systemd after enabling %s: %w", unit, err)
		}
		did = append(did, "enabled "+unit)
	}
	p, err := conn.GetUnitPropertyContext(ctx, unit, "ActiveState")
	if err != nil {
		return "", fmt.Errorf("read %s's state: %w", unit, err)
	}
	if st := p.Value.Value(); st != "active" && st != "activating" && st != "reloading" {
		done := make(chan string, 1) // buffered: an unread job channel deadlocks the connection
		if _, err := conn.StartUnitContext(ctx, unit, "replace", done); err != nil {
			return "", fmt.Errorf("start %s: %w", unit, err)
		}
		select {
		case r := <-done:
			if r != "done" {
				return "", fmt.Errorf("start %s: job %s (see journalctl -u %s)", unit, r, unit)
			}
		case <-ctx.Done():
			return "", fmt.Errorf("start %s: %w", unit, ctx.Err())
		}
		did = append(did, fmt.Sprintf("started %s (was %v)", unit, st))
	}
	return strings.Join(did, ", "), nil
}

// unitActive reports whether a systemd unit's ActiveState is "active".
func unitActive(ctx context.Context, unit string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := dbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return false, fmt.Errorf("connect to systemd: %w", err)
	}
	defer conn.Close()
	p, err := conn.GetUnitPropertyContext(ctx, unit, "ActiveState")
	if err != nil {
		return false, fmt.Errorf("read %s's state: %w", unit, err)
	}
	return p.Value.Value() == "active", nil
}

// unitJob starts one systemd job through start and waits for it (at most 2 minutes).
func unitJob(ctx context.Context, verb, unit string, start func(*dbus.Conn, chan<- string) (int, error)) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	conn, err := dbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return fmt.Errorf("connect to systemd: %w", err)
	}
	defer conn.Close()
	done := make(chan string, 1) // buffered: an unread job channel deadlocks the connection
	if _, err := start(conn, done); err != nil {
		return fmt.Errorf("%s %s: %w", verb, unit, err)
	}
	select {
	case r := <-done:
		if r != "done" {
			return fmt.Errorf("%s %s: job %s (see journalctl -u %s)", verb, unit, r, unit)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s %s: %w", verb, unit, ctx.Err())
	}
}

// cniConfig is the bridge network: a node-local bridge cni0 with host-local addresses from the node's
// pod range (containernetworking-plugins bridge + host-local, plus portmap for hostPort).
type cniConfig struct {
	CNIVersion string      `json:"cniVersion"`
	Name       string      `json:"name"`
	Plugins    []cniPlugin `json:"plugins"`
}

type cniPlugin struct {
	Type         string          `json:"type"`
	Bridge       string          `json:"bridge,omitempty"`
	IsGateway    bool            `json:"isGateway,omitempty"`
	HairpinMode  bool            `json:"hairpinMode,omitempty"`
	MTU          int             `json:"mtu,omitempty"`
	IPAM         *cniIPAM        `json:"ipam,omitempty"`
	Capabilities map[string]bool `json:"capabilities,omitempty"`
}

type cniIPAM struct {
	Type   string                `json:"type"`
	Ranges [][]map[string]string `json:"ranges"`
	Routes []map[string]string   `json:"routes"`
}

// CNIConfig renders the node's bridge network for podCIDR (JSON, deterministic); mtu, when not 0, is
// the MTU of cni0 and the pods' interfaces (the bridge plugin's "mtu"; the flannel CNI leaves room
// for VXLAN). Pod traffic leaves unmasqueraded: every node routes every other node's pod range (via
// its workload-plane address, or over the flannel overlay).
func CNIConfig(podCIDR netip.Prefix, mtu int) ([]byte, error) {
	def := "0.0.0.0/0"
	if podCIDR.Addr().Is6() {
		def = "::/0"
	}
	c := cniConfig{CNIVersion: "1.0.0", Name: "appliance", Plugins: []cniPlugin{
		{Type: "bridge", Bridge: "cni0", IsGateway: true, HairpinMode: true, MTU: mtu, IPAM: &cniIPAM{
			Type:   "host-local",
			Ranges: [][]map[string]string{{{"subnet": podCIDR.String()}}},
			Routes: []map[string]string{{"dst": def}},
		}},
		{Type: "portmap", Capabilities: map[string]bool{"portMappings": true}},
	}}
	b, err := json.MarshalIndent(c, "", "  ")
	return append(b, '\n'), err
}

// stepCNI enables IP forwarding, writes the bridge CNI network for the node's pod range and routes
// every other node's pod range via that node's workload-plane address (netlink, replace). With the
// flannel CNI it writes the bridge network with the pods' MTU and no route: the overlay DaemonSet
// routes the other nodes' ranges over flannel.1 (and routePods would remove those routes, which
// point into the pod network through a gateway).
func (a *Agent) stepCNI(_ context.Context) (string, error) {
	if err := a.onHost("cni"); err != nil {
		return "", err
	}
	_, k := a.kube()
	var did []string
	const fwd = "/proc/sys/net/ipv4/ip_forward"
	if b, err := os.ReadFile(fwd); err != nil || strings.TrimSpace(string(b)) != "1" {
		if err := os.WriteFile(fwd, []byte("1\n"), 0o644); err != nil {
			return "", fmt.Errorf("enable IP forwarding (kubeadm preflight requires it): %w", err)
		}
		did = append(did, "enabled IP forwarding")
	}
	if k.CNI == CNICalico {
		return stepCNICalico(did)
	}
	mtu := 0
	if k.CNI == CNIFlannel {
		mtu = k.PodMTU
	}
	conf, err := CNIConfig(k.PodCIDR, mtu)
	if err != nil {
		return "", err
	}
	if c, err := atomicfile.Write(CNIConfigPath, conf, 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", CNIConfigPath, err)
	} else if c {
		did = append(did, "wrote "+CNIConfigPath)
	}
	if k.CNI == CNIFlannel {
		detail := fmt.Sprintf("bridge cni0 with pods %s, MTU %d; the flannel overlay routes the other nodes' pods", k.PodCIDR, mtu)
		if len(did) == 0 {
			return "unchanged: " + detail, nil
		}
		return strings.Join(did, ", ") + ": " + detail, nil
	}
	n, err := routePods(k.PodRoutes, k.PodSubnet)
	if err != nil {
		return "", err
	}
	if n > 0 {
		did = append(did, fmt.Sprintf("set %d pod routes", n))
	}
	detail := fmt.Sprintf("bridge cni0 with pods %s, %d peer pod ranges routed", k.PodCIDR, len(k.PodRoutes))
	if len(did) == 0 {
		return "unchanged: " + detail, nil
	}
	return strings.Join(did, ", ") + ": " + detail, nil
}

// routePods makes each route present (RouteReplace) and, when podSubnet is set (the cluster's
// networks.pods), removes the routes via a gateway into podSubnet that routes no longer lists: the
// pod range of a node removed from the inventory. It returns how many routes it changed.
func routePods(routes []agentapi.PodRoute, podSubnet netip.Prefix) (int, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return 0, err
	}
	defer h.Close()
	changed := 0
	for _, r := range routes {
		dst := &net.IPNet{IP: r.Prefix.Addr().AsSlice(), Mask: net.CIDRMask(r.Prefix.Bits(), r.Prefix.Addr().BitLen())}
		gw := net.IP(r.Via.AsSlice())
		have, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Dst: dst}, netlink.RT_FILTER_DST)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return changed, fmt.Errorf("list routes to %s: %w", r.Prefix, err)
		}
		if len(have) == 1 && have[0].Gw.Equal(gw) {
			continue
		}
		if err := h.RouteReplace(&netlink.Route{Dst: dst, Gw: gw}); err != nil {
			return changed, fmt.Errorf("route %s (node %s) via %s: %w", r.Prefix, r.Node, r.Via, err)
		}
		changed++
	}
	if !podSubnet.IsValid() {
		return changed, nil
	}
	all, err := h.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return changed, fmt.Errorf("list routes: %w", err)
	}
	for _, rt := range all {
		if rt.Dst == nil || rt.Gw == nil || rt.Table != syscall.RT_TABLE_MAIN {
			continue
		}
		ones, _ := rt.Dst.Mask.Size()
		addr, ok := netip.AddrFromSlice(rt.Dst.IP)
		if !ok {
			continue
		}
		dst := netip.PrefixFrom(addr.Unmap(), ones)
		if dst.Bits() < podSubnet.Bits() || !podSubnet.Contains(dst.Addr()) ||
			slices.ContainsFunc(routes, func(r agentapi.PodRoute) bool { return r.Prefix == dst }) {
			continue
		}
		if err := h.RouteDel(&rt); err != nil {
			return changed, fmt.Errorf("remove the route to %s (a node no longer in the inventory): %w", dst, err)
		}
		changed++
	}
	return changed, nil
}

// kubeadmState is KubeadmStatePath.
type kubeadmState struct {
	Action string    `json:"action"`
	Done   time.Time `json:"done"`
	// TokenID is the ID part of the bootstrap token the cluster got from this node (init only).
	TokenID string `json:"tokenID,omitempty"`
	// NodeTokenIDs are the IDs of the workers' own tokens the cluster got from this node with it
	// (agentapi.KubernetesConfig.NodeBootstrapTokens), sorted.
	NodeTokenIDs []string `json:"nodeTokenIDs,omitempty"`
}

func tokenID(token string) string { id, _, _ := strings.Cut(token, "."); return id }

// nodeTokenIDs are the sorted IDs of k's workers' tokens.
func nodeTokenIDs(k *agentapi.KubernetesConfig) []string {
	var ids []string
	for _, t := range k.NodeBootstrapTokens {
		ids = append(ids, tokenID(t.Token))
	}
	slices.Sort(ids)
	return ids
}

// createdTokens records in st the tokens of k the cluster now has from this node.
func createdTokens(st *kubeadmState, k *agentapi.KubernetesConfig) {
	st.TokenID, st.NodeTokenIDs = tokenID(k.BootstrapToken), nodeTokenIDs(k)
}

// leftovers lists what an interrupted kubeadm run leaves behind.
func leftovers() []string {
	var found []string
	for _, p := range []string{"/etc/kubernetes/kubelet.conf", "/etc/kubernetes/admin.conf", "/etc/kubernetes/manifests/kube-apiserver.yaml", "/etc/kubernetes/manifests/etcd.yaml", "/var/lib/etcd/member"} {
		if _, err := os.Stat(p); err == nil {
			found = append(found, p)
		}
	}
	return found
}

// stepKubeadm runs kubeadm once: init on the first control plane (with the appliance's cluster CA
// in /etc/kubernetes/pki and --upload-certs under the appliance's certificate key), join
// --control-plane on the others, join on workers; each only when the appliance says the node before
// it is done (Proceed). A finished run is recorded in KubeadmStatePath, so reruns do nothing; a run
// interrupted before that is undone with `kubeadm reset -f` and repeated. On the kubeadm leader (the
// init node, or after its removal the control plane the appliance names: renewsJoinSecrets) a
// renewed bootstrap token (a rerun after it expired) is created in the cluster with `kubeadm init
// phase bootstrap-token` and the certificates re-uploaded.
func (a *Agent) stepKubeadm(ctx context.Context) (string, error) {
	if err := a.onHost("kubeadm"); err != nil {
		return "", err
	}
	nc, k := a.kube()
	a.mu.Lock()
	addr := a.cp.Prefix.Addr()
	a.mu.Unlock()
	var st kubeadmState
	if b, err := os.ReadFile(KubeadmStatePath); err == nil {
		if err := json.Unmarshal(b, &st); err != nil {
			return "", fmt.Errorf("%s: %w (remove it and run `kubeadm reset -f` to join again)", KubeadmStatePath, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if st.Action != "" {
		// Joined at an earlier boot: kubelet must run at this one too.
		did, err := ensureUnitRunning(ctx, "kubelet.service")
		if err != nil {
			return "", err
		}
		if renewsJoinSecrets(st, k) {
			return a.renewJoinSecrets(ctx, nc, k, addr, st)
		}
		if did != "" {
			return fmt.Sprintf("kubeadm %s done %s; %s", st.Action, st.Done.UTC().Format(time.RFC3339), did), nil
		}
		return fmt.Sprintf("unchanged: kubeadm %s done %s", st.Action, st.Done.UTC().Format(time.RFC3339)), nil
	}
	if !k.Proceed {
		msg := "waiting for " + k.WaitingFor + " to finish kubeadm"
		if pulled := a.prepullImages(ctx, k); pulled != "" {
			msg += "; " + pulled
		}
		return "", &waitError{msg}
	}
	if k.BootstrapToken == "" {
		return "", fmt.Errorf("the node config has no bootstrap token: the appliance serves it from this node's kubeadm turn until it has joined (a node recorded as joined gets none: run `appliance node remove %s` before joining it again)", nc.Node)
	}
	if k.Action == agentapi.ActionInit && k.CAKeyPEM == "" {
		return "", errors.New("kubeadm init without the cluster CA key: the appliance hands it out only until the cluster exists, and its records say a node of this cluster has run kubeadm already; this node must not start a second cluster (to build the cluster anew, `appliance node remove` every node first)")
	}
	if time.Until(k.BootstrapTokenExpires) < time.Minute {
		return "", fmt.Errorf("the bootstrap token expired at %s: run `appliance bootstrap` again to renew it", k.BootstrapTokenExpires.UTC().Format(time.RFC3339))
	}
	start := time.Now()
	var reset string
	if left := leftovers(); len(left) > 0 {
		// An interrupted init/join: start over, as kubeadm's docs say (reset also removes this
		// node's etcd member from the cluster).
		if _, err := run(ctx, resetTimeout, KubeadmLogPath, nil, "kubeadm", "reset", "-f"); err != nil {
			return "", err
		}
		reset = fmt.Sprintf(" (after kubeadm reset of an interrupted run: %s)", strings.Join(left, ", "))
	}
	cfg, err := renderKubeadm(nc, k, addr)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(KubeadmConfigPath), 0o700); err != nil {
		return "", err
	}
	if _, err := atomicfile.Write(KubeadmConfigPath, cfg, 0o600); err != nil {
		return "", err
	}
	var args []string
	switch k.Action {
	case agentapi.ActionInit:
		if _, err := atomicfile.Write("/etc/kubernetes/pki/ca.crt", []byte(k.CACertPEM), 0o644); err != nil {
			return "", err
		}
		if _, err := atomicfile.Write("/etc/kubernetes/pki/ca.key", []byte(k.CAKeyPEM), 0o600); err != nil {
			return "", err
		}
		args = []string{"init", "--config", KubeadmConfigPath, "--upload-certs", "--skip-token-print", "--skip-certificate-key-print"}
	case agentapi.ActionJoinControlPlane, agentapi.ActionJoin:
		args = []string{"join", "--config", KubeadmConfigPath}
	default:
		return "", fmt.Errorf("unknown kubeadm action %q in the node config", k.Action)
	}
	if _, err := run(ctx, kubeadmTimeout, KubeadmLogPath, nil, "kubeadm", args...); err != nil {
		return "", err
	}
	// kubeadm started kubelet; enabled, it also starts at the next boot.
	if _, err := ensureUnitRunning(ctx, "kubelet.service"); err != nil {
		return "", err
	}
	st = kubeadmState{Action: k.Action, Done: time.Now().UTC()}
	if k.Action == agentapi.ActionInit {
		createdTokens(&st, k)
	}
	b, _ := json.Marshal(st)
	if _, err := atomicfile.Write(KubeadmStatePath, b, 0o600); err != nil {
		return "", err
	}
	return fmt.Sprintf("kubeadm %s done in %.1fs%s", k.Action, time.Since(start).Seconds(), reset), nil
}

// renewsJoinSecrets reports whether this node, whose kubeadm record is st, must put the join secrets
// of its node config k into the cluster: it is a control plane that has run kubeadm (init or
// join-control-plane), its config makes it the kubeadm leader (a control-plane action without an
// After node: agentapi.KubernetesConfig.RenewsJoinSecrets, "the first remaining control plane",
// which after the init node's removal is a control plane that joined), and the cluster has not got
// k's bootstrap token, or one of its workers' tokens (a worker added), from it yet.
func renewsJoinSecrets(st kubeadmState, k *agentapi.KubernetesConfig) bool {
	if st.Action == "" || st.Action == agentapi.ActionJoin || !k.RenewsJoinSecrets() || k.BootstrapToken == "" {
		return false
	}
	if st.TokenID != tokenID(k.BootstrapToken) {
		return true
	}
	for _, id := range nodeTokenIDs(k) {
		if _, found := slices.BinarySearch(st.NodeTokenIDs, id); !found {
			return true
		}
	}
	return false
}

// renewJoinSecrets uploads the control-plane certificates under the appliance's current certificate
// key and then creates its current bootstrap token in the cluster (kubeadm init phases upload-certs
// and bootstrap-token, with admin.conf), in that order: see below. Both phases read an
// InitConfiguration, also on a leader that joined (Action join-control-plane).
func (a *Agent) renewJoinSecrets(ctx context.Context, nc agentapi.NodeConfig, k *agentapi.KubernetesConfig, addr netip.Addr, st kubeadmState) (string, error) {
	cfg, err := renewalConfig(nc, k, addr)
	if err != nil {
		return "", err
	}
	if _, err := atomicfile.Write(KubeadmConfigPath, cfg, 0o600); err != nil {
		return "", err
	}
	// Certificates first: a control plane joining with the new token passes discovery as soon as
	// the token signs cluster-info, and then downloads the certificates under the new key.
	if _, err := run(ctx, kubeadmTimeout, KubeadmLogPath, nil, "kubeadm", "init", "phase", "upload-certs", "--upload-certs", "--config", KubeadmConfigPath, "--skip-certificate-key-print"); err != nil {
		return "", err
	}
	if _, err := run(ctx, kubeadmTimeout, KubeadmLogPath, nil, "kubeadm", "init", "phase", "bootstrap-token", "--config", KubeadmConfigPath, "--skip-token-print"); err != nil {
		return "", err
	}
	createdTokens(&st, k)
	b, _ := json.Marshal(st)
	if _, err := atomicfile.Write(KubeadmStatePath, b, 0o600); err != nil {
		return "", err
	}
	// The token ID (public; the secret part is not) makes each renewal's report differ from the
	// last one: the appliance drops a report equal to the step's previous one.
	return fmt.Sprintf("renewed the bootstrap token %s and %d workers' tokens (the control-plane certificates re-uploaded first)", st.TokenID, len(st.NodeTokenIDs)), nil
}

// renewalConfig is the kubeadm configuration renewJoinSecrets runs its init phases with: the node's
// InitConfiguration (bootstrap token, certificate key, cluster configuration), whatever its Action.
func renewalConfig(nc agentapi.NodeConfig, k *agentapi.KubernetesConfig, addr netip.Addr) ([]byte, error) {
	asInit := *k
	asInit.Action = agentapi.ActionInit
	return renderKubeadm(nc, &asInit, addr)
}

// renderKubeadm renders the node's kubeadm configuration (kubeadm-manifests) for addr, its
// control-plane address.
func renderKubeadm(nc agentapi.NodeConfig, k *agentapi.KubernetesConfig, addr netip.Addr) ([]byte, error) {
	c := kubeadmmanifests.Cluster{
		Name:                 nc.ClusterName,
		KubernetesVersion:    k.Version,
		ControlPlaneEndpoint: k.ControlPlaneEndpoint,
		ImageRepository:      k.ImageRepository,
		PodSubnet:            k.PodSubnet,
		ServiceSubnet:        k.ServiceSubnet,
		APIServerCertSANs:    k.APIServerCertSANs,
		EtcdMembers:          k.EtcdMembers,
		BootstrapToken:       k.BootstrapToken,
		BootstrapTokenTTL:    time.Until(k.BootstrapTokenExpires).Truncate(time.Second),
		CertificateKey:       k.CertificateKey,
		CACertHashes:         k.CACertHashes,
	}
	for _, t := range k.NodeBootstrapTokens {
		c.NodeBootstrapTokens = append(c.NodeBootstrapTokens, kubeadmmanifests.NodeToken{Node: t.Node, Token: t.Token})
	}
	n := kubeadmmanifests.Node{
		Name:                  nc.Node,
		Address:               addr,
		ControlPlane:          k.Action != agentapi.ActionJoin,
		IgnorePreflightErrors: k.IgnorePreflightErrors,
	}
	if k.Action == agentapi.ActionInit {
		return kubeadmmanifests.InitConfig(c, n)
	}
	return kubeadmmanifests.JoinConfig(c, n)
}

// stepAPI checks that this control plane's kube-apiserver answers /readyz on the API port (the
// same probe keepalived's track script runs).
func (a *Agent) stepAPI(ctx context.Context) (string, error) {
	a.mu.Lock()
	port := a.nc.APIServerPort
	a.mu.Unlock()
	url := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))) + "/readyz"
	if err := a.checkInNS(ctx, url); err != nil {
		return "", fmt.Errorf("kube-apiserver not ready: %w", err)
	}
	detail := "kube-apiserver ready at " + url
	_, k := a.kube()
	if k != nil && k.CNIManifest != "" {
		did, err := applyCNI(ctx, k, nodeCNIPaths)
		if err != nil {
			return "", err
		}
		detail += "; " + did
	}
	if k != nil && k.IngressRouterManifest != "" {
		did, err := applyManifest(ctx, "ingress router", k.IngressRouterManifest, nodeIngressRouterPaths)
		if err != nil {
			return "", err
		}
		detail += "; " + did
	}
	return detail, nil
}

// prepullTimeout bounds the image pre-pull of a control plane waiting for its kubeadm turn.
const prepullTimeout = 5 * time.Minute

// prepullImages pulls, once per process and Kubernetes version, the images a control plane's
// kubeadm run will need (`kubeadm config images pull`: kube-apiserver, kube-controller-manager,
// kube-scheduler, kube-proxy, CoreDNS, pause, etcd, from k.ImageRepository through the node's
// containerd mirrors) while the node waits for the node before it: kubeadm's own preflight pulls
// them inside the serialized init/join otherwise, one node after the other (what made the ISO
// journey's converge longest, the appliance in a TCG VM serving every pull). Workers are skipped
// (kubeadm join pulls nothing for them). A failure is only logged and said in the returned note:
// kubeadm pulls what is missing itself. It returns a note for the wait's detail ("" when nothing
// was done now).
func (a *Agent) prepullImages(ctx context.Context, k *agentapi.KubernetesConfig) string {
	if k.Action != agentapi.ActionJoinControlPlane || a.prepulled == k.Version {
		return ""
	}
	a.prepulled = k.Version
	start := time.Now()
	_, err := run(ctx, prepullTimeout, KubeadmLogPath, nil, "kubeadm", "config", "images", "pull",
		"--kubernetes-version", k.Version, "--image-repository", k.ImageRepository, "--cri-socket", kubeadmmanifests.CRISocket)
	if err != nil {
		a.log.Warn("pre-pulling the control-plane images failed; kubeadm will pull them", "error", err)
		return "pre-pulling its images failed (kubeadm will pull them): " + strings.Join(strings.Fields(err.Error()), " ")
	}
	return fmt.Sprintf("its control-plane images pre-pulled in %.1fs", time.Since(start).Seconds())
}
