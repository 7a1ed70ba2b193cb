package hostagent

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/test/labns"
)

// TestAgentRestartKeepsDetachedKeepalived is what an upgrade does to a control plane's hostagent
// (`appliance bootstrap` with a new build: new binary, SIGTERM, a new agent process): with
// DetachKeepalived (as `hostagent run` sets it) the first agent's exit leaves keepalived running and
// the next agent adopts it, so the VIP never leaves the node. Real keepalived in a namespace; the VIP
// is sampled with netlink from the first agent's exit until the second one reported its keepalived
// step, and must be there in every sample; the keepalived PID must be the same. Without the option
// the first agent stops keepalived on exit and the VIP is gone (the restart moved the VIP).
func TestAgentRestartKeepsDetachedKeepalived(t *testing.T) {
	labns.RequireRoot(t)
	labns.RequireTool(t, "keepalived")
	curl := labns.RequireTool(t, "curl")
	ns, ifc := nodeNS(t, "10.76.0.2/24", "10.76.0.9/24")
	nc := cpNodeConfig("10.76.0", 44)
	nc.Keepalived.AdvertIntervalMS = 250
	vip := nc.APIServerVIP
	app := newAppliance(t, nc)
	root := t.TempDir()
	dir := filepath.Join(root, KeepalivedDir)
	t.Cleanup(func() { // runs after both agents stopped (cleanups run last-registered first)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := keepalived.StopDetached(ctx, dir); err != nil {
			t.Errorf("stop the detached keepalived: %v", err)
		}
	})
	cfg := app.config()
	cfg.Roles = []string{"control-plane"}
	opts := Options{Config: cfg, Root: root, NetNS: ns.Name, BootID: "b1",
		RetryInitial: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, Resync: time.Hour,
		TrackScript: []string{curl, "-sfk", "https://127.0.0.1:6443/readyz"}, DetachKeepalived: true}

	first := startAgent(t, opts)
	waitFor(t, "cp1 ready", func() bool { st, _ := app.store.Get("cp1"); return st.State == agentapi.StateReady })
	waitFor(t, "VIP on the node interface", func() bool { ok, _ := keepalived.Holds(ns.Path(), ifc, vip); return ok })
	pid := readPid(t, filepath.Join(dir, "keepalived.pid"))

	// Sample the VIP every 20 ms from before the first agent stops until the second one adopted.
	var samples, missing atomic.Int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(20 * time.Millisecond):
			}
			samples.Add(1)
			if ok, err := keepalived.Holds(ns.Path(), ifc, vip); err != nil || !ok {
				missing.Add(1)
			}
		}
	}()
	first.stop()
	if ok, _ := keepalived.Holds(ns.Path(), ifc, vip); !ok {
		t.Errorf("the VIP left the node when the agent exited")
	}
	startAgent(t, opts)
	waitFor(t, "the second agent's keepalived step", func() bool {
		st, _ := app.store.Get("cp1")
		return strings.HasPrefix(st.Steps[agentapi.StepKeepalived].Detail, "adopted")
	})
	close(stopSampling)
	<-sampled
	st, _ := app.store.Get("cp1")
	t.Logf("keepalived step of the second agent: %s", st.Steps[agentapi.StepKeepalived].Detail)
	if n := missing.Load(); n > 0 || samples.Load() == 0 {
		t.Errorf("VIP missing in %d of %d samples across the agent restart, want 0", n, samples.Load())
	}
	if p := readPid(t, filepath.Join(dir, "keepalived.pid")); p != pid {
		t.Errorf("keepalived pid %d after the restart, want the first agent's %d (adopted, not restarted)", p, pid)
	}
	waitFor(t, "cp1 ready again", func() bool { st, _ := app.store.Get("cp1"); return st.State == agentapi.StateReady })
}
