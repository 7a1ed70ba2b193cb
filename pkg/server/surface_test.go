package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/registry"
)

// surface is the appliance's HTTPS front assembled as `appliance serve` assembles it
// (pkg/applianced.Serve): the real registry over a real OCI layout imported by registry.Import, the
// bundle's repo directory, the Ignition store and agent API over one rendered dir, the node store,
// the CA certificate and the hostagent artifact. Nothing in it is a fake.
type surface struct {
	srv      *Server
	dir      string
	pauseRef string  // repository of the imported image, e.g. "registry.k8s.io/pause"
	manifest v1.Hash // its manifest digest
	layer    v1.Hash // one of its layers
	nodes    *nodestate.Store
	tokens   map[string]string
	caPEM    []byte
}

func newSurface(t testing.TB) *surface {
	t.Helper()
	dir := t.TempDir()
	sf := &surface{dir: dir, pauseRef: "registry.k8s.io/pause", tokens: map[string]string{"cp1": "tok-cp1", "w1": "tok-w1"}}

	// A real OCI image layout, as the bundle carries, imported into registry storage.
	ociDir := filepath.Join(dir, "bundle", "oci")
	p, err := layout.Write(ociDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for range 2 {
		l, err := random.Layer(1024, types.OCILayer)
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "registry.k8s.io/pause:3.10"})); err != nil {
		t.Fatal(err)
	}
	sf.manifest, _ = img.Digest()
	ls, _ := img.Layers()
	sf.layer, _ = ls[0].Digest()
	regRoot := filepath.Join(dir, "state", "registry")
	if _, err := registry.Import(context.Background(), ociDir, regRoot, nil); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.NewHandler(context.Background(), regRoot, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })

	// The bundle's repo directory, rendered Ignition configs and node configs.
	rendered := filepath.Join(dir, "state", "rendered")
	nc, _ := json.Marshal(agentapi.NodeConfig{Node: "cp1", Roles: []string{"control-plane"}, CAPEM: "PEM"})
	files := map[string]string{
		"bundle/repo/debian/dists/stable/Release":            "Suite: stable\n",
		"bundle/repo/debian/pool/main/h/hello_1.0_amd64.deb": "not really a deb",
		"bundle/repo/.hidden":                                "secret",
		"state/rendered/cp1/ignition/3.3.0.json":             `{"ignition":{"version":"3.3.0"}}`,
		"state/rendered/cp1/ignition/3.5.0.json":             `{"ignition":{"version":"3.5.0"}}`,
		"state/rendered/cp1/" + statedir.NodeConfigFile:      string(nc),
		"bin/hostagent":  "\x7fELF hostagent",
		"outside/secret": "outside the repo",
	}
	for path, data := range files {
		full := filepath.Join(dir, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(dir, "outside"), filepath.Join(dir, "bundle/repo/debian/escape")); err != nil {
		t.Fatal(err)
	}
	caPEM, cert := pkitest.Issue(t)
	sf.caPEM = caPEM
	sf.nodes = nodestate.Open(filepath.Join(dir, "state", "nodes"))
	sf.srv, err = New(Options{
		Listen:      "127.0.0.1:0",
		Certificate: cert,
		Registry:    reg,
		RepoDir:     filepath.Join(dir, "bundle", "repo"),
		Ignition:    NewIgnitionStore(rendered, sf.tokens),
		Agent:       NewAgentAPI(rendered, sf.tokens, sf.nodes, nil),
		CAPEM:       caPEM,
		Artifacts:   map[string]string{"hostagent": filepath.Join(dir, "bin", "hostagent")},
		Generation:  "gen-surface",
	})
	if err != nil {
		t.Fatal(err)
	}
	return sf
}

// probe is one request against the surface.
type probe struct {
	method, target string
	header         [][2]string
	body           string
}

// raw renders p as an HTTP/1.1 request (with a Content-Length for its body unless it sets one).
func (p probe) raw() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: appliance.test\r\n", p.method, p.target)
	framed := false
	for _, h := range p.header {
		fmt.Fprintf(&b, "%s: %s\r\n", h[0], h[1])
		framed = framed || strings.EqualFold(h[0], "Content-Length") || strings.EqualFold(h[0], "Transfer-Encoding")
	}
	if !framed {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(p.body))
	}
	b.WriteString("\r\n")
	b.WriteString(p.body)
	return b.Bytes()
}

