package nodestate

import (
	"fmt"
	"testing"
	"time"
)

// TestNoteThrottle: a key passes once per Every (others independently), again after Every; past
// MaxKeys the keys are forgotten, so a remembered key passes once more.
func TestNoteThrottle(t *testing.T) {
	var th NoteThrottle
	t0 := time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC)
	steps := []struct {
		key  string
		at   time.Duration
		want bool
	}{
		{"n1\x00DHCP OFFER", 0, true},
		{"n1\x00DHCP OFFER", 30 * time.Second, false},
		{"n1\x00DHCP ACK", 30 * time.Second, true},
		{"n2\x00DHCP OFFER", 31 * time.Second, true},
		{"n1\x00DHCP OFFER", 59 * time.Second, false},
		{"n1\x00DHCP OFFER", 60 * time.Second, true},
		{"n1\x00DHCP OFFER", 61 * time.Second, false},
	}
	for i, s := range steps {
		if got := th.Allow(s.key, t0.Add(s.at)); got != s.want {
			t.Errorf("step %d: Allow(%q, +%s) = %v, want %v", i, s.key, s.at, got, s.want)
		}
	}
	small := NoteThrottle{Every: time.Hour, MaxKeys: 3}
	for i := range 3 {
		if !small.Allow(fmt.Sprint("k", i), t0) {
			t.Fatalf("k%d refused on its first note", i)
		}
	}
	if small.Allow("k0", t0) {
		t.Error("k0 passed twice within Every")
	}
	if !small.Allow("k3", t0) || !small.Allow("k0", t0) {
		t.Error("past MaxKeys the throttle did not forget its keys")
	}
}
