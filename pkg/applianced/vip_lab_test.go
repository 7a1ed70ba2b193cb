package applianced

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/test/labns"
)

// holderEnv names the state directory when the test binary runs as TestHelperVIPHolder.
const holderEnv = "APPLIANCED_VIP_HOLDER_STATE"

// TestHelperVIPHolder is not a test: run by TestVIPSurvivesServeCrash as a child process inside a lab
// namespace, it is the VIP half of `appliance serve` (checkVIPClaim then runVIP, the real code, in Serve's order)
// until killed or SIGTERMed.
func TestHelperVIPHolder(t *testing.T) {
	state := os.Getenv(holderEnv)
	if state == "" {
		t.Skip("helper process for TestVIPSurvivesServeCrash")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// As Serve does it: the pre-flight before serving, then the holder that trusts it.
	if err := checkVIPClaim(ctx, state, log); err != nil {
		log.Error("runVIP", "error", err)
		os.Exit(1)
	}
	if err := runVIP(ctx, &config.BootstrapConfiguration{}, state, log, true); err != nil {
		log.Error("runVIP", "error", err)
		os.Exit(1)
	}
	log.Info("holder exits")
	os.Exit(0)
}

// holder is one run of TestHelperVIPHolder; lines carries its log lines.
type holder struct {
	cmd   *exec.Cmd
	lines chan string
}

func startHolder(t *testing.T, ns *labns.NS, state string) *holder {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns.Name, os.Args[0], "-test.run=^TestHelperVIPHolder$", "-test.v")
	cmd.Env = append(os.Environ(), holderEnv+"="+state)
	out, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holder{cmd: cmd, lines: make(chan string, 256)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			t.Logf("[holder %d] %s", cmd.Process.Pid, sc.Text())
			select {
			case h.lines <- sc.Text():
			default:
			}
		}
		close(h.lines)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return h
}

// waitFor waits for a log line containing any of subs; the limit is a hang guard, not a speed check.
func (h *holder) waitFor(t *testing.T, subs ...string) string {
	t.Helper()
	limit := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-h.lines:
			if !ok {
				t.Fatalf("holder exited before logging any of %q", subs)
			}
			for _, s := range subs {
				if strings.Contains(l, s) {
					return l
				}
			}
		case <-limit:
			t.Fatalf("holder did not log any of %q within 30 s", subs)
		}
	}
}

// vipSampler reads the VIP on the namespace's interface every 50 ms (netlink) and counts the samples
// without it.
type vipSampler struct {
	mu               sync.Mutex
	samples, without int
	stop, done       chan struct{}
}

func sampleVIP(t *testing.T, nsPath, iface string, vip netip.Addr) *vipSampler {
	s := &vipSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			held, err := keepalived.Holds(nsPath, iface, vip)
			if err != nil {
				t.Errorf("Holds: %v", err)
			}
			s.mu.Lock()
			s.samples++
			if !held {
				s.without++
			}
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-tk.C:
			}
		}
	}()
	return s
}

func (s *vipSampler) Stop() (samples, without int) {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples, s.without
}

