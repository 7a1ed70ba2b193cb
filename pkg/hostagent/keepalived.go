package hostagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/netresolve"
	"github.com/airgap-appliance/appliance/pkg/vipcheck"
)

// KeepalivedConfig builds the node's keepalived configuration: unicast from the node's control-plane
// address cp (its interface carries the VIP) to the peers of nc.Keepalived, VIP nc.APIServerVIP with
// the prefix length of the control-plane CIDR that holds it (cp's CIDR when none does), and a track
// script (command track, run as scriptUser) that adds agentapi.VRRPAPIHealthWeight while the local API answers;
// with nc.Ingress, a second instance (agentapi.VRRPIngressInstanceName) for the ingress VIP.
// Errors: nc has no keepalived section or no VIP.
func KeepalivedConfig(nc agentapi.NodeConfig, cp netresolve.Address, track []string, scriptUser string) (keepalived.Config, error) {
	k := nc.Keepalived
	if k == nil || !nc.APIServerVIP.IsValid() {
		return keepalived.Config{}, errors.New("node config has no keepalived section or API VIP")
	}
	bits := cp.CIDR.Bits()
	for _, p := range nc.ControlPlaneCIDRs {
		if p.Contains(nc.APIServerVIP) {
			bits = p.Bits()
			break
		}
	}
	kc := keepalived.Config{
		RouterID:   nc.Node,
		ScriptUser: scriptUser,
		Instances: []keepalived.Instance{{
			Name:            agentapi.VRRPInstanceName,
			Interface:       cp.Interface,
			SourceIP:        cp.Prefix.Addr(),
			Peers:           k.Peers,
			VIP:             netip.PrefixFrom(nc.APIServerVIP, bits),
			VirtualRouterID: k.VirtualRouterID,
			Priority:        k.Priority,
			AuthPass:        k.AuthPass,
			AdvertInterval:  k.AdvertInterval(),
			TrackScript: &keepalived.Script{
				Command: track, Interval: 2 * time.Second, Timeout: 2 * time.Second, Fall: 2, Rise: 1,
				Weight: agentapi.VRRPAPIHealthWeight,
			},
		}},
	}
	if in := nc.Ingress; in != nil && in.VIP.IsValid() {
		// The ingress VIP: a second instance with the same speakers but the bootstrap host (which never
		// carries it), priorities and track script; its own VRID.
		ibits := cp.CIDR.Bits()
		for _, p := range nc.ControlPlaneCIDRs {
			if p.Contains(in.VIP) {
				ibits = p.Bits()
				break
			}
		}
		api := kc.Instances[0]
		ing := api
		ing.Name = agentapi.VRRPIngressInstanceName
		ing.VIP = netip.PrefixFrom(in.VIP, ibits)
		ing.VirtualRouterID = in.VirtualRouterID
		ing.Peers = nil
		for _, p := range api.Peers {
			if p != nc.ApplianceAddress {
				ing.Peers = append(ing.Peers, p)
			}
		}
		kc.Instances = append(kc.Instances, ing)
	}
	return kc, nil
}

// keepalivedSupervisor is the keepalived child of this agent.
type keepalivedSupervisor struct {
	proc *keepalived.Process
	conf []byte
}

func (s *keepalivedSupervisor) died() <-chan struct{} { return s.proc.Done() }

func (s *keepalivedSupervisor) running() bool {
	select {
	case <-s.proc.Done():
		return false
	default:
		return true
	}
}

func (s *keepalivedSupervisor) stop(ctx context.Context) { _ = s.proc.Stop(ctx) }

// trackCommand is the track script: Options.TrackScript, or this binary's `check-api`.
func (a *Agent) trackCommand(port uint16) ([]string, error) {
	if len(a.opts.TrackScript) > 0 {
		return a.opts.TrackScript, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the hostagent binary for the keepalived track script: %w", err)
	}
	return []string{exe, "check-api", "https://127.0.0.1:" + strconv.Itoa(int(port)) + "/readyz"}, nil
}

