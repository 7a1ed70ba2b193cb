package applianced

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/server"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// Supervision of `appliance serve`: on a systemd host the unit appliance.service (systemd.go),
// elsewhere a detached process (own session, log STATE/serve/serve.log, PID STATE/serve/pid) that is
// stopped only after /proc confirms it is this state directory's server.

// Timing.
const (
	healthWait = 30 * time.Second
	stopWait   = 10 * time.Second
)

// StartOptions say how to start the server and how to know it is up.
type StartOptions struct {
	// Argv is the command: the appliance binary, "serve" and its flags (--state-dir included).
	Argv []string
	// StateDir is the server's state directory (its PID and log go to statedir.Serve).
	StateDir string
	// HealthURL is https://…/healthz as nodes reach it; Client trusts only the appliance CA.
	HealthURL string
	Client    *http.Client
	// Generation is what /healthz must report before Start returns.
	Generation string
}

// Started says what Start did.
type Started struct {
	PID int
	// Detail is for people: "started appliance.service", "stopped stale server (pid 12), started server".
	Detail string
}

// Start (re)starts the server and waits up to 30 s until /healthz reports opts.Generation: the
// systemd unit on a systemd host, else a detached process, replacing a stale one of the same state
// directory (SIGTERM, SIGKILL after 10 s). Errors say where the server's log is.
func Start(ctx context.Context, o StartOptions) (Started, error) {
	if systemdBooted() {
		// On a real host the services belong to systemd, which restarts them and starts them at boot.
		pid, _, err := startUnit(ctx, o.Argv)
		if err != nil {
			return Started{}, err
		}
		if _, err := waitHealthy(ctx, o.Client, o.HealthURL, o.Generation, nil, "journalctl -u "+ServeUnit); err != nil {
			return Started{}, err
		}
		return Started{PID: pid, Detail: "started " + ServeUnit}, nil
	}
	dir := statedir.Serve(o.StateDir)
	pidFile := filepath.Join(dir, "pid")
	detail := ""
	if pid, ok := ourServer(pidFile, o.StateDir); ok {
		if err := stopProcess(pid); err != nil {
			return Started{}, err
		}
		detail = fmt.Sprintf("stopped stale server (pid %d), ", pid)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Started{}, err
	}
	logf, err := os.OpenFile(filepath.Join(dir, "serve.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return Started{}, err
	}
	defer logf.Close()
	cmd := exec.Command(o.Argv[0], o.Argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none")
	if err := cmd.Start(); err != nil {
		return Started{}, fmt.Errorf("start appliance serve: %w", err)
	}
	pid := cmd.Process.Pid
	if _, err := atomicfile.Write(pidFile, []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		return Started{}, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	_, err = waitHealthy(ctx, o.Client, o.HealthURL, o.Generation, func() error {
		select {
		case err := <-exited:
			return fmt.Errorf("appliance serve exited (%v); last log lines:\n%s", err, tail(filepath.Join(dir, "serve.log"), 10))
		default:
			return nil
		}
	}, "log: "+filepath.Join(dir, "serve.log"))
	if err != nil {
		return Started{}, err
	}
	return Started{PID: pid, Detail: detail + "started server"}, nil
}

// waitHealthy polls /healthz until it answers with generation gen (for up to healthWait); dead, if
// not nil, reports a server that has already exited.
func waitHealthy(ctx context.Context, client *http.Client, url, gen string, dead func() error, where string) (server.Health, error) {
	h, err := backoff.Retry(ctx, func() (server.Health, error) {
		if dead != nil {
			if err := dead(); err != nil {
				return server.Health{}, backoff.Permanent(err)
			}
		}
		h, err := GetHealth(ctx, client, url)
		if err == nil && h.Generation != gen {
			err = fmt.Errorf("generation %s answers, want %s", h.Generation, gen)
		}
		return h, err
	}, backoff.WithBackOff(backoff.NewConstantBackOff(100*time.Millisecond)), backoff.WithMaxElapsedTime(healthWait))
	if err != nil {
		return h, fmt.Errorf("appliance serve is not healthy at %s: %w (%s)", url, err, where)
	}
	return h, nil
}

// GetHealth GETs url (…/healthz) and decodes server.Health; a non-200 answer is an error.
func GetHealth(ctx context.Context, c *http.Client, url string) (server.Health, error) {
	var h server.Health
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return h, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return h, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return h, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	err = json.NewDecoder(resp.Body).Decode(&h)
	return h, err
}

// ourServer reads the PID file and confirms the process is an `appliance serve` of this state
// directory (so a recycled PID is never signalled).
func ourServer(pidFile, stateDir string) (int, bool) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0, false
	}
	args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
	isServe, isOurs := false, false
	for i, a := range args {
		if string(a) == "serve" {
			isServe = true
		}
		if string(a) == "--state-dir" && i+1 < len(args) && string(args[i+1]) == stateDir {
			isOurs = true
		}
	}
	return pid, isServe && isOurs
}

// stopProcess sends SIGTERM, waits up to stopWait, then SIGKILL.
func stopProcess(pid int) error {
	p, _ := os.FindProcess(pid)
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return nil // already gone
	}
	deadline := time.Now().Add(stopWait)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = p.Signal(syscall.SIGKILL)
	for i := 0; i < 100 && alive(pid); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	if alive(pid) {
		return fmt.Errorf("appliance serve (pid %d) does not stop", pid)
	}
	return nil
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil { // gone (fs.ErrNotExist) or unreadable
		return false
	}
	// Field 3 (after "pid (comm) ") is the state; Z = zombie.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z'
	}
	return true
}

// Stop stops the `appliance serve` of stateDir: the systemd unit on a systemd host, else
// the detached process recorded in STATE/serve/pid (checked to be that state directory's server);
// then the keepalived that holds the API VIP for it, which outlives serve on purpose (runVIP).
func Stop(stateDir string) (bool, error) {
	stopped, err := stopServer(stateDir)
	if err != nil {
		return stopped, err
	}
	vip, err := stopVIP(stateDir)
	return stopped || vip, err
}

func stopServer(stateDir string) (bool, error) {
	if systemdBooted() {
		if stopped, err := stopUnit(context.Background()); stopped || err != nil {
			return stopped, err
		}
	}
	pid, ok := ourServer(filepath.Join(statedir.Serve(stateDir), "pid"), stateDir)
	if !ok {
		return false, nil
	}
	return true, stopProcess(pid)
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
