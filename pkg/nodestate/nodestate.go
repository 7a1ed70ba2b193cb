// Package nodestate keeps the appliance's record of every node's progress, written by the agent
// API (hostagent reports) and the power phase, read by `appliance status`.
//
// Layout under the directory given to Open (STATE/nodes):
//
//	<node>/status.json   0600  agentapi.NodeStatus: state, reason, boot ID, last report per step
//	<node>/events.jsonl  0600  one Event per line, appended (fsynced) for every recorded change
//	<node>/events.jsonl.1 0600 the previous events.jsonl, moved aside at EventsMaxBytes
//	<node>/history.jsonl 0600  one LifecycleEntry per line: the node's day-2 history (lifecycle.go)
//	<node>/kubeadm-done.json 0600 the node's first kubeadm-done report, kept across reboots until
//	                           it is Removed (kubeadm.go: RanKubeadm)
//
// status.json is replaced atomically (pkg/atomicfile), so a reader never sees a torn file.
//
// The node lifecycle (agentapi.State*):
//
//	pending → powering → booting → agent-connected → configured → ready
//	                                      any step failed → failed(reason) until the step succeeds
//
// powering and booting are set by the appliance (Set); the rest follow from hostagent reports
// (Record): step "config" done → agent-connected; every configuration step of the node's plan
// (agentapi.Plan) done → configured; step "ready" done → ready; any step whose last report is failed →
// failed with "<step>: <detail>" as the reason. A retry of the failed step (running) keeps the
// failure; its success clears it. A report with a new BootID starts the step list anew (the node
// rebooted).
//
// The history is what an operator reads of a node's life (`appliance status NODE`): added to the
// configuration, first ready, ready again after a reboot, hostagent upgraded, removed, its token
// rotated or revoked, a second machine that claimed it by enrolment (an alarm) and the operator's
// approval of its enrolment key. Record derives ready, rebooted and upgraded from reports; the bootstrap's
// render phase records added and removed (SyncMembership); other commands and the enrolment call
// RecordLifecycle. It is append-only (one fsynced write per
// line; a torn last line is ignored on read and cut before the next append) and capped at
// HistoryCap entries per node.
package nodestate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// File names inside a node's directory.
const (
	StatusFile = "status.json"
	EventsFile = "events.jsonl"
)

// Sentinel errors.
var (
	// ErrInvalidReport: a report with an unknown step or status, or no BootID.
	ErrInvalidReport = errors.New("invalid report")
	// ErrInvalidState: Set with a state that is not one of agentapi.State*, or a node name that is
	// not a plain file name.
	ErrInvalidState = errors.New("invalid node state")
	// ErrNotFound: no record for the node.
	ErrNotFound = errors.New("no record for node")
)

var knownSteps = agentapi.Steps

var knownStates = []string{agentapi.StatePending, agentapi.StatePowering, agentapi.StateBooting,
	agentapi.StateAgentConnected, agentapi.StateConfigured, agentapi.StateReady, agentapi.StateFailed}