// stepKeepalived renders and checks keepalived.conf and makes keepalived run with it: unchanged when
// the running child has the same config, reloaded (SIGHUP) when it differs, started otherwise
// (after stopping a keepalived a previous agent left running from the same pid file).
func (a *Agent) stepKeepalived(ctx context.Context) (string, error) {
	a.mu.Lock()
	nc, cp := a.nc, a.cp
	a.mu.Unlock()
	// With the API load balancer, the track script asks the API through it: the VIP stays where it is
	// while the holder's own kube-apiserver restarts or drains, since the balancer serves the VIP's
	// port from the others (OpenShift's on-prem keepalived checks its haproxy the same way).
	trackPort := nc.APIServerPort
	if nc.APILoadBalancer != nil {
		trackPort = nc.APILoadBalancer.Port
	}
	track, err := a.trackCommand(trackPort)
	if err != nil {
		return "", err
	}
	cfg, err := KeepalivedConfig(nc, cp, track, a.opts.ScriptUser)
	if err != nil {
		return "", err
	}
	conf, err := keepalived.Render(cfg)
	if err != nil {
		return "", err
	}
	in := cfg.Instances[0]
	desc := fmt.Sprintf("VIP %s on %s, VRID %d, priority %d, %d peers", in.VIP, in.Interface, in.VirtualRouterID, in.Priority, len(in.Peers))
	if a.keep != nil && a.keep.running() {
		if bytes.Equal(conf, a.keep.conf) {
			return fmt.Sprintf("unchanged: keepalived running (pid %d), %s", a.keep.proc.Pid(), desc), nil
		}
		if err := a.keep.proc.Reload(ctx, cfg); err != nil {
			return "", fmt.Errorf("reload keepalived: %w", err)
		}
		a.keep.conf = conf
		return fmt.Sprintf("reloaded keepalived (pid %d), %s", a.keep.proc.Pid(), desc), nil
	}
	dir := a.path(KeepalivedDir)
	restarted := a.keep != nil
	detached := a.opts.DetachKeepalived
	if restarted {
		a.log.Warn("keepalived had exited", "error", a.keep.proc.Err())
		_ = a.keep.proc.Cleanup()
	} else {
		// The first start in this agent: check the segment before claiming, unless a keepalived of
		// ours from a previous agent still runs (a rerun or an upgrade: only the first claim is
		// checked). A detached one is adopted by Start below; any other is stopped first.
		_, stale := vipcheck.KeepalivedRunning(dir)
		if !detached {
			if err := keepalived.StopStale(ctx, dir, a.log); err != nil {
				return "", err
			}
		}
		if !stale {
			took, err := a.vipPreflight(ctx, in)
			if err != nil {
				return "", err
			}
			desc += fmt.Sprintf(", VRRP pre-flight clear in %.1fs", took.Seconds())
		}
	}
	newProcess := func() *keepalived.Process {
		return &keepalived.Process{Config: cfg, Dir: dir, NetNS: a.opts.NetNS, Log: a.log.With("component", "keepalived"), Detached: detached}
	}
	p := newProcess()
	err = p.Start(ctx)
	if detached && errors.Is(err, keepalived.ErrAlreadyRunning) {
		// A keepalived without a record (started by a hostagent that did not detach it): replace it once.
		if err := keepalived.StopStale(ctx, dir, a.log); err != nil {
			return "", err
		}
		p = newProcess()
		err = p.Start(ctx)
	}
	if err != nil {
		return "", fmt.Errorf("start keepalived: %w", err)
	}
	a.keep = &keepalivedSupervisor{proc: p, conf: conf}
	verb := "started"
	switch {
	case restarted:
		verb = "restarted"
	case p.Outcome() == "adopted":
		verb = "adopted the running" // a previous agent's: the VIP did not move
	case p.Outcome() != "" && p.Outcome() != "started":
		verb = p.Outcome() + " the running" // "adopted and reloaded"
	}
	return fmt.Sprintf("%s keepalived (pid %d), %s", verb, p.Pid(), desc), nil
}

// vipPreflight runs the VRRP pre-flight (pkg/vipcheck) for in in the agent's namespace before
// keepalived first claims the VIP: a foreign speaker on our VRID or another host answering for the VIP
// fails the step with the speaker and the field to change (the node report's detail).
func (a *Agent) vipPreflight(ctx context.Context, in keepalived.Instance) (time.Duration, error) {
	o := vipcheck.FromInstance(a.nsPath(), in)
	o.Log = a.log
	res, err := vipcheck.Run(ctx, o)
	a.log.Info("VRRP pre-flight", "vip", in.VIP.Addr(), "vrid", in.VirtualRouterID, "took", res.Took.Round(time.Millisecond),
		"window", res.Window, "peerAdverts", res.Adverts, "otherVRIDs", res.OtherVRIDs, "conflict", err != nil)
	if err != nil {
		return res.Took, fmt.Errorf("VRRP pre-flight refused to claim the API VIP %s: %w", in.VIP.Addr(), err)
	}
	return res.Took, nil
}
