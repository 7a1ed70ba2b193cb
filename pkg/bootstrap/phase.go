// Package bootstrap runs `appliance bootstrap` as ordered phases (kubeadm's phase workflow, Talos'
// sequencer): load → resolve → pki → bundle → serve → firewall → render.
//
// Every phase checks the real world first (is the CA there and valid? is the rule set live? is the
// server healthy with the current generation?) and acts only on the difference, so a second run
// changes nothing and a run killed at any point finishes when run again. Outcomes are appended to a
// journal in the state directory; the journal is a record for people and tools, never the source
// of truth.
package bootstrap

import (
	"context"
	"time"
)

// Result is what a phase did.
type Result struct {
	// Changed is true when the phase altered anything on disk, in the kernel or in processes.
	Changed bool
	// Detail is one line for people, e.g. "reused CA (expires 2036-11-20), issued serving cert (4 SANs)".
	Detail string
}

// Phase is one step of the bootstrap flow.
type Phase interface {
	// Name is the phase's stable identifier, used by --skip-phases and in the journal.
	Name() string
	// Run checks the real world and converges it, using and filling st.
	Run(ctx context.Context, st *State) (Result, error)
}

// Event is a machine-readable progress record (`--output json`, one JSON object per line).
type Event struct {
	Time     time.Time `json:"time"`
	Phase    string    `json:"phase"`
	Index    int       `json:"index"`
	Total    int       `json:"total"`
	Status   string    `json:"status"` // started, done, skipped, failed
	Changed  bool      `json:"changed,omitempty"`
	Detail   string    `json:"detail,omitempty"`
	Error    string    `json:"error,omitempty"`
	Duration float64   `json:"durationSeconds,omitempty"`
}

// Phase statuses used in Event.Status and the journal.
const (
	StatusStarted = "started"
	StatusDone    = "done"
	StatusSkipped = "skipped"
	StatusFailed  = "failed"
)
