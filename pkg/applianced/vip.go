package applianced

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// handedOffName is the hand-off marker in statedir.Keepalived.
const handedOffName = "handed-off"

// runVIP holds the API VIP on the bootstrap host with keepalived until the control planes take it:
// once a control-plane node reports its API step done, the instance is stopped (SIGTERM: keepalived
// sends a priority-0 advertisement, so a control plane takes over at once) and the hand-off is
// recorded, so later runs of `appliance serve` leave the VRRP group alone. It returns when ctx ends
// (stopping keepalived) or after the hand-off.
func runVIP(ctx context.Context, cfg *config.BootstrapConfiguration, stateDir string, log *slog.Logger) error {
	kc, ok, err := ReadKeepalived(stateDir)
	if err != nil || !ok {
		return err
	}
	dir := statedir.Keepalived(stateDir)
	if _, err := os.Stat(filepath.Join(dir, handedOffName)); err == nil {
		log.Info("VIP already handed off to the control planes")
		return nil
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
	store := nodestate.Open(statedir.Nodes(stateDir))
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
