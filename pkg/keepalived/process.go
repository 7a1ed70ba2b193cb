package keepalived

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// Sentinel errors of Process.
var (
	// ErrNotStarted is returned by Reload and Kill before Start.
	ErrNotStarted = errors.New("keepalived process not started")
	// ErrAlreadyStarted is returned by Start on a Process that was already started.
	ErrAlreadyStarted = errors.New("keepalived process already started")
	// ErrAlreadyRunning is returned by Start when a live keepalived (e.g. from a previous run of the
	// caller) still owns a pid file in Dir.
	ErrAlreadyRunning = errors.New("a keepalived from a previous run still uses this directory")
)

// DefaultBinary is the keepalived program looked up on PATH, then in /usr/sbin and /sbin.
const DefaultBinary = "keepalived"

// netnsDir is where iproute2 (`ip netns add NAME`) bind-mounts named network namespaces.
const netnsDir = "/run/netns"

// Check validates conf with the real binary (`keepalived -t -f FILE`, rc 0 valid) in the current
// network namespace: interfaces named in conf must exist there. See CheckIn.
func Check(ctx context.Context, conf []byte) error { return CheckIn(ctx, "", conf) }

// CheckIn is Check inside the named network namespace (`ip netns exec NETNS keepalived -t ...`); ""
// means the current one. conf is written to a private temporary file (0600 in a 0700 directory,
// removed afterwards), never logged.
//
// Errors: keepalived's rejection (rc 5, or any other non-zero status) wraps ErrInvalidConfig and carries
// its output, e.g. "(api-vip) VRRP version 3 does not support authentication"; a missing binary, a
// missing namespace, or ctx ending are returned as they are.
//
// keepalived 2.2.7 kills itself with SIGTERM in config-test mode whenever script_user names a user other
// than root (acassen/keepalived#2617, fixed upstream by #2182 in 2.2.8). CheckIn recognises that death,
// checks that the user exists on this host (os/user), and re-runs the test with `script_user root`, so
// everything else in conf is still validated by keepalived itself.
func CheckIn(ctx context.Context, netnsName string, conf []byte) error {
	bin, err := binary("")
	if err != nil {
		return err
	}
	err = checkOnce(ctx, bin, netnsName, conf)
	var bug *selfTerminated
	if !errors.As(err, &bug) {
		return err
	}
	m := scriptUserRe.FindSubmatch(conf)
	if m == nil {
		return fmt.Errorf("%w: keepalived -t died of SIGTERM without a script_user line to blame", ErrInvalidConfig)
	}
	if _, err := user.Lookup(string(m[2])); err != nil {
		return fmt.Errorf("%w: script_user %q: %w (create the user or pick another)", ErrInvalidConfig, m[2], err)
	}
	return checkOnce(ctx, bin, netnsName, scriptUserRe.ReplaceAll(conf, []byte("${1}root")))
}

var scriptUserRe = regexp.MustCompile(`(?m)^(\s*script_user\s+)(\S+)`)

type selfTerminated struct{ out string }

func (e *selfTerminated) Error() string {
	return "keepalived -t terminated itself with SIGTERM: " + e.out
}

func checkOnce(ctx context.Context, bin, netnsName string, conf []byte) error {
	dir, err := os.MkdirTemp("", "keepalived-check-")
	if err != nil {
		return fmt.Errorf("create a temporary directory for keepalived -t: %w", err)
	}
	defer os.RemoveAll(dir)
	f := filepath.Join(dir, "keepalived.conf")
	if err := os.WriteFile(f, conf, 0o600); err != nil {
		return fmt.Errorf("write %s for keepalived -t: %w", f, err)
	}
	args := argv(netnsName, bin, "-t", "-f", f)
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("keepalived -t: %w", ctx.Err())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return fmt.Errorf("run %s -t: %w", bin, err)
	}
	text := string(bytes.TrimSpace(out))
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
		return &selfTerminated{out: text}
	}
	if netnsName != "" && ee.ExitCode() == 255 && bytes.Contains(out, []byte("Cannot open network namespace")) {
		return fmt.Errorf("ip netns exec %s: %s", netnsName, text)
	}
	return fmt.Errorf("%w: keepalived -t exited %d: %s", ErrInvalidConfig, ee.ExitCode(), text)
}

// argv prefixes args with `ip netns exec NAME` when netnsName is set. ip execs the program after
// setns, so the started PID is keepalived's own.
func argv(netnsName string, args ...string) []string {
	if netnsName == "" {
		return args
	}
	return append([]string{"ip", "netns", "exec", netnsName}, args...)
}

