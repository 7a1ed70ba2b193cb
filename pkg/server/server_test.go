package server

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
)

func selfSigned(t testing.TB) tls.Certificate {
	t.Helper()
	_, cert := pkitest.Issue(t)
	return cert
}

func newTestServer(t testing.TB) (*Server, string) {
	t.Helper()
	dir := t.TempDir()
	for path, data := range map[string]string{
		"rendered/cp1/ignition/3.3.0.json": `{"ignition":{"version":"3.3.0"}}`,
		"rendered/cp1/ignition/3.5.0.json": `{"ignition":{"version":"3.5.0"}}`,
		"repo/debian/dists/stable/Release": "Suite: stable\n",
		"repo/.hidden":                     "secret",
	} {
		p := filepath.Join(dir, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(Options{
		Listen:      "127.0.0.1:0",
		Certificate: selfSigned(t),
		RepoDir:     filepath.Join(dir, "repo"),
		Ignition:    NewIgnitionStore(filepath.Join(dir, "rendered"), map[string]string{"cp1": "tok-cp1", "cp2": "tok-cp2"}),
		Generation:  "gen1",
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

func do(t *testing.T, h http.Handler, method, target string, hdr map[string]string) (int, string, http.Header) {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b), rec.Header()
}

func TestIgnitionAuthAndNegotiation(t *testing.T) {
	s, _ := newTestServer(t)
	h := s.Handler()
	accept33 := map[string]string{"Accept": "application/vnd.coreos.ignition+json;version=3.3.0, */*;q=0.1"}
	withToken := func(tok string, hdr map[string]string) map[string]string {
		out := map[string]string{"Authorization": "Bearer " + tok}
		for k, v := range hdr {
			out[k] = v
		}
		return out
	}
	code, body, hdr := do(t, h, "GET", "/ignition/cp1", withToken("tok-cp1", accept33))
	if code != 200 || !strings.Contains(body, `"3.3.0"`) || !strings.Contains(hdr.Get("Content-Type"), "version=3.3.0") {
		t.Fatalf("own token via bearer: %d %q %v", code, body, hdr)
	}
	cases := []struct{ name, target, token string }{
		{"no token", "/ignition/cp1", ""},
		{"own token in the query (never accepted: URLs reach logs)", "/ignition/cp1?token=tok-cp1", ""},
		{"wrong token", "/ignition/cp1", "nope"},
		{"other node's token", "/ignition/cp1", "tok-cp2"},
		{"unknown node", "/ignition/cp9", "tok-cp1"},
		{"path traversal", "/ignition/..%2fcp1", "tok-cp1"},
	}
	var first string
	for _, c := range cases {
		hdr := accept33
		if c.token != "" {
			hdr = withToken(c.token, accept33)
		}
		code, body, _ := do(t, h, "GET", c.target, hdr)
		if code != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", c.name, code)
		}
		if first == "" {
			first = body
		} else if body != first {
			t.Errorf("%s: body %q differs from %q: leaks node existence", c.name, body, first)
		}
	}
	// Known node, authorized, but a version it was not rendered in → 404; an unsupported Accept → 406.
	code, _, _ = do(t, h, "GET", "/ignition/cp1", withToken("tok-cp1", map[string]string{"Accept": "application/vnd.coreos.ignition+json;version=3.4.0"}))
	if code != http.StatusNotFound {
		t.Errorf("unrendered version: %d, want 404", code)
	}
	code, _, _ = do(t, h, "GET", "/ignition/cp1", withToken("tok-cp1", map[string]string{"Accept": "application/vnd.coreos.ignition+json;version=2.2.0"}))
	if code != http.StatusNotAcceptable {
		t.Errorf("spec 2.2.0 only: %d, want 406", code)
	}
	if code, _, _ := do(t, h, "POST", "/ignition/cp1", withToken("tok-cp1", nil)); code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", code)
	}
}

func TestRepoStaticFiles(t *testing.T) {
	s, _ := newTestServer(t)
	h := s.Handler()
	if code, body, _ := do(t, h, "GET", "/repo/debian/dists/stable/Release", nil); code != 200 || body != "Suite: stable\n" {
		t.Fatalf("Release: %d %q", code, body)
	}
	if code, _, _ := do(t, h, "GET", "/repo/.hidden", nil); code != 404 {
		t.Fatalf("dot-file served: %d", code)
	}
}

// TestRepoNoDirectoryListings is the attack of anyone on the provisioning network walking the
// package repository over the real TLS listener: every directory (the root, with or without its
// slash) answers 404, never a listing of the bundle's files; the files themselves are served.
func TestRepoNoDirectoryListings(t *testing.T) {
	s, _ := newTestServer(t)
	addr := serveTLSFront(t, s)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the answers are what is tested
	defer hc.CloseIdleConnections()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := hc.Get("https://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, path := range []string{"/repo/", "/repo/debian/", "/repo/debian", "/repo/debian/dists/", "/repo/debian/dists/stable/", "/repo/./debian/", "/repo/debian/index.html"} {
		code, body := get(path)
		if code != http.StatusNotFound || strings.Contains(body, "<a href") || strings.Contains(body, "dists") || strings.Contains(body, "Release") {
			t.Errorf("GET %s: %d %q, want 404 and no listing", path, code, body)
		}
	}
	if code, body := get("/repo/debian/dists/stable/Release"); code != 200 || body != "Suite: stable\n" {
		t.Errorf("GET the Release file: %d %q", code, body)
	}
}

func TestHealthAndMetrics(t *testing.T) {
	s, _ := newTestServer(t)
	h := s.Handler()
	code, body, _ := do(t, h, "GET", "/healthz", nil)
	if code != 200 || !strings.Contains(body, `"generation":"gen1"`) {
		t.Fatalf("healthz: %d %s", code, body)
	}
	do(t, h, "GET", "/repo/debian/dists/stable/Release", nil)
	_, metrics, _ := do(t, h, "GET", "/metrics", nil)
	if !strings.Contains(metrics, `appliance_http_requests_total{code="200",service="repo"} 1`) {
		t.Fatalf("metrics do not count the repo request:\n%.3000s", metrics)
	}
	if strings.Contains(metrics, "tok-cp1") {
		t.Fatal("a token leaked into metrics")
	}
}

func TestTLSMinimumVersion(t *testing.T) {
	s, _ := newTestServer(t)
	ts := httptest.NewUnstartedServer(s.Handler())
	ts.TLS = s.TLSConfig()
	ts.StartTLS()
	defer ts.Close()
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS11}} //nolint:gosec // probing the server's floor
	if _, err := (&http.Client{Transport: tr}).Get(ts.URL + "/healthz"); err == nil {
		t.Fatal("a TLS 1.1 client was served")
	}
}