func keepalivedPID(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "keepalived.pid"))
	if err != nil {
		t.Fatalf("keepalived pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestVIPSurvivesServeCrash (issue 16, class 4): the bootstrap host's VIP holder (runVIP, as in
// `appliance serve`) runs with a real keepalived in a lab namespace. kill -9 of the holder and a new
// holder's start must not take the VIP off the interface for a single 50 ms sample, and the new holder
// adopts the same keepalived (same PID). A graceful stop (as systemd's restart) leaves keepalived
// too; the next holder with a changed configuration reloads it (same PID, SIGHUP), and Stop (`appliance
// stop`) ends it and releases the VIP.
func TestVIPSurvivesServeCrash(t *testing.T) {
	labns.RequireRoot(t)
	labns.RequireTool(t, "keepalived")
	ns := labns.New(t, "vipc")
	// A veth pair inside the namespace (this kernel has no dummy links); the peer end stays silent.
	ns.MustRun("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
	ns.MustRun("ip", "addr", "add", "10.78.0.10/24", "dev", "eth0")
	ns.MustRun("ip", "link", "set", "eth1", "up")
	ns.MustRun("ip", "link", "set", "eth0", "up")
	vip := netip.MustParsePrefix("10.78.0.100/24")
	kc := keepalived.Config{RouterID: "bootstrap", Instances: []keepalived.Instance{{
		Name: "api-vip", Interface: "eth0", SourceIP: netip.MustParseAddr("10.78.0.10"),
		Peers: []netip.Addr{netip.MustParseAddr("10.78.0.11")}, VIP: vip, VirtualRouterID: 78, Priority: 150,
		AdvertInterval: 250 * time.Millisecond,
	}}}
	state := t.TempDir()
	writeKC := func(kc keepalived.Config) {
		b, err := json.Marshal(kc)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(statedir.Appliance(state), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(statedir.Appliance(state), statedir.KeepalivedFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeKC(kc)
	kdir := statedir.Keepalived(state)
	t.Cleanup(func() {
		// Whatever the outcome, no keepalived outlives the test (the namespace goes with it).
		if _, err := Stop(state); err != nil {
			t.Errorf("Stop: %v", err)
		}
		if b, err := os.ReadFile(filepath.Join(kdir, "keepalived.pid")); err == nil {
			if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 1 && keepalivedAlive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})

	h1 := startHolder(t, ns, state)
	h1.waitFor(t, "keepalived started")
	nsPath := "/run/netns/" + ns.Name
	limit := time.Now().Add(30 * time.Second) // hang guard for the first election
	for held, _ := keepalived.Holds(nsPath, "eth0", vip.Addr()); !held; held, _ = keepalived.Holds(nsPath, "eth0", vip.Addr()) {
		if time.Now().After(limit) {
			t.Fatal("the VIP never came up on the holder's interface")
		}
		time.Sleep(50 * time.Millisecond)
	}
	k1 := keepalivedPID(t, kdir)
	s := sampleVIP(t, nsPath, "eth0", vip.Addr())

	// kill -9 of serve, then the next serve.
	if err := h1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = h1.cmd.Wait()
	h2 := startHolder(t, ns, state)
	h2.waitFor(t, "keepalived started", "keepalived adopted")
	// Observe past keepalived's Master_Down_Interval (4×250 ms) twice over: a restarted keepalived
	// would have dropped the VIP in that window.
	time.Sleep(2 * time.Second)
	if k2 := keepalivedPID(t, kdir); k2 != k1 {
		t.Errorf("after kill -9 of the holder keepalived is PID %d, want the adopted %d", k2, k1)
	}

	// A graceful stop (systemd restart, the serve phase replacing a server) leaves keepalived too;
	// the next holder with a changed configuration reloads it in place.
	if err := h2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	h2.waitFor(t, "holder exits")
	_ = h2.cmd.Wait()
	kc.Instances[0].Priority = 140
	writeKC(kc)
	h3 := startHolder(t, ns, state)
	h3.waitFor(t, "keepalived started", "keepalived reloaded")
	time.Sleep(2 * time.Second)
	samples, without := s.Stop()
	t.Logf("%d samples over kill -9, restart, SIGTERM and a reloading restart; %d without the VIP", samples, without)
	if without != 0 {
		t.Errorf("%d of %d samples (50 ms apart) saw the VIP off the bootstrap host's interface, want 0", without, samples)
	}
	if k3 := keepalivedPID(t, kdir); k3 != k1 {
		t.Errorf("after the reloading restart keepalived is PID %d, want %d", k3, k1)
	}
	if conf, err := os.ReadFile(filepath.Join(kdir, "keepalived.conf")); err != nil || !strings.Contains(string(conf), "priority 140") {
		t.Errorf("keepalived.conf after the reload does not carry the new priority (%v)", err)
	}

	// appliance stop ends the holder and keepalived; the VIP is released.
	if err := h3.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = h3.cmd.Wait()
	if _, err := Stop(state); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if keepalivedAlive(k1) {
		t.Errorf("keepalived %d still runs after Stop", k1)
	}
	if held, err := keepalived.Holds(nsPath, "eth0", vip.Addr()); err != nil || held {
		t.Errorf("after Stop the VIP is still on the interface (held %v, err %v)", held, err)
	}
}

// keepalivedAlive: the process exists, is not a zombie, and is keepalived.
func keepalivedAlive(pid int) bool {
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return err == nil && strings.TrimSpace(string(comm)) == "keepalived" && alive(pid)
}
