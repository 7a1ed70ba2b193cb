package applianced

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/pkg/vipcheck"
)

// handedOffName is the hand-off marker in statedir.Keepalived.
const handedOffName = "handed-off"

// runVIP holds the API VIP on the bootstrap host with keepalived until the control planes take it:
// once a control-plane node reports its API step done, the instance is stopped (SIGTERM: keepalived
// sends a priority-0 advertisement, so a control plane takes over at once) and the hand-off is
// recorded, so later runs of `appliance serve` leave the VRRP group alone. It returns when ctx ends
// or after the hand-off.
//
// keepalived is detached from `appliance serve` (keepalived.Process.Detached: own session, log and
// record in statedir.Keepalived), so the VIP never moves because serve crashed, was killed or was
// restarted: when ctx ends keepalived is left running, and the next serve adopts it (same rendered
// configuration: left alone; another: reloaded with SIGHUP) instead of restarting it. Only the
// hand-off and Stop (`appliance stop`) end it. On systemd hosts the unit's KillMode=process keeps
// systemd from killing it with serve (systemd.go).
//
// Before the first claim (no keepalived of ours runs yet) the VRRP pre-flight (pkg/vipcheck) listens
// for a few advertisement intervals and ARP-probes the VIP; a foreign speaker on our VRID or another
// host answering for the VIP stops the claim: runVIP returns that error (serve logs it) and starts
// nothing. Serve runs that check itself before it serves (checkVIPClaim), so that a refusal makes
// serve exit and `appliance bootstrap` print it; it then passes checked = true.
func runVIP(ctx context.Context, cfg *config.BootstrapConfiguration, stateDir string, log *slog.Logger, checked bool) error {
	kc, ok, err := ReadKeepalived(stateDir)
	if err != nil || !ok {
		return err
	}
	dir := statedir.Keepalived(stateDir)
	if _, err := os.Stat(filepath.Join(dir, handedOffName)); err == nil {
		log.Info("VIP already handed off to the control planes")
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	klog := log.With("component", "keepalived")
	start := func() (*keepalived.Process, error) {
		p := &keepalived.Process{Config: kc, Dir: dir, Log: klog, Detached: true}
		err := p.Start(ctx)
		if errors.Is(err, keepalived.ErrAlreadyRunning) {
			// A keepalived without a record (started by an older serve): replace it once.
			if err := keepalived.StopStale(ctx, dir, log); err != nil {
				return nil, err
			}
			p = &keepalived.Process{Config: kc, Dir: dir, Log: klog, Detached: true}
			err = p.Start(ctx)
		}
		if err != nil {
			return nil, err
		}
		log.Info("keepalived for the API VIP", "outcome", p.Outcome(), "pid", p.Pid(), "log", p.LogPath())
		return p, nil
	}
	// Only the first claim is checked: a keepalived of ours that already runs (adopted below) is
	// left alone and costs nothing.
	if pid, running := vipcheck.KeepalivedRunning(dir); running {
		log.Info("keepalived for the API VIP already runs; no VRRP pre-flight", "pid", pid)
	} else if checked {
		log.Debug("VRRP pre-flight done before serving")
	} else if err := preflight(ctx, kc, "", log); err != nil {
		if ctx.Err() != nil { // serve is stopping: nothing was claimed, nothing to report
			return nil
		}
		return err
	}
	p, err := start()
	if err != nil {
		return fmt.Errorf("start keepalived for the API VIP: %w", err)
	}
	store := nodestate.Open(statedir.Nodes(stateDir))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			log.Info("leaving keepalived running for the next serve to adopt", "pid", p.Pid())
			return nil
		case <-p.Done():
			log.Warn("keepalived exited; restarting", "pid", p.Pid(), "error", p.Err())
			if p, err = start(); err != nil {
				return fmt.Errorf("restart keepalived for the API VIP: %w", err)
			}
		case <-tick.C:
			if node, ok := controlPlaneAPIUp(cfg, store); ok {
				log.Info("control plane API answers; leaving the VRRP group", "node", node)
				sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := p.Stop(sctx)
				cancel()
				if err != nil {
					log.Warn("stop keepalived", "error", err)
				}
				_, err = atomicfile.Write(filepath.Join(dir, handedOffName), []byte(node+"\n"), 0o600)
				return err
			}
		}
	}
}

