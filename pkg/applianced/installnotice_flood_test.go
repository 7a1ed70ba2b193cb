package applianced

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/pkg/power"
	"github.com/airgap-appliance/appliance/pkg/server"
)

// countingBMC stands in for a node's BMC (power.VirtualMediaBooter) and counts the sessions the
// appliance opens to it. ClearVirtualMediaBoot waits for gate (or its context); what that context
// said when the call ended is kept.
type countingBMC struct {
	open, maxOpen, sessions, clears, ejects atomic.Int32
	gate                                    chan struct{}
	mu                                      sync.Mutex
	clearEnded                              []error // ctx.Err() as each ClearVirtualMediaBoot returned
}

func (b *countingBMC) newVM(ctx context.Context, n config.Node) (power.VirtualMediaBooter, func(), error) {
	b.sessions.Add(1)
	o := b.open.Add(1)
	for m := b.maxOpen.Load(); o > m && !b.maxOpen.CompareAndSwap(m, o); m = b.maxOpen.Load() {
	}
	var once sync.Once
	return b, func() { once.Do(func() { b.open.Add(-1) }) }, nil
}

func (b *countingBMC) BootVirtualMedia(context.Context, power.VirtualMediaOptions) (power.VirtualMediaReport, error) {
	return power.VirtualMediaReport{}, nil
}

func (b *countingBMC) EjectVirtualMedia(context.Context) error { b.ejects.Add(1); return nil }

func (b *countingBMC) ClearVirtualMediaBoot(ctx context.Context) (bool, error) {
	b.clears.Add(1)
	select {
	case <-b.gate:
	case <-ctx.Done():
	case <-time.After(10 * time.Second): // a hang guard: a context that never ends
	}
	b.mu.Lock()
	b.clearEnded = append(b.clearEnded, ctx.Err())
	b.mu.Unlock()
	return true, ctx.Err()
}

// TestInstallNoticeFloodOneBMCSession is the attack of a node's live system (or anyone holding its
// token) sending its install notice over and over, against the real agent API over TLS with a
// virtual-media node whose BMC counts the sessions opened to it:
//   - 20 notices at once while the BMC is slow: one BMC session, the 19 others answered 429 at once
//     (before: 20 sessions at once, each on serve's context);
//   - a notice whose client goes away mid-call: the BMC call's context ends with the request
//     (before: serve's context, which the client cannot end);
//   - 10 notices in a row: each closes its BMC session before it answers and replaces the node's
//     eject watch, so once the installed system reports the CD is ejected once (before: each
//     notice left its session open in a watch of its own, and each watch ejected).
func TestInstallNoticeFloodOneBMCSession(t *testing.T) {
	dir := t.TempDir()
	v1 := config.Node{Name: "v1", Roles: []config.Role{config.RoleWorker}, MAC: "52:54:00:00:00:31",
		Power: config.Power{Kind: config.PowerRedfish, Address: "https://127.0.0.1:1", BootDevice: config.BootCDROM,
			VirtualMediaImage: "https://10.0.0.1:8443/boot/node.iso"}}
	cfg := &config.BootstrapConfiguration{Nodes: []config.Node{v1}}
	store := nodestate.Open(filepath.Join(dir, "nodes"))
	log := slog.New(slog.DiscardHandler)
	h := newInstallNotices(t.Context(), cfg, nil, store, log)
	bmc := &countingBMC{gate: make(chan struct{})}
	h.newVM = bmc.newVM
	agent := server.NewAgentAPI(filepath.Join(dir, "rendered"), map[string]string{"v1": "tok-v1"}, store, log)
	agent.Installed = h.note
	_, cert := pkitest.Issue(t)
	s, err := server.New(server.Options{Listen: "127.0.0.1:0", Certificate: cert, Agent: agent})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(s.Handler())
	ts.TLS = s.TLSConfig()
	ts.StartTLS()
	t.Cleanup(ts.Close)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the BMC sessions are what is tested
	defer hc.CloseIdleConnections()
	notice := func(ctx context.Context, boot string) (int, error) {
		body, _ := json.Marshal(agentapi.InstallNotice{BootID: boot})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+agentapi.InstalledPathV1, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok-v1")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}

	// 20 at once while the BMC is slow.
	var wg sync.WaitGroup
	codes := make(chan int, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _ := notice(context.Background(), "live-boot")
			codes <- code
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); len(codes) < 19 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if n := bmc.sessions.Load(); n != 1 {
		t.Errorf("%d BMC sessions for 20 notices at once, want 1", n)
	}
	close(bmc.gate)
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	if count[http.StatusNoContent] != 1 || count[http.StatusTooManyRequests] != 19 {
		t.Errorf("answers %v, want one 204 and 19 429", count)
	}

	// A client that goes away mid-call ends the BMC call.
	bmc.gate = make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := notice(ctx, "live-boot"); err == nil {
		t.Fatal("the notice was answered although the BMC call blocks")
	}
	var ended error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		bmc.mu.Lock()
		done := len(bmc.clearEnded) == 2
		if done {
			ended = bmc.clearEnded[1]
		}
		bmc.mu.Unlock()
		if done {
			break
		}
	}
	if ended == nil {
		t.Errorf("the BMC call of a notice whose client went away did not see its context end (%v)", ended)
	}
	close(bmc.gate)

	// Ten in a row: no session left open, one eject watch, one eject.
	for i := range 10 {
		if code, err := notice(context.Background(), "live-boot"); code != http.StatusNoContent {
			t.Fatalf("notice %d: %d %v", i, code, err)
		}
		if n := bmc.open.Load(); n != 0 {
			t.Fatalf("after notice %d, %d BMC sessions open", i, n)
		}
	}
	h.mu.Lock()
	watches := len(h.watches)
	h.mu.Unlock()
	if watches != 1 {
		t.Errorf("%d eject watches for one node, want 1", watches)
	}
	if _, _, err := store.Record("v1", nil, agentapi.Report{BootID: "disk-boot", Step: agentapi.StepConfig, Status: agentapi.StatusRunning, Time: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(4 * ejectPoll); bmc.ejects.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * ejectPoll) // any other watch would eject by now
	if n := bmc.ejects.Load(); n != 1 {
		t.Errorf("%d ejects after the installed system reported, want 1", n)
	}
	if n := bmc.maxOpen.Load(); n != 1 {
		t.Errorf("at most %d BMC sessions were open at once, want 1", n)
	}
}
