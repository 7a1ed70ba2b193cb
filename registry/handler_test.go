package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airgap-appliance/appliance/test/labns"
)

// servedFixture imports a fresh fixture and serves it over TLS with a fresh CA.
func servedFixture(t *testing.T, opts ...HandlerOption) (fixture, string, testCA, *http.Client, string) {
	t.Helper()
	f := writeFixture(t, t.TempDir())
	root := t.TempDir()
	if _, err := Import(context.Background(), f.dir, root, nil); err != nil {
		t.Fatal(err)
	}
	h, err := NewHandler(context.Background(), root, slog.New(slog.DiscardHandler), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	ca := newTestCA(t)
	addr, client := ca.serveTLS(t, h)
	return f, addr, ca, client, root
}

func TestSkopeoPullsThroughMirror(t *testing.T) {
	skopeo := labns.RequireTool(t, "skopeo")
	f, addr, ca, _, root := servedFixture(t)
	dst := t.TempDir()
	src := "docker://" + addr + "/registry.k8s.io/pause:3.10"

	out, err := exec.Command(skopeo, "copy", "--insecure-policy", "--src-cert-dir", ca.certDir, src, "oci:"+dst+":pause").CombinedOutput()
	if err != nil {
		t.Fatalf("skopeo copy with the CA: %v\n%s", err, out)
	}
	var idx v1.IndexManifest
	b, _ := os.ReadFile(filepath.Join(dst, "index.json"))
	if err := json.Unmarshal(b, &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("pulled index.json: %v %s", err, b)
	}
	if got := idx.Manifests[0].Digest; got != f.pause {
		t.Fatalf("pulled digest %s, layout has %s", got, f.pause)
	}

	// Multi-arch: the index is served byte for byte, and --all copies both platforms unchanged (skopeo
	// 1.9 re-serialises the index itself, dropping artifactType, so its digest is checked via --raw).
	busy := "docker://" + addr + "/docker.io/library/busybox:1.36"
	raw, err := exec.Command(skopeo, "inspect", "--raw", "--cert-dir", ca.certDir, busy).Output()
	if err != nil {
		t.Fatalf("skopeo inspect --raw: %v", err)
	}
	if got := sha256.Sum256(raw); hex.EncodeToString(got[:]) != f.busy.Hex {
		t.Fatalf("served index bytes do not hash to %s:\n%s", f.busy, raw)
	}
	out, err = exec.Command(skopeo, "copy", "--all", "--insecure-policy", "--src-cert-dir", ca.certDir, busy, "oci:"+dst+":busybox").CombinedOutput()
	if err != nil {
		t.Fatalf("skopeo copy --all of the index: %v\n%s", err, out)
	}
	for _, c := range readIndex(t, f.dir, f.busy).Manifests {
		if _, err := os.Stat(filepath.Join(dst, "blobs/sha256", c.Digest.Hex)); err != nil {
			t.Errorf("platform %s (%s) not copied: %v", c.Platform, c.Digest, err)
		}
	}

	// Without the CA the TLS handshake fails on verification.
	out, err = exec.Command(skopeo, "copy", "--insecure-policy", "--src-cert-dir", t.TempDir(), src, "oci:"+t.TempDir()+":x").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "x509: certificate signed by unknown authority") {
		t.Fatalf("skopeo without the CA: err=%v, want an x509 unknown authority error; output:\n%s", err, out)
	}

	// Pushing is refused, and nothing lands in the tree.
	out, err = exec.Command(skopeo, "copy", "--insecure-policy", "--dest-cert-dir", ca.certDir,
		"oci:"+dst+":pause", "docker://"+addr+"/registry.k8s.io/pushed:1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "read-only mirror") {
		t.Fatalf("skopeo push: err=%v, want the OCI refusal naming the read-only mirror; output:\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(root, "docker/registry/v2/repositories/registry.k8s.io/pushed")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused push left a repository behind: %v", err)
	}
}

func TestGoContainerregistryPullsWithCA(t *testing.T) {
	f, addr, _, client, _ := servedFixture(t)
	for _, tc := range []struct {
		repo string
		want v1.Hash
	}{{"registry.k8s.io/pause:3.10", f.pause}, {"docker.io/library/busybox:1.36", f.busy}, {"myreg_5000/team/app:v1", f.app}} {
		ref, err := name.ParseReference(addr + "/" + tc.repo)
		if err != nil {
			t.Fatal(err)
		}
		desc, err := remote.Get(ref, remote.WithTransport(client.Transport))
		if err != nil {
			t.Fatalf("%s: %v", tc.repo, err)
		}
		if desc.Digest != tc.want {
			t.Fatalf("%s: digest %s, want %s", tc.repo, desc.Digest, tc.want)
		}
		pullRef(t, ref, remote.WithTransport(client.Transport))
	}
	// Without the CA, go-containerregistry refuses the server too.
	ref, _ := name.ParseReference(addr + "/registry.k8s.io/pause:3.10")
	if _, err := remote.Get(ref); err == nil || !strings.Contains(err.Error(), "x509") {
		t.Fatalf("pull without the CA: %v, want an x509 error", err)
	}
}

