package applianced

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestSweepNodeRecords: a serve killed -9 mid-report leaves STATE/nodes/NODE/.status.json.tmp-PID-N
// (seen in the soak, test/bench/soak.sh); the next serve removes it at start, and leaves a live
// writer's temporary file and the records themselves alone. Before, only a bootstrap run swept.
func TestSweepNodeRecords(t *testing.T) {
	state := t.TempDir()
	dir := filepath.Join(statedir.Nodes(state), "n1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	dead := exec.Command("/bin/true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{ // name → kept
		fmt.Sprintf(".status.json.tmp-%d-123", dead.Process.Pid): false,
		fmt.Sprintf(".status.json.tmp-%d-456", os.Getpid()):      true,
		"status.json":  true,
		"events.jsonl": true,
	}
	for name := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("{}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sweepNodeRecords(state, slog.New(slog.DiscardHandler))
	for name, kept := range files {
		_, err := os.Stat(filepath.Join(dir, name))
		if kept && err != nil {
			t.Errorf("%s was removed: %v", name, err)
		}
		if !kept && err == nil {
			t.Errorf("%s (writer PID %d is dead) is still there", name, dead.Process.Pid)
		}
	}
}