func binary(b string) (string, error) {
	if b == "" {
		b = DefaultBinary
	}
	if filepath.IsAbs(b) {
		return b, nil
	}
	if p, err := exec.LookPath(b); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		if p := filepath.Join(d, b); isExec(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("find %q on PATH, /usr/sbin or /sbin: %w (install the keepalived package)", b, exec.ErrNotFound)
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// Process is one keepalived run without systemd: `keepalived --vrrp -f DIR/keepalived.conf
// -p DIR/keepalived.pid -r DIR/vrrp.pid -c DIR/checkers.pid --dont-fork --log-console`, optionally
// inside a named network namespace. keepalived runs in a process group of its own (its parent and VRRP
// child); its console output goes to Log, one record per line. The Process does not kill keepalived
// when the caller exits: call Stop.
//
// Set the fields before Start; a Process is started at most once.
type Process struct {
	// Config is rendered to DIR/keepalived.conf (0600) by Start.
	Config Config
	// Dir holds the config and pid files; created 0700 if missing. One Dir per keepalived.
	Dir string
	// NetNS is the name of the network namespace to run in (`ip netns exec NAME`, i.e.
	// /run/netns/NAME); "" means the current one.
	NetNS string
	// Binary is the keepalived program; "" means DefaultBinary.
	Binary string
	// Log receives keepalived's output ("keepalived output", attribute line) and lifecycle records;
	// nil discards. keepalived does not print auth_pass unless asked to dump its config, which Process
	// never does. A Detached keepalived's own output goes to its log file instead (LogPath).
	Log *slog.Logger
	// Detached makes keepalived independent of the caller, so that a crash of the caller (kill -9)
	// never moves the VIP: keepalived runs in a session of its own, writes its output to LogPath, and
	// is recorded in RecordPath; Start adopts a live keepalived of this Dir instead of starting another
	// (see Start). Stop, and only Stop, ends it.
	Detached bool

	mu      sync.Mutex
	cmd     *exec.Cmd // nil for an adopted keepalived (not our child)
	pid     int
	outcome string
	done    chan struct{}
	waitErr error
}

func (p *Process) log() *slog.Logger {
	if p.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Log
}

// NSPath is the namespace path for netlink (Holds, Cleanup): /run/netns/NAME, or "" for the current one.
func (p *Process) NSPath() string {
	if p.NetNS == "" {
		return ""
	}
	return filepath.Join(netnsDir, p.NetNS)
}

// ConfigPath is where Start and Reload write the rendered configuration.
func (p *Process) ConfigPath() string { return filepath.Join(p.Dir, "keepalived.conf") }

// Start renders and checks Config (CheckIn, in NetNS), writes it, removes VIPs a killed predecessor
// left on the interfaces (keepalived does not clean them up after SIGKILL), and starts keepalived. ctx
// bounds only the check; the process lives until Stop or Kill. Use Done to learn of an early exit
// (e.g. another keepalived already owns the pid files).
//
// With Detached, Start first looks for the keepalived a previous owner of Dir started (RecordPath:
// its PID, confirmed in /proc to be keepalived running DIR/keepalived.conf, and the SHA-256 of the
// configuration it runs). A live one is adopted, not restarted, so the VIP it holds never moves: left
// alone when its configuration is the rendered Config, else sent the new one (written, then SIGHUP,
// as Reload). Outcome says which happened.
//
// Errors: ErrAlreadyStarted; validation or keepalived -t errors (wrap ErrInvalidConfig); file, netlink
// or exec errors.
func (p *Process) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pid != 0 {
		return ErrAlreadyStarted
	}
	bin, err := binary(p.Binary)
	if err != nil {
		return err
	}
	if p.Detached {
		if ok, err := p.adopt(ctx); ok || err != nil {
			return err
		}
	}
	if err := p.writeConfig(ctx, p.Config); err != nil {
		return err
	}
	if err := p.clearPidFiles(); err != nil {
		return err
	}
	if err := p.cleanup(p.Config); err != nil {
		return err
	}
	args := argv(p.NetNS, bin, "--vrrp", "-f", p.ConfigPath(),
		"-p", filepath.Join(p.Dir, "keepalived.pid"),
		"-r", filepath.Join(p.Dir, "vrrp.pid"),
		"-c", filepath.Join(p.Dir, "checkers.pid"),
		"--dont-fork", "--log-console")
	cmd := exec.Command(args[0], args[1:]...)
	lw := &lineLogger{log: p.log(), netns: p.NetNS}
	cmd.Stdout, cmd.Stderr = lw, lw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var logf *os.File
	if p.Detached {
		// Own session (so no signal to the caller's session or process group reaches it) and a log
		// file instead of a pipe (a pipe would break when the caller dies).
		if logf, err = os.OpenFile(p.LogPath(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600); err != nil {
			return fmt.Errorf("open keepalived log: %w", err)
		}
		defer logf.Close()
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	p.cmd, p.pid, p.done, p.outcome = cmd, cmd.Process.Pid, make(chan struct{}), "started"
	go func() {
		err := cmd.Wait()
		lw.flush()
		p.waitErr = err
		close(p.done)
	}()
	if p.Detached {
		if err := p.writeRecord(p.Config); err != nil {
			_ = syscall.Kill(-p.pid, syscall.SIGKILL)
			<-p.done
			return err
		}
	}
	p.log().Info("keepalived started", "pid", p.pid, "netns", p.NetNS, "config", p.ConfigPath(), "detached", p.Detached)
	return nil
}

var pidFiles = []string{"keepalived.pid", "vrrp.pid", "checkers.pid"}

// clearPidFiles removes pid files in Dir whose process is gone or a zombie. After a SIGKILL the VRRP
// child is reparented and, where PID 1 does not reap (containers, this lab), stays a zombie that
// keepalived takes for a live daemon ("daemon is already running"). A live process is ErrAlreadyRunning.
func (p *Process) clearPidFiles() error {
	for _, name := range pidFiles {
		f := filepath.Join(p.Dir, name)
		b, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read keepalived pid file: %w", err)
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 && alive(pid) {
			return fmt.Errorf("%w: PID %d (%s); stop it first", ErrAlreadyRunning, pid, f)
		}
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove stale keepalived pid file: %w", err)
		}
	}
	return nil
}

// alive reports whether pid exists and is not a zombie (/proc/PID/stat state field, proc(5)).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')') // the command name may hold spaces and parentheses
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] != 'Z' && b[i+2] != 'X'
}

