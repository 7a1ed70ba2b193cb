package hostagent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/netresolve"
	"github.com/airgap-appliance/appliance/pkg/version"
)

// Paths on the node, each prefixed with Options.Root.
const (
	// CACertPath is the pinned appliance CA (0644).
	CACertPath = "/etc/hostagent/ca.crt"
	// NodeConfigCachePath is the last node config fetched (0600: it holds the VRRP secret).
	NodeConfigCachePath = "/var/lib/hostagent/nodeconfig.json"
	// KeepalivedDir holds keepalived.conf (0600) and keepalived's pid files.
	KeepalivedDir = "/etc/keepalived"
)

// DefaultResync is how often a running agent re-fetches its config and re-checks every step.
const DefaultResync = time.Minute

// Options configure an Agent.
type Options struct {
	// Config is the node's hostagent configuration (identity, appliance URL, pin, token).
	Config agentapi.Configuration
	// Root prefixes every path the agent writes or reads on the node ("" = /), e.g. /sysroot from an
	// initramfs.
	Root string
	// NoFirewall skips the firewall step (reported done, "skipped: --no-firewall").
	NoFirewall bool
	// NetNS is a network namespace name (/run/netns/NAME) to act in: addresses, nftables, keepalived and
	// the API probe. "" = the agent's own namespace (production). The Kubernetes steps refuse to run
	// with a NetNS or Root set: they act on the host itself.
	NetNS string
	// BootID identifies this boot; "" reads /proc/sys/kernel/random/boot_id.
	BootID string
	// TrackScript overrides the keepalived track-script command (default: this binary's `check-api`).
	TrackScript []string
	// ScriptUser runs the track script (default "nobody").
	ScriptUser string
	// DetachKeepalived makes the API VIP's keepalived outlive this agent (keepalived.Process.Detached:
	// own session, log file, record in KeepalivedDir): an agent that exits (SIGTERM for an upgrade or
	// a restart) or crashes leaves keepalived holding the VIP, and the next agent adopts it (same
	// configuration: left alone; another: reloaded with SIGHUP), so restarting or upgrading hostagent
	// never moves the VIP. hostagent.service's KillMode=process keeps systemd from killing it with the
	// agent (agentapi.HostagentUnitContents). `hostagent run` sets it; false (tests) stops keepalived
	// when Run returns.
	DetachKeepalived bool
	// Resync is the period of re-checks after ready; 0 means DefaultResync. Between re-checks the
	// agent watches its config (agentapi.ConfigWaitParam) and re-checks at once when it changes.
	Resync time.Duration
	// Executable is the hostagent executable that a self-upgrade (NodeConfig.AgentUpgrade) replaces;
	// "" = this process's own (os.Executable).
	Executable string
	// RetryInitial and RetryMax bound the exponential backoff between retries towards the appliance
	// (defaults 500 ms and 30 s).
	RetryInitial, RetryMax time.Duration
	// Log receives progress; tokens and secrets are never logged.
	Log *slog.Logger
}

// Agent configures one node. Build it with New and call Run.
type Agent struct {
	opts   Options
	log    *slog.Logger
	bootID string
	rep    *reporter
	// build is this hostagent's version and executable SHA-256, sent with every report.
	build agentBuild

	mu     sync.Mutex
	client *Client
	nc     agentapi.NodeConfig
	cp, wl netresolve.Address
	keep   *keepalivedSupervisor
	last   map[string]agentapi.Report // last report per step, to report changes only
	// fetched: the config step applied a config fetched from the appliance now (not a cached one).
	fetched bool
	// prepulled is the Kubernetes version whose control-plane images this process pulled while the
	// node waited for its kubeadm turn (stepKubeadm).
	prepulled string
}

