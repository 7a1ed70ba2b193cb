package server

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/test/logbuf"
)

const (
	testPin  = "sha256:0000000000000000000000000000000000000000000000000000000000000000"
	w1MAC    = "52:54:00:01:64:00"
	w1UUID   = "52540001-6400-4000-8000-525400016400"
	w1Config = "apiVersion: appliance.airgap.dev/v1alpha1\nkind: HostagentConfiguration\nnode: w1\ntoken: tok-w1\n"
)

// enrollFixture is an appliance's enrolment endpoint behind the real route (server.New) over a
// state dir: w1 (ipmi, MAC and system UUID configured, hostagent.yaml rendered), w2 (ipmi, MAC only,
// nothing rendered), cp1 (ssh, MAC given). The clock is the fixture's.
type enrollFixture struct {
	t     testing.TB
	h     http.Handler
	srv   *Server
	e     *Enrollment
	store *nodestate.Store
	now   time.Time
	dir   string
}

func newEnrollFixture(t testing.TB) *enrollFixture {
	t.Helper()
	dir := t.TempDir()
	rendered := filepath.Join(dir, "rendered")
	if err := os.MkdirAll(filepath.Join(rendered, "w1"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rendered, "w1", statedir.AgentConfigFile), []byte(w1Config), 0o600); err != nil {
		t.Fatal(err)
	}
	f := &enrollFixture{t: t, dir: dir, now: time.Date(2026, 11, 25, 6, 0, 0, 0, time.UTC)}
	f.store = nodestate.Open(filepath.Join(dir, "nodes"))
	f.store.Now = func() time.Time { return f.now }
	f.e = NewEnrollment(rendered, filepath.Join(dir, "enrolment"), []EnrollNode{
		{Name: "w1", BMC: true, MAC: w1MAC, SystemUUID: w1UUID, InstallArgs: w1InstallArgs},
		{Name: "w2", BMC: true, MAC: "52:54:00:02:64:00"},
		{Name: "cp1", BMC: false, MAC: "52:54:00:00:00:11"},
	}, f.store, nil)
	f.e.Now = func() time.Time { return f.now }
	s, err := New(Options{Listen: "127.0.0.1:0", Certificate: selfSigned(t), Enroll: f.e})
	if err != nil {
		t.Fatal(err)
	}
	f.h, f.srv = s.Handler(), s
	return f
}

// powerOn records what the power phase records for a BMC node it powers on.
func (f *enrollFixture) powerOn(node string) {
	f.t.Helper()
	for _, st := range []string{agentapi.StatePowering, agentapi.StateBooting} {
		if _, err := f.store.Set(node, st, ""); err != nil {
			f.t.Fatal(err)
		}
	}
}

func newKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func nonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// request is a signed request from a machine with the given MACs and UUID, made now.
func (f *enrollFixture) request(key ed25519.PrivateKey, uuid string, macs ...string) agentapi.EnrollRequest {
	r := agentapi.EnrollRequest{MACs: macs, SystemUUID: uuid, Timestamp: f.now, Nonce: nonce(), CAPin: testPin}
	r.Sign(key)
	return r
}

func (f *enrollFixture) post(body []byte) (int, string) {
	f.t.Helper()
	req := httptest.NewRequest(http.MethodPost, agentapi.EnrollPathV1, bytes.NewReader(body))
	req.RemoteAddr = "10.100.0.21:40000"
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

func (f *enrollFixture) send(r agentapi.EnrollRequest) (int, string) {
	f.t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		f.t.Fatal(err)
	}
	return f.post(b)
}

func (f *enrollFixture) lastEvent(node string) nodestate.Event {
	f.t.Helper()
	evs, err := f.store.Events(node)
	if err != nil || len(evs) == 0 {
		f.t.Fatalf("events of %s: %v %v", node, evs, err)
	}
	return evs[len(evs)-1]
}

