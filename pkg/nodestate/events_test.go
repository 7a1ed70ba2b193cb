package nodestate

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// TestEventsTornLine is the attack of a crash (or a kill -9) in the middle of an append: the
// events file ends in half a line. Events reads every complete line without an error, and the next
// report is recorded after the complete lines, readable: the torn remainder is cut off first, never
// glued onto it (before: the torn line was an error, the next append glued onto it, and that
// report and every later one were unreadable, so the enrolment window and the converge phase lost
// the node's power-on).
func TestEventsTornLine(t *testing.T) {
	s := Open(t.TempDir())
	if _, err := s.Set("w1", agentapi.StatePowering, ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Record("w1", nil, rep("b1", agentapi.StepConfig, agentapi.StatusRunning, "")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(s.Dir(), "w1", EventsFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"time":"2026-11-25T06:00:00Z","node":"w1","step":"con`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	evs, err := s.Events("w1")
	if err != nil || len(evs) != 2 {
		t.Fatalf("Events with a torn last line: %d events, %v; want the 2 complete ones and no error", len(evs), err)
	}
	if _, _, err := s.Record("w1", nil, rep("b1", agentapi.StepConfig, agentapi.StatusDone, "")); err != nil {
		t.Fatal(err)
	}
	evs, err = s.Events("w1")
	if err != nil || len(evs) != 3 || evs[2].Step != agentapi.StepConfig || evs[2].Status != agentapi.StatusDone {
		t.Fatalf("after the next report: %+v, %v; want 3 events, the last config done", evs, err)
	}
	b, _ := os.ReadFile(path)
	if strings.Contains(string(b), `"step":"con{`) || strings.Count(string(b), "\n") != 3 {
		t.Fatalf("the torn line was not cut before the append:\n%s", b)
	}

	// A corrupt line in the middle (an old file, written before the cut) hides nothing after it.
	if err := os.WriteFile(path, append([]byte(`{"node":"w1","state":"powering"}`+"\n"+`not json`+"\n"), b...), 0o600); err != nil {
		t.Fatal(err)
	}
	evs, err = s.Events("w1")
	if len(evs) != 4 || err == nil || !strings.Contains(err.Error(), "line(s) 2") {
		t.Fatalf("a corrupt middle line: %d events, %v; want 4 and an error naming line 2", len(evs), err)
	}
}

// TestEventsCapped is the attack of a node (or anyone holding its token) that reports without end:
// each report differs, so each is a new event of up to 64 KiB. The node's events stay within two
// files of EventsMaxBytes (the current one and events.jsonl.1), every append is readable, and
// Events returns the newest ones in order.
func TestEventsCapped(t *testing.T) {
	s := Open(t.TempDir())
	detail := strings.Repeat("x", 60<<10)
	n := 3*EventsMaxBytes/len(detail) + 5 // three caps' worth
	for i := range n {
		if _, _, err := s.Record("w1", nil, rep("b1", agentapi.StepConfig, agentapi.StatusRunning, fmt.Sprintf("%d %s", i, detail))); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(s.Dir(), "w1")
	var total int64
	for _, name := range []string{EventsFile, EventsRotatedFile} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if fi.Size() > EventsMaxBytes || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %d bytes, mode %v; want at most %d, 0600", name, fi.Size(), fi.Mode().Perm(), EventsMaxBytes)
		}
		total += fi.Size()
	}
	if ents, _ := os.ReadDir(dir); len(ents) > 5 { // status.json, .lock, history.jsonl? and the two event files
		t.Errorf("files in the node's directory: %v", ents)
	}
	evs, err := s.Events("w1")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) < EventsMaxBytes/len(detail) || int64(len(evs))*int64(len(detail)) > total {
		t.Fatalf("%d events read from %d bytes", len(evs), total)
	}
	for i, ev := range evs {
		want := fmt.Sprintf("%d ", n-len(evs)+i)
		if !strings.HasPrefix(ev.Detail, want) {
			t.Fatalf("event %d of %d: detail %.20q, want it to start %q (the newest, in order)", i, len(evs), ev.Detail, want)
		}
	}
}
