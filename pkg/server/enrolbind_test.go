package server

import (
	"bufio"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// Issue 34 item 1, third layer: the enrolment of a blank machine without a TPM, attacked from the
// provisioning L2 over the real TLS listener. The machines are loopback addresses of this host
// (tlsClient dials from them), so the front sees each request come from its own address.
//
// The lease table is a function here (leaseTable), not pkg/netboot's DHCP server: driving that needs
// root, network namespaces and raw sockets. pkg/applianced's TestLabServeEnrolFromLease runs the
// real `appliance serve` with boot.dhcp: server and takes the lease with a real DHCP client.

// leaseTable is what the appliance's DHCP server has leased: MAC → address.
type leaseTable struct {
	mu sync.Mutex
	m  map[string]netip.Addr
}

func (l *leaseTable) set(mac, addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]netip.Addr{}
	}
	if addr == "" {
		delete(l.m, mac)
		return
	}
	l.m[mac] = netip.MustParseAddr(addr)
}

func (l *leaseTable) lease(mac string) (netip.Addr, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.m[mac]
	return a, ok
}

// fromLease makes w1 a node the appliance's DHCP server leases (boot.dhcp: server,
// boot.enrolment.sourceAddress: lease) with leases from table.
func fromLease(table *leaseTable) func(*Enrollment) {
	return func(e *Enrollment) {
		e.SetNodes([]EnrollNode{{Name: "w1", BMC: true, MAC: w1MAC, SystemUUID: w1UUID, FromLease: true}, {Name: "cp1"}})
		e.SetLeases(table.lease)
	}
}

// logTo sends the enrolment's log to buf as JSON lines.
func logTo(buf *syncBuffer) func(*Enrollment) {
	return func(e *Enrollment) { e.Log = slog.New(slog.NewJSONHandler(buf, nil)) }
}

// logRecords are the JSON log records in buf at level whose message starts with msg.
func logRecords(t *testing.T, buf *syncBuffer, level, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(buf.String()))
	for sc.Scan() {
		var r map[string]any
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if r["level"] == level && strings.HasPrefix(r["msg"].(string), msg) {
			out = append(out, r)
		}
	}
	return out
}