// New checks opts and returns an agent. Errors: missing node, URL, pin or token.
func New(opts Options) (*Agent, error) {
	c := opts.Config
	var missing []string
	for name, v := range map[string]string{"node": c.Node, "applianceURL": c.ApplianceURL, "caPin": c.CAPin, "token": c.Token} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("hostagent configuration: %s required", strings.Join(missing, ", "))
	}
	if _, err := agentapi.ParsePin(c.CAPin); err != nil {
		return nil, fmt.Errorf("hostagent configuration: caPin: %w", err)
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Resync == 0 {
		opts.Resync = DefaultResync
	}
	if opts.RetryInitial == 0 {
		opts.RetryInitial = 500 * time.Millisecond
	}
	if opts.RetryMax == 0 {
		opts.RetryMax = 30 * time.Second
	}
	if opts.ScriptUser == "" {
		opts.ScriptUser = "nobody"
	}
	boot := opts.BootID
	if boot == "" {
		b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
		if err != nil {
			return nil, fmt.Errorf("read boot id: %w", err)
		}
		boot = strings.TrimSpace(string(b))
	}
	a := &Agent{opts: opts, log: opts.Log.With("node", c.Node), bootID: boot, last: map[string]agentapi.Report{}}
	a.build = currentBuild()
	if a.build.err != nil {
		a.log.Warn("cannot hash the hostagent executable; reports carry its version only", "error", a.build.err)
	}
	return a, nil
}

// agentBuild identifies the running hostagent in its reports (agentapi.Report.AgentVersion,
// AgentSHA256).
type agentBuild struct {
	version, sha256 string
	err             error // why sha256 is empty
}

// currentBuild is this process's version (pkg/version.String) and the SHA-256 of its executable
// (os.Executable), hashed once per process.
var currentBuild = sync.OnceValue(func() agentBuild {
	b := agentBuild{version: version.String()}
	exe, err := os.Executable()
	if err != nil {
		b.err = err
		return b
	}
	f, err := os.Open(exe)
	if err != nil {
		b.err = err
		return b
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		b.err = fmt.Errorf("hash %s: %w", exe, err)
		return b
	}
	b.sha256 = hex.EncodeToString(h.Sum(nil))
	return b
})

func (a *Agent) path(p string) string { return filepath.Join(a.opts.Root, p) }

func (a *Agent) nsPath() string {
	if a.opts.NetNS == "" {
		return ""
	}
	return "/run/netns/" + a.opts.NetNS
}

func (a *Agent) backoff() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = a.opts.RetryInitial, a.opts.RetryMax
	return b
}

// Run configures the node and keeps it configured until ctx ends: it obtains the CA, runs every
// step (reporting each), notifies systemd READY=1 once configured, then re-checks every Resync
// (after a failed step sooner: with exponential backoff from RetryInitial to RetryMax),
// reporting only what changed, and restarts keepalived when it dies. On return it stops the
// children it started (keepalived, unless Options.DetachKeepalived) and flushes pending reports for
// a moment.
// Errors: a refused token (ErrUnauthorized) or a bad pin; ErrRestart after a self-upgrade
// (NodeConfig.AgentUpgrade); otherwise only ctx's error.
func (a *Agent) Run(ctx context.Context) error {
	defer a.shutdown()
	caPEM, err := a.ensureCA(ctx)
	if err != nil {
		return err
	}
	client, err := NewClient(a.opts.Config.ApplianceURL, caPEM, a.opts.Config.Token, a.bootID)
	if err != nil {
		return err
	}
	a.client = client
	a.rep = newReporter(client, a.backoff, a.log)
	// The reporter stops with Run, also when Run returns while ctx lives on (ErrRestart, a refused
	// token); what it still holds is then sent with a bounded context.
	rctx, stopReporter := context.WithCancel(ctx)
	go a.rep.run(rctx)
	defer func() {
		stopReporter()
		a.rep.drain(5 * time.Second)
	}()

	notified := false
	var failWait time.Duration // backoff between attempts while a step fails
	for {
		wait := a.opts.Resync
		var waiting *waitError
		if err := a.converge(ctx); errors.As(err, &waiting) {
			wait = min(2*time.Second, a.opts.Resync) // another node goes first: look again soon
		} else if err != nil {
			if errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrRestart) || ctx.Err() != nil {
				return err
			}
			// A failed step is retried with exponential backoff (RetryInitial doubling up to
			// RetryMax), not only at the next resync.
			failWait = min(max(2*failWait, a.opts.RetryInitial), a.opts.RetryMax)
			wait = min(failWait, a.opts.Resync)
		} else {
			failWait = 0
			if !notified {
				if ok, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
					a.log.Warn("sd_notify failed", "error", err)
				} else if ok {
					a.log.Info("notified systemd: ready")
				}
				notified = true
			}
		}
		var died <-chan struct{}
		if a.keep != nil {
			died = a.keep.died()
		}
		wctx, stopWatch := context.WithCancel(ctx)
		var changed <-chan struct{}
		if wait == a.opts.Resync {
			changed = a.watchConfig(wctx)
		}
		select {
		case <-ctx.Done():
			stopWatch()
			return ctx.Err()
		case <-changed:
			a.log.Info("node config changed; re-checking now")
		case <-time.After(wait):
		case <-died:
			// A keepalived killed with SIGKILL leaves the VIP on the interface, where the kernel keeps
			// answering ARP for it while a peer takes over within a second: two holders. Remove it now,
			// not when the keepalived step runs again after the config fetch, which can wait for an
			// unreachable appliance far longer than the peers do.
			if err := a.keep.proc.Cleanup(); err != nil {
				a.log.Warn("keepalived exited; removing the VIP it left failed", "error", err)
			}
			a.log.Warn("keepalived exited; restarting it")
		}
		stopWatch()
	}
}