func (p probe) String() string {
	s := fmt.Sprintf("%s %q %q body %d bytes", p.method, p.target, p.header, len(p.body))
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// serveRaw parses raw as net/http's server does (http.ReadRequest) and serves it with h. ok is false
// when the request does not parse: net/http answers those itself, with 400 or 431 (TestHTTPSurfaceTLS
// sends such requests over a real connection).
func serveRaw(h http.Handler, raw []byte) (code int, ok bool, body string) {
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
	if err != nil {
		return 0, false, ""
	}
	req.RemoteAddr = "192.0.2.1:40000"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b := rec.Body.String()
	if len(b) > 200 {
		b = b[:200]
	}
	return rec.Code, true, b
}

// surfaceCorpus is the deterministic corpus: every route's paths (good, odd, hostile) under every
// method, then the header and body variants under the methods that read them.
func surfaceCorpus(sf *surface) []probe {
	pause := "/v2/" + sf.pauseRef
	long := strings.Repeat("p", 300)
	paths := []string{
		"/", "*", "/v2", "/v2/", "/v2/_catalog", "/v2/_catalog?n=-1", "/v2/_catalog?n=99999999999999999999&last=%00",
		pause + "/manifests/3.10", pause + "/manifests/" + sf.manifest.String(), pause + "/manifests/sha256:zz",
		pause + "/manifests/" + strings.Repeat("t", 200), pause + "/manifests/latest", pause + "/manifests/sha256:" + strings.ToUpper(sf.manifest.Hex),
		pause + "/blobs/" + sf.layer.String(), pause + "/blobs/sha256:zz", pause + "/blobs/sha512:" + strings.Repeat("a", 128),
		pause + "/blobs/md5:" + strings.Repeat("a", 32), pause + "/blobs/" + sf.layer.String() + "/extra",
		pause + "/tags/list", pause + "/tags/list?n=-1", pause + "/tags/list?n=abc&last=%ff", pause + "/tags/list?n=0",
		pause + "/blobs/uploads/", pause + "/blobs/uploads/abc?digest=sha256:zz", pause + "/blobs/uploads/?mount=sha256:zz&from=" + long,
		pause + "/referrers/" + sf.manifest.String(),
		"/v2/registry.k8s.io/" + long + "/manifests/latest", "/v2/" + strings.Repeat("a/", 200) + "a/tags/list",
		"/v2/" + long + "/blobs/" + sf.layer.String(), "/v2/" + long + "/blobs/uploads/",
		"/v2/UPPER/manifests/1", "/v2/registry.k8s.io/../../../etc/passwd", "/v2/%2e%2e/%2e%2e/blobs/" + sf.layer.String(),
		"/v2//registry.k8s.io//pause/manifests/3.10", pause + "/manifests/3.10%00", "/v2/%C3%BC/manifests/1", "/v2/ü/manifests/1",
		"/v2/registry.k8s.io/pause%2fmanifests/3.10", "/v2/_catalog/../_catalog",
		"/repo/", "/repo/debian/dists/stable/Release", "/repo/.hidden", "/repo/debian/escape/secret", "/repo/../outside/secret",
		"/repo/%2e%2e/outside/secret", "/repo/debian/pool/", "/repo/debian/pool/main/h/hello_1.0_amd64.deb", "/repo/nonexistent",
		"/repo/debian%00/x", "/repo/%C3%BC", "/repo/debian/dists/stable/Release/", "/repo//debian//dists", "/repo/" + strings.Repeat("d/", 2000),
		"/ignition/", "/ignition/cp1", "/ignition/cp1?token=tok-cp1", "/ignition/cp1?token=", "/ignition/..%2fcp1?token=tok-cp1",
		"/ignition/cp1/extra", "/ignition/%00", "/ignition/" + long, "/ignition/w1?token=tok-w1", "/ignition/.?token=x",
		"/ignition/cp1?token=tok-cp1&token=tok-w1", "/ignition/cp1%5c..%5cw1?token=tok-cp1",
		"/agent/", "/agent/v1/config", "/agent/v1/report", "/agent/v1/config/../report", "/agent/v2/config", "/agent/v1/config?token=tok-cp1",
		"/artifacts/", "/artifacts/hostagent", "/artifacts/../bin/hostagent", "/artifacts/nope", "/artifacts/hostagent/x",
		"/ca.crt", "/ca.crt/x", "/healthz", "/healthz?x=1", "/metrics", "/metrics?name[]=x", "/" + strings.Repeat("x", 8<<10),
	}
	methods := []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "BREW", "PROPFIND", "get"}
	var out []probe
	for _, p := range paths {
		for _, m := range methods {
			out = append(out, probe{method: m, target: p})
		}
	}
	headers := [][][2]string{
		{{"Range", "bytes=0-0"}}, {{"Range", "bytes=-1"}}, {{"Range", "bytes=99999999-"}}, {{"Range", "bytes=1-0"}},
		{{"Range", "bytes=abc"}}, {{"Range", "items=0-1"}}, {{"Range", "bytes=0-1,2-3,4-5"}},
		{{"Range", "bytes=" + strings.TrimSuffix(strings.Repeat("0-0,", 500), ",")}},
		{{"Accept", "*/*"}}, {{"Accept", "application/vnd.coreos.ignition+json;version=3.3.0"}},
		{{"Accept", "application/vnd.coreos.ignition+json;version=2.2.0"}}, {{"Accept", ";;;=,,q=abc"}},
		{{"Accept", strings.Repeat("a/b;q=0.5, ", 1000)}}, {{"Accept", "application/vnd.oci.image.manifest.v1+json"}},
		{{"Accept", "application/openmetrics-text; version=1.0.0"}}, {{"Accept-Encoding", "gzip, deflate, br"}},
		{{"Authorization", "Bearer tok-cp1"}}, {{"Authorization", "bearer tok-w1"}}, {{"Authorization", "BEARER tok-cp1"}},
		{{"Authorization", "Bearer"}}, {{"Authorization", "Bearer  "}}, {{"Authorization", "Basic Og=="}},
		{{"Authorization", "Bearer tok-cp1, Bearer tok-w1"}}, {{"Authorization", "Bearer " + strings.Repeat("t", 64<<10)}},
		{{"Authorization", "Negotiate abc"}}, {{"Authorization", "Bearer tok-cp1"}, {"Authorization", "Bearer tok-w1"}},
		{{"If-None-Match", "*"}}, {{"If-Modified-Since", "yesterday"}}, {{"If-Range", "garbage"}, {"Range", "bytes=0-1"}},
		{{"Content-Type", "application/json; charset=\xff"}}, {{"Hostagent-Boot-Id", strings.Repeat("b", 4096)}},
		{{"Expect", "100-continue"}}, {{"Authorization", "Bearer tok-cp1"}, {"Accept", "application/vnd.coreos.ignition+json;version=3.5.0"}},
		{{"Authorization", "Bearer tok-cp1"}, {"Range", "bytes=5-2"}},
	}
	keyPaths := []string{"/", pause + "/manifests/3.10", pause + "/blobs/" + sf.layer.String(), pause + "/tags/list", "/v2/_catalog",
		"/repo/debian/dists/stable/Release", "/ignition/cp1", "/agent/v1/config", "/agent/v1/report", "/artifacts/hostagent",
		"/ca.crt", "/healthz", "/metrics"}
	for _, hs := range headers {
		for _, p := range keyPaths {
			for _, m := range []string{"GET", "HEAD", "POST"} {
				out = append(out, probe{method: m, target: p, header: hs})
			}
		}
	}
	bodies := []string{"{}", "null", "[", `{"bootID":"b1","step":"config","status":"done"}`, `{"bootID":"b1","step":"dance","status":"done"}`,
		`{"bootID":"","step":"config","status":"done"}`, `{"bootID":"b1","step":"config","status":"done"}{"x":1}`,
		`{"bootID":"b1","step":"config","status":"done","time":"not a time"}`, strings.Repeat("x", 70<<10), "\x00\xff\xfe"}
	for _, b := range bodies {
		for _, p := range keyPaths {
			for _, m := range []string{"POST", "PUT", "PATCH"} {
				out = append(out, probe{method: m, target: p, header: [][2]string{{"Authorization", "Bearer tok-cp1"}, {"Content-Type", "application/json"}}, body: b})
			}
		}
	}
	return out
}