func (p *Process) writeConfig(ctx context.Context, c Config) error {
	conf, err := Render(c)
	if err != nil {
		return err
	}
	if err := CheckIn(ctx, p.NetNS, conf); err != nil {
		return err
	}
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return fmt.Errorf("create keepalived directory: %w", err)
	}
	if _, err := atomicfile.Write(p.ConfigPath(), conf, 0o600); err != nil {
		return fmt.Errorf("write keepalived config: %w", err)
	}
	return nil
}

// Pid is keepalived's parent PID (also its process group ID), or 0 before Start.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// Outcome says what Start did, for people: "started", "adopted" (a Detached keepalived of Dir was
// running with this configuration) or "adopted and reloaded"; "" before Start.
func (p *Process) Outcome() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.outcome
}

// Done is closed when keepalived has exited (nil before Start); Err then tells how.
func (p *Process) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Err is keepalived's exit error after Done is closed (nil for a clean exit, e.g. after SIGTERM; always
// nil for an adopted keepalived, whose exit status goes to its parent).
func (p *Process) Err() error {
	select {
	case <-p.Done():
		return p.waitErr
	default:
		return nil
	}
}

// Reload renders and checks c, writes it and sends SIGHUP: keepalived re-reads its config without
// dropping a VIP it holds, unless c changes that instance. On a render or check error nothing changes
// and the running config stays. Errors: ErrNotStarted; the exited process (os.ErrProcessDone);
// validation errors (wrap ErrInvalidConfig).
func (p *Process) Reload(ctx context.Context, c Config) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pid == 0 {
		return ErrNotStarted
	}
	return p.reload(ctx, c)
}

func (p *Process) reload(ctx context.Context, c Config) error {
	select {
	case <-p.done:
		return fmt.Errorf("signal keepalived %d to reload: %w", p.pid, os.ErrProcessDone)
	default:
	}
	if err := p.writeConfig(ctx, c); err != nil {
		return err
	}
	p.Config = c
	if err := syscall.Kill(p.pid, syscall.SIGHUP); err != nil {
		return fmt.Errorf("signal keepalived %d to reload: %w", p.pid, err)
	}
	if p.Detached {
		if err := p.writeRecord(c); err != nil {
			return err
		}
	}
	p.log().Info("keepalived reloaded", "pid", p.pid)
	return nil
}

// Stop sends SIGTERM (keepalived then advertises priority 0, RFC 5798 §6.4.3, so a backup takes over
// at once, and removes its VIPs) and waits for the exit. If ctx ends first it SIGKILLs the process group,
// waits, and removes the VIPs itself (Cleanup). Stopping a Process that was never started or has
// exited is not an error. Errors: Cleanup failures.
func (p *Process) Stop(ctx context.Context) error {
	p.mu.Lock()
	pid, done := p.pid, p.done
	p.mu.Unlock()
	if pid == 0 {
		return nil
	}
	select {
	case <-done:
		p.removeRecord()
		return nil
	default:
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-done:
		p.log().Info("keepalived stopped", "pid", pid)
		p.removeRecord()
		return nil
	case <-ctx.Done():
	}
	p.log().Warn("keepalived ignored SIGTERM; killing it", "pid", pid)
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-done
	p.removeRecord()
	return p.Cleanup()
}