// TestEnrollAcceptsRetriesAndRecords: the machine the appliance just powered on enrols (its MAC
// among several NICs', its SMBIOS UUID in another case); the answer is w1's rendered hostagent
// configuration; the binding is recorded 0600 with the key; a retry with the same key (new nonce)
// gets the same answer; another key is then refused 409 and the refusal is in w1's events.
// w1InstallArgs are w1's install parameters in the enrolment answer (public words, as
// applianced.enrollInstallArgs makes them).
var w1InstallArgs = []string{"appliance.rootdevice.serialNumber=LAB-DISK-w1", "appliance.address=10.100.0.21/24", "appliance.mac=" + w1MAC}

func TestEnrollAcceptsRetriesAndRecords(t *testing.T) {
	f := newEnrollFixture(t)
	f.powerOn("w1")
	f.now = f.now.Add(2 * time.Minute)
	key := newKey(t)
	code, body := f.send(f.request(key, strings.ToUpper(w1UUID), "52:54:00:01:c8:00", "52:54:00:01:64:00"))
	if code != http.StatusOK {
		t.Fatalf("enrol: %d %s", code, body)
	}
	var resp agentapi.EnrollResponse
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	fp := keyFingerprint(key.Public().(ed25519.PublicKey))
	if resp.Node != "w1" || resp.HostagentConfig != w1Config || resp.KeyFingerprint != fp || !slices.Equal(resp.InstallArgs, w1InstallArgs) {
		t.Errorf("answer %+v, want w1's hostagent.yaml, key %s and install args %q", resp, fp, w1InstallArgs)
	}
	recPath := filepath.Join(f.dir, "enrolment", "w1.json")
	st, err := os.Stat(recPath)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("record %s: %v %v, want mode 0600", recPath, st, err)
	}
	rec, found, err := f.e.ReadRecord("w1")
	if err != nil || !found || rec.KeyFingerprint != fp || rec.SystemUUID != w1UUID || len(rec.Nonces) != 1 ||
		!rec.PoweredOn.Equal(f.now.Add(-2*time.Minute)) || !rec.Enrolled.Equal(f.now) {
		t.Errorf("record %+v found=%v err=%v", rec, found, err)
	}
	if ev := f.lastEvent("w1"); !strings.Contains(ev.Detail, "enrolled with key "+fp) || ev.State != agentapi.StateBooting {
		t.Errorf("last event %+v, want the enrolment noted with the state unchanged", ev)
	}
	if s, _ := f.store.Get("w1"); s.State != agentapi.StateBooting {
		t.Errorf("w1 is %s after enrolling, want booting (a note changes no state)", s.State)
	}

	// A lost response: the machine retries with the same key, a new nonce, a minute later.
	f.now = f.now.Add(time.Minute)
	code, body2 := f.send(f.request(key, w1UUID, w1MAC))
	var resp2 agentapi.EnrollResponse
	_ = json.Unmarshal([]byte(body2), &resp2)
	if code != http.StatusOK || !reflect.DeepEqual(resp2, resp) {
		t.Fatalf("retry with the same key: %d %s, want the same answer", code, body2)
	}
	if rec, _, _ := f.e.ReadRecord("w1"); len(rec.Nonces) != 2 || !rec.Enrolled.Equal(f.now.Add(-time.Minute)) || !rec.Answered.Equal(f.now) {
		t.Errorf("record after the retry %+v, want 2 nonces, first enrolment time kept", rec)
	}

	// A second machine claiming w1's identity (its MAC and UUID) with its own key.
	code, body = f.send(f.request(newKey(t), w1UUID, w1MAC))
	if code != http.StatusConflict || !strings.Contains(body, "already enrolled with another key ("+fp+")") {
		t.Errorf("another key: %d %s, want 409 naming the bound key", code, body)
	}
	if ev := f.lastEvent("w1"); !strings.Contains(ev.Detail, "enrolment refused") || !strings.Contains(ev.Detail, "another key") {
		t.Errorf("last event %+v, want the refusal recorded", ev)
	}
	if strings.Contains(body, "tok-w1") {
		t.Error("a refusal carries the token")
	}
}