// watchMinInterval spaces config watches that come back at once (an appliance that predates the
// watch, or one that cannot be reached): at most one request per this interval.
const watchMinInterval = 5 * time.Second

// watchConfig watches the node's config (Client.WaitConfig) until ctx ends and returns a channel
// closed when the appliance serves another config than the one last fetched. Errors only space the
// requests (the next re-check reports what is wrong); an appliance that sent no ETag ends the watch.
func (a *Agent) watchConfig(ctx context.Context) <-chan struct{} {
	changed := make(chan struct{})
	go func() {
		for ctx.Err() == nil {
			start := time.Now()
			ok, err := a.client.WaitConfig(ctx)
			switch {
			case ctx.Err() != nil:
				return
			case err == nil && ok:
				close(changed)
				return
			case errors.Is(err, ErrNoWatch):
				return
			}
			if time.Since(start) < watchMinInterval {
				select {
				case <-ctx.Done():
				case <-time.After(watchMinInterval - time.Since(start)):
				}
			}
		}
	}()
	return changed
}

// ensureCA returns the pinned CA: ROOT/etc/hostagent/ca.crt when it matches the pin, else FetchCA
// (retried with backoff while the appliance is unreachable), written 0644.
func (a *Agent) ensureCA(ctx context.Context) ([]byte, error) {
	path := a.path(CACertPath)
	if b, err := os.ReadFile(path); err == nil {
		if caPEM, _, err := VerifyCA(b, a.opts.Config.CAPin); err == nil {
			return caPEM, nil
		}
		a.log.Warn("cached CA does not match the pin; fetching it again", "path", path)
	}
	caPEM, err := backoff.Retry(ctx, func() ([]byte, error) {
		b, err := FetchCA(ctx, a.opts.Config.ApplianceURL, a.opts.Config.CAPin)
		if errors.Is(err, ErrBadPin) || errors.Is(err, ErrPinMismatch) {
			return nil, backoff.Permanent(err)
		}
		return b, err
	}, backoff.WithBackOff(a.backoff()), backoff.WithMaxElapsedTime(0), backoff.WithNotify(func(err error, d time.Duration) {
		a.log.Warn("appliance CA not reachable; retrying", "error", err, "retryIn", d)
	}))
	if err != nil {
		return nil, err
	}
	if _, err := atomicfile.Write(path, caPEM, 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	return caPEM, nil
}

// stepFuncs maps each step of the contract's plan (agentapi.Plan) to what this agent does for it.
func (a *Agent) stepFuncs() map[string]func(context.Context) (string, error) {
	return map[string]func(context.Context) (string, error){
		agentapi.StepConfig:     a.stepConfig,
		agentapi.StepFirewall:   a.stepFirewall,
		agentapi.StepPackages:   a.stepPackages,
		agentapi.StepContainerd: a.stepContainerd,
		agentapi.StepCNI:        a.stepCNI,
		agentapi.StepKeepalived: a.stepKeepalived,
		agentapi.StepAPILB:      a.stepAPILB,
		agentapi.StepKubeadm:    a.stepKubeadm,
		agentapi.StepAPI:        a.stepAPI,
		agentapi.StepDNS:        a.stepDNS,
		agentapi.StepHandoff:    a.stepHandoff,
		agentapi.StepReady:      func(context.Context) (string, error) { return "node configured", nil },
	}
}

// converge runs every step of the plan once, in plan order (the config step first: it fetches the
// node config the rest of the plan comes from), stopping at the first failure.
func (a *Agent) converge(ctx context.Context) error {
	funcs := a.stepFuncs()
	if err := a.report(ctx, agentapi.StepConfig, funcs[agentapi.StepConfig]); err != nil {
		return err
	}
	if up := a.nc.AgentUpgrade; up != nil && a.fetched && a.needsUpgrade(*up) {
		return a.upgradeSelf(ctx, *up)
	}
	for _, name := range agentapi.Plan(a.nc)[1:] {
		run, ok := funcs[name]
		if !ok {
			return fmt.Errorf("the appliance's plan names step %q, which this hostagent does not know: upgrade hostagent", name)
		}
		if err := a.report(ctx, name, run); err != nil {
			return err
		}
	}
	return nil
}

// report runs one step and queues its reports: running (the first time in this process) then done
// or failed; a step cut by ctx's end (the agent stopping) reports nothing more. A re-check is
// reported only when its status differs from the last report, or its detail differs and says it
// changed something or failed (details of no-op re-checks start with "unchanged"); the appliance
// ignores exact repeats anyway.
func (a *Agent) report(ctx context.Context, step string, run func(context.Context) (string, error)) error {
	last, seen := a.last[step]
	if !seen {
		a.send(agentapi.Report{Step: step, Status: agentapi.StatusRunning})
	}
	detail, err := run(ctx)
	r := agentapi.Report{Step: step, Status: agentapi.StatusDone, Detail: detail}
	var waiting *waitError
	switch {
	case errors.As(err, &waiting):
		r.Status, r.Detail = agentapi.StatusRunning, err.Error()
		if seen && last.Status == r.Status && last.Detail == r.Detail {
			return err
		}
		a.log.Info("step waiting", "step", step, "detail", r.Detail)
		a.send(r)
		return err
	case err != nil && ctx.Err() != nil:
		// Stopped mid-step (SIGTERM: a restart, an upgrade, a shutdown): the step did not fail, it
		// was cut, and the next agent runs it again. Reporting it failed would make the node (and,
		// after an upgrade, the new build) look failed for a step nobody saw fail.
		a.log.Info("step interrupted by the agent's stop", "step", step, "error", err)
		return err
	case err != nil:
		r.Status, r.Detail = agentapi.StatusFailed, err.Error()
	}
	if !seen || last.Status != r.Status || (r.Detail != last.Detail && (err != nil || changed(detail))) {
		if err != nil {
			a.log.Error("step failed", "step", step, "error", err)
		} else {
			a.log.Info("step done", "step", step, "detail", detail)
		}
		a.send(r)
	}
	return err
}

// changed reports whether a step's detail says it changed something (details of no-op re-checks
// start with "unchanged").
func changed(detail string) bool { return !strings.HasPrefix(detail, "unchanged") }

func (a *Agent) send(r agentapi.Report) {
	r.BootID, r.Time = a.bootID, time.Now().UTC()
	r.AgentVersion, r.AgentSHA256 = a.build.version, a.build.sha256
	a.last[r.Step] = r
	a.rep.enqueue(r)
}

// stepConfig fetches the node config (falling back to the cached one while the appliance is away),
// caches it, and resolves the node's own addresses.
func (a *Agent) stepConfig(ctx context.Context) (string, error) {
	cache := a.path(NodeConfigCachePath)
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	nc, raw, err := a.client.NodeConfig(fctx)
	cancel()
	source := "fetched"
	switch {
	case errors.Is(err, ErrUnauthorized):
		return "", err
	case err != nil:
		b, rerr := os.ReadFile(cache)
		if rerr != nil {
			if a.nc.Node != "" { // keep the one already applied in this process
				nc, source = a.nc, "unchanged: kept"
				break
			}
			return "", fmt.Errorf("fetch node config: %w; no cached copy at %s", err, cache)
		}
		if nc, err = parseNodeConfig(b); err != nil {
			return "", fmt.Errorf("cached %s: %w", cache, err)
		}
		source = "appliance unreachable, using cached"
	default:
		if nc.Node != a.opts.Config.Node {
			return "", fmt.Errorf("the appliance sent the config of node %q, this is %q: check node in the hostagent config", nc.Node, a.opts.Config.Node)
		}
		c, werr := atomicfile.Write(cache, raw, 0o600)
		if werr != nil {
			return "", fmt.Errorf("cache node config: %w", werr)
		}
		if !c && a.nc.Node != "" {
			source = "unchanged: fetched"
		}
	}
	r, err := netresolve.New(a.nsPath())
	if err != nil {
		return "", err
	}
	defer r.Close()
	var exclude []netip.Addr
	if nc.APIServerVIP.IsValid() {
		exclude = append(exclude, nc.APIServerVIP)
	}
	cp, err := r.Resolve(nc.ControlPlaneCIDRs, exclude...)
	if err != nil {
		return "", fmt.Errorf("control-plane address: %w", err)
	}
	wl := cp
	if len(nc.WorkloadPlaneCIDRs) > 0 {
		if wl, err = r.Resolve(nc.WorkloadPlaneCIDRs, exclude...); err != nil {
			return "", fmt.Errorf("workload-plane address: %w", err)
		}
	}
	a.mu.Lock()
	a.nc, a.cp, a.wl = nc, cp, wl
	a.fetched = !strings.Contains(source, "cached") && !strings.HasPrefix(source, "unchanged: kept")
	a.mu.Unlock()
	return fmt.Sprintf("%s node config; control plane %s, workload plane %s", source, cp, wl), nil
}

// shutdown stops the children this agent started, except a detached keepalived
// (Options.DetachKeepalived), which the next agent adopts.
func (a *Agent) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if a.keep != nil && !a.opts.DetachKeepalived {
		a.keep.stop(ctx)
	}
}