// Kill SIGKILLs keepalived's process group (parent and VRRP child) and waits for the parent: a crash,
// with no priority-0 advertisement, so backups take over only after Master_Down_Interval. The VIP stays
// on the interface, as after a real crash; call Cleanup to remove it. Errors: ErrNotStarted.
func (p *Process) Kill() error {
	p.mu.Lock()
	pid, done := p.pid, p.done
	p.mu.Unlock()
	if pid == 0 {
		return ErrNotStarted
	}
	select {
	case <-done:
		return nil
	default:
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill keepalived process group %d: %w", pid, err)
	}
	<-done
	return nil
}

// Cleanup removes every instance VIP of Config from its interface in NetNS: what a killed keepalived
// leaves behind. Call it only while this keepalived is not running. Errors: netlink failures.
func (p *Process) Cleanup() error {
	p.mu.Lock()
	c := p.Config
	p.mu.Unlock()
	return p.cleanup(c)
}

func (p *Process) cleanup(c Config) error {
	var errs []error
	for _, in := range c.Instances {
		removed, err := Cleanup(p.NSPath(), in.Interface, in.VIP)
		if err != nil {
			errs = append(errs, err)
		} else if removed {
			p.log().Info("removed stale VIP", "netns", p.NetNS, "interface", in.Interface, "vip", in.VIP)
		}
	}
	return errors.Join(errs...)
}

// handleAt opens a netlink handle bound to the namespace at nsPath ("" = current); the calling thread's
// namespace is never switched.
func handleAt(nsPath string) (*netlink.Handle, func(), error) {
	if nsPath == "" {
		h, err := netlink.NewHandle()
		if err != nil {
			return nil, nil, fmt.Errorf("open netlink: %w", err)
		}
		return h, h.Close, nil
	}
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, nil, fmt.Errorf("open network namespace %s (does it exist?): %w", nsPath, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		_ = ns.Close()
		return nil, nil, fmt.Errorf("open netlink in %s: %w", nsPath, err)
	}
	return h, func() { h.Close(); _ = ns.Close() }, nil
}

// addrs lists iface's addresses, retrying an interrupted dump.
func addrs(h *netlink.Handle, nsPath, iface string) ([]netlink.Addr, netlink.Link, error) {
	link, err := h.LinkByName(iface)
	if err != nil {
		return nil, nil, fmt.Errorf("interface %q in netns %q: %w", iface, nsPath, err)
	}
	for range 5 {
		as, err := h.AddrList(link, netlink.FAMILY_ALL)
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("list addresses of %q in netns %q: %w", iface, nsPath, err)
		}
		return as, link, nil
	}
	return nil, nil, fmt.Errorf("list addresses of %q in netns %q: %w", iface, nsPath, netlink.ErrDumpInterrupted)
}

// Holds reports whether interface iface in the network namespace at nsPath (e.g. /run/netns/node1; ""
// for the current one) carries vip, by netlink. Errors: missing namespace or interface, netlink failures.
func Holds(nsPath, iface string, vip netip.Addr) (bool, error) {
	h, done, err := handleAt(nsPath)
	if err != nil {
		return false, err
	}
	defer done()
	as, _, err := addrs(h, nsPath, iface)
	if err != nil {
		return false, err
	}
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == vip.Unmap() {
			return true, nil
		}
	}
	return false, nil
}

// Cleanup removes vip (any prefix length) from iface in the namespace at nsPath ("" = current) and
// reports whether it was there. Use it after keepalived was SIGKILLed, which leaves its VIPs behind.
// Errors: missing namespace or interface, netlink failures.
func Cleanup(nsPath, iface string, vip netip.Prefix) (removed bool, err error) {
	h, done, err := handleAt(nsPath)
	if err != nil {
		return false, err
	}
	defer done()
	as, link, err := addrs(h, nsPath, iface)
	if err != nil {
		return false, err
	}
	for _, a := range as {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.Unmap() != vip.Addr().Unmap() {
			continue
		}
		del := a
		if err := h.AddrDel(link, &del); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return removed, fmt.Errorf("remove %s from %q in netns %q: %w", a.IPNet, iface, nsPath, err)
		}
		removed = true
	}
	return removed, nil
}

// lineLogger turns keepalived's console output into one log record per line.
type lineLogger struct {
	log   *slog.Logger
	netns string
	mu    sync.Mutex
	buf   []byte
}

var _ io.Writer = (*lineLogger)(nil)

func (l *lineLogger) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, b...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.emit(l.buf[:i])
		l.buf = l.buf[i+1:]
	}
	return len(b), nil
}

func (l *lineLogger) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.emit(l.buf)
		l.buf = nil
	}
}

func (l *lineLogger) emit(line []byte) {
	if line = bytes.TrimSpace(line); len(line) > 0 {
		l.log.Info("keepalived output", "netns", l.netns, "line", string(line))
	}
}
