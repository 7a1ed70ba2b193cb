package bootstrap

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/hostagent"
	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/netresolve"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
)

// AppliancePriority is the VRRP priority of the bootstrap host's instance: above every control
// plane whose API does not answer (ControlPlaneBasePriority and below) and below every control plane
// whose API answers (its priority plus hostagent.APIHealthWeight), so the VIP starts on the
// bootstrap host and moves to the control planes by itself as their API comes up.
const AppliancePriority = ControlPlaneBasePriority + hostagent.APIHealthWeight/2

// vipDirName is STATE/keepalived: the bootstrap host's keepalived config, pid files and the
// hand-off marker.
const (
	vipDirName    = "keepalived"
	handedOffName = "handed-off"
)

// runVIP holds the API VIP on the bootstrap host with keepalived until the control planes take it:
// once a control-plane node reports its API step done, the instance is stopped (SIGTERM: keepalived
// sends a priority-0 advertisement, so a control plane takes over at once) and the hand-off is
// recorded, so later runs of `appliance serve` leave the VRRP group alone. It returns when ctx ends
// (stopping keepalived) or after the hand-off.
func runVIP(ctx context.Context, cfg *config.BootstrapConfiguration, stateDir string, log *slog.Logger) error {
	if !cfg.APIServer.Keepalived.IsEnabled() || !cfg.APIServer.VIP.IsValid() {
		return nil
	}
	dir := filepath.Join(stateDir, vipDirName)
	if _, err := os.Stat(filepath.Join(dir, handedOffName)); err == nil {
		log.Info("VIP already handed off to the control planes")
		return nil
	}
	kc, err := applianceKeepalived(cfg, stateDir)
	if err != nil {
		return err
	}
	p := &keepalived.Process{Config: kc, Dir: dir, Log: log.With("component", "keepalived")}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := keepalived.StopStale(ctx, dir, log); err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return fmt.Errorf("start keepalived for the API VIP: %w", err)
	}
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Stop(sctx); err != nil && !errors.Is(err, keepalived.ErrNotStarted) {
			log.Warn("stop keepalived", "error", err)
		}
	}
	store := nodestate.Open(NodesDir(stateDir))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			stop()
			return nil
		case <-p.Done():
			log.Warn("keepalived exited; restarting", "error", p.Err())
			p = &keepalived.Process{Config: kc, Dir: dir, Log: p.Log}
			if err := p.Start(ctx); err != nil {
				return fmt.Errorf("restart keepalived for the API VIP: %w", err)
			}
		case <-tick.C:
			if node, ok := controlPlaneAPIUp(cfg, store); ok {
				log.Info("control plane API answers; leaving the VRRP group", "node", node)
				stop()
				_, err := atomicfile.Write(filepath.Join(dir, handedOffName), []byte(node+"\n"), 0o600)
				return err
			}
		}
	}
}

// controlPlaneAPIUp reports a control-plane node whose hostagent reported the API step done.
func controlPlaneAPIUp(cfg *config.BootstrapConfiguration, store *nodestate.Store) (string, bool) {
	for _, n := range cfg.ControlPlaneNodes() {
		s, err := store.Get(n.Name)
		if err != nil {
			continue
		}
		if r, ok := s.Steps[nodestate.StepAPI]; ok && r.Status == nodestate.StatusDone {
			return n.Name, true
		}
	}
	return "", false
}

// applianceKeepalived is the bootstrap host's VRRP instance: unicast from its control-plane address
// to every control plane, the cluster's VRID and auth, AppliancePriority.
func applianceKeepalived(cfg *config.BootstrapConfiguration, stateDir string) (keepalived.Config, error) {
	r, err := netresolve.New("")
	if err != nil {
		return keepalived.Config{}, err
	}
	defer r.Close()
	vip := cfg.APIServer.VIP
	cp, err := r.Resolve(cfg.Networks.ControlPlane.CIDRs, vip)
	if err != nil {
		return keepalived.Config{}, fmt.Errorf("networks.controlPlane.cidrs: %w", err)
	}
	var peers []netip.Addr
	for _, n := range cfg.ControlPlaneNodes() {
		for _, a := range n.Addresses {
			if cp.CIDR.Contains(a) {
				peers = append(peers, a)
				break
			}
		}
	}
	auth, _, err := vrrpAuth(cfg, stateDir, false)
	if err != nil {
		return keepalived.Config{}, err
	}
	return keepalived.Config{
		RouterID: "appliance",
		Instances: []keepalived.Instance{{
			Name:            hostagent.InstanceName,
			Interface:       cp.Interface,
			SourceIP:        cp.Prefix.Addr(),
			Peers:           peers,
			VIP:             netip.PrefixFrom(vip, cp.CIDR.Bits()),
			VirtualRouterID: cfg.APIServer.Keepalived.VirtualRouterID,
			Priority:        AppliancePriority,
			AuthPass:        auth,
		}},
	}, nil
}

// vrrpAuth returns the VRRP PASS secret shared by the VIP's speakers (RFC 2338 simple text auth,
// 1..8 bytes): the file apiServer.keepalived.authPasswordFile names, else STATE/pki/vrrp-auth. When
// create is true and that file is missing, it is created (0600) with 8 random URL-safe characters
// and created=true. An existing file of the wrong length is refused, never replaced: every node
// already holds the secret.
func vrrpAuth(cfg *config.BootstrapConfiguration, stateDir string, create bool) (secret string, created bool, err error) {
	if f := cfg.APIServer.Keepalived.AuthPasswordFile; f != "" {
		b, err := config.ReadSecretFile(f)
		if err != nil {
			return "", false, fmt.Errorf("apiServer.keepalived.authPasswordFile: %w", err)
		}
		return string(b), false, nil
	}
	path := filepath.Join(PKIDir(stateDir), "vrrp-auth")
	b, err := config.ReadSecretFile(path)
	switch {
	case err == nil && len(b) >= 1 && len(b) <= 8:
		return string(b), false, nil
	case err == nil:
		return "", false, fmt.Errorf("%s holds %d bytes, want 1 to 8 (VRRP PASS auth): restore it, or delete it and rerun bootstrap so that every node gets a new one", path, len(b))
	case !errors.Is(err, fs.ErrNotExist):
		return "", false, fmt.Errorf("VRRP auth secret: %w", err)
	case !create:
		return "", false, fmt.Errorf("VRRP auth secret %s is missing: run `appliance bootstrap`", path)
	}
	raw := make([]byte, 6)
	if _, err := rand.Read(raw); err != nil {
		return "", false, err
	}
	secret = base64.RawURLEncoding.EncodeToString(raw) // 8 characters
	if _, err := atomicfile.Write(path, []byte(secret+"\n"), 0o600); err != nil {
		return "", false, err
	}
	return secret, true, nil
}
