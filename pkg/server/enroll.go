package server

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// EnrollNode is what Enrollment knows of one node of the inventory (bootstrap.yaml nodes[]).
type EnrollNode struct {
	// Name is nodes[].name.
	Name string
	// BMC is true for power.kind ipmi or redfish: only those enrol.
	BMC bool
	// MAC is nodes[].mac, lowercase colon-separated (config.SetDefaults); empty: the node cannot enrol.
	MAC string
	// SystemUUID is nodes[].systemUUID, lowercase; empty: not checked.
	SystemUUID string
	// InstallArgs are the node's install parameters (agentapi.EnrollResponse.InstallArgs).
	InstallArgs []string
	// Reenrol is what the operator runs to have the node enrol again (a power-on by the appliance,
	// which opens a new enrolment and so gives the node a new token), as refusals say it; empty:
	// "run `appliance node reinstall NODE --yes`".
	Reenrol string
}

// reenrol is n.Reenrol or its default.
func (n EnrollNode) reenrol() string {
	if n.Reenrol != "" {
		return n.Reenrol
	}
	return "run `appliance node reinstall " + n.Name + " --yes` (it writes the disk anew, replaces the token at once and power-cycles the node to enrol)"
}

// EnrollRecord is the binding of a node to the key it enrolled with for one power-on, kept in
// Enrollment.RecordDir/<node>.json (0600, written atomically).
type EnrollRecord struct {
	Node string `json:"node"`
	// PublicKey is the Ed25519 public key, standard base64 (agentapi.EnrollRequest.PublicKey).
	PublicKey string `json:"publicKey"`
	// KeyFingerprint is "sha256:<hex>" of the public key's 32 bytes.
	KeyFingerprint string `json:"keyFingerprint"`
	// PoweredOn is the time of the power phase's "powering" record this enrolment answers.
	PoweredOn time.Time `json:"poweredOn"`
	// Enrolled is when the first request was accepted; Answered when the last one was.
	Enrolled time.Time `json:"enrolled"`
	Answered time.Time `json:"answered"`
	// MACs and SystemUUID are the first accepted request's.
	MACs       []string `json:"macs"`
	SystemUUID string   `json:"systemUUID,omitempty"`
	// Nonces are the nonces of every accepted request: none of them is accepted again.
	Nonces []string `json:"nonces"`
	// TokenSHA256 is the hex SHA-256 of the node token this binding issued (Enrollment.PKIDir set):
	// a retry with the same key is answered that token only while it is still the node's.
	TokenSHA256 string `json:"tokenSHA256,omitempty"`
}

// maxRecordNonces bounds EnrollRecord.Nonces (a node retries a handful of times).
const maxRecordNonces = 64

// maxSeenNonces bounds the in-memory replay cache; entries leave it agentapi.EnrollClockSkew after
// their timestamp (a request older than that is refused by its timestamp anyway).
const maxSeenNonces = 8192