// TestHTTPSurfaceNo5xx serves the whole corpus in process, each request parsed from its bytes as the
// server parses it: every answer is below 500 and nothing panics. Positive controls prove the routes
// are really served (a surface answering 404 to everything would pass otherwise).
func TestHTTPSurfaceNo5xx(t *testing.T) {
	sf := newSurface(t)
	h := sf.srv.Handler()
	corpus := surfaceCorpus(sf)
	parsed := 0
	for _, p := range corpus {
		code, ok, body := serveRaw(h, p.raw())
		if !ok {
			continue
		}
		parsed++
		if code >= 500 {
			t.Errorf("%s: %d %s", p, code, body)
		}
	}
	if parsed < len(corpus)*9/10 {
		t.Errorf("only %d of %d requests parsed: the corpus does not reach the handlers", parsed, len(corpus))
	}
	tok := [][2]string{{"Authorization", "Bearer tok-cp1"}}
	for _, c := range []struct {
		p    probe
		want int
	}{
		{probe{method: "GET", target: "/v2/"}, 200},
		{probe{method: "GET", target: "/v2/" + sf.pauseRef + "/manifests/3.10", header: [][2]string{{"Accept", "application/vnd.oci.image.manifest.v1+json"}}}, 200},
		{probe{method: "GET", target: "/v2/" + sf.pauseRef + "/blobs/" + sf.layer.String()}, 200},
		{probe{method: "GET", target: "/repo/debian/dists/stable/Release"}, 200},
		{probe{method: "GET", target: "/ignition/cp1", header: tok}, 200},
		{probe{method: "GET", target: "/agent/v1/config", header: tok}, 200},
		{probe{method: "POST", target: "/agent/v1/report", header: tok, body: `{"bootID":"b9","step":"config","status":"done"}`}, 204},
		{probe{method: "GET", target: "/artifacts/hostagent"}, 200},
		{probe{method: "GET", target: "/ca.crt"}, 200},
		{probe{method: "GET", target: "/healthz"}, 200},
		{probe{method: "GET", target: "/metrics"}, 200},
		{probe{method: "GET", target: "/repo/debian/escape/secret"}, 404},
		{probe{method: "GET", target: "/v2/registry.k8s.io/" + strings.Repeat("p", 300) + "/manifests/latest"}, 400},
	} {
		if code, _, body := serveRaw(h, c.p.raw()); code != c.want {
			t.Errorf("control %s: %d %s, want %d", c.p, code, body, c.want)
		}
	}
}