// checkVIPClaim runs the VRRP pre-flight when this host is about to claim the API VIP for the first
// time: keepalived is configured, the VIP was not handed off, and no keepalived of ours runs (a rerun
// or a restarted serve adopts it and checks nothing). Serve calls it before it serves: a conflict is
// returned, serve exits with it, and the bootstrap's serve phase prints it with serve's last log
// lines. It adds the pre-flight's window (vipcheck.Options.Window) to a first start only.
func checkVIPClaim(ctx context.Context, stateDir string, log *slog.Logger) error {
	kc, ok, err := ReadKeepalived(stateDir)
	if err != nil || !ok {
		return err
	}
	dir := statedir.Keepalived(stateDir)
	if _, err := os.Stat(filepath.Join(dir, handedOffName)); err == nil {
		return nil
	}
	if _, running := vipcheck.KeepalivedRunning(dir); running {
		return nil
	}
	if age, ok := takePreflightRecord(dir, kc, time.Now()); ok {
		log.Info("VRRP pre-flight already passed (run by appliance bootstrap ahead of serve)", "ago", age.Round(time.Millisecond))
		return nil
	}
	return preflight(ctx, kc, "", log)
}

// preflightRecordFile, in statedir.Keepalived, records a VRRP pre-flight that PreflightAhead passed;
// checkVIPClaim accepts it instead of listening again when it is younger than preflightRecordTTL
// and was made for the same instances, and removes it (it is good for one claim).
const (
	preflightRecordFile = "preflight-passed.json"
	preflightRecordTTL  = 2 * time.Minute
)

// preflightRecord is the JSON content of preflightRecordFile: what the pre-flight listened and
// probed for (vipcheck.FromInstance of every instance, without secrets) and when it passed.
type preflightRecord struct {
	Checks []preflightCheck `json:"checks"`
	Passed time.Time        `json:"passed"`
}

type preflightCheck struct {
	Interface      string        `json:"interface"`
	SourceIP       netip.Addr    `json:"sourceIP"`
	Peers          []netip.Addr  `json:"peers"`
	VIPs           []netip.Addr  `json:"vips"`
	VRID           uint8         `json:"vrid"`
	AdvertInterval time.Duration `json:"advertInterval"`
}

func preflightChecks(kc keepalived.Config) []preflightCheck {
	var out []preflightCheck
	for _, in := range kc.Instances {
		o := vipcheck.FromInstance("", in)
		out = append(out, preflightCheck{Interface: o.Interface, SourceIP: o.SourceIP, Peers: o.Peers, VIPs: o.VIPs,
			VRID: o.VRID, AdvertInterval: o.AdvertInterval})
	}
	return out
}

