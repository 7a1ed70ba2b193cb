package server

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// newAgentServer is a Server with the Ignition store and agent API over one rendered dir where
// cp1 has a node config and cp2 has none.
func newAgentServer(t *testing.T) (*Server, *nodestate.Store, string) {
	t.Helper()
	dir := t.TempDir()
	rendered := filepath.Join(dir, "rendered")
	nc, _ := json.Marshal(agentapi.NodeConfig{Node: "cp1", Roles: []string{"worker"}, CAPEM: "PEM"})
	if err := os.MkdirAll(filepath.Join(rendered, "cp1"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rendered, "cp1", statedir.NodeConfigFile), nc, 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{"cp1": "tok-cp1", "cp2": "tok-cp2"}
	store := nodestate.Open(filepath.Join(dir, "nodes"))
	s, err := New(Options{
		Listen: "127.0.0.1:0", Certificate: selfSigned(t),
		Ignition: NewIgnitionStore(rendered, tokens),
		Agent:    NewAgentAPI(rendered, tokens, store, nil),
		CAPEM:    []byte("-----BEGIN CERTIFICATE-----\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, store, dir
}

func doBody(t *testing.T, h http.Handler, method, target, token, body string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

// TestAgentAuthAnswers: every bad credential gets one and the same 401 from the agent API (a caller
// learns nothing about which nodes exist), and that answer names what the agent API accepts (the
// Authorization header; never ?token=), and /ignition/'s 401 likewise names the header alone. Both
// challenge with the Bearer scheme (RFC 6750 §3).
func TestAgentAuthAnswers(t *testing.T) {
	s, _, _ := newAgentServer(t)
	h := s.Handler()
	igCode, igBody, igHdr := do(t, h, "GET", "/ignition/cp1", map[string]string{"Authorization": "Bearer wrong"})
	if igCode != http.StatusUnauthorized || !strings.Contains(igBody, "Authorization: Bearer") || strings.Contains(igBody, "?token=") ||
		!strings.HasPrefix(igHdr.Get("WWW-Authenticate"), "Bearer ") {
		t.Errorf("ignition with a wrong token: %d %q %q", igCode, igBody, igHdr.Get("WWW-Authenticate"))
	}
	var first string
	for _, tc := range []struct{ name, method, path, hdr string }{
		{"no token", "GET", agentapi.ConfigPathV1, ""},
		{"wrong token", "GET", agentapi.ConfigPathV1, "Bearer wrong"},
		{"empty bearer", "GET", agentapi.ConfigPathV1, "Bearer "},
		{"scheme only", "GET", agentapi.ConfigPathV1, "Bearer"},
		{"basic auth", "GET", agentapi.ConfigPathV1, "Basic dG9rLWNwMQ=="},
		{"scheme glued to token", "GET", agentapi.ConfigPathV1, "Bearertok-cp1"},
		{"report, wrong token", "POST", agentapi.ReportPathV1, "Bearer tok-cp3"},
		{"token in query", "GET", agentapi.ConfigPathV1 + "?token=tok-cp1", ""},
	} {
		hdr := map[string]string{}
		if tc.hdr != "" {
			hdr["Authorization"] = tc.hdr
		}
		code, body, h2 := do(t, h, tc.method, tc.path, hdr)
		if code != http.StatusUnauthorized || h2.Get("WWW-Authenticate") != igHdr.Get("WWW-Authenticate") {
			t.Errorf("%s: %d %q, want 401 with %q", tc.name, code, h2.Get("WWW-Authenticate"), igHdr.Get("WWW-Authenticate"))
		}
		if first == "" {
			first = body
		} else if body != first {
			t.Errorf("%s: body %q differs from %q: leaks which credential was wrong", tc.name, body, first)
		}
	}
	if !strings.Contains(first, "Authorization: Bearer") || strings.Contains(first, "token=") {
		t.Errorf("agent API 401 %q: want it to name the Authorization: Bearer header and nothing the API refuses (?token=)", first)
	}
}

// TestAuthSchemeCaseInsensitive: the auth scheme is a case-insensitive token (RFC 7235 §2.1; RFC
// 6750 §2.1 defines "Bearer"), followed by one or more spaces: "bearer", "BEARER" work on the agent
// API and on /ignition/ alike.
func TestAuthSchemeCaseInsensitive(t *testing.T) {
	s, _, _ := newAgentServer(t)
	h := s.Handler()
	for _, auth := range []string{"Bearer tok-cp1", "bearer tok-cp1", "BEARER tok-cp1", "bEaReR tok-cp1", "Bearer   tok-cp1"} {
		hdr := map[string]string{"Authorization": auth}
		if code, body, _ := do(t, h, "GET", agentapi.ConfigPathV1, hdr); code != http.StatusOK {
			t.Errorf("agent config with %q: %d %s", auth, code, body)
		}
		hdr["Accept"] = "application/vnd.coreos.ignition+json;version=3.5.0"
		if code, body, _ := do(t, h, "GET", "/ignition/cp1", hdr); code != http.StatusNotFound { // authorized, nothing rendered
			t.Errorf("ignition with %q: %d %s, want 404 (authorized, not rendered)", auth, code, body)
		}
	}
}

func TestAgentConfig(t *testing.T) {
	s, store, _ := newAgentServer(t)
	h := s.Handler()
	code, body := doBody(t, h, "GET", agentapi.ConfigPathV1, "tok-cp1", "")
	var nc agentapi.NodeConfig
	if code != http.StatusOK || json.Unmarshal([]byte(body), &nc) != nil || nc.Node != "cp1" {
		t.Fatalf("cp1 config: %d %s", code, body)
	}
	// A fetch is not progress: only a report moves the node (issue 16: a mere GET, by anyone holding
	// the token, marked the node agent-connected).
	for _, boot := range []string{"", "boot-1"} {
		req := httptest.NewRequest("GET", agentapi.ConfigPathV1, nil)
		req.Header.Set("Authorization", "Bearer tok-cp1")
		req.Header.Set(agentapi.BootIDHeader, boot)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	if st, err := store.Get("cp1"); !errors.Is(err, nodestate.ErrNotFound) {
		t.Errorf("after config fetches: %+v, %v; want no record (only reports are recorded)", st, err)
	}
	if code, body := doBody(t, h, "POST", agentapi.ReportPathV1, "tok-cp1", `{"bootID":"boot-1","step":"config","status":"done"}`); code != http.StatusNoContent {
		t.Fatalf("report: %d %s", code, body)
	}
	if st, err := store.Get("cp1"); err != nil || st.State != agentapi.StateAgentConnected {
		t.Errorf("after the config report: %+v, %v; want agent-connected", st, err)
	}
	// cp2 is authenticated but has no rendered config: 404, and it cannot read cp1's.
	if code, body := doBody(t, h, "GET", agentapi.ConfigPathV1, "tok-cp2", ""); code != http.StatusNotFound || strings.Contains(body, "cp1") {
		t.Errorf("cp2 config: %d %s, want 404", code, body)
	}
	if code, _ := doBody(t, h, "POST", agentapi.ConfigPathV1, "tok-cp1", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("POST config: %d", code)
	}
	if code, body := doBody(t, h, "GET", "/ca.crt", "", ""); code != http.StatusOK || !strings.HasPrefix(body, "-----BEGIN CERTIFICATE") {
		t.Errorf("/ca.crt: %d %q", code, body)
	}
}

func TestAgentReport(t *testing.T) {
	s, store, _ := newAgentServer(t)
	h := s.Handler()
	post := func(token string, r agentapi.Report) (int, string) {
		b, _ := json.Marshal(r)
		return doBody(t, h, "POST", agentapi.ReportPathV1, token, string(b))
	}
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	seq := []agentapi.Report{
		{BootID: "b1", Step: "config", Status: "done", Time: at},
		{BootID: "b1", Step: "config", Status: "done", Time: at.Add(time.Second)}, // resend
		{BootID: "b1", Step: "firewall", Status: "done", Time: at},
		{BootID: "b1", Step: "containerd", Status: "failed", Detail: "disk full", Time: at},
	}
	for i, r := range seq {
		if code, body := post("tok-cp1", r); code != http.StatusNoContent {
			t.Fatalf("report %d: %d %s", i, code, body)
		}
	}
	st, err := store.Get("cp1")
	if err != nil || st.State != agentapi.StateFailed || st.Reason != "containerd: disk full" || len(st.Steps) != 3 {
		t.Fatalf("status: %+v, %v", st, err)
	}
	evs, _ := store.Events("cp1")
	if len(evs) != 3 || evs[0].Step != "config" || evs[1].Step != "firewall" || evs[2].Step != "containerd" {
		t.Errorf("events (resend recorded once, in order): %+v", evs)
	}
	// A new boot starts the step list anew.
	if code, _ := post("tok-cp1", agentapi.Report{BootID: "b2", Step: "config", Status: "done"}); code != http.StatusNoContent {
		t.Fatal(code)
	}
	if st, _ := store.Get("cp1"); st.BootID != "b2" || len(st.Steps) != 1 || st.State != agentapi.StateAgentConnected {
		t.Errorf("after reboot: %+v", st)
	}
	// cp2's token writes cp2's record only.
	if code, _ := post("tok-cp2", agentapi.Report{BootID: "x", Step: "config", Status: "running"}); code != http.StatusNoContent {
		t.Fatal(code)
	}
	if st, _ := store.Get("cp1"); st.BootID != "b2" {
		t.Errorf("cp2's report touched cp1: %+v", st)
	}
	for _, tc := range []struct {
		name, body string
		code       int
	}{
		{"unknown step", `{"bootID":"b","step":"dance","status":"done"}`, http.StatusBadRequest},
		{"unknown field", `{"bootID":"b","step":"config","status":"done","extra":1}`, http.StatusBadRequest},
		{"not JSON", `nope`, http.StatusBadRequest},
		{"two reports", `{"bootID":"b","step":"config","status":"done"}{"bootID":"b","step":"firewall","status":"done"}`, http.StatusBadRequest},
		{"trailing garbage", `{"bootID":"b","step":"config","status":"done"} x`, http.StatusBadRequest},
		{"too large", `{"bootID":"b","step":"config","status":"done","detail":"` + strings.Repeat("x", MaxReportBytes) + `"}`, http.StatusRequestEntityTooLarge},
	} {
		if code, body := doBody(t, h, "POST", agentapi.ReportPathV1, "tok-cp1", tc.body); code != tc.code {
			t.Errorf("%s: %d %s, want %d", tc.name, code, body, tc.code)
		}
	}
}

// TestAgentConfigWatch: GET config carries the served bytes' ETag; ?wait=<that ETag> answers only
// once the served config changes (the body is the new config, which did not exist when the request
// was sent), ?wait=<another ETag> answers at once, and EndWatches (server shutdown) answers a watch
// in progress with the config it has. A watch that ends unchanged still answers 200 with the config.
// Watches stay out of the request latency histogram.
func TestAgentConfigWatch(t *testing.T) {
	s, _, dir := newAgentServer(t)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	get := func(query string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, ts.URL+agentapi.ConfigPathV1+query, nil)
		req.Header.Set("Authorization", "Bearer tok-cp1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("ETag"), string(b)
	}
	code, etag, body := get("")
	if code != http.StatusOK || !strings.HasPrefix(etag, `"`) || len(etag) != 34 || !strings.Contains(body, `"cp1"`) {
		t.Fatalf("GET config: %d ETag %q %s", code, etag, body)
	}
	if code, etag2, _ := get("?wait=%22other%22"); code != http.StatusOK || etag2 != etag {
		t.Errorf("a watch on another ETag: %d %q, want 200 at once with %q", code, etag2, etag)
	}

	// A watch on the current config, then the rendered file changes.
	type answer struct {
		code       int
		etag, body string
	}
	got := make(chan answer, 1)
	go func() {
		c, e, b := get("?wait=" + etag)
		got <- answer{c, e, b}
	}()
	time.Sleep(300 * time.Millisecond) // let the watch start on the old config (if it answered at once, it answers that)
	nc, _ := json.Marshal(agentapi.NodeConfig{Node: "cp1", Roles: []string{"worker"}, CAPEM: "PEM", ClusterName: "changed"})
	if err := os.WriteFile(filepath.Join(dir, "rendered", "cp1", statedir.NodeConfigFile), nc, 0o600); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.code != http.StatusOK || a.etag == etag || !strings.Contains(a.body, `"changed"`) {
		t.Errorf("the watch answered %d ETag %q (old %q) %s, want the changed config", a.code, a.etag, etag, a.body)
	}

	// A watch in progress ends with EndWatches, unchanged.
	go func() {
		c, e, b := get("?wait=" + a.etag)
		got <- answer{c, e, b}
	}()
	guard := time.After(agentapi.ConfigWaitMax - 5*time.Second) // a hang guard, not a timing assertion
	for {
		select {
		case b := <-got:
			if b.code != http.StatusOK || b.etag != a.etag || !strings.Contains(b.body, `"changed"`) {
				t.Errorf("the watch ended by EndWatches answered %d %q %s, want 200 with the same config", b.code, b.etag, b.body)
			}
			// Four requests counted; the latency histogram holds only the one that was not a watch.
			_, metrics := doBody(t, s.Handler(), "GET", "/metrics", "", "")
			for _, want := range []string{`appliance_http_requests_total{code="200",service="agent"} 4`, `appliance_http_request_duration_seconds_count{service="agent"} 1`} {
				if !strings.Contains(metrics, want) {
					t.Errorf("metrics lack %s", want)
				}
			}
			return
		case <-guard:
			t.Fatal("EndWatches did not end the watch in progress")
		case <-time.After(100 * time.Millisecond):
			s.opts.Agent.EndWatches() // again until the watch, which may start late, has ended
		}
	}
}