// TestEnrollRefusals: each way a request is wrong gets its own 4xx saying what to fix, and never
// names a node the requester did not prove (by a MAC) nor carries a token; the refusals for a
// proven node are in its events.
func TestEnrollRefusals(t *testing.T) {
	f := newEnrollFixture(t)
	f.powerOn("w1")
	f.powerOn("w2")
	key := newKey(t)
	good := func() agentapi.EnrollRequest { return f.request(key, w1UUID, w1MAC) }
	tests := []struct {
		name    string
		req     func() agentapi.EnrollRequest
		code    int
		msg     string
		noteFor string // node whose events record the refusal; "" none
	}{
		{"unknown MAC", func() agentapi.EnrollRequest { return f.request(key, w1UUID, "52:54:00:09:09:09") },
			http.StatusForbidden, "no node of the inventory has one of the MACs 52:54:00:09:09:09", ""},
		{"MACs of two nodes", func() agentapi.EnrollRequest { return f.request(key, w1UUID, w1MAC, "52:54:00:02:64:00") },
			http.StatusForbidden, "more than one node", ""},
		{"mismatched system UUID", func() agentapi.EnrollRequest {
			return f.request(key, "52540001-6400-4000-8000-000000000000", w1MAC)
		}, http.StatusForbidden, "SMBIOS system UUID (52540001-6400-4000-8000-000000000000) is not node w1's nodes[].systemUUID", "w1"},
		{"no system UUID where one is configured", func() agentapi.EnrollRequest { return f.request(key, "", w1MAC) },
			http.StatusForbidden, "system UUID (none) is not node w1's", "w1"},
		{"ssh node", func() agentapi.EnrollRequest { return f.request(key, "", "52:54:00:00:00:11") },
			http.StatusForbidden, "node cp1 is not BMC-powered", "cp1"},
		{"bad signature", func() agentapi.EnrollRequest {
			r := good()
			r.MACs = append(r.MACs, "52:54:00:01:c8:00") // changed after signing
			return r
		}, http.StatusBadRequest, "signature: does not verify", ""},
		{"signed by another key", func() agentapi.EnrollRequest {
			r := good()
			r.PublicKey = base64.StdEncoding.EncodeToString(newKey(t).Public().(ed25519.PublicKey))
			return r
		}, http.StatusBadRequest, "proof of possession failed", ""},
		{"timestamp too old", func() agentapi.EnrollRequest {
			r := agentapi.EnrollRequest{MACs: []string{w1MAC}, SystemUUID: w1UUID, Timestamp: f.now.Add(-11 * time.Minute), Nonce: nonce(), CAPin: testPin}
			r.Sign(key)
			return r
		}, http.StatusForbidden, "from the appliance's clock", ""},
		{"timestamp in the future", func() agentapi.EnrollRequest {
			r := agentapi.EnrollRequest{MACs: []string{w1MAC}, SystemUUID: w1UUID, Timestamp: f.now.Add(11 * time.Minute), Nonce: nonce(), CAPin: testPin}
			r.Sign(key)
			return r
		}, http.StatusForbidden, "set the machine's clock", ""},
		{"short nonce", func() agentapi.EnrollRequest {
			r := agentapi.EnrollRequest{MACs: []string{w1MAC}, SystemUUID: w1UUID, Timestamp: f.now, Nonce: "abc", CAPin: testPin}
			r.Sign(key)
			return r
		}, http.StatusBadRequest, "nonce: want 16 or more random bytes", ""},
		{"bad MAC", func() agentapi.EnrollRequest { return f.request(key, w1UUID, "52:54:00") },
			http.StatusBadRequest, `macs[0]: "52:54:00" is not a 48-bit MAC`, ""},
		{"no MAC", func() agentapi.EnrollRequest { return f.request(key, w1UUID) },
			http.StatusBadRequest, "macs: want 1 to 64 MAC addresses", ""},
		{"bad UUID", func() agentapi.EnrollRequest { return f.request(key, "not-a-uuid", w1MAC) },
			http.StatusBadRequest, `systemUUID: "not-a-uuid" is not a UUID`, ""},
		{"bad pin", func() agentapi.EnrollRequest {
			r := agentapi.EnrollRequest{MACs: []string{w1MAC}, Timestamp: f.now, Nonce: nonce(), CAPin: "md5:00"}
			r.Sign(key)
			return r
		}, http.StatusBadRequest, "caPin:", ""},
		{"nothing rendered for the node", func() agentapi.EnrollRequest { return f.request(key, "", "52:54:00:02:64:00") },
			http.StatusNotFound, "no hostagent configuration rendered for node w2", "w2"},
	}
	for _, tc := range tests {
		// A minute apart: the same rule refusing the same node is noted once a minute (the two
		// system UUID cases), TestEnrollRefusalFloodNotedOnce.
		f.now = f.now.Add(nodestate.DefaultNoteEvery)
		t.Run(tc.name, func(t *testing.T) {
			var before int
			if tc.noteFor != "" {
				evs, _ := f.store.Events(tc.noteFor)
				before = len(evs)
			}
			code, body := f.send(tc.req())
			if code != tc.code || !strings.Contains(body, tc.msg) {
				t.Errorf("%d %q, want %d with %q", code, body, tc.code, tc.msg)
			}
			for _, other := range []string{"w1", "w2", "cp1"} {
				if other != tc.noteFor && strings.Contains(body, other) {
					t.Errorf("the refusal names %s, which the request did not prove: %s", other, body)
				}
			}
			if strings.Contains(body, "tok-") {
				t.Errorf("a refusal carries a token: %s", body)
			}
			if tc.noteFor != "" {
				evs, _ := f.store.Events(tc.noteFor)
				if len(evs) != before+1 || !strings.Contains(evs[len(evs)-1].Detail, "enrolment refused") {
					t.Errorf("events of %s: %d → %d, want the refusal recorded", tc.noteFor, before, len(evs))
				}
			}
		})
	}
	// None of the above bound w1 to anything.
	if _, found, _ := f.e.ReadRecord("w1"); found {
		t.Error("a refused request left a binding")
	}
}