// TestHTTPSurfaceTLS sends what a client library would never send over real TLS connections to the
// front served by ServeListener (the production path): Content-Length lies, bad chunking, Expect,
// NUL and over-long request lines, absolute-form targets, HTTP/1.0. Each gets an answer below 500
// (net/http's own 400/417/431 included), never a dropped connection; one exception is pinned: a
// request line naming an HTTP version the server does not speak gets 505, which RFC 9110 §15.6.6
// prescribes (net/http answers it before any handler runs).
func TestHTTPSurfaceTLS(t *testing.T) {
	sf := newSurface(t)
	addr := serveTLSFront(t, sf.srv)
	tok := "Authorization: Bearer tok-cp1\r\n"
	report := `{"bootID":"b1","step":"config","status":"done"}`
	cases := []struct {
		name, raw  string
		closeWrite bool // send EOF after raw (a body shorter than its Content-Length)
		want       int  // exact status; 0: any status below 500
	}{
		{"control", "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n", false, 200},
		{"body shorter than Content-Length", "POST /agent/v1/report HTTP/1.1\r\nHost: a\r\n" + tok + "Content-Length: 100\r\n\r\n" + report, true, 400},
		{"body longer than Content-Length", "POST /agent/v1/report HTTP/1.1\r\nHost: a\r\n" + tok + "Content-Length: 5\r\n\r\n" + report, false, 400},
		{"negative Content-Length", "POST /agent/v1/report HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", false, 400},
		{"two Content-Lengths", "POST /agent/v1/report HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", false, 400},
		{"Content-Length and chunked", "POST /agent/v1/report HTTP/1.1\r\nHost: a\r\n" + tok + "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", false, 400},
		{"bad chunk", "POST /agent/v1/report HTTP/1.1\r\nHost: a\r\n" + tok + "Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", false, 400},
		{"Expect 100-continue", "POST /agent/v1/report HTTP/1.1\r\nHost: a\r\n" + tok + "Expect: 100-continue\r\nContent-Length: " + strconv.Itoa(len(report)) + "\r\n\r\n" + report, false, 204},
		{"unknown Expect", "POST /agent/v1/report HTTP/1.1\r\nHost: a\r\n" + tok + "Expect: coffee\r\nContent-Length: 2\r\n\r\n{}", false, 417},
		{"NUL in path", "GET /repo/\x00 HTTP/1.1\r\nHost: a\r\n\r\n", false, 400},
		{"space in path", "GET /repo/a b HTTP/1.1\r\nHost: a\r\n\r\n", false, 400},
		{"request line of 2 MiB", "GET /v2/" + strings.Repeat("a", 2<<20) + "/tags/list HTTP/1.1\r\nHost: a\r\n\r\n", false, 431},
		{"header of 2 MiB", "GET /healthz HTTP/1.1\r\nHost: a\r\nX: " + strings.Repeat("x", 2<<20) + "\r\n\r\n", false, 431},
		{"no Host", "GET /healthz HTTP/1.1\r\n\r\n", false, 400},
		{"HTTP/1.0 without Host", "GET /healthz HTTP/1.0\r\n\r\n", false, 200},
		{"absolute form", "GET https://elsewhere.example/healthz HTTP/1.1\r\nHost: a\r\n\r\n", false, 200},
		{"CONNECT", "CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n", false, 0},
		{"dot segments", "GET /repo/../../outside/secret HTTP/1.1\r\nHost: a\r\n\r\n", false, 0},
		{"bad method token", "G(T /healthz HTTP/1.1\r\nHost: a\r\n\r\n", false, 400},
		{"garbage", "\x16\x03\x01 hello\r\n\r\n", false, 400},
		{"HTTP/2 preface over HTTP/1", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", false, 0},
		{"HTTP/3.0 request line", "GET /healthz HTTP/3.0\r\nHost: a\r\n\r\n", false, http.StatusHTTPVersionNotSupported},
		{"long name, real registry", "GET /v2/registry.k8s.io/" + strings.Repeat("p", 300) + "/manifests/latest HTTP/1.1\r\nHost: a\r\n\r\n", false, 400},
		{"unicode path", "GET /repo/\xc3\xbc/\xff HTTP/1.1\r\nHost: a\r\n\r\n", false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}) //nolint:gosec // status codes only
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			go func() { // the server may answer before it has read everything (431): write concurrently
				_, _ = conn.Write([]byte(tc.raw))
				if tc.closeWrite {
					_ = conn.CloseWrite()
				}
			}()
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			for err == nil && resp.StatusCode == http.StatusContinue {
				resp, err = http.ReadResponse(br, nil)
			}
			if err != nil {
				t.Fatalf("no answer (a panic drops the connection): %v", err)
			}
			resp.Body.Close()
			if tc.want != 0 && resp.StatusCode != tc.want || tc.want == 0 && resp.StatusCode >= 500 {
				t.Errorf("%d, want %d (0: any below 500)", resp.StatusCode, tc.want)
			}
		})
	}
}

