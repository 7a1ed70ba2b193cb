package keepalived

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// TestStopDetachedLeavesForeignProcesses: a record naming a live process that is not this directory's
// keepalived (a recycled PID, a keepalived of another directory) is neither adopted nor signalled.
func TestStopDetachedLeavesForeignProcesses(t *testing.T) {
	dir := t.TempDir()
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	p := &Process{Dir: dir, Detached: true}
	rec := `{"pid":` + strconv.Itoa(sleeper.Process.Pid) + `,"configSHA256":"x"}`
	if err := os.WriteFile(p.RecordPath(), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	stopped, err := StopDetached(context.Background(), dir)
	if err != nil || stopped {
		t.Fatalf("StopDetached = %v, %v; want false, nil for a process that is not keepalived", stopped, err)
	}
	if !alive(sleeper.Process.Pid) {
		t.Fatal("StopDetached signalled a process that is not keepalived")
	}
	// The same with a Start: nothing is adopted (Start would go on to start keepalived; check only adopt).
	q := &Process{Dir: dir, Detached: true, Config: Config{}}
	q.mu.Lock()
	ok, _ := q.adopt(context.Background())
	q.mu.Unlock()
	if ok {
		t.Fatal("adopted a process that is not keepalived")
	}
	if _, err := os.Stat(filepath.Join(dir, "running.json")); err != nil {
		t.Fatalf("the record was removed: %v", err)
	}
}