// TestEnrollReplayWindowAndOnce: a captured request replayed byte for byte is refused (also by a
// restarted appliance, from the record); a node the appliance did not power on, or powered on
// longer ago than the window, or that has reported since its power-on, is refused; a new power-on
// opens a new window in which another key may enrol.
func TestEnrollReplayWindowAndOnce(t *testing.T) {
	f := newEnrollFixture(t)
	key := newKey(t)

	code, body := f.send(f.request(key, w1UUID, w1MAC))
	if code != http.StatusForbidden || !strings.Contains(body, "the appliance has not powered node w1 on") {
		t.Errorf("never powered on: %d %s", code, body)
	}

	f.powerOn("w1")
	req, _ := json.Marshal(f.request(key, w1UUID, w1MAC))
	if code, body := f.post(req); code != http.StatusOK {
		t.Fatalf("enrol: %d %s", code, body)
	}
	if code, body := f.post(req); code != http.StatusForbidden || !strings.Contains(body, "nonce already used (a replayed request)") {
		t.Errorf("replay: %d %s", code, body)
	}
	// A restarted appliance (new Enrollment, empty replay cache) still refuses it: the record has the nonce.
	restarted := NewEnrollment(f.e.Dir, f.e.RecordDir, []EnrollNode{{Name: "w1", BMC: true, MAC: w1MAC, SystemUUID: w1UUID}}, f.store, nil)
	restarted.Now = f.e.Now
	rr := httptest.NewRecorder()
	restarted.ServeHTTP(rr, httptest.NewRequest(http.MethodPost, agentapi.EnrollPathV1, bytes.NewReader(req)))
	if rr.Code != http.StatusForbidden || !strings.Contains(rr.Body.String(), "replayed") {
		t.Errorf("replay to a restarted appliance: %d %s", rr.Code, rr.Body.String())
	}

	// w1's hostagent reports: from then on nobody enrols as w1, not even with its key.
	if _, _, err := f.store.Record("w1", nil, agentapi.Report{BootID: "b1", Step: agentapi.StepConfig, Status: agentapi.StatusDone, Time: f.now}); err != nil {
		t.Fatal(err)
	}
	if code, body := f.send(f.request(key, w1UUID, w1MAC)); code != http.StatusConflict || !strings.Contains(body, "already enrolled and its hostagent has reported") {
		t.Errorf("after a report: %d %s", code, body)
	}

	// A new power-on: another machine key may enrol (the node was reinstalled or replaced).
	f.now = f.now.Add(time.Hour)
	f.powerOn("w1")
	key2 := newKey(t)
	if code, body := f.send(f.request(key2, w1UUID, w1MAC)); code != http.StatusOK {
		t.Fatalf("after a new power-on: %d %s", code, body)
	}
	if rec, _, _ := f.e.ReadRecord("w1"); rec.KeyFingerprint != keyFingerprint(key2.Public().(ed25519.PublicKey)) || len(rec.Nonces) != 1 {
		t.Errorf("record after the new power-on %+v, want key2", rec)
	}

	// Past the window: refused, even with the bound key.
	f.now = f.now.Add(agentapi.EnrollWindow + time.Second)
	if code, body := f.send(f.request(key2, w1UUID, w1MAC)); code != http.StatusForbidden || !strings.Contains(body, "more than 30m0s ago") {
		t.Errorf("outside the window: %d %s", code, body)
	}
}