// Event is one line of events.jsonl: what was recorded and the state that followed.
type Event struct {
	Time time.Time `json:"time"`
	// Reported is the node's own clock reading when it made the report (agentapi.Report.Time):
	// reports may arrive late (retried), so timelines use this. Zero for Set.
	Reported time.Time `json:"reported,omitzero"`
	Node     string    `json:"node"`
	BootID   string    `json:"bootID,omitempty"`
	// Step, Status and Detail are the report's; empty for Set.
	Step   string `json:"step,omitempty"`
	Status string `json:"status,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Contact is, for a note (Store.NoteContact), the machine's contact it records (ContactNetboot,
	// ContactEnrolRefused, ContactEnrolled, ContactEnrolPending, ContactInstalled); empty otherwise.
	Contact string `json:"contact,omitempty"`
	// State and Reason are the node's after the event.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// Store reads and writes the records under one directory. It is safe for concurrent use within
// one process; one process (the appliance server) writes a directory at a time, and the power
// phase's Set calls go through the same rules. Writers of one node are serialised (a mutex per node
// in this process, an flock across processes); writers of different nodes and every reader run in
// parallel, so one node's two fsyncs never hold up another node's report or any config fetch.
type Store struct {
	dir string
	// Now is the clock (tests replace it); nil means time.Now.
	Now func() time.Time

	locks sync.Map // node name → *sync.Mutex
}

// Open returns a store for dir (STATE/nodes). The directory is created 0700 on first write.
func Open(dir string) *Store { return &Store{dir: dir} }

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

func checkNode(node string) error {
	if node == "" || node != filepath.Base(node) || strings.HasPrefix(node, ".") {
		return fmt.Errorf("%w: node name %q is not a plain file name", ErrInvalidState, node)
	}
	return nil
}

// Get returns the node's record; an error wrapping ErrNotFound when it has none. It takes no lock:
// status.json is only ever replaced whole (pkg/atomicfile), so a read sees one complete record.
func (s *Store) Get(node string) (agentapi.NodeStatus, error) {
	if err := checkNode(node); err != nil {
		return agentapi.NodeStatus{}, err
	}
	return s.read(node)
}

func (s *Store) read(node string) (agentapi.NodeStatus, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, node, StatusFile))
	if errors.Is(err, fs.ErrNotExist) {
		return agentapi.NodeStatus{Node: node, State: agentapi.StatePending}, fmt.Errorf("%w %s", ErrNotFound, node)
	} else if err != nil {
		return agentapi.NodeStatus{}, fmt.Errorf("read status of node %s: %w", node, err)
	}
	var st agentapi.NodeStatus
	if err := json.Unmarshal(b, &st); err != nil {
		return agentapi.NodeStatus{}, fmt.Errorf("%s is corrupt (delete it to start the node's record anew): %w", filepath.Join(s.dir, node, StatusFile), err)
	}
	return st, nil
}

// List returns every node's record, sorted by node name.
func (s *Store) List() ([]agentapi.NodeStatus, error) {
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("list node records: %w", err)
	}
	var out []agentapi.NodeStatus
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		st, err := s.Get(e.Name())
		if errors.Is(err, ErrNotFound) {
			continue
		} else if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

// Set puts node into state with reason (the power phase: powering, booting; or failed with why).
// Setting powering or booting forgets the previous boot's steps. Setting the state the node is
// already in with the same reason writes nothing. Errors: an unknown state or bad node name
// (ErrInvalidState), file system errors.
func (s *Store) Set(node, state, reason string) (agentapi.NodeStatus, error) {
	if err := checkNode(node); err != nil {
		return agentapi.NodeStatus{}, err
	}
	if !slices.Contains(knownStates, state) {
		return agentapi.NodeStatus{}, fmt.Errorf("%w: %q (want one of %s)", ErrInvalidState, state, strings.Join(knownStates, ", "))
	}
	st, found, unlock, err := s.lockRead(node)
	if err != nil {
		return st, err
	}
	defer unlock()
	if found && st.State == state && st.Reason == reason {
		return st, nil
	}
	st.Node, st.State, st.Reason, st.Updated = node, state, reason, s.now()
	if state == agentapi.StatePowering || state == agentapi.StateBooting {
		st.Steps, st.BootID = nil, ""
	}
	return st, s.commit(st, Event{Time: st.Updated, Node: node, BootID: st.BootID, State: state, Reason: reason})
}

// Record applies one hostagent report for node, whose step plan is plan (Plan of its NodeConfig;
// nil means the steps every node runs: config, firewall, containerd, ready). It returns the new
// status and whether anything was written: a report equal to the step's last one (same BootID,
// status and detail; the time is ignored) is a no-op, so agents may resend freely. A report of a new
// boot, or of another hostagent build in the same boot (an upgraded agent), forgets the steps
// reported before it: the node is booting until its new agent reports them again.
//
// Errors: unknown step or status, empty BootID, an agentVersion over 128 characters or with spaces
// or control characters, an agentSHA256 that is not 64 lowercase hex digits (ErrInvalidReport); file
// system errors; a history error after the state was committed (changed is then true).
func (s *Store) Record(node string, plan []string, r agentapi.Report) (agentapi.NodeStatus, bool, error) {
	if err := checkNode(node); err != nil {
		return agentapi.NodeStatus{}, false, err
	}
	if err := validReport(r); err != nil {
		return agentapi.NodeStatus{}, false, err
	}
	if plan == nil {
		plan = []string{agentapi.StepConfig, agentapi.StepFirewall, agentapi.StepContainerd, agentapi.StepReady}
	}
	st, _, unlock, err := s.lockRead(node)
	if err != nil {
		return st, false, err
	}
	defer unlock()
	before := st
	st.Node = node
	if r.BootID != st.BootID {
		// A new boot: nothing the previous boot reached still holds (a rebooted node is not ready
		// until it says so again), so its state starts over. Without a previous boot (new record,
		// or the power phase's Set just forgot it) the state stays what Set made it.
		if st.BootID != "" {
			st.State, st.Reason = agentapi.StateBooting, ""
		}
		st.BootID, st.Steps = r.BootID, nil
	}
	newBuild := (r.AgentVersion != "" || r.AgentSHA256 != "") && (r.AgentVersion != st.AgentVersion || r.AgentSHA256 != st.AgentSHA256)
	if newBuild && r.BootID == st.BootID && (st.AgentVersion != "" || st.AgentSHA256 != "") && len(st.Steps) > 0 {
		// Another build in the same boot: the agent was replaced (an upgrade) and runs every step
		// anew, so nothing the previous build reported holds for it, a failure least of all (a
		// report the old agent sent as it was stopped must not become the new build's failure).
		st.State, st.Reason, st.Steps = agentapi.StateBooting, "", nil
	}
	if last, ok := st.Steps[r.Step]; ok && last.Status == r.Status && last.Detail == r.Detail && !newBuild {
		return st, false, nil
	}
	prev := st.Steps[r.Step]
	if st.Steps == nil {
		st.Steps = map[string]agentapi.Report{}
	} else {
		st.Steps = maps.Clone(st.Steps) // before keeps the old map
	}
	step := r
	step.AgentVersion, step.AgentSHA256 = "", "" // once per node below, not once per step
	st.Steps[r.Step] = step
	st.State, st.Reason = derive(st, plan, prev, r)
	if newBuild {
		st.AgentVersion, st.AgentSHA256 = r.AgentVersion, r.AgentSHA256
	}
	st.Updated = s.now()
	// The history first: if a crash follows, the agent resends the report (not acknowledged) and
	// lifecycleFromReport finds its entries already there. A history that cannot be read or written
	// does not hold up the node's state: the state is committed and the history's error returned.
	herr := s.lifecycleFromReport(node, before, st, r)
	ev := Event{Time: st.Updated, Reported: r.Time, Node: node, BootID: r.BootID, Step: r.Step, Status: r.Status,
		Detail: r.Detail, State: st.State, Reason: st.Reason}
	if err := s.commit(st, ev); err != nil {
		return st, false, err
	}
	if err := s.markKubeadm(node, r); err != nil {
		return st, true, err
	}
	if herr != nil {
		return st, true, fmt.Errorf("node %s: state recorded, history not: %w", node, herr)
	}
	return st, true, nil
}

func validReport(r agentapi.Report) error {
	var errs []string
	if r.BootID == "" {
		errs = append(errs, "bootID is empty")
	}
	if !slices.Contains(knownSteps, r.Step) {
		errs = append(errs, fmt.Sprintf("step %q is unknown (want one of %s)", r.Step, strings.Join(knownSteps, ", ")))
	}
	if r.Status != agentapi.StatusRunning && r.Status != agentapi.StatusDone && r.Status != agentapi.StatusFailed {
		errs = append(errs, fmt.Sprintf("status %q is unknown (want running, done or failed)", r.Status))
	}
	if len(r.AgentVersion) > maxAgentVersion || strings.IndexFunc(r.AgentVersion, func(c rune) bool { return !unicode.IsPrint(c) || c == ' ' }) >= 0 {
		errs = append(errs, fmt.Sprintf("agentVersion %.40q is not a version (at most %d printable characters, no spaces)", r.AgentVersion, maxAgentVersion))
	}
	if r.AgentSHA256 != "" && !isSHA256Hex(r.AgentSHA256) {
		errs = append(errs, fmt.Sprintf("agentSHA256 %.70q is not 64 lowercase hex digits", r.AgentSHA256))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidReport, strings.Join(errs, "; "))
	}
	return nil
}

// maxAgentVersion bounds agentapi.Report.AgentVersion (pkg/version strings are far shorter).
const maxAgentVersion = 128

func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// derive computes the state after report r (prev is the step's previous report).
func derive(st agentapi.NodeStatus, plan []string, prev, r agentapi.Report) (string, string) {
	if r.Status == agentapi.StatusRunning && prev.Status == agentapi.StatusFailed && st.State == agentapi.StateFailed {
		return st.State, st.Reason // a retry keeps the failure until it succeeds
	}
	for _, step := range plan { // plan order: the first failure is the reason
		if rep, ok := st.Steps[step]; ok && rep.Status == agentapi.StatusFailed {
			return agentapi.StateFailed, failReason(rep)
		}
	}
	for _, step := range knownSteps { // steps outside the plan fail the node too
		if rep, ok := st.Steps[step]; ok && rep.Status == agentapi.StatusFailed {
			return agentapi.StateFailed, failReason(rep)
		}
	}
	done := func(step string) bool { return st.Steps[step].Status == agentapi.StatusDone }
	if done(agentapi.StepReady) {
		return agentapi.StateReady, ""
	}
	configured := true
	for _, step := range plan {
		if step != agentapi.StepReady && !done(step) {
			configured = false
		}
	}
	switch {
	case configured:
		return agentapi.StateConfigured, ""
	case done(agentapi.StepConfig):
		return agentapi.StateAgentConnected, ""
	case st.State == agentapi.StateFailed || st.State == "":
		return agentapi.StateBooting, "" // the agent talks, but has not got its config yet
	}
	return st.State, st.Reason
}

func failReason(r agentapi.Report) string {
	if r.Detail == "" {
		return r.Step + ": failed"
	}
	return r.Step + ": " + r.Detail
}

// commit appends ev to events.jsonl, then writes status.json atomically (0600): in that order, a
// reader that sees a status finds the event that led to it (status first left a window in which
// the status said ready and the events did not yet; TestAgentWorkerAgainstAppliance read in it).
// A crash between the two leaves an event whose status was not written; the agent resends the
// unacknowledged report and it is recorded again.
func (s *Store) commit(st agentapi.NodeStatus, ev Event) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode status of node %s: %w", st.Node, err)
	}
	if err := s.appendEvent(st.Node, ev); err != nil {
		return err
	}
	if _, err := atomicfile.Write(filepath.Join(s.dir, st.Node, StatusFile), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("write status of node %s: %w", st.Node, err)
	}
	return nil
}

// EventsMaxBytes caps a node's events file: an append that would make events.jsonl longer first
// moves it to events.jsonl.1 (replacing the previous one) and starts a new file, so a node's events
// take at most twice this on disk however long it lives or however often it is refused. 1 MiB is
// about 3,000 events of the usual size (a report's detail is a line; at most 64 KiB, see
// pkg/server.MaxReportBytes): a node's whole install and years of its day-2 life fit in the two
// files, which is what the readers need (the enrolment window and the converge phase read the last
// power-on and what followed it; `appliance status` the recent past).
const EventsMaxBytes = 1 << 20

// EventsRotatedFile is the previous events file (EventsFile moved aside by the cap).
const EventsRotatedFile = EventsFile + ".1"

// appendEvent appends ev as one line to the node's events.jsonl (0600); the caller holds the node's
// lock. A torn line a crash left at the end is cut off first, so it never glues onto the new one;
// past EventsMaxBytes the file is rotated (EventsRotatedFile); the line goes out in one write(2)
// with O_APPEND and is fsynced (and after a rotation the directory too), so an acknowledged report
// survives a power cut.
func (s *Store) appendEvent(node string, ev Event) error {
	line, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode event of node %s: %w", node, err)
	}
	line = append(line, '\n')
	dir := filepath.Join(s.dir, node)
	path := filepath.Join(dir, EventsFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("append event of node %s: %w", node, err)
	}
	defer func() { _ = f.Close() }()
	if err := cutTornTail(f); err != nil {
		return fmt.Errorf("append event of node %s: %w", node, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("append event of node %s: %w", node, err)
	}
	rotated := false
	if fi.Size() > 0 && fi.Size()+int64(len(line)) > EventsMaxBytes {
		if err := os.Rename(path, filepath.Join(dir, EventsRotatedFile)); err != nil {
			return fmt.Errorf("rotate events of node %s: %w", node, err)
		}
		_ = f.Close()
		if f, err = os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600); err != nil {
			return fmt.Errorf("append event of node %s: %w", node, err)
		}
		rotated = true
	}
	if _, err := f.Write(line); err != nil {
		return fmt.Errorf("append event of node %s: %w", node, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("append event of node %s: %w", node, err)
	}
	if rotated {
		if err := syncDir(dir); err != nil {
			return fmt.Errorf("rotate events of node %s: %w", node, err)
		}
	}
	return f.Close()
}

// syncDir fsyncs a directory (a rename or a new file in it made durable).
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Events returns the node's events, oldest first: those of EventsRotatedFile, then of EventsFile.
// It takes no lock: appends are whole lines in one write and a rotation is a rename, so a reader
// sees whole events. A last line a crash tore mid-append is ignored (the next append cuts it off);
// any other line that does not parse is skipped, and named in the error returned with all the
// events that do parse (callers that can act on those do).
func (s *Store) Events(node string) ([]Event, error) {
	if err := checkNode(node); err != nil {
		return nil, err
	}
	dir := filepath.Join(s.dir, node)
	// The current file first, then the rotated one: a rotation between the two opens makes both the
	// same file (read once), never a generation skipped.
	cur, err := os.Open(filepath.Join(dir, EventsFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read events of node %s: %w", node, err)
	}
	if cur != nil {
		defer cur.Close()
	}
	old, err := os.Open(filepath.Join(dir, EventsRotatedFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read events of node %s: %w", node, err)
	}
	if old != nil {
		defer old.Close()
		if cur != nil && sameFile(cur, old) {
			old = nil
		}
	}
	var out []Event
	var errs []error
	for _, f := range []*os.File{old, cur} {
		if f == nil {
			continue
		}
		b, err := io.ReadAll(f)
		if err != nil {
			return out, fmt.Errorf("read events of node %s: %w", node, err)
		}
		evs, err := parseEvents(f.Name(), b)
		out = append(out, evs...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

func sameFile(a, b *os.File) bool {
	ai, aerr := a.Stat()
	bi, berr := b.Stat()
	return aerr == nil && berr == nil && os.SameFile(ai, bi)
}

// parseEvents parses the lines of one events file (path names it in errors): a torn last line
// (no newline after it) is ignored, other lines that do not parse are skipped and named.
func parseEvents(path string, b []byte) ([]Event, error) {
	lines := bytes.Split(b, []byte("\n"))
	lines = lines[:len(lines)-1] // "" after a complete last line, or the torn remainder of an append
	var out []Event
	var bad []string
	for i, line := range lines {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var ev Event
		if err := json.Unmarshal(line, &ev); err != nil {
			bad = append(bad, strconv.Itoa(i+1))
			continue
		}
		out = append(out, ev)
	}
	if len(bad) > 0 {
		return out, fmt.Errorf("%s: line(s) %s are corrupt and were skipped (remove them)", path, strings.Join(bad, ", "))
	}
	return out, nil
}

// lockRead locks node's record against this process (the node's mutex) and other processes
// (lockNode) and reads it; found is false for a node without a record (st is then its pending
// default). The caller must call unlock once it has committed.
func (s *Store) lockRead(node string) (st agentapi.NodeStatus, found bool, unlock func(), err error) {
	v, _ := s.locks.LoadOrStore(node, new(sync.Mutex))
	mu := v.(*sync.Mutex)
	mu.Lock()
	release, err := s.lockNode(node)
	if err != nil {
		mu.Unlock()
		return agentapi.NodeStatus{}, false, nil, err
	}
	unlock = func() { release(); mu.Unlock() }
	st, err = s.read(node)
	if err != nil && !errors.Is(err, ErrNotFound) {
		unlock()
		return st, false, nil, err
	}
	return st, err == nil, unlock, nil
}

// lockNode takes an exclusive flock on DIR/<node>/.lock for one read-modify-write of the node's
// record: `appliance bootstrap` (power phase) and `appliance serve` (agent reports) are separate
// processes writing the same records. The kernel drops the lock if the process dies.
func (s *Store) lockNode(node string) (func(), error) {
	dir := filepath.Join(s.dir, node)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock the record of node %s: %w", node, err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}