// TestBlobFastPathMatchesDistribution compares the fast path with distribution's own blob handler on
// the same tree: status, body and the headers clients use, for GET, HEAD, Range, If-None-Match, a blob
// not linked into the repository and a malformed digest.
func TestBlobFastPathMatchesDistribution(t *testing.T) {
	f := writeFixture(t, t.TempDir())
	root := t.TempDir()
	if _, err := Import(context.Background(), f.dir, root, nil); err != nil {
		t.Fatal(err)
	}
	ca := newTestCA(t)
	serve := func(fast bool) (string, *http.Client) {
		h, err := NewHandler(context.Background(), root, nil, WithBlobFastPath(fast))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		return ca.serveTLS(t, h)
	}
	fastAddr, client := serve(true)
	slowAddr, _ := serve(false)
	layer := readManifest(t, f.dir, f.pause).Layers[0].Digest
	appLayer := readManifest(t, f.dir, f.app).Layers[0].Digest
	cases := []struct {
		name, method, path string
		hdr                map[string]string
		status             int
	}{
		{"get layer", "GET", "/v2/registry.k8s.io/pause/blobs/" + layer.String(), nil, 200},
		{"head layer", "HEAD", "/v2/registry.k8s.io/pause/blobs/" + layer.String(), nil, 200},
		{"range", "GET", "/v2/registry.k8s.io/pause/blobs/" + layer.String(), map[string]string{"Range": "bytes=10-99"}, 206},
		{"if-none-match", "GET", "/v2/registry.k8s.io/pause/blobs/" + layer.String(), map[string]string{"If-None-Match": `"` + layer.String() + `"`}, 304},
		{"not linked here", "GET", "/v2/registry.k8s.io/pause/blobs/" + appLayer.String(), nil, 404},
		{"unknown digest", "GET", "/v2/registry.k8s.io/pause/blobs/sha256:" + strings.Repeat("0", 64), nil, 404},
		{"bad digest", "GET", "/v2/registry.k8s.io/pause/blobs/sha256:zz", nil, 400},
		{"dot-dot name", "GET", "/v2/registry.k8s.io/../../../blobs/" + layer.String(), nil, 404},
		{"push refused", "POST", "/v2/registry.k8s.io/pause/blobs/uploads/", nil, 405},
		{"manifest delete refused", "DELETE", "/v2/registry.k8s.io/pause/manifests/" + f.pause.String(), nil, 405},
	}
	headers := []string{"Content-Type", "Content-Length", "Content-Range", "Docker-Content-Digest", "ETag", "Cache-Control", "Docker-Distribution-Api-Version", "X-Content-Type-Options", "Accept-Ranges"}
	do := func(addr, method, path string, hdr map[string]string) (int, http.Header, []byte) {
		req, _ := http.NewRequest(method, "https://"+addr+path, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, body
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs, fh, fb := do(fastAddr, tc.method, tc.path, tc.hdr)
			ss, sh, sb := do(slowAddr, tc.method, tc.path, tc.hdr)
			if fs != tc.status || ss != tc.status {
				t.Fatalf("status fast=%d distribution=%d, want %d", fs, ss, tc.status)
			}
			if !bytes.Equal(fb, sb) {
				t.Fatalf("bodies differ: fast %d bytes, distribution %d bytes", len(fb), len(sb))
			}
			for _, k := range headers {
				if fh.Get(k) != sh.Get(k) {
					t.Errorf("header %s: fast %q, distribution %q", k, fh.Get(k), sh.Get(k))
				}
			}
		})
	}
	// The blob bytes are the layout's bytes.
	_, _, body := do(fastAddr, "GET", "/v2/registry.k8s.io/pause/blobs/"+layer.String(), nil)
	want, _ := os.ReadFile(filepath.Join(f.dir, "blobs/sha256", layer.Hex))
	if !bytes.Equal(body, want) {
		t.Fatal("served blob differs from the layout file")
	}
}

