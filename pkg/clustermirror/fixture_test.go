package clustermirror

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/airgap-appliance/appliance/pkg/debrepo"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/server"
	"github.com/airgap-appliance/appliance/registry"
	"github.com/airgap-appliance/appliance/test/labns"
)

// testPKI is one appliance CA with two serving certificates for 127.0.0.1, made by pkg/pki: the
// appliance's and the cluster mirror's.
type testPKI struct {
	caFile             string
	pool               *x509.CertPool
	appliance          tls.Certificate
	mirrorCert, mirKey string // PEM files of the mirror's serving certificate and key
}

func newTestPKI(t testing.TB) testPKI {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	ca, _, err := pki.EnsureCA(dir, "test appliance CA", now)
	if err != nil {
		t.Fatal(err)
	}
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	app, _, err := pki.EnsureServingCert(filepath.Join(dir, "appliance"), ca, lo, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	mdir := filepath.Join(dir, "mirror")
	if _, _, err := pki.EnsureServingCert(mdir, ca, lo, nil, now); err != nil {
		t.Fatal(err)
	}
	p := testPKI{caFile: filepath.Join(dir, pki.CACertFile), pool: x509.NewCertPool(), appliance: app,
		mirrorCert: filepath.Join(mdir, pki.ServingCertFile), mirKey: filepath.Join(mdir, pki.ServingKeyFile)}
	p.pool.AppendCertsFromPEM(ca.CertPEM)
	return p
}

// upstream is the appliance's real serving stack (pkg/server with registry.NewHandler over a tree
// registry.Import built from an OCI layout, and a repository built by debrepo.BuildRepo), on
// 127.0.0.1. Its handler is wrapped by a counting hook, the only thing between the client and
// pkg/server: tests use it to count requests and to stop a sync midway.
type upstream struct {
	dir   string // bundle: oci/, repo/, registry/
	refs  []string
	repos []string // registry repositories with their tags, "repo:tag"
	// digestOnly is the image the bundle names by digest only ("registry.k8s.io/etcd@sha256:…").
	digestOnly string
	debs       []string // pool files relative to repo/debian
	url        string
	hs         *http.Server
	requests   atomic.Int64
	blobGets   atomic.Int64
	debGets    atomic.Int64
	hook       atomic.Pointer[func(r *http.Request)]
	written    atomic.Pointer[func(r *http.Request, n int64)] // after each body write: bytes written so far
	ca         testPKI
}

// buildUpstream writes the bundle: four images (an OCI image, an OCI index of two platforms, a
// Docker schema 2 image from a registry with a port, and a larger image of 4 x 2 MiB layers for the
// throughput figure) and a signed repository of three .debs.
func buildUpstream(t testing.TB, ca testPKI) *upstream {
	t.Helper()
	u := &upstream{dir: t.TempDir(), ca: ca}
	ociPath := filepath.Join(u.dir, "oci")
	p, err := layout.Write(ociPath, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	ann := func(ref string) layout.Option {
		u.refs = append(u.refs, ref)
		return layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})
	}
	if err := p.AppendImage(ociImage(t, 2, 2048), ann("registry.k8s.io/pause:3.10")); err != nil {
		t.Fatal(err)
	}
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range []string{"amd64", "arm64"} {
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        ociImage(t, 1, 1024),
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}
	if err := p.AppendIndex(idx, ann("docker.io/library/busybox:1.36")); err != nil {
		t.Fatal(err)
	}
	app, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(app, ann("myreg:5000/team/app:v1")); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(ociImage(t, 4, 2<<20), ann("registry.k8s.io/kube-apiserver:v1.37.2")); err != nil {
		t.Fatal(err)
	}
	// An image the bundle names by digest only: no tag lists it, so the cluster mirror cannot find it.
	etcd := ociImage(t, 1, 512)
	ed, _ := etcd.Digest()
	u.digestOnly = "registry.k8s.io/etcd@" + ed.String()
	if err := p.AppendImage(etcd, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": u.digestOnly})); err != nil {
		t.Fatal(err)
	}
	for _, r := range u.refs {
		repo, tag, err := registry.RepositoryFor(r)
		if err != nil {
			t.Fatal(err)
		}
		u.repos = append(u.repos, repo+":"+tag)
	}
	if _, err := registry.Import(context.Background(), ociPath, filepath.Join(u.dir, "registry"), nil); err != nil {
		t.Fatal(err)
	}

	// The repository as bundlecreate writes it: repo/debian (suite stable, component main) + keyring.
	var debs []string
	debDir := t.TempDir()
	for _, n := range []string{"containerd", "kubelet", "kubeadm"} {
		debs = append(debs, makeDeb(t, debDir, n))
	}
	key, err := debrepo.GenerateRepoKey(time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	repo, err := debrepo.BuildRepo(context.Background(), filepath.Join(u.dir, "repo", "debian"), debs, "stable", "main", "amd64", key,
		debrepo.RepoOptions{Date: time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	for _, pk := range repo.Packages {
		u.debs = append(u.debs, pk.Filename)
	}
	if _, err := key.WritePublicKeyring(filepath.Join(u.dir, "repo", "debian", "appliance-repo.gpg")); err != nil {
		t.Fatal(err)
	}
	return u
}

// ociImage is a random OCI image with layers of size bytes.
func ociImage(t testing.TB, layers int, size int64) v1.Image {
	t.Helper()
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for range layers {
		l, err := random.Layer(size, types.OCILayer)
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatal(err)
		}
	}
	return img
}

var debMu sync.Mutex

// makeDeb builds a package with the real dpkg-deb, uncompressed: 64 KiB of payload, 8 MiB for kubeadm.
func makeDeb(t testing.TB, dir, pkg string) string {
	t.Helper()
	dpkgDeb := labns.RequireTool(t, "dpkg-deb")
	root := filepath.Join(t.TempDir(), pkg)
	for _, d := range []string{"DEBIAN", "usr/share/doc/" + pkg} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctl := "Package: " + pkg + "\nVersion: 1.0-1\nArchitecture: amd64\nMaintainer: Appliance Tests <tests@example.invalid>\nDescription: test package " + pkg + "\n"
	if err := os.WriteFile(filepath.Join(root, "DEBIAN", "control"), []byte(ctl), 0o644); err != nil {
		t.Fatal(err)
	}
	size := 64 << 10
	if pkg == "kubeadm" {
		size = 8 << 20 // many writes of the server's 256 KiB copy buffer: a kill cuts it midway
	}
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i*7 + len(pkg))
	}
	if err := os.WriteFile(filepath.Join(root, "usr/share/doc", pkg, "data"), payload, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, pkg+"_1.0-1_amd64.deb")
	cmd := exec.Command(dpkgDeb, "--root-owner-group", "-Znone", "--build", root, out)
	debMu.Lock()
	defer debMu.Unlock()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// start serves the bundle with pkg/server on addr ("127.0.0.1:0" for any port) until stop.
func (u *upstream) start(t testing.TB, addr string) {
	t.Helper()
	reg, err := registry.NewHandler(context.Background(), filepath.Join(u.dir, "registry"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(u.ca.caFile)
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Options{Listen: addr, Certificate: u.ca.appliance, Registry: reg,
		RepoDir: filepath.Join(u.dir, "repo"), CAPEM: caPEM, Generation: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	u.hs = &http.Server{
		TLSConfig: s.TLSConfig(),
		ErrorLog:  log.New(io.Discard, "", 0),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u.requests.Add(1)
			if strings.Contains(r.URL.Path, "/blobs/sha256:") {
				u.blobGets.Add(1)
			}
			if strings.HasSuffix(r.URL.Path, ".deb") {
				u.debGets.Add(1)
			}
			if f := u.hook.Load(); f != nil {
				(*f)(r)
			}
			if f := u.written.Load(); f != nil {
				w = &countingWriter{ResponseWriter: w, f: func(n int64) { (*f)(r, n) }}
			}
			h.ServeHTTP(w, r)
		}),
	}
	go func() { _ = u.hs.ServeTLS(ln, "", "") }()
	u.url = "https://" + ln.Addr().String()
	t.Cleanup(func() { u.stop(); _ = reg.Close() })
}

// stop closes the server and every connection.
func (u *upstream) stop() {
	if u.hs != nil {
		_ = u.hs.Close()
	}
}

func (u *upstream) setHook(f func(r *http.Request)) { u.hook.Store(&f) }

// countingWriter reports the body bytes written so far after every write (and flushes them, so
// they are on the wire).
type countingWriter struct {
	http.ResponseWriter
	n int64
	f func(int64)
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	if fl, ok := c.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
	c.f(c.n)
	return n, err
}

// mirror is one Run of the cluster mirror on 127.0.0.1.
type mirror struct {
	dir    string
	addr   string
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned err
	err    error
	client *http.Client
	logs   *bytes.Buffer
}

// runMirror starts Run over dir against upstreamURL, on a fresh 127.0.0.1 port.
func runMirror(t testing.TB, ca testPKI, dir, upstreamURL string) *mirror {
	t.Helper()
	return runMirrorCtx(t, context.Background(), ca, dir, upstreamURL)
}

// runMirrorCtx is runMirror under parent: cancelling parent stops Run.
func runMirrorCtx(t testing.TB, parent context.Context, ca testPKI, dir, upstreamURL string) *mirror {
	t.Helper()
	return runMirrorWith(t, parent, ca, dir, upstreamURL, nil)
}

// runMirrorWith is runMirrorCtx with edit applied to the options (nil: none).
func runMirrorWith(t testing.TB, parent context.Context, ca testPKI, dir, upstreamURL string, edit func(*Options)) *mirror {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(parent)
	m := &mirror{dir: dir, addr: ln.Addr().String(), cancel: cancel, done: make(chan struct{}), logs: &bytes.Buffer{}}
	logw := &lockedWriter{w: m.logs}
	o := Options{Upstream: upstreamURL, CAFile: ca.caFile, Dir: dir, CertFile: ca.mirrorCert, KeyFile: ca.mirKey,
		Listener: ln, Log: slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	if edit != nil {
		edit(&o)
	}
	go func() { m.err = Run(ctx, o); close(m.done) }()
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}}
	m.client = &http.Client{Transport: tr}
	t.Cleanup(func() {
		cancel()
		<-m.done
		tr.CloseIdleConnections()
		if t.Failed() {
			t.Logf("cluster mirror log:\n%s", logw.String())
		}
	})
	return m
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

// stop cancels Run and returns its error.
func (m *mirror) stop() error {
	m.cancel()
	return m.wait()
}

// wait waits until Run returns and returns its error.
func (m *mirror) wait() error {
	<-m.done
	return m.err
}

// health GETs /healthz; a connection error is status 0.
func (m *mirror) health(t testing.TB) (int, Health) {
	t.Helper()
	resp, err := m.client.Get("https://" + m.addr + "/healthz")
	if err != nil {
		return 0, Health{}
	}
	defer resp.Body.Close()
	var h Health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatalf("/healthz: %v", err)
	}
	return resp.StatusCode, h
}

// waitFor polls /healthz until cond holds or Run ends; a 3-minute bound only keeps a broken test from
// hanging (it is not a speed assertion).
func (m *mirror) waitFor(t testing.TB, what string, cond func(int, Health) bool) Health {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		code, h := m.health(t)
		if cond(code, h) {
			return h
		}
		select {
		case <-m.done:
			t.Fatalf("Run ended while waiting for %s: %v (last /healthz %d %+v)", what, m.err, code, h)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 3 minutes; last /healthz %d %+v", what, code, h)
		}
	}
}