// reporter delivers reports in order, retrying each with backoff until the appliance takes it.
type reporter struct {
	client  *Client
	backoff func() backoff.BackOff
	log     *slog.Logger

	mu      sync.Mutex
	queue   []agentapi.Report
	wake    chan struct{}
	idle    chan struct{} // closed and replaced when the queue empties
	stopped chan struct{}
}

func newReporter(c *Client, b func() backoff.BackOff, log *slog.Logger) *reporter {
	return &reporter{client: c, backoff: b, log: log, wake: make(chan struct{}, 1), idle: make(chan struct{}), stopped: make(chan struct{})}
}

func (r *reporter) enqueue(rep agentapi.Report) {
	r.mu.Lock()
	r.queue = append(r.queue, rep)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *reporter) run(ctx context.Context) {
	defer close(r.stopped)
	for {
		r.mu.Lock()
		if len(r.queue) == 0 {
			close(r.idle)
			r.idle = make(chan struct{})
			r.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
			}
			continue
		}
		next := r.queue[0]
		r.mu.Unlock()
		_, err := backoff.Retry(ctx, func() (struct{}, error) {
			err := r.client.Report(ctx, next)
			if errors.Is(err, ErrUnauthorized) {
				return struct{}{}, backoff.Permanent(err)
			}
			return struct{}{}, err
		}, backoff.WithBackOff(r.backoff()), backoff.WithMaxElapsedTime(0), backoff.WithNotify(func(err error, d time.Duration) {
			r.log.Warn("report not delivered; retrying", "step", next.Step, "status", next.Status, "error", err, "retryIn", d)
		}))
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.log.Error("report refused; dropping it", "step", next.Step, "error", err)
		}
		r.mu.Lock()
		r.queue = r.queue[1:]
		r.mu.Unlock()
	}
}

