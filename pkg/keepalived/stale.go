package keepalived

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StopStale stops the keepalived whose PID is in dir/keepalived.pid (left by a previous owner of
// dir, e.g. a hostagent or appliance serve that was killed) so a new Process can take over: SIGTERM,
// then SIGKILL after 5 s. A missing file, a dead PID or a PID that is not keepalived (/proc/PID/comm)
// is left alone.
func StopStale(ctx context.Context, dir string, log *slog.Logger) error {
	b, err := os.ReadFile(filepath.Join(dir, "keepalived.pid"))
	if err != nil {
		return nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return nil
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(comm)) != "keepalived" {
		return nil
	}
	log.Warn("stopping keepalived left by a previous run", "pid", pid)
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if syscall.Kill(pid, 0) != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill stale keepalived %d: %w", pid, err)
	}
	return nil
}
