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
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
	// FromLease: the node's enrolment must come from the address the appliance's DHCP server leased
	// to MAC and acknowledged (Enrollment.SetLeases; config EnrolFromLease: boot.dhcp server,
	// boot.enrolment.sourceAddress lease, a node that server gives an address to). With no such lease
	// the node cannot enrol.
	FromLease bool
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
	// Source is the address (no port) the first accepted request came from.
	Source string `json:"source,omitempty"`
	// Pending is true while the binding waits for the operator's approval
	// (Enrollment.RequireApproval): no token was issued for it yet.
	Pending bool `json:"pending,omitempty"`
	// Approved is when the operator approved the binding's key (ApproveEnrollment; the approval is
	// RecordDir/approved/<node>.json); zero when it was not approved.
	Approved time.Time `json:"approved,omitzero"`
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
//  6. the appliance's power phase powered it on (its last "powering" event) → 403;
//  7. no binding of that power-on to another key → 409, and the alarm: a second machine claims the
//     node. It is raised once per node and power-on (also across restarts): an error-level log
//     record and an enrol-conflict entry in the node's history (nodestate.EnrolConflict, which
//     `appliance status` shows until the key is approved or the token replaced or revoked), naming
//     both keys and source addresses and what the operator does;
//  8. it has not reported since the power-on (no hostagent report after that event) → 409, and it
//     was powered on within Window → 403;
//  9. with EnrollNode.FromLease, the request comes from the address the appliance's DHCP server
//     leased to the node's MAC (SetLeases) → 403 (no lease, or another address: IPv4-mapped IPv6 is
//     compared as IPv4, any other IPv6 source is refused, the leases being IPv4);
//  10. the node's hostagent configuration is rendered → 404;
//  11. with RequireApproval, a binding the operator has not approved (ApproveEnrollment) → 202 and
//     an agentapi.EnrollPending, no token: the binding is recorded (Pending), the machine asks again;
//  12. otherwise 200 with the node's rendered hostagent configuration (Dir/<node>/hostagent.yaml), and
//     with PKIDir set, the token: a new (or newly approved) binding rotates the node's token
//     (pki.RotateNodeToken: the token any earlier install or enrolment gave it is refused from then
//     on, and the node's history records token-rotated) and the answer carries the new one; a retry
//     with the same key is answered the token its binding issued, or refused 409 when that token was
//     revoked or replaced since.
//
// Every refusal from step 4 on is recorded in that node's events (nodestate.Store.NoteContact; a refusal
// by the same rule of the same node at most once a minute, whatever key, UUID or address the requests
// carry: nodestate.ContactEnrolRefused), as is every acceptance (nodestate.ContactEnrolled) and a
// pending answer (nodestate.ContactEnrolPending, once a minute); steps 1 to 3 are logged only (no
// node is proven). Refusals are logged once a minute per source address and rule. Store failures
// answer 500 (the appliance's fault, never the client's input). The node token and keys are never
// logged (key fingerprints are).
type Enrollment struct {
	// Dir is the rendered dir (STATE/rendered): Dir/<node>/hostagent.yaml is the answer.
	Dir string
	// RecordDir holds the bindings, <node>.json, and the operator's approvals, approved/<node>.json
	// (STATE/enrolment: statedir.Enrolment).
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
	// RequireApproval keeps every new binding pending, its answers 202 without a token, until the
	// operator approves its key (boot.enrolment.approval: operator; ApproveEnrollment, which
	// `appliance node approve` runs); the machine's next request then gets the token.
	RequireApproval bool

	mu     sync.Mutex
	nodes  []EnrollNode
	leases func(mac string) (netip.Addr, bool) // SetLeases; nil: no lease is known
	seen   map[string]time.Time                // nonce → when it may be forgotten
	noted  nodestate.NoteThrottle              // node + refusal kind: each noted in the node's events once a minute
	logged nodestate.NoteThrottle              // source address + refusal kind: each logged once a minute

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

// SetLeases gives the lookup of the address the appliance's DHCP server leased to a MAC (the
// running pkg/netboot.Server's Lease), which EnrollNode.FromLease nodes must enrol from. Without it
// such a node has no lease and cannot enrol.
func (e *Enrollment) SetLeases(lease func(mac string) (netip.Addr, bool)) {
	e.mu.Lock()
	e.leases = lease
	e.mu.Unlock()
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
	var pending *pendingError
	if errors.As(err, &pending) {
		b, _ := json.Marshal(pending.p)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Retry-After", strconv.Itoa(int(agentapi.EnrollPendingRetry/time.Second)))
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write(b)
		return
	} else if errors.As(err, &refusal) {
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
	bound := found && rec.PoweredOn.Equal(poweredOn)
	if bound && subtle.ConstantTimeCompare([]byte(rec.PublicKey), []byte(req.PublicKey)) != 1 {
		// A second machine claims the node in this power-on: refused, and the alarm.
		e.raiseConflict(n, rec, fp, remote, now, reported)
		holds := "and holds the token that enrolment issued"
		if rec.Pending {
			holds = "and waits for the operator's approval"
		}
		return deny("other-key", http.StatusConflict, "enrolment refused: node %s is already enrolled with another key (%s) since its power-on at %s, %s: "+
			"a second machine claims its identity, or the machine lost its key (it rebooted); the appliance raised an alarm (`appliance status`). "+
			"Only a new power-on by the appliance opens a new enrolment, whose token replaces this one: %s; and `appliance node revoke %s` now if a machine you do not trust may hold the current token",
			n.Name, rec.KeyFingerprint, poweredOn.Format(time.RFC3339), holds, n.reenrol(), n.Name)
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
	src := sourceAddr(remote)
	if n.FromLease {
		lease, ok := netip.Addr{}, false
		if e.leases != nil {
			lease, ok = e.leases(n.MAC)
		}
		switch {
		case !ok:
			return deny("no-lease", http.StatusForbidden, "enrolment refused: node %s must enrol from the address the appliance's DHCP server leased to its MAC %s (boot.dhcp: server, boot.enrolment.sourceAddress: lease), "+
				"and it holds no lease for that MAC: the machine takes its address from the appliance's DHCP before it enrols (check on its console that it did, on the NIC with that MAC); "+
				"where its address does not come from the appliance, set boot.enrolment.sourceAddress: any (and boot.enrolment.approval: operator)", n.Name, n.MAC)
		case src != lease:
			v6 := ""
			if src.Is6() {
				v6 = " (over IPv6: the appliance leases IPv4 addresses only, and its URL on the boot path is IPv4)"
			}
			return deny("not-lease", http.StatusForbidden, "enrolment refused: the request came from %s%s, not from %s, the address the appliance's DHCP server leased to node %s's MAC %s: "+
				"an enrolment comes from the leased address only (boot.enrolment.sourceAddress: lease). If this machine is node %s, its live system uses another address: check its network on its console; "+
				"if it is not, another machine claims node %s's identity", sourceText(src, remote), v6, lease, n.Name, n.MAC, n.Name, n.Name)
		}
	}
	if !bound {
		rec = EnrollRecord{Node: n.Name, PublicKey: req.PublicKey, KeyFingerprint: fp, PoweredOn: poweredOn, Enrolled: now,
			MACs: macs, SystemUUID: strings.ToLower(req.SystemUUID), Source: sourceText(src, remote), Pending: e.RequireApproval}
	}
	cfg, err := os.ReadFile(filepath.Join(e.Dir, n.Name, statedir.AgentConfigFile))
	if errors.Is(err, fs.ErrNotExist) {
		return deny("no-config", http.StatusNotFound, "enrolment refused: no hostagent configuration rendered for node %s yet; rerun `appliance bootstrap` (render phase)", n.Name)
	} else if err != nil {
		return agentapi.EnrollResponse{}, fmt.Errorf("read the hostagent configuration of %s: %w", n.Name, err)
	}
	rec.Answered = now
	rec.Nonces = append(rec.Nonces, req.Nonce)
	if len(rec.Nonces) > maxRecordNonces {
		rec.Nonces = rec.Nonces[len(rec.Nonces)-maxRecordNonces:]
	}
	if rec.Pending {
		ap, ok, err := readApproval(e.RecordDir, n.Name)
		if err != nil {
			return agentapi.EnrollResponse{}, err
		}
		if !ok || ap.KeyFingerprint != rec.KeyFingerprint || !ap.PoweredOn.Equal(rec.PoweredOn) {
			return agentapi.EnrollResponse{}, e.pending(n, rec, bound, remote, poweredOn.Add(window))
		}
		rec.Pending, rec.Approved = false, ap.Approved
		bound = false // the token goes out now, as for a new binding
	}
	rotated := false
	if e.PKIDir != "" {
		token, ok, err := e.token(n.Name, rec, bound)
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
	if err := e.writeRecord(rec); err != nil {
		return agentapi.EnrollResponse{}, err
	}
	what := "enrolled"
	switch {
	case !rec.Approved.IsZero() && rotated:
		what = "enrolled (approved by the operator at " + rec.Approved.Format(time.RFC3339) + ")"
	case bound:
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

// ErrEnrollPending is matched (errors.Is) by Enroll's answer to an enrolment that waits for the
// operator's approval (HTTPStatus 202; ServeHTTP answers an agentapi.EnrollPending).
var ErrEnrollPending = errors.New("enrolment pending the operator's approval")

// pendingError is that answer.
type pendingError struct{ p agentapi.EnrollPending }

func (p *pendingError) Error() string { return p.p.Message }
func (p *pendingError) Unwrap() error { return ErrEnrollPending }

// pending records the binding rec of node n (e.mu held; bound: it was recorded before) as waiting
// for the operator's approval and returns the pending answer; closes is when the node's enrolment
// window closes. The first answer of a binding is logged (warn) with the key and address the
// operator must compare; the node's events note it at most once a minute (the converge phase sees
// a machine that keeps asking).
func (e *Enrollment) pending(n EnrollNode, rec EnrollRecord, bound bool, remote string, closes time.Time) error {
	if err := e.writeRecord(rec); err != nil {
		return err
	}
	approve := "appliance node approve " + n.Name + " --fingerprint " + rec.KeyFingerprint
	what := fmt.Sprintf("enrolment with key %s from %s waits for the operator's approval (%s) until %s", rec.KeyFingerprint, rec.Source, approve, closes.Format(time.RFC3339))
	if !bound {
		e.log().Warn("enrolment pending: the operator approves it after comparing the key and address with the machine's console", "node", n.Name,
			"remote", remote, "key", rec.KeyFingerprint, "approve", approve, "windowCloses", closes.Format(time.RFC3339))
	}
	if e.noted.Allow(n.Name+"\x00pending", rec.Answered) {
		if err := e.Nodes.NoteContact(n.Name, nodestate.ContactEnrolPending, what); err != nil {
			e.log().Error("record the pending enrolment", "node", n.Name, "error", err)
		}
	}
	return &pendingError{agentapi.EnrollPending{Node: n.Name, KeyFingerprint: rec.KeyFingerprint, Source: rec.Source,
		Message: fmt.Sprintf("the enrolment of node %s with key %s from %s waits for the operator's approval: on the appliance, the operator compares this key and address with `appliance status` and runs `%s`; "+
			"this machine asks again until then, or until its enrolment window closes at %s", n.Name, rec.KeyFingerprint, rec.Source, approve, closes.Format(time.RFC3339))}}
}

// raiseConflict raises the alarm for a request with key fp from remote claiming node n, whose
// enrolment for this power-on is bound to rec's key (e.mu held): once per node and power-on (the
// node's history: nodestate.EnrolConflict, also across restarts), an error-level log record and the
// history entry, both naming the two keys and addresses and what the operator does.
func (e *Enrollment) raiseConflict(n EnrollNode, rec EnrollRecord, fp, remote string, now time.Time, reported bool) {
	claim := sourceText(sourceAddr(remote), remote)
	from := rec.Source
	if from == "" {
		from = "an unrecorded address"
	}
	var state, ifGenuine, ifNot string
	switch {
	case rec.Pending:
		state = "waiting for the operator's approval (no token issued)"
		ifGenuine = fmt.Sprintf("run `appliance node approve %s --fingerprint %s` (%s gets its token and this alarm is settled)", n.Name, rec.KeyFingerprint, n.Name)
		ifNot = fmt.Sprintf("do not approve it: the machine at %s waits for node %s's token; to enrol %s anew, %s; and find that machine", from, n.Name, n.Name, n.reenrol())
	default:
		state = "holding the token that enrolment issued"
		if reported {
			state += ", and the node's hostagent has reported since"
		}
		ifGenuine = fmt.Sprintf("run `appliance node approve %s --fingerprint %s` to confirm it (this alarm is settled)", n.Name, rec.KeyFingerprint)
		ifNot = fmt.Sprintf("the machine at %s holds node %s's token: run `appliance node revoke %s --yes` now, then %s (a machine that rebooted during its install and enrolled again with a new key looks the same, and needs the same new enrolment)", from, n.Name, n.Name, n.reenrol())
	}
	detail := fmt.Sprintf("a second machine claims node %s: an enrolment with key %s from %s at %s was refused, because the node's enrolment for its power-on at %s is bound to key %s from %s (at %s), %s. "+
		"Compare the key on %s's console (`hostagent enroll` prints the key it enrols with) with %s. If it is that key, the node is genuine: %s, and find the machine at %s. If it is not, %s.",
		n.Name, fp, claim, now.Format(time.RFC3339), rec.PoweredOn.Format(time.RFC3339), rec.KeyFingerprint, from, rec.Enrolled.Format(time.RFC3339), state,
		n.Name, rec.KeyFingerprint, ifGenuine, claim, ifNot)
	recorded, err := e.Nodes.RecordLifecycleOnce(n.Name, nodestate.EnrolConflict, rec.PoweredOn, detail)
	if err != nil {
		e.log().Error("record the enrolment alarm in the node's history", "node", n.Name, "error", err)
	}
	if recorded || err != nil {
		e.log().Error("ALARM: a second machine claims the node by enrolment (once per node and power-on; `appliance status` shows it)",
			"node", n.Name, "poweredOn", rec.PoweredOn.Format(time.RFC3339), "boundKey", rec.KeyFingerprint, "boundSource", from,
			"claimKey", fp, "claimSource", claim, "todo", detail)
	}
}

// sourceAddr is the IP address of remote ("host:port"; IPv4-mapped IPv6 as IPv4); invalid when it
// does not parse.
func sourceAddr(remote string) netip.Addr {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return ap.Addr().Unmap()
	}
	a, _ := netip.ParseAddr(remote)
	return a.Unmap()
}

// sourceText is src for people, or remote's host when src is invalid.
func sourceText(src netip.Addr, remote string) string {
	if src.IsValid() {
		return src.String()
	}
	return sourceHost(remote)
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

// HTTPStatus is the status ServeHTTP answers err from Enroll with: 202 for a pending enrolment
// (ErrEnrollPending), the refusal's 4xx, else 500.
func HTTPStatus(err error) int {
	var refusal *enrollError
	if errors.As(err, &refusal) {
		return refusal.code
	}
	if errors.Is(err, ErrEnrollPending) {
		return http.StatusAccepted
	}
	return http.StatusInternalServerError
}

// keyFingerprint is agentapi.KeyFingerprint: "sha256:<hex>" of an Ed25519 public key's bytes.
func keyFingerprint(pub ed25519.PublicKey) string { return agentapi.KeyFingerprint(pub) }

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

// approvalDir is where the operator's approvals are kept: RecordDir/approved (a directory of its
// own, so that no node name makes an approval's file name another node's record).
func approvalDir(recordDir string) string { return filepath.Join(recordDir, "approved") }

// EnrollApproval is the operator's approval of a node's enrolment key for one power-on, kept in
// RecordDir/approved/<node>.json (0600, written atomically by ApproveEnrollment): the server hands
// out the node's token to the binding whose key and power-on it names.
type EnrollApproval struct {
	Node           string    `json:"node"`
	KeyFingerprint string    `json:"keyFingerprint"`
	PoweredOn      time.Time `json:"poweredOn"`
	Approved       time.Time `json:"approved"`
}

// Errors of ApproveEnrollment that callers test.
var (
	// ErrNoEnrollment: the node has no enrolment binding to approve.
	ErrNoEnrollment = errors.New("no enrolment to approve")
	// ErrFingerprintMismatch: the fingerprint given is not the bound key's.
	ErrFingerprintMismatch = errors.New("the key fingerprint is not the enrolment's")
)

// minFingerprintPrefix is how many hex digits of a key fingerprint ApproveEnrollment needs at least.
const minFingerprintPrefix = 16

// ReadEnrollRecord reads node's binding from recordDir (STATE/enrolment) without an Enrollment:
// what `appliance status` and `appliance node approve` show. found is false when it has none.
func ReadEnrollRecord(recordDir, node string) (EnrollRecord, bool, error) {
	return (&Enrollment{RecordDir: recordDir}).readRecord(node)
}

// ApproveEnrollment approves node's enrolment binding in recordDir (STATE/enrolment), as `appliance
// node approve` does once the operator has compared its key fingerprint and source address with the
// machine's console: it writes approved/<node>.json (0600, atomically) naming the binding's key and
// power-on, and returns the binding. A pending binding (boot.enrolment.approval: operator) gets the
// node's token at the machine's next request; an approval of a binding that has its token already
// confirms the key (it settles an enrolment alarm). fingerprint, when not empty, must be the bound
// key's ("sha256:<hex>", or at least minFingerprintPrefix of its first hex digits), else
// ErrFingerprintMismatch; no binding is ErrNoEnrollment. It runs beside a serving appliance: the
// server reads the approval at the next request, and this never writes the binding itself.
func ApproveEnrollment(recordDir, node, fingerprint string, now time.Time) (EnrollRecord, error) {
	if node == "" || node != filepath.Base(node) || strings.HasPrefix(node, ".") {
		return EnrollRecord{}, fmt.Errorf("%w: %q is not a node name", ErrNoEnrollment, node)
	}
	rec, found, err := ReadEnrollRecord(recordDir, node)
	if err != nil {
		return rec, err
	}
	if !found {
		return rec, fmt.Errorf("%w: node %s has not enrolled (no %s)", ErrNoEnrollment, node, filepath.Join(recordDir, node+".json"))
	}
	if fingerprint != "" {
		want := strings.TrimPrefix(strings.ToLower(strings.TrimSpace(fingerprint)), "sha256:")
		have := strings.TrimPrefix(rec.KeyFingerprint, "sha256:")
		if len(want) < minFingerprintPrefix || !strings.HasPrefix(have, want) {
			return rec, fmt.Errorf("%w: node %s's enrolment is bound to key %s (from %s), not to %s (give the fingerprint as the machine's console shows it, sha256:<hex>, or at least its first %d hex digits)",
				ErrFingerprintMismatch, node, rec.KeyFingerprint, rec.Source, fingerprint, minFingerprintPrefix)
		}
	}
	b, err := json.MarshalIndent(EnrollApproval{Node: node, KeyFingerprint: rec.KeyFingerprint, PoweredOn: rec.PoweredOn, Approved: now.UTC()}, "", "  ")
	if err != nil {
		return rec, err
	}
	if err := os.MkdirAll(approvalDir(recordDir), 0o700); err != nil {
		return rec, fmt.Errorf("enrolment approvals: %w", err)
	}
	if _, err := atomicfile.Write(filepath.Join(approvalDir(recordDir), node+".json"), append(b, '\n'), 0o600); err != nil {
		return rec, fmt.Errorf("write the approval of %s's enrolment: %w", node, err)
	}
	return rec, nil
}

// ReadEnrollApproval reads node's approval from recordDir; found is false when there is none.
func ReadEnrollApproval(recordDir, node string) (EnrollApproval, bool, error) {
	return readApproval(recordDir, node)
}

func readApproval(recordDir, node string) (EnrollApproval, bool, error) {
	path := filepath.Join(approvalDir(recordDir), node+".json")
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return EnrollApproval{}, false, nil
	} else if err != nil {
		return EnrollApproval{}, false, fmt.Errorf("read the approval of %s's enrolment: %w", node, err)
	}
	var ap EnrollApproval
	if err := json.Unmarshal(b, &ap); err != nil {
		return EnrollApproval{}, false, fmt.Errorf("%s is corrupt (delete it and run `appliance node approve %s` again): %w", path, node, err)
	}
	return ap, true, nil
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