// drain waits up to d for queued reports to be delivered (after Run's context ended, the queue is
// sent with a fresh, bounded context).
func (r *reporter) drain(d time.Duration) {
	<-r.stopped
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	r.mu.Lock()
	q := r.queue
	r.queue = nil
	r.mu.Unlock()
	for _, rep := range q {
		if err := r.client.Report(ctx, rep); err != nil {
			return
		}
	}
}

// pending is the number of undelivered reports.
func (r *reporter) pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}

// ErrRestart is returned by Agent.Run once the agent replaced its executable with the build its
// config names (agentapi.NodeConfig.AgentUpgrade): the caller starts the new executable in its
// place (`hostagent run` execs it with the same arguments, keeping its PID for systemd and the lab
// kit's init). A detached keepalived (Options.DetachKeepalived) keeps running and the new agent
// adopts it.
var ErrRestart = errors.New("hostagent replaced its executable with the build its config names: start the new one")

// needsUpgrade reports whether up names another build than this process's: by SHA-256 when this
// executable could be hashed, else by version.
func (a *Agent) needsUpgrade(up agentapi.AgentUpgrade) bool {
	if a.build.sha256 != "" {
		return !strings.EqualFold(up.SHA256, a.build.sha256)
	}
	return up.Version != a.build.version
}