// TestMalformedPathsAreClientErrors: a repository name the OCI distribution spec does not allow (over
// 255 characters, reference.RepositoryNameTotalLengthMax) answers NAME_INVALID with 400, on every route
// and method, as distribution's own error table says (distribution v3.1.2 itself answered 500 UNKNOWN);
// a malformed digest in the path answers DIGEST_INVALID with 400 and a message about the path's
// digest (distribution's stock message is about uploaded content). Both paths, fast and distribution.
func TestMalformedPathsAreClientErrors(t *testing.T) {
	f, addr, _, client, _ := servedFixture(t)
	layer := readManifest(t, f.dir, f.pause).Layers[0].Digest
	long := "registry.k8s.io/" + strings.Repeat("p", 256-len("registry.k8s.io/"))
	max := long[:255]
	type answer struct {
		status  int
		code    string
		message string // substring of the first error's message
	}
	nameInvalid := answer{400, "NAME_INVALID", "invalid repository name"}
	digestInvalid := answer{400, "DIGEST_INVALID", "digest in the request path"}
	cases := []struct {
		path string
		want answer
	}{
		{"/v2/" + long + "/manifests/latest", nameInvalid},
		{"/v2/" + long + "/manifests/" + f.pause.String(), nameInvalid},
		{"/v2/" + long + "/blobs/" + layer.String(), nameInvalid},
		{"/v2/" + long + "/tags/list", nameInvalid},
		{"/v2/" + long + "/blobs/uploads/", nameInvalid},
		{"/v2/" + long + "/blobs/uploads/0123", nameInvalid},
		{"/v2/" + strings.Repeat("a/", 130) + "a/manifests/1", nameInvalid},
		{"/v2/" + max + "/manifests/latest", answer{404, "MANIFEST_UNKNOWN", ""}},
		{"/v2/registry.k8s.io/pause/blobs/sha256:zz", digestInvalid},
		{"/v2/registry.k8s.io/pause/blobs/sha256:" + strings.Repeat("a", 63), digestInvalid},
		{"/v2/registry.k8s.io/pause/blobs/md5:" + strings.Repeat("a", 32), digestInvalid},
		{"/v2/registry.k8s.io/pause/manifests/sha256:zz", digestInvalid},
		{"/v2/registry.k8s.io/pause/manifests/sha256:" + strings.ToUpper(f.pause.Hex), digestInvalid},
		{"/v2/registry.k8s.io/pause/blobs/sha512:" + strings.Repeat("a", 128), answer{404, "BLOB_UNKNOWN", ""}},
	}
	for _, tc := range cases {
		for _, method := range []string{"GET", "HEAD", "PUT", "DELETE", "PATCH", "POST"} {
			want := tc.want
			if want.status == 404 && method != "GET" && method != "HEAD" {
				want = answer{405, "UNSUPPORTED", ""} // read-only: only names and digests are checked first
			}
			req, _ := http.NewRequest(method, "https://"+addr+tc.path, nil)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			short := tc.path
			if len(short) > 80 {
				short = short[:80] + "..."
			}
			if resp.StatusCode != want.status {
				t.Errorf("%s %s: %d %s, want %d %s", method, short, resp.StatusCode, body, want.status, want.code)
				continue
			}
			if want.status == 405 && resp.Header.Get("Allow") != "GET, HEAD" {
				t.Errorf("%s %s: 405 with Allow %q, want \"GET, HEAD\" (RFC 9110 §15.5.6)", method, short, resp.Header.Get("Allow"))
			}
			if method == "HEAD" || want.code == "" { // no body
				continue
			}
			var e struct {
				Errors []struct{ Code, Message string } `json:"errors"`
			}
			if err := json.Unmarshal(body, &e); err != nil || len(e.Errors) == 0 || e.Errors[0].Code != want.code ||
				!strings.Contains(e.Errors[0].Message, want.message) || strings.Contains(e.Errors[0].Message, "upload") {
				t.Errorf("%s %s: body %s, want the OCI error %s (%q)", method, short, body, want.code, want.message)
			}
			if len(body) > 1024 {
				t.Errorf("%s %s: a %d-byte error body echoes the request", method, short, len(body))
			}
		}
	}
}

