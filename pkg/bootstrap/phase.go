// Package bootstrap runs `appliance bootstrap` as ordered phases (kubeadm's phase workflow, Talos'
// sequencer), one phase a file:
//
//	load      phase_load.go      strict decode, defaults, validation (all errors at once)
//	resolve   phase_resolve.go   the control-plane and workload-plane CIDRs → local addresses
//	pki       phase_pki.go       CA, serving certificate, node tokens, VRRP secret, cluster CA, admin kubeconfig
//	bundle    phase_bundle.go    verify the bundle, make its images pullable
//	render    phase_render.go    pkg/plan's artefacts written to STATE/rendered and STATE/appliance
//	firewall  phase_firewall.go  the bootstrap host's own nftables table, from the plan
//	serve     phase_serve.go     `appliance serve` (pkg/applianced) healthy with the current generation
//	power     phase_power.go     nodes brought under hostagent (SSH, or BMC boot device + power on)
//	converge  phase_converge.go  hostagents ready, then Kubernetes Nodes Ready and static pods running
//	upgrade   phase_upgrade.go   nodes on another hostagent build re-provisioned with this one, one at a time
//	handoff   phase_handoff.go   the registry mirror and package repo moved into the cluster (when asked)
//	escrow    phase_escrow.go    the state a future appliance needs, sealed into a cluster Secret (when configured)
//
// The runner (runner.go) loads the configuration, then takes the state directory's lock and opens its
// journal before any other phase runs. A skipped phase that produces something later phases use
// (Loader) reads it back from the state directory instead. A phase that needs converged nodes
// (upgrade, handoff, escrow) skips itself, with the reason (Result.Skipped), when converge was skipped in this
// run and the nodes have not converged (needsConverge, converged.go); a converge that ran and failed
// stops the run before them. With Options.DryRun every phase runs its checks and reports what it
// would change, and nothing is changed.
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
	// Skipped, when not empty, says why the phase found nothing it may do in this run and did nothing
	// (e.g. "needs converge, which --skip-phases skipped; …"). The runner reports the phase as
	// skipped with this reason, not as done and not as failed.
	Skipped string
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
