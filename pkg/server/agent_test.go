package server

import (
	"encoding/json"
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

// TestAgentAuthMatchesIgnition: every bad credential gets exactly the Ignition endpoint's 401.
func TestAgentAuthMatchesIgnition(t *testing.T) {
	s, _, _ := newAgentServer(t)
	h := s.Handler()
	wantCode, wantBody, wantHdr := do(t, h, "GET", "/ignition/cp1", map[string]string{"Authorization": "Bearer wrong"})
	if wantCode != http.StatusUnauthorized {
		t.Fatalf("ignition with a wrong token: %d", wantCode)
	}
	for _, tc := range []struct{ name, method, path, hdr string }{
		{"no token", "GET", agentapi.ConfigPathV1, ""},
		{"wrong token", "GET", agentapi.ConfigPathV1, "Bearer wrong"},
		{"empty bearer", "GET", agentapi.ConfigPathV1, "Bearer "},
		{"basic auth", "GET", agentapi.ConfigPathV1, "Basic dG9rLWNwMQ=="},
		{"report, wrong token", "POST", agentapi.ReportPathV1, "Bearer tok-cp3"},
		{"token in query", "GET", agentapi.ConfigPathV1 + "?token=tok-cp1", ""},
	} {
		hdr := map[string]string{}
		if tc.hdr != "" {
			hdr["Authorization"] = tc.hdr
		}
		code, body, h2 := do(t, h, tc.method, tc.path, hdr)
		if code != wantCode || body != wantBody || h2.Get("WWW-Authenticate") != wantHdr.Get("WWW-Authenticate") {
			t.Errorf("%s: %d %q %q, want the ignition answer %d %q", tc.name, code, body, h2.Get("WWW-Authenticate"), wantCode, wantBody)
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
	st, err := store.Get("cp1")
	if err != nil || st.State != agentapi.StateAgentConnected {
		t.Errorf("after the fetch: %+v, %v; want agent-connected", st, err)
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
		{"too large", `{"bootID":"b","step":"config","status":"done","detail":"` + strings.Repeat("x", MaxReportBytes) + `"}`, http.StatusRequestEntityTooLarge},
	} {
		if code, body := doBody(t, h, "POST", agentapi.ReportPathV1, "tok-cp1", tc.body); code != tc.code {
			t.Errorf("%s: %d %s, want %d", tc.name, code, body, tc.code)
		}
	}
}