func TestNewHandlerTwiceAndEnvCannotUnlock(t *testing.T) {
	// Operators' REGISTRY_* variables must not make the mirror writable or move its storage.
	t.Setenv("REGISTRY_STORAGE_MAINTENANCE_READONLY", "{enabled: false}")
	t.Setenv("REGISTRY_STORAGE_DELETE_ENABLED", "true")
	root := t.TempDir()
	var hs []*Handler
	for range 2 {
		h, err := NewHandler(context.Background(), root, nil)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	ca := newTestCA(t)
	addr, client := ca.serveTLS(t, hs[1])
	resp, err := client.Post("https://"+addr+"/v2/x.io/y/blobs/uploads/", "application/octet-stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("upload with REGISTRY_* overrides: %d, want 405", resp.StatusCode)
	}
	for _, h := range hs {
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
		if err := h.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	}
	if _, err := NewHandler(context.Background(), "", nil); !errors.Is(err, ErrHandler) {
		t.Fatalf("empty root: %v, want ErrHandler", err)
	}
}

func TestHandlerRoutesDistributionLogs(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h, err := NewHandler(context.Background(), t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	addr, client := newTestCA(t).serveTLS(t, h)
	resp, err := client.Get("https://" + addr + "/v2/registry.k8s.io/none/manifests/1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("unknown manifest: %d", resp.StatusCode)
	}
	var rec map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		if err := json.Unmarshal([]byte(line), &rec); err == nil && rec["msg"] == "registry: distribution" {
			break
		}
		rec = nil
	}
	if rec == nil || rec["level"] != "DEBUG" || fmt.Sprint(rec["http.response.status"]) != "404" {
		t.Fatalf("distribution's 404 log not routed to slog at DEBUG; got:\n%s", buf.String())
	}
	if d := cmp.Diff("MANIFEST_UNKNOWN", fmt.Sprint(rec["err.code"])); d != "" && !strings.Contains(fmt.Sprint(rec), "unknown") {
		t.Fatalf("log record lacks the error: %v", rec)
	}
}

// BenchmarkServeBlob measures one blob GET through the handler in-process (no network, no TLS), with
// the fast path and with distribution's blob handler. test/bench/registry-blobs.sh measures over TLS
// against nginx.
func BenchmarkServeBlob(b *testing.B) {
	f := writeFixture(b, b.TempDir())
	root := b.TempDir()
	if _, err := Import(context.Background(), f.dir, root, nil); err != nil {
		b.Fatal(err)
	}
	layer := readManifest(b, f.dir, f.pause).Layers[0]
	for _, fast := range []bool{true, false} {
		b.Run(fmt.Sprintf("fast=%v", fast), func(b *testing.B) {
			h, err := NewHandler(context.Background(), root, nil, WithBlobFastPath(fast))
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			b.SetBytes(layer.Size)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					w := httptest.NewRecorder()
					h.ServeHTTP(w, httptest.NewRequest("GET", "/v2/registry.k8s.io/pause/blobs/"+layer.Digest.String(), nil))
					if w.Code != http.StatusOK {
						b.Fatalf("status %d", w.Code)
					}
				}
			})
		})
	}
}

// TestContainerdPullsThroughHostsTOMLMirror runs a private containerd (own root, state and socket) and
// pulls "registry.k8s.io/pause:3.10" and "docker.io/library/busybox:1.36" through a hosts.toml mirror
// with override_path pointing at the handler: the layout the lead's ignition/containerd config uses.
// The upstream "server" is a closed loopback port, so a mirror failure cannot reach any network.
func TestContainerdPullsThroughHostsTOMLMirror(t *testing.T) {
	labns.RequireRoot(t)
	containerd := labns.RequireTool(t, "containerd")
	ctr := labns.RequireTool(t, "ctr")
	f, addr, ca, _, _ := servedFixture(t)
	dir, err := os.MkdirTemp("", "ctrd-") // short: the socket path must fit sun_path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "sock")
	conf := fmt.Sprintf("version = 2\nroot = %q\nstate = %q\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\n  address = %q\n",
		filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock)
	must(t, os.WriteFile(filepath.Join(dir, "config.toml"), []byte(conf), 0o600))
	for host, comp := range map[string]string{"registry.k8s.io": "registry.k8s.io", "docker.io": "docker.io"} {
		toml := fmt.Sprintf("server = \"https://127.0.0.1:1\"\n\n[host.\"https://%s/v2/%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = %q\n  override_path = true\n",
			addr, comp, filepath.Join(ca.certDir, "ca.crt"))
		must(t, os.MkdirAll(filepath.Join(dir, "certs.d", host), 0o755))
		must(t, os.WriteFile(filepath.Join(dir, "certs.d", host, "hosts.toml"), []byte(toml), 0o644))
	}
	var logs bytes.Buffer
	cmd := exec.Command(containerd, "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = &logs, &logs
	must(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	run := func(args ...string) (string, error) {
		out, err := exec.Command(ctr, append([]string{"--address", sock, "--namespace", "regtest"}, args...)...).CombinedOutput()
		return string(out), err
	}
	var out string
	for range 100 { // containerd starts in well under a second; give it up to 10 s
		if out, err = run("version"); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("containerd did not start: %v\n%s\n%s", err, out, logs.String())
	}
	for ref, want := range map[string]v1.Hash{"registry.k8s.io/pause:3.10": f.pause, "docker.io/library/busybox:1.36": f.busy} {
		if out, err := run("images", "pull", "--all-platforms", "--hosts-dir", filepath.Join(dir, "certs.d"), ref); err != nil {
			t.Fatalf("ctr pull %s through the mirror: %v\n%s", ref, err, out)
		}
		out, err := run("images", "ls")
		if err != nil || !strings.Contains(out, want.String()) {
			t.Fatalf("ctr images ls lacks %s @ %s: %v\n%s", ref, want, err, out)
		}
	}
}