// FuzzHTTPSurface sends fuzzed requests (method, target, header lines, body) to the front assembled
// as `appliance serve` assembles it; every request net/http would hand to a handler must be answered
// below 500 without a panic. Seeded with the deterministic corpus (surfaceCorpus).
//
//	go test -run='^$' -fuzz=FuzzHTTPSurface -fuzztime=30s ./pkg/server
func FuzzHTTPSurface(f *testing.F) {
	sf := newSurface(f)
	for i, p := range surfaceCorpus(sf) {
		if i%7 != 0 && len(p.header) == 0 && p.body == "" { // a sample of the plain path × method product
			continue
		}
		var hs strings.Builder
		for _, h := range p.header {
			hs.WriteString(h[0] + ": " + h[1] + "\n")
		}
		f.Add(p.method, p.target, hs.String(), []byte(p.body))
	}
	h := sf.srv.Handler()
	f.Fuzz(func(t *testing.T, method, target, headers string, body []byte) {
		p := probe{method: method, target: target, body: string(body)}
		for line := range strings.SplitSeq(headers, "\n") {
			if k, v, ok := strings.Cut(line, ": "); ok {
				p.header = append(p.header, [2]string{k, v})
			}
		}
		if code, ok, resp := serveRaw(h, p.raw()); ok && code >= 500 {
			t.Errorf("%s: %d %s", p, code, resp)
		}
	})
}