// Enrollment serves POST agentapi.EnrollPathV1 (see the agentapi package for the exchange). A
// request is checked in this order, and the first failure answers:
//
//  0. the source address within EnrollSourceRate/EnrollSourceBurst, before the body is read → 429;
//  1. shape and signature (agentapi.EnrollRequest.Check) → 400;
//  2. timestamp within agentapi.EnrollClockSkew of the appliance's clock → 403;
//  3. exactly one node of the inventory whose nodes[].mac is among the request's MACs → 403
//     "no node of the inventory has these MACs" (no node is named: the requester proved none);
//     the requests matched to that node, from any source, within EnrollNodeRate/EnrollNodeBurst
//     → 429 (not noted in its events);
//  4. that node is BMC-powered → 403; its nodes[].systemUUID, when set, equals the request's → 403;
//  5. the nonce was not seen (in memory, and in the node's record across restarts) → 403 (replay);
//  6. the appliance's power phase powered it on (its last "powering" event) within Window, and it
//     has not reported since (no hostagent report after that event) → 403;
//  7. no binding for that power-on, or one to the same key → 200 with the node's rendered hostagent
//     configuration (Dir/<node>/hostagent.yaml); a binding to another key → 409;
//  8. with PKIDir set, the token: a new binding rotates the node's token (pki.RotateNodeToken: the
//     token any earlier install or enrolment gave it is refused from then on, and the node's history
//     records token-rotated) and the answer carries the new one; a retry with the same key is
//     answered the token its binding issued, or refused 409 when that token was revoked or replaced
//     since.
//
// Every refusal from step 4 on is recorded in that node's events (nodestate.Store.NoteContact; a refusal
// by the same rule of the same node at most once a minute, whatever key, UUID or address the requests
// carry: nodestate.ContactEnrolRefused), as is every acceptance (nodestate.ContactEnrolled); steps 1
// to 3 are logged only (no node is proven). Refusals are logged once a minute per source address and
// rule. Store failures answer 500 (the appliance's fault, never the client's input). The node token
// and keys are never logged.
type Enrollment struct {
	// Dir is the rendered dir (STATE/rendered): Dir/<node>/hostagent.yaml is the answer.
	Dir string
	// RecordDir holds the bindings, <node>.json (STATE/enrolment).
	RecordDir string
	// Nodes is the node store: the power phase's records (window) and the events.
	Nodes *nodestate.Store
	// Window is how long after a power-on a node may enrol; zero means agentapi.EnrollWindow.
	Window time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Log receives refusals (without keys or tokens); nil discards.
	Log *slog.Logger
	// PKIDir is the PKI directory (STATE/pki) whose tokens/<node> the enrolment rotates; the answer
	// carries the node's new token in place of the rendered one. Empty: no token is rotated and the
	// rendered configuration is answered as it is (a front without a state directory).
	PKIDir string

	mu     sync.Mutex
	nodes  []EnrollNode
	seen   map[string]time.Time   // nonce → when it may be forgotten
	noted  nodestate.NoteThrottle // node + refusal kind: each noted in the node's events once a minute
	logged nodestate.NoteThrottle // source address + refusal kind: each logged once a minute

	limitsOnce sync.Once
	perSource  *keyedLimiter // EnrollSourceRate, EnrollSourceBurst
	perNode    *keyedLimiter // EnrollNodeRate, EnrollNodeBurst
}

func (e *Enrollment) limits() {
	e.limitsOnce.Do(func() {
		e.perSource = newKeyedLimiter(EnrollSourceRate, EnrollSourceBurst)
		e.perNode = newKeyedLimiter(EnrollNodeRate, EnrollNodeBurst)
	})
}

// logRefusal logs a refusal at most once a minute per source address (remote's host) and kind (the
// rule that refused): a machine retrying in a loop, or anyone flooding the endpoint, must not grow
// the appliance's log without bound.
func (e *Enrollment) logRefusal(remote, kind, msg string, attrs ...any) {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	if e.logged.Allow(host+"\x00"+kind, e.now()) {
		e.log().Warn(msg+" (logged once a minute per source and reason)", attrs...)
	}
}

// NewEnrollment returns the enrolment endpoint for the inventory nodes.
func NewEnrollment(dir, recordDir string, nodes []EnrollNode, store *nodestate.Store, log *slog.Logger) *Enrollment {
	e := &Enrollment{Dir: dir, RecordDir: recordDir, Nodes: store, Log: log}
	e.SetNodes(nodes)
	return e
}

// SetNodes replaces the inventory.
func (e *Enrollment) SetNodes(nodes []EnrollNode) {
	e.mu.Lock()
	e.nodes = slices.Clone(nodes)
	e.mu.Unlock()
}

func (e *Enrollment) now() time.Time {
	if e.Now != nil {
		return e.Now().UTC()
	}
	return time.Now().UTC()
}

func (e *Enrollment) log() *slog.Logger {
	if e.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return e.Log
}

// enrollError is a refusal: the HTTP status and the text the requester reads (and for a 429, when
// to retry).
type enrollError struct {
	code       int
	msg        string
	retryAfter time.Duration
}

func (e *enrollError) Error() string { return e.msg }

func refuse(code int, format string, args ...any) *enrollError {
	return &enrollError{code: code, msg: fmt.Sprintf(format, args...)}
}