// TestSpoofedEnrolmentFromAnotherAddressRefused: w1 is a node the appliance's DHCP server leases.
// Before it has a lease, nobody enrols as w1, not even from the address it will get. An attacker on
// the segment who copies w1's MAC and UUID (both in its DHCPDISCOVER) and races it from its own
// address is refused, before and after the real machine takes its lease, with a 403 that names the
// leased address; the refusals bind nothing and leave w1's token alone. The real machine, from its
// leased address, enrols and gets the new token. When its lease moves (a release, then another
// address), its next request must come from the new address. A request from the leased address
// over IPv4-mapped IPv6 is the same address; any other IPv6 source is refused.
func TestSpoofedEnrolmentFromAnotherAddressRefused(t *testing.T) {
	var table leaseTable
	l := newTokenLab(t, fromLease(&table))
	node, attacker := tlsClient("127.0.0.21"), tlsClient("127.0.0.66")
	defer node.CloseIdleConnections()
	defer attacker.CloseIdleConnections()
	l.powerOn()
	nodeKey, attackerKey := newKey(t), newKey(t)

	// No lease yet: the machine has not finished its DHCP.
	if code, body := l.enrolFrom(node, nodeKey); code != http.StatusForbidden || !strings.Contains(body, "it holds no lease for that MAC") {
		t.Fatalf("w1 before its lease: %d %s, want 403 (no lease)", code, body)
	}
	if code, body := l.enrolFrom(attacker, attackerKey); code != http.StatusForbidden || !strings.Contains(body, "no lease") {
		t.Fatalf("the attacker before w1's lease: %d %s, want 403 (no lease)", code, body)
	}

	table.set(w1MAC, "127.0.0.21") // w1's DHCP: the appliance leased it 127.0.0.21
	code, body := l.enrolFrom(attacker, attackerKey)
	if code != http.StatusForbidden || !strings.Contains(body, "the request came from 127.0.0.66, not from 127.0.0.21, the address the appliance's DHCP server leased to node w1's MAC "+w1MAC) {
		t.Fatalf("the attacker from its own address: %d %s, want 403 naming the lease", code, body)
	}
	if strings.Contains(body, l.initial["w1"]) {
		t.Fatal("the refusal carries w1's token")
	}
	if _, found, _ := ReadEnrollRecord(statedir.Enrolment(l.state), "w1"); found {
		t.Fatal("the refused request bound w1")
	}
	if code, _, _ := l.do(t.Context(), http.MethodGet, agentapi.ConfigPathV1, l.initial["w1"], ""); code != http.StatusOK {
		t.Errorf("w1's token after the refused attack: %d, want it untouched (200)", code)
	}

	code, tok := l.enrolFrom(node, nodeKey)
	if code != http.StatusOK || tok == "" || tok == l.initial["w1"] {
		t.Fatalf("w1 from its lease: %d %s, want 200 and a new token", code, tok)
	}
	rec, _, _ := ReadEnrollRecord(statedir.Enrolment(l.state), "w1")
	if rec.Source != "127.0.0.21" || rec.KeyFingerprint != keyFingerprint(nodeKey.Public().(ed25519.PublicKey)) {
		t.Errorf("binding %+v, want w1's key from 127.0.0.21", rec)
	}
	evs, _ := l.store.Events("w1")
	if !slices.ContainsFunc(evs, func(ev nodestate.Event) bool {
		return ev.Contact == nodestate.ContactEnrolRefused && strings.Contains(ev.Detail, "from 127.0.0.66") && strings.Contains(ev.Detail, "not from 127.0.0.21")
	}) {
		t.Errorf("w1's events do not record the refused attack: %+v", evs)
	}

	// The lease moves: w1 released 127.0.0.21 (from it) and leased 127.0.0.22.
	table.set(w1MAC, "127.0.0.22")
	if code, body := l.enrolFrom(node, nodeKey); code != http.StatusForbidden || !strings.Contains(body, "not from 127.0.0.22") {
		t.Errorf("a retry from the old address after the lease moved: %d %s, want 403", code, body)
	}
	moved := tlsClient("127.0.0.22")
	defer moved.CloseIdleConnections()
	if code, again := l.enrolFrom(moved, nodeKey); code != http.StatusOK || again != tok {
		t.Errorf("a retry from the new lease: %d, same token %v; want the binding's token", code, again == tok)
	}

	// The source as the front sees it on a dual-stack listener.
	e := NewEnrollment(statedir.Rendered(l.state), statedir.Enrolment(l.state), nil, l.store, nil)
	fromLease(&table)(e)
	e.PKIDir = statedir.PKI(l.state)
	req := func() agentapi.EnrollRequest {
		r := agentapi.EnrollRequest{MACs: []string{w1MAC}, SystemUUID: w1UUID, Timestamp: time.Now().UTC(), Nonce: nonce(), CAPin: testPin}
		r.Sign(nodeKey)
		return r
	}
	if _, err := e.Enroll(req(), "[::ffff:127.0.0.22]:40000"); err != nil {
		t.Errorf("from the lease as IPv4-mapped IPv6: %v, want accepted", err)
	}
	if _, err := e.Enroll(req(), "[fe80::5054:ff:fe01:6400]:40000"); HTTPStatus(err) != http.StatusForbidden || !strings.Contains(err.Error(), "over IPv6: the appliance leases IPv4 addresses only") {
		t.Errorf("from an IPv6 address: %v, want 403 saying the leases are IPv4", err)
	}
}

