package nodestate

import (
	"sync"
	"time"
)

// DefaultNoteEvery is how often a NoteThrottle with no Every passes the same key: the same contact
// or refusal of the same node is noted at most once a minute.
const DefaultNoteEvery = time.Minute

// DefaultNoteKeys bounds a NoteThrottle with no MaxKeys.
const DefaultNoteKeys = 4096

// NoteThrottle passes a key (a node and what happened to it) at most once per Every, so that a
// machine retrying in a loop (DHCP, a refused enrolment), or anyone who knows a node's MAC, cannot
// grow the node's events.jsonl without bound: the first note of a key goes through, repeats within
// Every do not. It remembers at most MaxKeys keys and forgets them all when that is reached (each key
// then costs at most one extra note). The zero value is ready to use; safe for concurrent use.
type NoteThrottle struct {
	// Every is the least time between two notes of one key; 0: DefaultNoteEvery.
	Every time.Duration
	// MaxKeys bounds the keys remembered; 0: DefaultNoteKeys.
	MaxKeys int

	mu   sync.Mutex
	last map[string]time.Time // key → when it last passed
}

// Allow reports whether key may be noted at now, and if so remembers now as its last note.
func (t *NoteThrottle) Allow(key string, now time.Time) bool {
	every, max := t.Every, t.MaxKeys
	if every <= 0 {
		every = DefaultNoteEvery
	}
	if max <= 0 {
		max = DefaultNoteKeys
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if at, ok := t.last[key]; ok && now.Sub(at) < every {
		return false
	}
	if t.last == nil || len(t.last) >= max {
		t.last = map[string]time.Time{}
	}
	t.last[key] = now
	return true
}
