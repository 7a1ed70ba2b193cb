package nodestate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// HistoryFile is the node's lifecycle history inside its directory: one LifecycleEntry per line.
const HistoryFile = "history.jsonl"

// HistoryCap is how many entries a node's history keeps: when an append makes it longer, the file
// is rewritten (atomically) with the newest HistoryCap entries, plus the newest entry of each kind
// that fell out of them, so the node's "added" and its last "ready" survive any number of later
// entries (the once-only rules below read them).
const HistoryCap = 100

// LifecycleKind is what happened to a node, as an operator reads its day-2 history.
type LifecycleKind string

// The lifecycle kinds.
const (
	// Added: the node appeared in the configuration of a bootstrap run (SyncMembership), recorded
	// once; again only after a Removed.
	Added LifecycleKind = "added"
	// Ready: the node became ready for the first time (kubeadm init, join-control-plane or join
	// done, or the plain steps for a node without Kubernetes). Record derives it from reports.
	Ready LifecycleKind = "ready"
	// Rebooted: the node became ready again in a new boot (boot ID changed since its last Ready or
	// Rebooted). Record derives it from reports.
	Rebooted LifecycleKind = "rebooted"
	// Upgraded: the hostagent version or executable hash the node reports changed from the one
	// recorded before (Entry.From → Entry.To). Record derives it from reports.
	Upgraded LifecycleKind = "upgraded"
	// Removed: the node left the configuration (SyncMembership at a bootstrap run, or
	// `appliance node remove` through RecordLifecycle), recorded once; again only after an Added.
	Removed LifecycleKind = "removed"
	// TokenRotated: the node's token was replaced by a new one (pkg/pki.RotateNodeToken) at an
	// enrolment, `appliance node reinstall` or an install over SSH; the old one is refused from then
	// on. Detail says which, never the token.
	TokenRotated LifecycleKind = "token-rotated"
	// TokenRevoked: `appliance node revoke` removed the node's token: nothing authenticates as the
	// node until it is enrolled or installed again.
	TokenRevoked LifecycleKind = "token-revoked"
	// EnrolConflict is an alarm: a second machine claimed the node by enrolment during one power-on
	// (another key than the one the power-on's enrolment is bound to; pkg/server.Enrollment),
	// recorded once per power-on. Detail names both enrolments (key fingerprints, source addresses)
	// and what the operator does. `appliance status` shows it (ActiveEnrolConflict) until the node's
	// key is approved (EnrolApproved), or its token is rotated or revoked after it.
	EnrolConflict LifecycleKind = "enrol-conflict"
	// EnrolApproved: `appliance node approve` confirmed the key of the node's enrolment, after the
	// operator compared it with the machine's console: a pending enrolment (boot.enrolment.approval:
	// operator) gets the node's token at its next retry, and an EnrolConflict before it is settled.
	EnrolApproved LifecycleKind = "enrol-approved"
)

// LifecycleKinds lists every kind.
var LifecycleKinds = []LifecycleKind{Added, Ready, Rebooted, Upgraded, Removed, TokenRotated, TokenRevoked, EnrolConflict, EnrolApproved}

// ActiveEnrolConflict returns the node's last EnrolConflict entry of hist (oldest first) while
// nothing after it settled it: an EnrolApproved (the operator confirmed the bound key), a
// TokenRotated (a new enrolment, reinstall or install replaced the token whoever held it), a
// TokenRevoked or a Removed. ok is false when there is no such alarm.
func ActiveEnrolConflict(hist []LifecycleEntry) (LifecycleEntry, bool) {
	last, ok := lastOf(hist, EnrolConflict, EnrolApproved, TokenRotated, TokenRevoked, Removed)
	if !ok || last.Kind != EnrolConflict {
		return LifecycleEntry{}, false
	}
	return last, true
}

// AgentBuild is one hostagent build as a node reported it (agentapi.Report.AgentVersion, AgentSHA256).
type AgentBuild struct {
	Version string `json:"version,omitempty"`
	SHA256  string `json:"sha256,omitempty"` // hex SHA-256 of the hostagent executable
}

// IsZero reports whether the build is unknown (neither field reported).
func (b AgentBuild) IsZero() bool { return b.Version == "" && b.SHA256 == "" }