// TestIgnitionCacheFollowsRender: a re-rendered (atomically replaced) file is served at once.
func TestIgnitionCacheFollowsRender(t *testing.T) {
	s, dir := newTestServer(t)
	h := s.Handler()
	accept := map[string]string{"Accept": "application/vnd.coreos.ignition+json;version=3.3.0", "Authorization": "Bearer tok-cp1"}
	if _, body, _ := do(t, h, "GET", "/ignition/cp1", accept); !strings.Contains(body, "3.3.0") {
		t.Fatalf("first read: %s", body)
	}
	p := filepath.Join(dir, "rendered/cp1/ignition/3.3.0.json")
	tmp := p + ".new"
	if err := os.WriteFile(tmp, []byte(`{"ignition":{"version":"3.3.0"},"changed":true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	if _, body, _ := do(t, h, "GET", "/ignition/cp1", accept); !strings.Contains(body, `"changed":true`) {
		t.Fatalf("stale content after re-render: %s", body)
	}
}

func BenchmarkIgnitionServe(b *testing.B) {
	s, _ := newTestServer(b)
	h := s.Handler()
	req := httptest.NewRequest("GET", "/ignition/cp1", nil)
	req.Header.Set("Authorization", "Bearer tok-cp1")
	req.Header.Set("Accept", "application/vnd.coreos.ignition+json;version=3.3.0")
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 {
			b.Fatal(rec.Code)
		}
	}
}
