package keepalived

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// record is RecordPath's content: which keepalived a Detached Process started and what it runs.
type record struct {
	PID int `json:"pid"`
	// ConfigSHA256 is the hex SHA-256 of the rendered configuration keepalived was started or last
	// reloaded with.
	ConfigSHA256 string `json:"configSHA256"`
}

// RecordPath is DIR/running.json (0600): the PID of the keepalived a Detached Process started and the
// SHA-256 of the configuration it runs, written right after the start (before keepalived writes its
// own pid file) and after every reload; removed by Stop.
func (p *Process) RecordPath() string { return filepath.Join(p.Dir, "running.json") }

// LogPath is DIR/keepalived.log (0600, appended): a Detached keepalived's console output.
func (p *Process) LogPath() string { return filepath.Join(p.Dir, "keepalived.log") }

func configHash(c Config) (string, error) {
	conf, err := Render(c)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(conf)
	return hex.EncodeToString(sum[:]), nil
}

func (p *Process) writeRecord(c Config) error {
	h, err := configHash(c)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(record{PID: p.pid, ConfigSHA256: h})
	if _, err := atomicfile.Write(p.RecordPath(), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("record the running keepalived: %w", err)
	}
	return nil
}

func (p *Process) removeRecord() {
	if p.Detached {
		_ = os.Remove(p.RecordPath())
	}
}

// adopt takes over the live keepalived RecordPath names, if it is keepalived running this Dir's
// ConfigPath (/proc/PID/comm and cmdline, checked after a pidfd pinned the process, so a recycled PID
// is never taken). The caller holds p.mu. ok=false (no error) when there is nothing to adopt.
func (p *Process) adopt(ctx context.Context) (bool, error) {
	rec, ok, err := p.readRecord()
	if !ok || err != nil {
		return false, err
	}
	want, err := configHash(p.Config)
	if err != nil {
		return true, err
	}
	if want == rec.ConfigSHA256 {
		p.log().Info("keepalived adopted", "pid", p.pid, "netns", p.NetNS, "config", p.ConfigPath())
		return true, nil
	}
	if err := p.reload(ctx, p.Config); err != nil {
		return true, fmt.Errorf("reload the adopted keepalived (pid %d): %w", p.pid, err)
	}
	p.outcome = "adopted and reloaded"
	return true, nil
}

// isOurs reports whether pid is keepalived running this Dir's configuration file.
func (p *Process) isOurs(pid int) bool {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(comm)) != "keepalived" {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
	for i, a := range args {
		if string(a) == "-f" && i+1 < len(args) && string(args[i+1]) == p.ConfigPath() {
			return true
		}
	}
	return false
}

// watchPidfd returns a channel closed when the process behind the pidfd exits (pidfd_open(2): the
// descriptor polls readable then, also for a process that is not our child). It closes fd.
func watchPidfd(fd int) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}()
	return done
}

// StopDetached stops the Detached keepalived recorded in dir (RecordPath), if it is alive and is
// keepalived running dir's configuration: SIGTERM (a priority-0 advertisement hands the VIP to a
// backup at once), SIGKILL of its process group when ctx ends first. It reports whether one was
// running. Errors: an unreadable record.
func StopDetached(ctx context.Context, dir string) (bool, error) {
	p := &Process{Dir: dir, Detached: true}
	p.mu.Lock()
	ok, err := p.adoptAny()
	p.mu.Unlock()
	if !ok || err != nil {
		return false, err
	}
	return true, p.Stop(ctx)
}

// adoptAny is adopt without comparing configurations (for StopDetached).
func (p *Process) adoptAny() (bool, error) {
	_, ok, err := p.readRecord()
	return ok, err
}

// readRecord reads RecordPath and, when it names a live keepalived running this Dir's configuration,
// pins it (pidfd_open(2), checked in /proc after pinning so a recycled PID is never taken) and sets
// p.pid and p.done. ok=false without error when there is no such process. The caller holds p.mu.
func (p *Process) readRecord() (record, bool, error) {
	var rec record
	b, err := os.ReadFile(p.RecordPath())
	if errors.Is(err, fs.ErrNotExist) {
		return rec, false, nil
	} else if err != nil {
		return rec, false, fmt.Errorf("read %s: %w", p.RecordPath(), err)
	}
	if json.Unmarshal(b, &rec) != nil || rec.PID <= 1 {
		p.log().Warn("ignoring an unreadable keepalived record", "path", p.RecordPath())
		return rec, false, nil
	}
	fd, err := unix.PidfdOpen(rec.PID, 0)
	if err != nil { // ESRCH: gone
		return rec, false, nil
	}
	if !alive(rec.PID) || !p.isOurs(rec.PID) {
		_ = unix.Close(fd)
		return rec, false, nil
	}
	p.pid, p.done, p.outcome = rec.PID, watchPidfd(fd), "adopted"
	return rec, true, nil
}