func (a *Agent) executable() (string, error) {
	if a.opts.Executable != "" {
		return a.opts.Executable, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(exe)
}

// upgradeSelf replaces this agent's executable with the build up names (issue 15: a node runs the
// hostagent of the appliance that serves it; the way for nodes the appliance cannot reach over SSH,
// such as BMC-booted ones): it reports the config step running ("upgrading hostagent from A to B"),
// downloads up.Path from the appliance over the pinned HTTPS into a temporary file beside the
// executable, refuses it unless its SHA-256 is up.SHA256, runs it once (`NEW version`, 30 s at
// most) so that a file this machine cannot execute never replaces a working agent, then renames it
// over the executable (atomic: a kill leaves the old file or the new one, and at worst a temporary
// file, which the next attempt removes) and returns ErrRestart. A failure
// reports the config step failed with the reason and leaves the executable as it was; Run retries
// with backoff.
func (a *Agent) upgradeSelf(ctx context.Context, up agentapi.AgentUpgrade) error {
	from := agentBuildString(a.build.version, a.build.sha256)
	to := agentBuildString(up.Version, up.SHA256)
	a.send(agentapi.Report{Step: agentapi.StepConfig, Status: agentapi.StatusRunning, Detail: fmt.Sprintf("upgrading hostagent from %s to %s", from, to)})
	err := a.replaceExecutable(ctx, up)
	if err != nil {
		err = fmt.Errorf("hostagent upgrade to %s: %w", to, err)
		a.last[agentapi.StepConfig] = agentapi.Report{Step: agentapi.StepConfig, Status: agentapi.StatusFailed, Detail: err.Error()}
		a.send(a.last[agentapi.StepConfig])
		return err
	}
	a.log.Info("hostagent executable replaced; restarting into it", "from", from, "to", to)
	return ErrRestart
}

func agentBuildString(version, sum string) string {
	if len(sum) > 12 {
		sum = sum[:12]
	}
	return fmt.Sprintf("%s (sha256 %s)", version, sum)
}

func (a *Agent) replaceExecutable(ctx context.Context, up agentapi.AgentUpgrade) error {
	if up.Path == "" || !strings.HasPrefix(up.Path, "/") {
		return fmt.Errorf("the appliance named no download path (%q)", up.Path)
	}
	exe, err := a.executable()
	if err != nil {
		return fmt.Errorf("locate this executable: %w", err)
	}
	pattern := "." + filepath.Base(exe) + ".upgrade-*"
	if stale, _ := filepath.Glob(filepath.Join(filepath.Dir(exe), pattern)); len(stale) > 0 {
		for _, p := range stale { // left by an attempt killed mid-download
			_ = os.Remove(p)
		}
	}
	f, err := os.CreateTemp(filepath.Dir(exe), pattern)
	if err != nil {
		return err
	}
	tmp := f.Name()
	keep := false
	defer func() {
		if !keep {
			_ = os.Remove(tmp)
		}
	}()
	sum, err := a.client.Download(ctx, up.Path, f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("download %s: %w", up.Path, err)
	}
	if !strings.EqualFold(sum, up.SHA256) {
		return fmt.Errorf("the appliance served %s with SHA-256 %s, the config names %s: not installed", up.Path, sum, up.SHA256)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(vctx, tmp, "version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("the downloaded hostagent does not run here (`version`: %v: %s): not installed", err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, exe); err != nil {
		return err
	}
	keep = true
	if d, err := os.Open(filepath.Dir(exe)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
