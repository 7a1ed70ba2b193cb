package server

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/ignition"
)

// TestIgnitionContentLength: a rendered config larger than net/http's 2 KiB response buffer (real
// ones are ~7 KiB) is answered with its Content-Length, not in chunked encoding (one TLS record
// and write(2) more per response), over a real TLS HTTP/1.1 connection; HEAD gets the same length
// without a body.
func TestIgnitionContentLength(t *testing.T) {
	s, dir := newTestServer(t)
	body := `{"ignition":{"version":"3.3.0"},"pad":"` + strings.Repeat("x", 7000) + `"}`
	if err := os.WriteFile(filepath.Join(dir, "rendered/cp1/ignition/3.3.0.json"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(s.Handler())
	ts.TLS = s.TLSConfig()
	ts.StartTLS()
	defer ts.Close()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // test server's throwaway certificate
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		req, _ := http.NewRequest(method, ts.URL+"/ignition/cp1", nil)
		req.Header.Set("Authorization", "Bearer tok-cp1")
		req.Header.Set("Accept", "application/vnd.coreos.ignition+json;version=3.3.0, */*;q=0.1")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 1 {
			t.Fatalf("%s: %s %s", method, resp.Proto, resp.Status)
		}
		if len(resp.TransferEncoding) != 0 || resp.Header.Get("Content-Length") != strconv.Itoa(len(body)) {
			t.Fatalf("%s: Transfer-Encoding %v, Content-Length %q; want no chunking and %d", method, resp.TransferEncoding, resp.Header.Get("Content-Length"), len(body))
		}
		if want := map[string]string{http.MethodGet: body, http.MethodHead: ""}[method]; string(got) != want {
			t.Fatalf("%s: body of %d bytes, want %d", method, len(got), len(want))
		}
		if ct := resp.Header.Get("Content-Type"); ct != ignition.ContentType("3.3.0") {
			t.Fatalf("%s: Content-Type %q", method, ct)
		}
	}
}

// TestIgnitionNegotiationCache: negotiated versions are remembered per Accept header, at most
// maxNegotiated of them, refusals are never remembered, and answers stay those of ignition.Negotiate.
func TestIgnitionNegotiationCache(t *testing.T) {
	s, _ := newTestServer(t)
	h := s.Handler()
	for i := range 2 * maxNegotiated {
		accept := "application/vnd.coreos.ignition+json;version=3.3.0, */*;q=0." + strconv.Itoa(i+1)
		for range 2 {
			code, body, _ := do(t, h, "GET", "/ignition/cp1", map[string]string{"Authorization": "Bearer tok-cp1", "Accept": accept})
			if code != http.StatusOK || !strings.Contains(body, `"3.3.0"`) {
				t.Fatalf("Accept %q: %d %s", accept, code, body)
			}
		}
	}
	for range 2 {
		if code, _, _ := do(t, h, "GET", "/ignition/cp1", map[string]string{"Authorization": "Bearer tok-cp1", "Accept": "text/plain"}); code != http.StatusNotAcceptable {
			t.Fatalf("text/plain: %d, want 406", code)
		}
	}
	code, body, _ := do(t, h, "GET", "/ignition/cp1", map[string]string{"Authorization": "Bearer tok-cp1", "Accept": "application/vnd.coreos.ignition+json;version=3.5.0"})
	if code != http.StatusOK || !strings.Contains(body, `"3.5.0"`) {
		t.Fatalf("3.5.0 after a full cache: %d %s", code, body)
	}
	ig := s.opts.Ignition
	ig.versions.mu.RLock()
	n := len(ig.versions.versions)
	_, refused := ig.versions.versions["text/plain"]
	ig.versions.mu.RUnlock()
	if n != maxNegotiated || refused {
		t.Fatalf("cache holds %d entries (want %d), refusal cached: %v", n, maxNegotiated, refused)
	}
}