// String is "VERSION (sha256 PREFIX)" with the hash's first 12 hex digits.
func (b AgentBuild) String() string {
	v := b.Version
	if v == "" {
		v = "unknown version"
	}
	if b.SHA256 == "" {
		return v
	}
	return fmt.Sprintf("%s (sha256 %s)", v, short(b.SHA256))
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// LifecycleEntry is one line of history.jsonl.
type LifecycleEntry struct {
	// Time is when the appliance recorded it (UTC).
	Time time.Time     `json:"time"`
	Node string        `json:"node"`
	Kind LifecycleKind `json:"kind"`
	// Detail is one line for people: "bootstrap run with /etc/appliance/bootstrap.yaml",
	// "kubeadm join done in 9.8s", "ready again after a reboot (boot 1a2b3c4d → 5e6f7a8b)".
	Detail string `json:"detail,omitempty"`
	// BootID is the boot in which the node became ready (Ready, Rebooted).
	BootID string `json:"bootID,omitempty"`
	// From and To are the hostagent builds before and after (Upgraded); To also on Ready and
	// Rebooted when the node reported its build.
	From *AgentBuild `json:"from,omitempty"`
	To   *AgentBuild `json:"to,omitempty"`
}

// Line is the entry as `appliance status NODE` prints it: "2026-11-24 22:41:07  added (bootstrap …)",
// the time in loc.
func (e LifecycleEntry) Line(loc *time.Location) string {
	s := e.Time.In(loc).Format(time.DateTime) + "  " + string(e.Kind)
	if e.Kind == Upgraded && e.From != nil && e.To != nil {
		s += " from " + e.From.String() + " to " + e.To.String()
	}
	if e.Detail != "" {
		s += " (" + strings.Join(strings.Fields(e.Detail), " ") + ")"
	}
	return s
}

// RecordLifecycle appends one entry of kind for node with detail, under the node's lock, for callers
// that act on nodes outside the hostagent reports (`appliance node remove` records Removed). Added
// and Removed change the node's membership and are recorded only when they change it: Added when
// the node has no history or its last membership entry is Removed, Removed when its last is not
// Removed; so a rerun of the same command records nothing. The other kinds are appended as given
// (Record derives them from reports already; use this only for what reports cannot show).
//
// Errors: an unknown kind or a node name that is not a plain file name (ErrInvalidState); file
// system errors.
func (s *Store) RecordLifecycle(node string, kind LifecycleKind, detail string) error {
	_, err := s.recordLifecycle(node, kind, detail)
	return err
}

func (s *Store) recordLifecycle(node string, kind LifecycleKind, detail string) (bool, error) {
	if err := checkNode(node); err != nil {
		return false, err
	}
	if !slices.Contains(LifecycleKinds, kind) {
		var names []string
		for _, k := range LifecycleKinds {
			names = append(names, string(k))
		}
		return false, fmt.Errorf("%w: lifecycle kind %q (want one of %s)", ErrInvalidState, kind, strings.Join(names, ", "))
	}
	_, _, unlock, err := s.lockRead(node)
	if err != nil {
		return false, err
	}
	defer unlock()
	hist, err := s.History(node)
	if err != nil {
		return false, err
	}
	if kind == Added || kind == Removed {
		last, ok := lastOf(hist, Added, Removed)
		if kind == Added && ok && last.Kind == Added || kind == Removed && ok && last.Kind == Removed {
			return false, nil
		}
	}
	if err := s.appendHistory(node, hist, LifecycleEntry{Time: s.now(), Node: node, Kind: kind, Detail: detail}); err != nil {
		return true, err
	}
	if kind == Removed {
		return true, s.unmarkKubeadm(node)
	}
	return true, nil
}

// RecordLifecycleOnce appends an entry of kind for node with detail unless the node's history
// already holds one of that kind at or after since, under the node's lock (so two callers at once
// record one); recorded says whether it appended. The enrolment records its EnrolConflict alarm
// this way, once per power-on (since: the power-on), also across restarts of the server. Errors as
// RecordLifecycle's.
func (s *Store) RecordLifecycleOnce(node string, kind LifecycleKind, since time.Time, detail string) (recorded bool, err error) {
	if err := checkNode(node); err != nil {
		return false, err
	}
	if !slices.Contains(LifecycleKinds, kind) || kind == Added || kind == Removed {
		return false, fmt.Errorf("%w: lifecycle kind %q cannot be recorded once (membership kinds have their own rule)", ErrInvalidState, kind)
	}
	_, _, unlock, err := s.lockRead(node)
	if err != nil {
		return false, err
	}
	defer unlock()
	hist, err := s.History(node)
	if err != nil {
		return false, err
	}
	for i := len(hist) - 1; i >= 0; i-- {
		if hist[i].Kind == kind && !hist[i].Time.Before(since) {
			return false, nil
		}
	}
	return true, s.appendHistory(node, hist, LifecycleEntry{Time: s.now(), Node: node, Kind: kind, Detail: detail})
}

// SyncMembership records a bootstrap run's configuration: Added (with detail) for every node of
// nodes whose history does not say it is already in, Removed ("removed from the configuration; "
// + detail) for every node with a record in the store (a status or a history) that is not in nodes
// and not already removed. It returns the nodes it recorded, each list sorted; a second call with
// the same nodes records nothing.
func (s *Store) SyncMembership(nodes []string, detail string) (added, removed []string, err error) {
	for _, n := range nodes {
		d := detail
		if h, err := s.History(n); err == nil && len(h) == 0 && s.hasRecord(n) {
			// A node this appliance recorded before it kept histories: added earlier than now.
			d = "recorded before histories were kept; " + detail
		}
		ok, err := s.recordLifecycle(n, Added, d)
		if err != nil {
			return added, removed, err
		}
		if ok {
			added = append(added, n)
		}
	}
	ents, err := os.ReadDir(s.dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return added, removed, fmt.Errorf("list node records: %w", err)
	}
	for _, e := range ents {
		n := e.Name()
		if !e.IsDir() || slices.Contains(nodes, n) || checkNode(n) != nil || !s.hasRecord(n) {
			continue
		}
		ok, err := s.recordLifecycle(n, Removed, "removed from the configuration; "+detail)
		if err != nil {
			return added, removed, err
		}
		if ok {
			removed = append(removed, n)
		}
	}
	sort.Strings(added)
	sort.Strings(removed)
	return added, removed, nil
}

// hasRecord reports whether node's directory holds a status or a history.
func (s *Store) hasRecord(node string) bool {
	for _, f := range []string{StatusFile, HistoryFile} {
		if _, err := os.Stat(filepath.Join(s.dir, node, f)); err == nil {
			return true
		}
	}
	return false
}

// History returns node's lifecycle entries, oldest first; none without a history. It takes no
// lock: appends are single writes of whole lines and compaction replaces the file atomically, so a
// reader sees whole entries, except a last line a crash tore mid-append, which it ignores. Any
// other line that does not parse is an error naming the file and line.
func (s *Store) History(node string) ([]LifecycleEntry, error) {
	if err := checkNode(node); err != nil {
		return nil, err
	}
	path := filepath.Join(s.dir, node, HistoryFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("read history of node %s: %w", node, err)
	}
	lines := bytes.Split(b, []byte("\n"))
	// The last element is "" after a complete last line, or the torn remainder of an append.
	lines = lines[:len(lines)-1]
	var out []LifecycleEntry
	for i, line := range lines {
		if len(line) == 0 {
			continue
		}
		var e LifecycleEntry
		if err := json.Unmarshal(line, &e); err != nil {
			return out, fmt.Errorf("%s line %d is corrupt (remove that line): %w", path, i+1, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// appendHistory appends e to node's history (hist is its current content; the caller holds the
// node's lock). The line goes out in one write(2) with O_APPEND and is fsynced; a torn line a crash
// left at the end is cut off first, so it never glues onto the new one. Past HistoryCap entries the
// file is rewritten through atomicfile (temp file, fsync, rename) with the entries compact keeps.
func (s *Store) appendHistory(node string, hist []LifecycleEntry, e LifecycleEntry) error {
	path := filepath.Join(s.dir, node, HistoryFile)
	line, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode history of node %s: %w", node, err)
	}
	if len(hist)+1 > HistoryCap {
		var buf bytes.Buffer
		for _, h := range compact(append(slices.Clone(hist), e), HistoryCap) {
			b, err := json.Marshal(h)
			if err != nil {
				return fmt.Errorf("encode history of node %s: %w", node, err)
			}
			buf.Write(append(b, '\n'))
		}
		if _, err := atomicfile.Write(path, buf.Bytes(), 0o600); err != nil {
			return fmt.Errorf("write history of node %s: %w", node, err)
		}
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("append history of node %s: %w", node, err)
	}
	defer f.Close()
	if err := cutTornTail(f); err != nil {
		return fmt.Errorf("append history of node %s: %w", node, err)
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("append history of node %s: %w", node, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("append history of node %s: %w", node, err)
	}
	return f.Close()
}

// cutTornTail truncates f after its last newline when its last byte is not one (a crash mid-append).
func cutTornTail(f *os.File) error {
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return err
	}
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf[:1], fi.Size()-1); err != nil {
		return err
	}
	if buf[0] == '\n' {
		return nil
	}
	for end := fi.Size(); end > 0; {
		start := max(end-int64(len(buf)), 0)
		n, err := f.ReadAt(buf[:end-start], start)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			return f.Truncate(start + int64(i) + 1)
		}
		end = start
	}
	return f.Truncate(0)
}

// compact keeps the newest limit entries plus, for each kind with no entry among them, its newest
// older entry, in their original order.
func compact(hist []LifecycleEntry, limit int) []LifecycleEntry {
	if len(hist) <= limit {
		return hist
	}
	cut := len(hist) - limit
	keep := make([]bool, len(hist))
	for i := cut; i < len(hist); i++ {
		keep[i] = true
	}
	for _, k := range LifecycleKinds {
		for i := len(hist) - 1; i >= 0; i-- {
			if hist[i].Kind == k {
				keep[i] = true
				break
			}
		}
	}
	var out []LifecycleEntry
	for i, h := range hist {
		if keep[i] {
			out = append(out, h)
		}
	}
	return out
}

// lastOf returns the newest entry of one of kinds.
func lastOf(hist []LifecycleEntry, kinds ...LifecycleKind) (LifecycleEntry, bool) {
	for i := len(hist) - 1; i >= 0; i-- {
		if slices.Contains(kinds, hist[i].Kind) {
			return hist[i], true
		}
	}
	return LifecycleEntry{}, false
}

// lifecycleFromReport derives the history entries report r adds (the caller holds node's lock,
// before is the status before r and after the status after it): Upgraded when r's hostagent
// build differs from the one recorded (a first build is recorded silently), Ready when the node
// becomes ready for the first time, Rebooted when it becomes ready in a boot other than the one of
// its last Ready or Rebooted. Each is checked against the history too, so a report the appliance
// recorded but did not acknowledge (a crash between the history and status writes) adds nothing
// when the agent sends it again.
func (s *Store) lifecycleFromReport(node string, before, after agentapi.NodeStatus, r agentapi.Report) error {
	from := AgentBuild{Version: before.AgentVersion, SHA256: before.AgentSHA256}
	to := AgentBuild{Version: r.AgentVersion, SHA256: r.AgentSHA256}
	upgraded := !from.IsZero() && !to.IsZero() && from != to
	ready := after.State == agentapi.StateReady && before.State != agentapi.StateReady
	if !upgraded && !ready {
		return nil
	}
	hist, err := s.History(node)
	if err != nil {
		return err
	}
	if upgraded {
		if last, ok := lastOf(hist, Upgraded); !ok || last.To == nil || *last.To != to {
			e := LifecycleEntry{Time: s.now(), Node: node, Kind: Upgraded, Detail: "hostagent in boot " + short8(r.BootID), From: &from, To: &to}
			if err := s.appendHistory(node, hist, e); err != nil {
				return err
			}
			hist = append(hist, e)
		}
	}
	if !ready {
		return nil
	}
	e := LifecycleEntry{Time: s.now(), Node: node, BootID: r.BootID}
	if !to.IsZero() {
		e.To = &to
	}
	last, ok := lastOf(hist, Ready, Rebooted)
	switch {
	case !ok:
		e.Kind, e.Detail = Ready, "first ready"
		if k, found := after.Steps[agentapi.StepKubeadm]; found && k.Status == agentapi.StatusDone && k.Detail != "" {
			e.Detail += "; " + k.Detail
		}
	case last.BootID != r.BootID:
		e.Kind, e.Detail = Rebooted, fmt.Sprintf("ready again after a reboot (boot %s → %s)", short8(last.BootID), short8(r.BootID))
	default:
		return nil // ready again in the same boot (after a failed step): not a lifecycle event
	}
	return s.appendHistory(node, hist, e)
}

func short8(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
