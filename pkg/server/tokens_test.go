package server

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/ignition"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// tokenLab is an appliance state directory as `appliance bootstrap` leaves it for one BMC node w1
// and one SSH node cp1 (tokens from pki.EnsureNodeTokens; w1's hostagent.yaml, node config and
// Ignition configs rendered with its token by pkg/ignition), and the HTTPS front over it assembled
// as `appliance serve` assembles it (frontAsServe), on a real TLS listener.
type tokenLab struct {
	t       *testing.T
	state   string
	store   *nodestate.Store
	url     string
	hc      *http.Client
	initial map[string]string // the tokens the pki phase made
	cert    tls.Certificate
	// configure is applied to the enrolment endpoint of every front (newTokenLab's arguments).
	configure []func(*Enrollment)
}

// newTokenLab makes the lab; each of configure is applied to the front's enrolment endpoint (as
// applianced.Serve sets it from the configuration) before it serves.
func newTokenLab(t *testing.T, configure ...func(*Enrollment)) *tokenLab {
	t.Helper()
	state := t.TempDir()
	tokens, _, err := pki.EnsureNodeTokens(statedir.PKI(state), []string{"w1", "cp1"})
	if err != nil {
		t.Fatal(err)
	}
	caPEM, cert := pkitest.Issue(t)
	for _, node := range []string{"w1", "cp1"} {
		cfg, err := agentapi.Configuration{Node: node, Roles: []string{"worker"}, ApplianceURL: "https://10.100.0.1:8443", CAPin: testPin, Token: tokens[node]}.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		doc, err := ignition.Render(ignition.Params{Node: node, ApplianceURL: "https://10.100.0.1:8443", CAPEM: caPEM,
			HostagentURL: "https://10.100.0.1:8443/artifacts/hostagent", HostagentSHA256: strings.Repeat("ab", 32), HostagentConfig: cfg})
		if err != nil {
			t.Fatal(err)
		}
		ign, _, err := doc.Marshal("3.3.0")
		if err != nil {
			t.Fatal(err)
		}
		nc, _ := json.Marshal(agentapi.NodeConfig{Node: node, Roles: []string{"worker"}, CAPEM: string(caPEM)})
		dir := statedir.RenderedNode(state, node)
		for name, data := range map[string][]byte{statedir.AgentConfigFile: cfg, statedir.NodeConfigFile: nc, filepath.Join(statedir.IgnitionDir, "3.3.0.json"): ign} {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	l := &tokenLab{t: t, state: state, store: nodestate.Open(statedir.Nodes(state)), hc: tlsClient(""), initial: tokens, cert: cert, configure: configure}
	l.url = "https://" + serveTLSFront(t, frontAsServe(t, state, cert, l.store, configure...))
	t.Cleanup(l.hc.CloseIdleConnections)
	return l
}

// restart serves a new front over the same state directory, as a restarted `appliance serve` (nothing
// kept in memory: replay cache, throttles, alarms raised), and sends the lab's requests to it.
func (l *tokenLab) restart() {
	l.t.Helper()
	l.url = "https://" + serveTLSFront(l.t, frontAsServe(l.t, l.state, l.cert, l.store, l.configure...))
}

// frontAsServe assembles the front over state as pkg/applianced.Serve does: one NodeTokensIn for the
// agent API and the Ignition store, the enrolment rotating tokens in STATE/pki; then each of
// configure is applied to the enrolment endpoint.
func frontAsServe(t *testing.T, state string, cert tls.Certificate, store *nodestate.Store, configure ...func(*Enrollment)) *Server {
	t.Helper()
	nodes := []string{"w1", "cp1"}
	tokens := NodeTokensIn(statedir.PKI(state), nodes)
	agent := NewAgentAPI(statedir.Rendered(state), nil, store, nil)
	agent.UseTokens(tokens)
	ign := NewIgnitionStore(statedir.Rendered(state), nil)
	ign.UseTokens(tokens)
	enroll := NewEnrollment(statedir.Rendered(state), statedir.Enrolment(state), []EnrollNode{
		{Name: "w1", BMC: true, MAC: w1MAC, SystemUUID: w1UUID},
		{Name: "cp1", BMC: false},
	}, store, nil)
	enroll.PKIDir = statedir.PKI(state)
	for _, c := range configure {
		c(enroll)
	}
	s, err := New(Options{Listen: "127.0.0.1:0", Certificate: cert, Ignition: ign, Agent: agent, Enroll: enroll})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// powerOn records what the power phase (or `appliance node reinstall`) records when it powers w1 on.
func (l *tokenLab) powerOn() {
	l.t.Helper()
	for _, st := range []string{agentapi.StatePowering, agentapi.StateBooting} {
		if _, err := l.store.Set("w1", st, ""); err != nil {
			l.t.Fatal(err)
		}
	}
}

// enrol enrols w1 over HTTPS with key and returns the token of the answer (the body when it is not 200).
func (l *tokenLab) enrol(key ed25519.PrivateKey) (int, string) {
	l.t.Helper()
	return l.enrolFrom(l.hc, key)
}

// enrolFrom is enrol through hc (a client whose connections come from a given address: tlsClient).
func (l *tokenLab) enrolFrom(hc *http.Client, key ed25519.PrivateKey) (int, string) {
	l.t.Helper()
	code, _, body := l.postEnrol(hc, key)
	if code != http.StatusOK {
		return code, body
	}
	var resp agentapi.EnrollResponse
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		l.t.Fatal(err)
	}
	cfg, err := agentapi.Parse([]byte(resp.HostagentConfig))
	if err != nil {
		l.t.Fatal(err)
	}
	return code, cfg.Token
}

// postEnrol sends w1's enrolment request signed with key through hc and returns the status, the
// Retry-After header and the body.
func (l *tokenLab) postEnrol(hc *http.Client, key ed25519.PrivateKey) (int, string, string) {
	l.t.Helper()
	r := agentapi.EnrollRequest{MACs: []string{w1MAC}, SystemUUID: w1UUID, Timestamp: time.Now().UTC(), Nonce: nonce(), CAPin: testPin}
	r.Sign(key)
	b, _ := json.Marshal(r)
	req, err := http.NewRequest(http.MethodPost, l.url+agentapi.EnrollPathV1, strings.NewReader(string(b)))
	if err != nil {
		l.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		l.t.Fatalf("POST %s: %v", agentapi.EnrollPathV1, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(body)
}

// do sends one request with token as its bearer token ("" none) and returns status, ETag and body.
func (l *tokenLab) do(ctx context.Context, method, path, token, body string) (int, string, string) {
	l.t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, l.url+path, strings.NewReader(body))
	if err != nil {
		l.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := l.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, "", ctx.Err().Error()
		}
		l.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("ETag"), string(b)
}

// report is a valid hostagent report of w1.
func report(step string) string {
	b, _ := json.Marshal(agentapi.Report{BootID: "boot-1", Step: step, Status: agentapi.StatusDone, Time: time.Now().UTC()})
	return string(b)
}

// endpoints are the token-authenticated requests of w1: agent config, report, install notice,
// Ignition config.
func (l *tokenLab) endpoints() []struct{ method, path, body string } {
	return []struct{ method, path, body string }{
		{http.MethodGet, agentapi.ConfigPathV1, ""},
		{http.MethodPost, agentapi.ReportPathV1, report(agentapi.StepConfig)},
		{http.MethodPost, agentapi.InstalledPathV1, `{"mac":"` + w1MAC + `"}`},
		{http.MethodGet, "/ignition/w1", ""},
	}
}

// TestTokenReplayAfterReinstallRefused is the attack of issue 34 item 2: w1 enrols and gets a token;
// someone copies it (from the installed disk, a captured Ignition config, a decommissioned
// machine); the operator reinstalls w1 (a new power-on, a new enrolment with a new key). The copied
// token, replayed against the running front, must be refused at once on every endpoint, with a
// 401 that says it was replaced; the re-enrolled machine's token works, and the Ignition config
// served with it carries it (not the old one).
func TestTokenReplayAfterReinstallRefused(t *testing.T) {
	l := newTokenLab(t)
	l.powerOn()
	code, old := l.enrol(newKey(t))
	if code != http.StatusOK || old == "" {
		t.Fatalf("first enrolment: %d %s", code, old)
	}
	if code, _, body := l.do(context.Background(), http.MethodGet, agentapi.ConfigPathV1, old, ""); code != http.StatusOK {
		t.Fatalf("the enrolled token: GET config %d %s", code, body)
	}
	if code, _, body := l.do(context.Background(), http.MethodGet, "/ignition/w1", old, ""); code != http.StatusOK || !strings.Contains(body, old) {
		t.Fatalf("the enrolled token: GET /ignition/w1 %d, carries the token: %v", code, strings.Contains(body, old))
	}

	// Reinstall: the appliance powers w1 on again, the freshly booted machine enrols with a new key.
	time.Sleep(10 * time.Millisecond) // a later power-on than the first
	l.powerOn()
	code, fresh := l.enrol(newKey(t))
	if code != http.StatusOK {
		t.Fatalf("re-enrolment after the reinstall: %d %s", code, fresh)
	}

	// The replay: every endpoint refuses the copied token.
	for _, e := range l.endpoints() {
		code, _, body := l.do(context.Background(), e.method, e.path, old, e.body)
		if code != http.StatusUnauthorized {
			t.Errorf("replayed token after the reinstall: %s %s answered %d, want 401", e.method, e.path, code)
			continue
		}
		if !strings.Contains(body, "replaced") || strings.Contains(body, fresh) {
			t.Errorf("replayed token: %s %s: 401 %q; want it to say the token was replaced, and no token", e.method, e.path, body)
		}
	}
	if fresh == old {
		t.Fatal("the re-enrolment answered the token of the first enrolment: tokens are never rotated")
	}
	if code, _, body := l.do(context.Background(), http.MethodGet, agentapi.ConfigPathV1, fresh, ""); code != http.StatusOK {
		t.Errorf("the new token: GET config %d %s", code, body)
	}
	code, _, body := l.do(context.Background(), http.MethodGet, "/ignition/w1", fresh, "")
	if code != http.StatusOK || !strings.Contains(body, fresh) || strings.Contains(body, old) {
		t.Errorf("the new token: GET /ignition/w1 %d; carries the new token %v, the old one %v; want the new one only",
			code, strings.Contains(body, fresh), strings.Contains(body, old))
	}
	if tok, _, _ := pki.ReadNodeToken(statedir.PKI(l.state), "w1"); tok != fresh {
		t.Error("STATE/pki/tokens/w1 does not hold the token the enrolment answered")
	}
	hist, err := l.store.History("w1")
	rotations := 0
	for _, e := range hist {
		if e.Kind == nodestate.TokenRotated {
			rotations++
			if strings.Contains(e.Detail, fresh) || strings.Contains(e.Detail, old) {
				t.Errorf("history entry %q holds a token", e.Detail)
			}
		}
	}
	if err != nil || rotations != 2 {
		t.Errorf("w1's history: %d token-rotated entries (%v), want 2 (one per enrolment)", rotations, err)
	}
	// The other node is untouched.
	if code, _, _ := l.do(context.Background(), http.MethodGet, agentapi.ConfigPathV1, l.initial["cp1"], ""); code != http.StatusOK {
		t.Errorf("cp1's token after w1's reinstall: %d, want 200", code)
	}
}

// TestRevokedTokenRefusedEverywhere: a retry of w1's enrolment with its key is answered the same
// token; after `appliance node revoke` (pki.RevokeNodeToken) that token
// is refused on every authenticated endpoint, a config watch it opened before ends with that 401,
// and a retry of its enrolment with the same key (within the window) does not bring a token back.
func TestRevokedTokenRefusedEverywhere(t *testing.T) {
	l := newTokenLab(t)
	l.powerOn()
	key := newKey(t)
	code, tok := l.enrol(key)
	if code != http.StatusOK {
		t.Fatalf("enrolment: %d %s", code, tok)
	}
	if code, again := l.enrol(key); code != http.StatusOK || again != tok {
		t.Fatalf("a retry of the enrolment with the same key: %d, same token %v; want the token the binding issued", code, again == tok)
	}
	_, etag, _ := l.do(context.Background(), http.MethodGet, agentapi.ConfigPathV1, tok, "")
	watch := make(chan [2]string, 1)
	go func() {
		code, _, body := l.do(context.Background(), http.MethodGet, agentapi.ConfigPathV1+"?"+agentapi.ConfigWaitParam+"="+etag, tok, "")
		watch <- [2]string{http.StatusText(code), body}
	}()
	time.Sleep(700 * time.Millisecond) // the watch is held
	select {
	case w := <-watch:
		t.Fatalf("the watch answered before the revocation: %v", w)
	default:
	}

	if had, err := pki.RevokeNodeToken(statedir.PKI(l.state), "w1"); err != nil || !had {
		t.Fatalf("revoke: %v %v", had, err)
	}
	select {
	case w := <-watch:
		if w[0] != http.StatusText(http.StatusUnauthorized) || !strings.Contains(w[1], "revoked") {
			t.Errorf("the open watch ended with %s %q, want 401 saying the token was revoked", w[0], w[1])
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch opened with the revoked token is still held 5 s after the revocation")
	}
	for _, e := range l.endpoints() {
		code, _, body := l.do(context.Background(), e.method, e.path, tok, e.body)
		if code != http.StatusUnauthorized || !strings.Contains(body, "revoked") {
			t.Errorf("revoked token: %s %s answered %d %q, want 401 saying it was revoked", e.method, e.path, code, body)
		}
	}
	if code, body := l.enrol(key); code != http.StatusConflict || !strings.Contains(body, "revoked or replaced") || !strings.Contains(body, "appliance node reinstall w1") {
		t.Errorf("a retry of the enrolment after the revocation: %d %q, want 409 naming the reinstall", code, body)
	}
	if _, found, _ := pki.ReadNodeToken(statedir.PKI(l.state), "w1"); found {
		t.Error("the refused enrolment retry made a token")
	}
	// A reinstall (a new power-on) enrols anew.
	time.Sleep(10 * time.Millisecond)
	l.powerOn()
	if code, fresh := l.enrol(newKey(t)); code != http.StatusOK || fresh == tok {
		t.Errorf("enrolment after a new power-on: %d, new token %v", code, fresh != tok)
	}
}

// TestRotationSeenAtOnce: tokens rotated out of the process (`appliance node reinstall` runs
// pki.RotateNodeToken while serve runs) back to back, each followed at once by a request with the
// new token and one with the old: the new one is accepted and the old one refused every time,
// however quickly the rotations follow each other (within one tick of the file system's clock), and a
// watch opened with a token ends with a 401 once it is rotated.
func TestRotationSeenAtOnce(t *testing.T) {
	l := newTokenLab(t)
	old := l.initial["w1"]
	for i := range 20 {
		tok, err := pki.RotateNodeToken(statedir.PKI(l.state), "w1")
		if err != nil {
			t.Fatal(err)
		}
		if code, _, body := l.do(context.Background(), http.MethodGet, agentapi.ConfigPathV1, tok, ""); code != http.StatusOK {
			t.Fatalf("rotation %d: the new token answered %d %s", i, code, body)
		}
		if code, _, _ := l.do(context.Background(), http.MethodGet, "/ignition/w1", old, ""); code != http.StatusUnauthorized {
			t.Fatalf("rotation %d: the previous token got %d from /ignition/w1", i, code)
		}
		if code, _, body := l.do(context.Background(), http.MethodGet, "/ignition/w1", tok, ""); code != http.StatusOK || !strings.Contains(body, tok) {
			t.Fatalf("rotation %d: /ignition/w1 with the new token %d, carries it %v", i, code, strings.Contains(body, tok))
		}
		old = tok
	}

	_, etag, _ := l.do(context.Background(), http.MethodGet, agentapi.ConfigPathV1, old, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan int, 1)
	go func() {
		code, _, _ := l.do(ctx, http.MethodGet, agentapi.ConfigPathV1+"?"+agentapi.ConfigWaitParam+"="+etag, old, "")
		done <- code
	}()
	time.Sleep(700 * time.Millisecond)
	if _, err := pki.RotateNodeToken(statedir.PKI(l.state), "w1"); err != nil {
		t.Fatal(err)
	}
	if code := <-done; code != http.StatusUnauthorized {
		t.Errorf("a watch whose token was rotated answered %d, want 401", code)
	}
}
