package bootstrap

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
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
)

// servePhase makes sure `appliance serve` runs with the current generation and answers /healthz
// over HTTPS with the pinned CA at the address nodes will use. The server outlives this command:
// it runs detached (own session, log in STATE/serve/serve.log, PID in STATE/serve/pid). A server of
// another generation is stopped (SIGTERM, then SIGKILL after 10 s) and replaced.
type servePhase struct{}

func (servePhase) Name() string { return "serve" }

// Serve phase timing.
const (
	healthWait = 30 * time.Second
	stopWait   = 10 * time.Second
)

func (servePhase) Run(ctx context.Context, st *State) (Result, error) {
	gen, err := Generation(st.Options.ConfigPath, st.ServingCert, st.Tokens, st.Options.HostagentBinary)
	if err != nil {
		return Result{}, err
	}
	client := healthClient(st)
	healthURL := st.ApplianceURL + "/healthz"
	dir := st.path(serveDirName)
	pidFile := filepath.Join(dir, "pid")

	if h, err := getHealth(ctx, client, healthURL); err == nil && h.Generation == gen {
		st.ServePID = h.PID
		return Result{Detail: fmt.Sprintf("already serving %s (pid %d, generation %s)", st.ApplianceURL, h.PID, gen)}, nil
	}
	bin := st.Options.ApplianceBinary
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return Result{}, err
		}
	}
	cfgPath, _ := filepath.Abs(st.Options.ConfigPath)
	args := []string{"serve", "--config", cfgPath, "--state-dir", st.StateDir, "--generation", gen}
	if st.Options.HostagentBinary != "" {
		args = append(args, "--hostagent-binary", st.Options.HostagentBinary)
	}
	if systemdBooted() {
		// On a real host the services belong to systemd, which restarts them and starts them at boot.
		pid, _, err := startUnit(ctx, append([]string{bin}, args...))
		if err != nil {
			return Result{}, err
		}
		h, err := waitHealthy(ctx, client, healthURL, gen, nil, "journalctl -u "+ServeUnit)
		if err != nil {
			return Result{}, err
		}
		st.ServePID = h.PID
		return Result{Changed: true, Detail: fmt.Sprintf("started %s at %s (pid %d, generation %s)", ServeUnit, st.ApplianceURL, pid, gen)}, nil
	}
	detail := ""
	if pid, ok := ourServer(pidFile, st.StateDir); ok {
		if err := stopProcess(pid); err != nil {
			return Result{}, err
		}
		detail = fmt.Sprintf("stopped stale server (pid %d), ", pid)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Result{}, err
	}
	logf, err := os.OpenFile(filepath.Join(dir, "serve.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return Result{}, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none")
	if err := cmd.Start(); err != nil {
		return Result{}, fmt.Errorf("start appliance serve: %w", err)
	}
	pid := cmd.Process.Pid
	if _, err := atomicfile.Write(pidFile, []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		return Result{}, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	h, err := waitHealthy(ctx, client, healthURL, gen, func() error {
		select {
		case err := <-exited:
			return fmt.Errorf("appliance serve exited (%v); last log lines:\n%s", err, tail(filepath.Join(dir, "serve.log"), 10))
		default:
			return nil
		}
	}, "log: "+filepath.Join(dir, "serve.log"))
	if err != nil {
		return Result{}, err
	}
	st.ServePID = h.PID
	return Result{Changed: true, Detail: detail + fmt.Sprintf("started server at %s (pid %d, generation %s)", st.ApplianceURL, pid, gen)}, nil
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
		h, err := getHealth(ctx, client, url)
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

// healthClient trusts only the appliance CA (the pin nodes use) and uses no proxy.
func healthClient(st *State) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(st.CA.Cert)
	return &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			Proxy:             nil,
			TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			DisableKeepAlives: true,
		},
	}
}

func getHealth(ctx context.Context, c *http.Client, url string) (server.Health, error) {
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

// StopServer stops the `appliance serve` of stateDir: the systemd unit on a systemd host, else
// the detached process recorded in STATE/serve/pid (checked to be that state directory's server).
func StopServer(stateDir string) (bool, error) {
	if systemdBooted() {
		if stopped, err := stopUnit(context.Background()); stopped || err != nil {
			return stopped, err
		}
	}
	pid, ok := ourServer(filepath.Join(stateDir, serveDirName, "pid"), stateDir)
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