// TestEnrollHTTPShape: the endpoint takes POST only; bodies that are not one JSON EnrollRequest of
// at most MaxEnrollBytes, or carry unknown fields, get 400; none of them a 5xx.
func TestEnrollHTTPShape(t *testing.T) {
	f := newEnrollFixture(t)
	req := httptest.NewRequest(http.MethodGet, agentapi.EnrollPathV1, nil)
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != http.MethodPost {
		t.Errorf("GET: %d Allow %q", rec.Code, rec.Header().Get("Allow"))
	}
	for name, body := range map[string]string{
		"not JSON":      "hello",
		"two objects":   `{"nonce":"x"} {}`,
		"unknown field": `{"token":"x"}`,
		"too large":     `{"macs":["` + strings.Repeat("a", agentapi.MaxEnrollBytes) + `"]}`,
		"empty":         "",
		"array":         "[]",
	} {
		if code, msg := f.post([]byte(body)); code != http.StatusBadRequest || !strings.Contains(msg, "bad enrolment request") {
			t.Errorf("%s: %d %s, want 400", name, code, msg)
		}
	}
}

// FuzzEnroll: whatever the body, the answer is never a 5xx, nor a 200 (the fuzzer cannot sign).
func FuzzEnroll(f *testing.F) {
	f.Add([]byte(`{"publicKey":"","macs":["52:54:00:01:64:00"],"timestamp":"2026-11-25T06:00:00Z","nonce":"AAAAAAAAAAAAAAAAAAAAAA","caPin":"` + testPin + `","signature":""}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"macs":null,"timestamp":"x"}`))
	fx := newEnrollFixture(f)
	fx.powerOn("w1")
	f.Fuzz(func(t *testing.T, body []byte) {
		fx.t = t
		code, msg := fx.post(body)
		if code >= 500 || code == http.StatusOK {
			t.Fatalf("body %q: %d %s", body, code, msg)
		}
	})
}