func (e *Enrollment) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed: POST an enrolment request (JSON) to "+agentapi.EnrollPathV1, http.StatusMethodNotAllowed)
		return
	}
	e.limits()
	if ok, wait := e.perSource.allow(sourceHost(r.RemoteAddr), e.now()); !ok {
		e.logRefusal(r.RemoteAddr, "rate", "enrolment refused: the source sends faster than the limit (429)", "remote", r.RemoteAddr,
			"limit", rateText(EnrollSourceRate, EnrollSourceBurst))
		tooManyRequests(w, wait, fmt.Sprintf("too many enrolment requests from %s: at most %s; retry after the Retry-After seconds",
			sourceHost(r.RemoteAddr), rateText(EnrollSourceRate, EnrollSourceBurst)))
		return
	}
	var req agentapi.EnrollRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, agentapi.MaxEnrollBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		http.Error(w, fmt.Sprintf("bad enrolment request: want one JSON object of at most %d bytes (agentapi.EnrollRequest): %v", agentapi.MaxEnrollBytes, err), http.StatusBadRequest)
		return
	}
	if dec.More() {
		http.Error(w, "bad enrolment request: one JSON object and nothing after it", http.StatusBadRequest)
		return
	}
	resp, err := e.Enroll(req, r.RemoteAddr)
	var refusal *enrollError
	if errors.As(err, &refusal) {
		if refusal.code == http.StatusTooManyRequests {
			tooManyRequests(w, refusal.retryAfter, refusal.msg)
			return
		}
		http.Error(w, refusal.msg, refusal.code)
		return
	} else if err != nil {
		e.log().Error("enrolment", "error", err)
		http.Error(w, "internal error: the appliance could not record the enrolment (see its log)", http.StatusInternalServerError)
		return
	}
	b, err := json.Marshal(resp)
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// Enroll checks req as ServeHTTP does and returns the answer. A refusal is an error whose text is
// what the requester reads (and that HTTPStatus maps to a 4xx); any other error is the appliance's.
func (e *Enrollment) Enroll(req agentapi.EnrollRequest, remote string) (agentapi.EnrollResponse, error) {
	pub, macs, err := req.Check()
	if err != nil {
		e.logRefusal(remote, "shape", "enrolment refused", "remote", remote, "reason", err.Error())
		return agentapi.EnrollResponse{}, refuse(http.StatusBadRequest, "%v", err)
	}
	now := e.now()
	if d := now.Sub(req.Timestamp); d > agentapi.EnrollClockSkew || d < -agentapi.EnrollClockSkew {
		e.logRefusal(remote, "timestamp", "enrolment refused", "remote", remote, "reason", "timestamp", "skew", d.String())
		return agentapi.EnrollResponse{}, refuse(http.StatusForbidden,
			"enrolment refused: timestamp %s is %s from the appliance's clock (%s; at most %s either way): set the machine's clock (BIOS/RTC), or this is a replayed request",
			req.Timestamp.UTC().Format(time.RFC3339), d.Round(time.Second), now.Format(time.RFC3339), agentapi.EnrollClockSkew)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var matched []EnrollNode
	for _, n := range e.nodes {
		if n.MAC != "" && slices.Contains(macs, n.MAC) {
			matched = append(matched, n)
		}
	}
	switch len(matched) {
	case 0:
		e.logRefusal(remote, "no-node", "enrolment refused: no node of the inventory has these MACs", "remote", remote, "macs", strings.Join(macs, ","))
		return agentapi.EnrollResponse{}, refuse(http.StatusForbidden,
			"enrolment refused: no node of the inventory has one of the MACs %s (the appliance's nodes[].mac must name this machine's boot NIC)", strings.Join(macs, ", "))
	case 1:
	default:
		e.logRefusal(remote, "several-nodes", "enrolment refused: the MACs belong to several nodes", "remote", remote, "macs", strings.Join(macs, ","))
		return agentapi.EnrollResponse{}, refuse(http.StatusForbidden,
			"enrolment refused: the MACs %s are the nodes[].mac of more than one node of the inventory: one machine is one node", strings.Join(macs, ", "))
	}
	n := matched[0]
	fp := keyFingerprint(pub)
	e.limits()
	if ok, wait := e.perNode.allow(n.Name, now); !ok {
		// Not noted in the node's events: a flood must not write there.
		e.logRefusal(remote, "node-rate", "enrolment refused: requests for the node come faster than the limit (429)", "node", n.Name,
			"remote", remote, "limit", rateText(EnrollNodeRate, EnrollNodeBurst))
		r := refuse(http.StatusTooManyRequests, "too many enrolment requests for node %s: at most %s; retry after the Retry-After seconds",
			n.Name, rateText(EnrollNodeRate, EnrollNodeBurst))
		r.retryAfter = wait
		return agentapi.EnrollResponse{}, r
	}
	// deny refuses with code and the text; kind names the rule that refused. The node's events note
	// a refusal per node and kind at most once a minute: the key holds nothing the requester chooses
	// (a new key or UUID per request must not add a note per request).
	deny := func(kind string, code int, format string, args ...any) (agentapi.EnrollResponse, error) {
		r := refuse(code, format, args...)
		e.logRefusal(remote, kind, "enrolment refused", "node", n.Name, "remote", remote, "key", fp, "reason", r.msg)
		if !e.noted.Allow(n.Name+"\x00"+kind, now) {
			return agentapi.EnrollResponse{}, r
		}
		if err := e.Nodes.NoteContact(n.Name, nodestate.ContactEnrolRefused, "enrolment refused (key "+fp+", from "+remote+"): "+r.msg); err != nil {
			e.log().Error("record the refused enrolment", "node", n.Name, "error", err)
		}
		return agentapi.EnrollResponse{}, r
	}
	if !n.BMC {
		return deny("not-bmc", http.StatusForbidden, "enrolment refused: node %s is not BMC-powered (its power.kind is ssh): it gets its credential over SSH, not by enrolment", n.Name)
	}
	if n.SystemUUID != "" && !strings.EqualFold(n.SystemUUID, req.SystemUUID) {
		got := req.SystemUUID
		if got == "" {
			got = "none"
		}
		return deny("system-uuid", http.StatusForbidden, "enrolment refused: the machine's SMBIOS system UUID (%s) is not node %s's nodes[].systemUUID", got, n.Name)
	}
	rec, found, err := e.readRecord(n.Name)
	if err != nil {
		return agentapi.EnrollResponse{}, err
	}
	if e.seenNonce(req.Nonce, now) || (found && slices.Contains(rec.Nonces, req.Nonce)) {
		return deny("replay", http.StatusForbidden, "enrolment refused: nonce already used (a replayed request); every request, retries included, needs a new nonce")
	}
	e.rememberNonce(req.Nonce, req.Timestamp.Add(agentapi.EnrollClockSkew), now)
	poweredOn, reported, err := e.powerOn(n.Name)
	if err != nil {
		return agentapi.EnrollResponse{}, err
	}
	window := e.Window
	if window <= 0 {
		window = agentapi.EnrollWindow
	}
	if poweredOn.IsZero() {
		return deny("not-powered", http.StatusForbidden, "enrolment refused: the appliance has not powered node %s on (run `appliance bootstrap`: its power phase powers the node on and opens a %s enrolment window)", n.Name, window)
	}
	if reported {
		return deny("reported", http.StatusConflict, "enrolment refused: node %s is already enrolled and its hostagent has reported since its power-on at %s: "+
			"an installed node keeps the token its enrolment gave it, and a machine enrols again only after the appliance powers it on for that. "+
			"if this machine is node %s and must get a new token, %s; "+
			"if it is not, `appliance node revoke %s` makes the current token worthless until the node enrols again", n.Name, poweredOn.Format(time.RFC3339), n.Name, n.reenrol(), n.Name)
	}
	if now.Sub(poweredOn) > window {
		return deny("window", http.StatusForbidden, "enrolment refused: node %s was powered on at %s, more than %s ago: to enrol it, %s", n.Name, poweredOn.Format(time.RFC3339), window, n.reenrol())
	}
	if found && rec.PoweredOn.Equal(poweredOn) {
		if subtle.ConstantTimeCompare([]byte(rec.PublicKey), []byte(req.PublicKey)) != 1 {
			return deny("other-key", http.StatusConflict, "enrolment refused: node %s is already enrolled with another key (%s) since its power-on at %s, and holds the token that enrolment issued: "+
				"a second machine claims its identity, or the machine lost its key (it rebooted). Only a new power-on by the appliance opens a new enrolment, whose token replaces this one: "+
				"%s; and `appliance node revoke %s` now if a machine you do not trust may hold the current token",
				n.Name, rec.KeyFingerprint, poweredOn.Format(time.RFC3339), n.reenrol(), n.Name)
		}
	} else {
		rec = EnrollRecord{Node: n.Name, PublicKey: req.PublicKey, KeyFingerprint: fp, PoweredOn: poweredOn, Enrolled: now,
			MACs: macs, SystemUUID: strings.ToLower(req.SystemUUID)}
		found = false
	}
	cfg, err := os.ReadFile(filepath.Join(e.Dir, n.Name, statedir.AgentConfigFile))
	if errors.Is(err, fs.ErrNotExist) {
		return deny("no-config", http.StatusNotFound, "enrolment refused: no hostagent configuration rendered for node %s yet; rerun `appliance bootstrap` (render phase)", n.Name)
	} else if err != nil {
		return agentapi.EnrollResponse{}, fmt.Errorf("read the hostagent configuration of %s: %w", n.Name, err)
	}
	rotated := false
	if e.PKIDir != "" {
		token, ok, err := e.token(n.Name, rec, found)
		if err != nil {
			return agentapi.EnrollResponse{}, err
		}
		if !ok {
			return deny("token-gone", http.StatusConflict, "enrolment refused: the token node %s's enrolment at %s issued was revoked or replaced since, "+
				"and a retry of that enrolment cannot bring it back: to enrol the node anew, %s", n.Name, rec.Enrolled.Format(time.RFC3339), n.reenrol())
		}
		sum := sha256.Sum256([]byte(token))
		rotated = rec.TokenSHA256 != hex.EncodeToString(sum[:])
		rec.TokenSHA256 = hex.EncodeToString(sum[:])
		if cfg, err = withToken(cfg, token); err != nil {
			return agentapi.EnrollResponse{}, fmt.Errorf("the rendered hostagent configuration of %s: %w", n.Name, err)
		}
	}
	rec.Answered = now
	rec.Nonces = append(rec.Nonces, req.Nonce)
	if len(rec.Nonces) > maxRecordNonces {
		rec.Nonces = rec.Nonces[len(rec.Nonces)-maxRecordNonces:]
	}
	if err := e.writeRecord(rec); err != nil {
		return agentapi.EnrollResponse{}, err
	}
	what := "enrolled"
	if found {
		what = "enrolment answered again (same key)"
	}
	if rotated {
		if err := e.Nodes.RecordLifecycle(n.Name, nodestate.TokenRotated, "enrolled with key "+fp+" from "+remote+": the token of any earlier install is refused"); err != nil {
			e.log().Error("record the token rotation", "node", n.Name, "error", err)
		}
	}
	e.log().Info(what, "node", n.Name, "remote", remote, "key", fp)
	if err := e.Nodes.NoteContact(n.Name, nodestate.ContactEnrolled, what+" with key "+fp+" from "+remote); err != nil {
		e.log().Error("record the enrolment", "node", n.Name, "error", err)
	}
	return agentapi.EnrollResponse{Node: n.Name, HostagentConfig: string(cfg), KeyFingerprint: fp, InstallArgs: n.InstallArgs}, nil
}

// token returns the node token the answer carries (e.mu held): for a new binding (found false) a
// new one (pki.RotateNodeToken); for a retry with the binding's key the one the binding issued, ok
// false when it is no longer the node's (revoked or replaced since). A binding recorded before
// tokens were rotated (no TokenSHA256) is given a new one.
func (e *Enrollment) token(node string, rec EnrollRecord, found bool) (string, bool, error) {
	if found && rec.TokenSHA256 != "" {
		cur, have, err := pki.ReadNodeToken(e.PKIDir, node)
		if err != nil {
			return "", false, fmt.Errorf("read the node token of %s: %w", node, err)
		}
		sum := sha256.Sum256([]byte(cur))
		return cur, have && subtle.ConstantTimeCompare([]byte(hex.EncodeToString(sum[:])), []byte(rec.TokenSHA256)) == 1, nil
	}
	tok, err := pki.RotateNodeToken(e.PKIDir, node)
	return tok, err == nil, err
}

// withToken returns the hostagent configuration cfg with its token replaced by token.
func withToken(cfg []byte, token string) ([]byte, error) {
	c, err := agentapi.Parse(cfg)
	if err != nil {
		return nil, err
	}
	c.Token = token
	return c.Marshal()
}

// HTTPStatus is the status ServeHTTP answers err from Enroll with: the refusal's 4xx, else 500.
func HTTPStatus(err error) int {
	var refusal *enrollError
	if errors.As(err, &refusal) {
		return refusal.code
	}
	return http.StatusInternalServerError
}

// keyFingerprint is "sha256:<hex>" of an Ed25519 public key's bytes.
func keyFingerprint(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// powerOn returns the time of node's last "powering" event (the power phase's Set before it powers a
// BMC node on; zero when there is none) and whether the node reported (an event with a step) after it.
func (e *Enrollment) powerOn(node string) (time.Time, bool, error) {
	evs, err := e.Nodes.Events(node)
	if err != nil && len(evs) == 0 {
		return time.Time{}, false, err
	}
	var at time.Time
	reported := false
	for _, ev := range evs {
		switch {
		case ev.Step == "" && ev.Contact == "" && ev.State == agentapi.StatePowering:
			at, reported = ev.Time, false
		case ev.Step != "" && !at.IsZero():
			reported = true
		}
	}
	return at, reported, nil
}

func (e *Enrollment) recordPath(node string) string { return filepath.Join(e.RecordDir, node+".json") }

// ReadRecord returns node's binding; found is false when it has none.
func (e *Enrollment) ReadRecord(node string) (EnrollRecord, bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.readRecord(node)
}

func (e *Enrollment) readRecord(node string) (EnrollRecord, bool, error) {
	b, err := os.ReadFile(e.recordPath(node))
	if errors.Is(err, fs.ErrNotExist) {
		return EnrollRecord{}, false, nil
	} else if err != nil {
		return EnrollRecord{}, false, fmt.Errorf("read the enrolment record of %s: %w", node, err)
	}
	var rec EnrollRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return EnrollRecord{}, false, fmt.Errorf("%s is corrupt (delete it and power the node on again): %w", e.recordPath(node), err)
	}
	return rec, true, nil
}

func (e *Enrollment) writeRecord(rec EnrollRecord) error {
	if err := os.MkdirAll(e.RecordDir, 0o700); err != nil {
		return fmt.Errorf("enrolment records: %w", err)
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if _, err := atomicfile.Write(e.recordPath(rec.Node), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("write the enrolment record of %s: %w", rec.Node, err)
	}
	return nil
}

// seenNonce reports whether nonce is in the replay cache (e.mu held).
func (e *Enrollment) seenNonce(nonce string, now time.Time) bool {
	until, ok := e.seen[nonce]
	return ok && now.Before(until)
}

// rememberNonce keeps nonce until until (e.mu held); past maxSeenNonces it drops expired entries
// first, then the ones that expire soonest.
func (e *Enrollment) rememberNonce(nonce string, until, now time.Time) {
	if e.seen == nil {
		e.seen = map[string]time.Time{}
	}
	if len(e.seen) >= maxSeenNonces {
		for k, t := range e.seen {
			if !now.Before(t) {
				delete(e.seen, k)
			}
		}
		for len(e.seen) >= maxSeenNonces {
			var oldest string
			for k, t := range e.seen {
				if oldest == "" || t.Before(e.seen[oldest]) {
					oldest = k
				}
			}
			delete(e.seen, oldest)
		}
	}
	e.seen[nonce] = until
}