// takePreflightRecord removes dir's pre-flight record and reports how old it was, if it matches kc
// and is at most preflightRecordTTL old. Any other record (stale, other instances, unreadable) is
// removed too, and the claim is checked again.
func takePreflightRecord(dir string, kc keepalived.Config, now time.Time) (time.Duration, bool) {
	path := filepath.Join(dir, preflightRecordFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	_ = os.Remove(path)
	var r preflightRecord
	if json.Unmarshal(b, &r) != nil {
		return 0, false
	}
	want, err := json.Marshal(preflightChecks(kc))
	if err != nil {
		return 0, false
	}
	got, err := json.Marshal(r.Checks)
	age := now.Sub(r.Passed)
	if err != nil || !bytes.Equal(got, want) || age < 0 || age > preflightRecordTTL {
		return 0, false
	}
	return age, true
}

// PreflightAhead runs, in `appliance bootstrap`, the VRRP pre-flight that the serve it is about to
// start would otherwise run before serving (checkVIPClaim), so that its listening window (3 s, see
// vipcheck.Options.Window) overlaps the bootstrap's earlier phases instead of adding to the serve
// phase. kc is the bootstrap host's keepalived configuration as the render phase will write it
// (plan.ApplianceKeepalived). The same rules apply: nothing is checked after the hand-off or while a
// keepalived of ours runs. A conflict is returned as checkVIPClaim returns it; a pass is recorded in
// statedir.Keepalived (0600) for serve, which accepts it for preflightRecordTTL for the same instances.
// checkOnly are instances the bootstrap host does not run but whose VIP and VRID it checks on its
// segment all the same (plan.ApplianceIngressCheck: the ingress VIP); they are not in the record, as
// serve does not check them.
func PreflightAhead(ctx context.Context, stateDir string, kc keepalived.Config, checkOnly []keepalived.Instance, log *slog.Logger) error {
	dir := statedir.Keepalived(stateDir)
	if _, err := os.Stat(filepath.Join(dir, handedOffName)); err == nil {
		return nil
	}
	if _, running := vipcheck.KeepalivedRunning(dir); running {
		return nil
	}
	all := kc
	all.Instances = append(slices.Clone(kc.Instances), checkOnly...)
	if err := preflight(ctx, all, "", log); err != nil {
		return err
	}
	b, err := json.Marshal(preflightRecord{Checks: preflightChecks(kc), Passed: time.Now()})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	_, err = atomicfile.Write(filepath.Join(dir, preflightRecordFile), b, 0o600)
	return err
}

// preflight runs the VRRP pre-flight (pkg/vipcheck) for every instance of kc in the network
// namespace at nsPath ("" = this one), logs what it heard and how long it took, and returns the
// conflicts: another VRRP group on our VRID, or another host answering for the VIP, each naming the
// speaker and the configuration field to change.
func preflight(ctx context.Context, kc keepalived.Config, nsPath string, log *slog.Logger) error {
	// The instances are checked at once (each listens for its own window): the ingress VIP's check
	// adds no time to the API VIP's.
	errs := make([]error, len(kc.Instances))
	var wg sync.WaitGroup
	for i, in := range kc.Instances {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := vipcheck.FromInstance(nsPath, in)
			o.Log = log
			o.Ingress = in.Name == agentapi.VRRPIngressInstanceName
			res, err := vipcheck.Run(ctx, o)
			log.Info("VRRP pre-flight", "vip", in.VIP.Addr(), "vrid", in.VirtualRouterID, "interface", in.Interface,
				"took", res.Took.Round(time.Millisecond), "window", res.Window, "peerAdverts", res.Adverts,
				"otherVRIDs", res.OtherVRIDs, "peersAnswering", len(res.PeerMACs), "conflict", err != nil)
			if err != nil {
				what := "claiming the API VIP"
				if o.Ingress {
					what = "the control planes claim the ingress VIP"
				}
				errs[i] = fmt.Errorf("VRRP pre-flight before %s %s refused the claim: %w", what, in.VIP.Addr(), err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// stopVIP stops the detached keepalived of stateDir (`appliance stop`): SIGTERM, so the VIP moves to a
// control plane at once if one is up; SIGKILL after 10 s.
func stopVIP(stateDir string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return keepalived.StopDetached(ctx, statedir.Keepalived(stateDir))
}

// controlPlaneAPIUp reports a control-plane node whose hostagent reported the API step done.
func controlPlaneAPIUp(cfg *config.BootstrapConfiguration, store *nodestate.Store) (string, bool) {
	for _, n := range cfg.ControlPlaneNodes() {
		s, err := store.Get(n.Name)
		if err != nil {
			continue
		}
		if r, ok := s.Steps[agentapi.StepAPI]; ok && r.Status == agentapi.StatusDone {
			return n.Name, true
		}
	}
	return "", false
}

// ReadKeepalived reads the bootstrap host's VRRP instance the render phase wrote
// (statedir.Appliance/keepalived.json, pkg/plan.ApplianceKeepalived). ok is false when there is none
// (keepalived disabled, no VIP).
func ReadKeepalived(stateDir string) (kc keepalived.Config, ok bool, err error) {
	path := filepath.Join(statedir.Appliance(stateDir), statedir.KeepalivedFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return kc, false, nil
	} else if err != nil {
		return kc, false, err
	}
	if err := json.Unmarshal(b, &kc); err != nil {
		return kc, false, fmt.Errorf("%s: %w (rerun bootstrap: the render phase writes it)", path, err)
	}
	return kc, true, nil
}