func (m *mirror) waitSynced(t testing.TB) Health {
	t.Helper()
	return m.waitFor(t, "synced /healthz", func(code int, h Health) bool { return code == http.StatusOK && h.Synced })
}

// get GETs path from the mirror and returns status and body.
func (m *mirror) get(t testing.TB, path string) (int, []byte) {
	t.Helper()
	resp, err := m.client.Get("https://" + m.addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, b
}

// checkServes proves that the mirror serves everything the upstream bundle holds: every image by tag
// and by digest through go-containerregistry (manifests, configs and layers byte-identical to the
// bundle's OCI layout files), every repository file byte-identical, and the CA at /ca.crt.
func checkServes(t *testing.T, u *upstream, m *mirror) {
	t.Helper()
	opts := []remote.Option{remote.WithTransport(m.client.Transport)}
	blob := func(h v1.Hash) []byte {
		b, err := os.ReadFile(filepath.Join(u.dir, "oci", "blobs", h.Algorithm, h.Hex))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, rt := range u.repos {
		ref, err := name.ParseReference(m.addr + "/" + rt)
		if err != nil {
			t.Fatal(err)
		}
		desc, err := remote.Get(ref, opts...)
		if err != nil {
			t.Errorf("pull %s by tag: %v", rt, err)
			continue
		}
		if !bytes.Equal(desc.Manifest, blob(desc.Digest)) {
			t.Errorf("%s: manifest differs from the bundle's", rt)
		}
		byDigest, err := remote.Get(ref.Context().Digest(desc.Digest.String()), opts...)
		if err != nil || !bytes.Equal(byDigest.Manifest, desc.Manifest) {
			t.Errorf("pull %s by digest %s: %v", rt, desc.Digest, err)
		}
		var imgs []v1.Image
		if desc.MediaType.IsIndex() {
			idx, err := desc.ImageIndex()
			if err != nil {
				t.Fatal(err)
			}
			im, _ := idx.IndexManifest()
			for _, c := range im.Manifests {
				img, err := idx.Image(c.Digest)
				if err != nil {
					t.Fatalf("%s child %s: %v", rt, c.Digest, err)
				}
				imgs = append(imgs, img)
			}
		} else {
			img, err := desc.Image()
			if err != nil {
				t.Fatal(err)
			}
			imgs = append(imgs, img)
		}
		for _, img := range imgs {
			raw, err := img.RawConfigFile()
			if err != nil {
				t.Fatalf("%s config: %v", rt, err)
			}
			cd, _ := img.ConfigName()
			if !bytes.Equal(raw, blob(cd)) {
				t.Errorf("%s: config differs from the bundle's", rt)
			}
			layers, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range layers {
				d, _ := l.Digest()
				rc, err := l.Compressed()
				if err != nil {
					t.Fatalf("%s layer %s: %v", rt, d, err)
				}
				got, err := io.ReadAll(rc)
				_ = rc.Close()
				if err != nil || !bytes.Equal(got, blob(d)) {
					t.Errorf("%s layer %s: %d bytes, differs from the bundle's (%v)", rt, d, len(got), err)
				}
			}
		}
	}
	repoRoot := filepath.Join(u.dir, "repo")
	n := 0
	err := filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, p)
		want, _ := os.ReadFile(p)
		code, got := m.get(t, "/repo/"+filepath.ToSlash(rel))
		if code != http.StatusOK || !bytes.Equal(got, want) {
			t.Errorf("/repo/%s: %d, %d bytes, want the upstream's %d bytes", rel, code, len(got), len(want))
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 9 { // keyring, Release, Release.gpg, InRelease, Packages, Packages.gz, 3 .debs
		t.Errorf("only %d repository files compared", n)
	}
	caPEM, _ := os.ReadFile(u.ca.caFile)
	if code, got := m.get(t, "/ca.crt"); code != http.StatusOK || !bytes.Equal(got, caPEM) {
		t.Errorf("/ca.crt: %d %q", code, got)
	}
}

// freePort returns a 127.0.0.1 address nothing listens on right now.
func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}
