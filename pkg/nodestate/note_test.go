package nodestate

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// TestNote: a note appends an event carrying the node's state and reason and changes nothing of
// its record (state, reason, steps, Updated) nor rewrites status.json; a first note makes a record.
func TestNote(t *testing.T) {
	s := Open(t.TempDir())
	now := time.Date(2026, 11, 25, 6, 0, 0, 0, time.UTC)
	s.Now = func() time.Time { return now }
	before, err := s.Set("w1", agentapi.StateBooting, "powered on by its BMC")
	if err != nil {
		t.Fatal(err)
	}
	statusPath := filepath.Join(s.Dir(), "w1", StatusFile)
	fiBefore, err := os.Stat(statusPath)
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Minute)
	if err := s.Note("w1", "enrolled with key sha256:00"); err != nil {
		t.Fatal(err)
	}
	// status.json is not rewritten (an atomic rewrite renames a new file over it: another inode).
	if fiAfter, err := os.Stat(statusPath); err != nil || !os.SameFile(fiBefore, fiAfter) {
		t.Errorf("a note rewrote %s (%v)", statusPath, err)
	}
	after, err := s.Get("w1")
	if err != nil {
		t.Fatal(err)
	}
	if after.State != before.State || after.Reason != before.Reason || !after.Updated.Equal(before.Updated) {
		t.Errorf("record changed by a note: %+v → %+v", before, after)
	}
	evs, err := s.Events("w1")
	if err != nil || len(evs) != 2 {
		t.Fatalf("events %v %v, want 2", evs, err)
	}
	if ev := evs[1]; ev.Detail != "enrolled with key sha256:00" || ev.State != agentapi.StateBooting || ev.Step != "" || !ev.Time.Equal(now) {
		t.Errorf("note event %+v", ev)
	}
	// A note for a node with no record yet makes one, so status lists the node with it.
	if err := s.NoteContact("w2", ContactNetboot, "DHCP offer"); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Get("w2"); err != nil || st.Node != "w2" || !st.Updated.Equal(now) {
		t.Errorf("record made by a first note: %+v %v", st, err)
	}
	if evs, err := s.Events("w2"); err != nil || len(evs) != 1 || evs[0].Contact != ContactNetboot {
		t.Errorf("events of a first note: %+v %v", evs, err)
	}
	if err := s.Note("../x", "no"); err == nil {
		t.Error("a note for a node name that is not a plain file name was accepted")
	}
}