// TestEnrollRefusalNotedOncePerMinute: a machine retrying the same refused request in a loop adds one
// event to the node's record per minute, not one per request (events.jsonl must not grow without
// bound); every request still gets its 4xx.
func TestEnrollRefusalNotedOncePerMinute(t *testing.T) {
	f := newEnrollFixture(t)
	key := newKey(t)
	count := func() int {
		evs, _ := f.store.Events("w1")
		return len(evs)
	}
	for i := 0; i < 5; i++ {
		if code, body := f.send(f.request(key, w1UUID, w1MAC)); code != http.StatusForbidden {
			t.Fatalf("request %d: %d %s, want 403 (not powered on)", i, code, body)
		}
	}
	if n := count(); n != 1 {
		t.Errorf("%d events after 5 identical refusals, want 1", n)
	}
	f.now = f.now.Add(nodestate.DefaultNoteEvery)
	if code, _ := f.send(f.request(key, w1UUID, w1MAC)); code != http.StatusForbidden {
		t.Fatal("not refused")
	}
	if n := count(); n != 2 {
		t.Errorf("%d events a minute later, want 2", n)
	}
}

// TestEnrollRefusalFloodNotedOnce is the attack of anyone who knows a node's MAC (it is on a label
// and in every DHCP packet): a flood of enrolment requests over the real TLS listener, each signed
// with a new key and claiming another SMBIOS UUID, so that no two requests are alike. They are all
// refused, and the node's events gain one note per refusal rule per minute, whatever the requests
// carry (before, the note's key held the requester's key fingerprint and the refusal text with the
// UUID in it: every request added a line to events.jsonl); the appliance's log gains one line per
// source and rule per minute.
func TestEnrollRefusalFloodNotedOnce(t *testing.T) {
	f := newEnrollFixture(t)
	var logBuf syncBuffer
	f.e.Log = slog.New(slog.NewTextHandler(&logBuf, nil))
	addr := serveTLSFront(t, f.srv)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the refusals are what is tested
	defer hc.CloseIdleConnections()
	const flood = 300
	codes := map[int]int{}
	for i := range flood {
		uuid := fmt.Sprintf("52540001-6400-4000-8000-%012d", i) // another machine each time, w1's MAC
		body, _ := json.Marshal(f.request(newKey(t), uuid, w1MAC))
		resp, err := hc.Post("https://"+addr+agentapi.EnrollPathV1, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	for code, n := range codes {
		if code != http.StatusForbidden && code != http.StatusTooManyRequests {
			t.Errorf("%d answers %d, want 403 (refused) or 429 (rate-limited)", n, code)
		}
	}
	evs, err := f.store.Events("w1")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Contact != nodestate.ContactEnrolRefused {
		t.Errorf("%d events after %d refused requests (%v), want 1 note", len(evs), flood, codes)
	}
	// One line per source and refusal rule: the UUID's, and the source's rate limit.
	if n := strings.Count(logBuf.String(), `msg="enrolment refused`); n != 1+min(1, codes[http.StatusTooManyRequests]) {
		t.Errorf("%d log lines for %d refusals from one source, want one per rule:\n%.2000s", n, flood, logBuf.String())
	}
}

// BenchmarkEnroll is the appliance's cost of one accepted enrolment request (a retry with the bound
// key: JSON decode, Ed25519 verify, the node's events read, the record rewritten and fsynced, a note
// appended), requests signed beforehand.
func BenchmarkEnroll(b *testing.B) {
	f := newEnrollFixture(b)
	f.powerOn("w1")
	key := newKey(b)
	bodies := make([][]byte, b.N)
	for i := range bodies {
		bodies[i], _ = json.Marshal(f.request(key, w1UUID, w1MAC))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if code, body := f.post(bodies[i]); code != http.StatusOK {
			b.Fatalf("%d %s", code, body)
		}
	}
}

// syncBuffer is a log sink safe for concurrent writers (test/logbuf).
type syncBuffer = logbuf.Buffer