// TestSecondEnrolmentRaisesAlarm: w1 enrols; a second machine then claims w1 (its MAC and UUID,
// another key) from another address. It is refused 409 (no token), and the appliance raises the
// alarm once for the power-on: one error-level log record naming the node, both keys and both
// addresses and what to run, and an enrol-conflict entry in w1's history, active for `appliance
// status`. More claims, also to a restarted appliance, raise no second alarm for that power-on;
// the operator's approval of w1's key settles it; a later power-on has an alarm of its own.
func TestSecondEnrolmentRaisesAlarm(t *testing.T) {
	var logBuf syncBuffer
	l := newTokenLab(t, logTo(&logBuf))
	node, attacker := tlsClient("127.0.0.21"), tlsClient("127.0.0.66")
	defer node.CloseIdleConnections()
	defer attacker.CloseIdleConnections()
	l.powerOn()
	nodeKey := newKey(t)
	code, tok := l.enrolFrom(node, nodeKey)
	if code != http.StatusOK {
		t.Fatalf("w1's enrolment: %d %s", code, tok)
	}
	bound := keyFingerprint(nodeKey.Public().(ed25519.PublicKey))
	attackerKey := newKey(t)
	claim := keyFingerprint(attackerKey.Public().(ed25519.PublicKey))
	code, body := l.enrolFrom(attacker, attackerKey)
	if code != http.StatusConflict || !strings.Contains(body, "already enrolled with another key ("+bound+")") || !strings.Contains(body, "the appliance raised an alarm") || strings.Contains(body, tok) {
		t.Fatalf("the second enrolment: %d %s, want 409 naming the bound key and the alarm, without the token", code, body)
	}
	alarms := logRecords(t, &logBuf, "ERROR", "ALARM")
	if len(alarms) != 1 {
		t.Fatalf("%d alarm log records after the second enrolment, want 1:\n%s", len(alarms), logBuf.String())
	}
	a := alarms[0]
	for k, want := range map[string]string{"node": "w1", "boundKey": bound, "boundSource": "127.0.0.21", "claimKey": claim, "claimSource": "127.0.0.66"} {
		if a[k] != want {
			t.Errorf("alarm record %s = %v, want %s", k, a[k], want)
		}
	}
	if todo, _ := a["todo"].(string); !strings.Contains(todo, "appliance node approve w1 --fingerprint "+bound) || !strings.Contains(todo, "appliance node revoke w1 --yes") {
		t.Errorf("the alarm's todo %q does not say what to run", todo)
	}
	entry, ok := nodestate.ActiveEnrolConflict(history(t, l.store, "w1"))
	if !ok {
		t.Fatalf("no active enrol-conflict in w1's history: %+v", history(t, l.store, "w1"))
	}
	for _, want := range []string{"a second machine claims node w1", claim, "from 127.0.0.66", bound, "from 127.0.0.21", "holding the token that enrolment issued",
		"Compare the key on w1's console", "appliance node approve w1 --fingerprint " + bound, "appliance node revoke w1 --yes", "appliance node reinstall w1 --yes"} {
		if !strings.Contains(entry.Detail, want) {
			t.Errorf("the alarm %q lacks %q", entry.Detail, want)
		}
	}
	if strings.Contains(logBuf.String(), tok) || strings.Contains(entry.Detail, tok) {
		t.Error("the log or the alarm holds w1's token")
	}

	// More claims, other keys, and one to a restarted appliance: refused, no second alarm.
	for range 3 {
		if code, _ := l.enrolFrom(attacker, newKey(t)); code != http.StatusConflict {
			t.Errorf("another claim: %d, want 409", code)
		}
	}
	var restartedLog syncBuffer
	l.configure = append(l.configure, logTo(&restartedLog))
	l.restart()
	if code, _ := l.enrolFrom(attacker, newKey(t)); code != http.StatusConflict {
		t.Errorf("a claim to the restarted appliance: %d, want 409", code)
	}
	if n := len(logRecords(t, &logBuf, "ERROR", "ALARM")) + len(logRecords(t, &restartedLog, "ERROR", "ALARM")); n != 1 {
		t.Errorf("%d alarm log records for one power-on, want 1", n)
	}
	if n := countKind(history(t, l.store, "w1"), nodestate.EnrolConflict); n != 1 {
		t.Errorf("%d enrol-conflict entries for one power-on, want 1", n)
	}
	// The real machine still gets its answer.
	if code, again := l.enrolFrom(node, nodeKey); code != http.StatusOK || again != tok {
		t.Errorf("w1's retry after the claims: %d, same token %v", code, again == tok)
	}

	// The operator compares the key on w1's console and approves it: the alarm is settled.
	if _, err := ApproveEnrollment(statedir.Enrolment(l.state), "w1", bound, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := l.store.RecordLifecycle("w1", nodestate.EnrolApproved, "appliance node approve"); err != nil { // what the command records
		t.Fatal(err)
	}
	if _, ok := nodestate.ActiveEnrolConflict(history(t, l.store, "w1")); ok {
		t.Error("the alarm is still active after the approval")
	}

	// A new power-on: a new enrolment, and a claim raises a new alarm.
	time.Sleep(10 * time.Millisecond)
	l.powerOn()
	if code, _ := l.enrolFrom(node, newKey(t)); code != http.StatusOK {
		t.Fatalf("enrolment after a new power-on: %d", code)
	}
	if code, _ := l.enrolFrom(attacker, newKey(t)); code != http.StatusConflict {
		t.Fatalf("a claim in the new power-on: %d", code)
	}
	if n := countKind(history(t, l.store, "w1"), nodestate.EnrolConflict); n != 2 {
		t.Errorf("%d enrol-conflict entries after two power-ons with a claim each, want 2", n)
	}
	if _, ok := nodestate.ActiveEnrolConflict(history(t, l.store, "w1")); !ok {
		t.Error("the new power-on's alarm is not active")
	}
}

// TestEnrolmentWaitsForApproval: with the operator's approval required, w1's enrolment (from its
// lease) is answered 202 with its key fingerprint, its address and what the operator runs, and no
// token, also by a restarted appliance; w1's old token stays the only one. A second machine's claim
// meanwhile is refused and raises the alarm. An approval of another key, or of a fingerprint too
// short to compare, is refused; the approval of w1's key makes its next request get the new token,
// and the old one is refused from then on.
func TestEnrolmentWaitsForApproval(t *testing.T) {
	var table leaseTable
	table.set(w1MAC, "127.0.0.21")
	var logBuf syncBuffer
	l := newTokenLab(t, fromLease(&table), logTo(&logBuf), func(e *Enrollment) { e.RequireApproval = true })
	node, attacker := tlsClient("127.0.0.21"), tlsClient("127.0.0.66")
	defer node.CloseIdleConnections()
	defer attacker.CloseIdleConnections()
	l.powerOn()
	key := newKey(t)
	fp := keyFingerprint(key.Public().(ed25519.PublicKey))
	pending := func() agentapi.EnrollPending {
		t.Helper()
		code, retry, body := l.postEnrol(node, key)
		if code != http.StatusAccepted || retry != "5" {
			t.Fatalf("w1's enrolment: %d (Retry-After %q) %s, want 202 pending, Retry-After 5", code, retry, body)
		}
		var p agentapi.EnrollPending
		if err := json.Unmarshal([]byte(body), &p); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(body, l.initial["w1"]) || strings.Contains(body, "token") {
			t.Fatalf("the pending answer carries a token: %s", body)
		}
		return p
	}
	p := pending()
	if p.Node != "w1" || p.KeyFingerprint != fp || p.Source != "127.0.0.21" || !strings.Contains(p.Message, "appliance node approve w1 --fingerprint "+fp) {
		t.Errorf("pending answer %+v, want w1, its key, its address and the approve command", p)
	}
	if n := len(logRecords(t, &logBuf, "WARN", "enrolment pending")); n != 1 {
		t.Errorf("%d pending log records, want 1 (the binding's first answer)", n)
	}
	l.restart()
	pending() // the restarted appliance keeps the binding pending
	rec, _, _ := ReadEnrollRecord(statedir.Enrolment(l.state), "w1")
	if !rec.Pending || rec.Source != "127.0.0.21" || len(rec.Nonces) != 2 || rec.TokenSHA256 != "" {
		t.Errorf("binding %+v, want pending, from 127.0.0.21, two nonces, no token", rec)
	}
	if tok, _, _ := pki.ReadNodeToken(statedir.PKI(l.state), "w1"); tok != l.initial["w1"] {
		t.Error("a pending enrolment rotated w1's token")
	}
	evs, _ := l.store.Events("w1")
	if !slices.ContainsFunc(evs, func(ev nodestate.Event) bool { return ev.Contact == nodestate.ContactEnrolPending }) {
		t.Errorf("w1's events hold no pending contact: %+v", evs)
	}

	// A second machine claims w1 meanwhile, from the lease's address too (it took it over).
	if code, body := l.enrolFrom(node, newKey(t)); code != http.StatusConflict || !strings.Contains(body, "waits for the operator's approval") {
		t.Errorf("a second key while w1 waits: %d %s, want 409", code, body)
	}
	alarm, ok := nodestate.ActiveEnrolConflict(history(t, l.store, "w1"))
	if !ok || !strings.Contains(alarm.Detail, "waiting for the operator's approval (no token issued)") || !strings.Contains(alarm.Detail, "do not approve it") {
		t.Errorf("alarm %+v %v, want one saying the binding waits and not to approve an unknown key", alarm, ok)
	}

	dir := statedir.Enrolment(l.state)
	if _, err := ApproveEnrollment(dir, "w1", keyFingerprint(newKey(t).Public().(ed25519.PublicKey)), time.Now()); !errors.Is(err, ErrFingerprintMismatch) || !strings.Contains(err.Error(), "bound to key "+fp+" (from 127.0.0.21)") {
		t.Errorf("approving another key: %v, want ErrFingerprintMismatch naming the bound key", err)
	}
	if _, err := ApproveEnrollment(dir, "w1", fp[:len("sha256:")+8], time.Now()); !errors.Is(err, ErrFingerprintMismatch) {
		t.Errorf("approving 8 hex digits: %v, want ErrFingerprintMismatch (too short to compare)", err)
	}
	if _, err := ApproveEnrollment(dir, "cp1", "", time.Now()); !errors.Is(err, ErrNoEnrollment) {
		t.Errorf("approving a node that never enrolled: %v, want ErrNoEnrollment", err)
	}
	pending() // nothing approved yet
	if _, err := ApproveEnrollment(dir, "w1", fp[len("sha256:"):len("sha256:")+16], time.Now()); err != nil {
		t.Fatalf("approving w1's key by its first 16 hex digits: %v", err)
	}
	code, tok := l.enrolFrom(node, key)
	if code != http.StatusOK || tok == "" || tok == l.initial["w1"] {
		t.Fatalf("w1 after the approval: %d %s, want 200 with a new token", code, tok)
	}
	if code, _, _ := l.do(t.Context(), http.MethodGet, agentapi.ConfigPathV1, l.initial["w1"], ""); code != http.StatusUnauthorized {
		t.Errorf("w1's old token after the approved enrolment: %d, want 401", code)
	}
	if code, again := l.enrolFrom(node, key); code != http.StatusOK || again != tok {
		t.Errorf("a retry after the approval: %d, same token %v", code, again == tok)
	}
	rec, _, _ = ReadEnrollRecord(dir, "w1")
	if rec.Pending || rec.Approved.IsZero() {
		t.Errorf("binding after the approval %+v, want approved, not pending", rec)
	}
	if n := countKind(history(t, l.store, "w1"), nodestate.TokenRotated); n != 1 {
		t.Errorf("%d token-rotated entries, want 1 (at the approved answer)", n)
	}
}

func history(t *testing.T, s *nodestate.Store, node string) []nodestate.LifecycleEntry {
	t.Helper()
	h, err := s.History(node)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func countKind(h []nodestate.LifecycleEntry, k nodestate.LifecycleKind) int {
	n := 0
	for _, e := range h {
		if e.Kind == k {
			n++
		}
	}
	return n
}
