package clustermirror

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airgap-appliance/appliance/pkg/debrepo"
	"github.com/airgap-appliance/appliance/test/labns"
)

// TestSyncThenServeOffline: against the appliance's real serving stack, the cluster mirror answers
// /healthz 503 (with what is missing) while it copies, then 200 with the counts; it then serves
// every image (by tag and digest, bytes identical) and every repository file (identical). A new Run
// over the same Dir contacts the upstream not once, and after the upstream is stopped for good a
// further Run still serves everything.
func TestSyncThenServeOffline(t *testing.T) {
	ca := newTestPKI(t)
	u := buildUpstream(t, ca)
	u.start(t, "127.0.0.1:0")
	dir := filepath.Join(t.TempDir(), "mirror")

	// Hold the first blob request until /healthz has been seen answering 503.
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	u.setHook(func(r *http.Request) {
		if strings.Contains(r.URL.Path, "/blobs/") {
			<-release
		}
	})
	m := runMirror(t, ca, dir, u.url)
	h := m.waitFor(t, "503 while syncing", func(code int, h Health) bool {
		return code == http.StatusServiceUnavailable && h.Phase == "images" && strings.Contains(strings.Join(h.Missing, ";"), "0 of 4 images")
	})
	if h.Synced || len(h.Missing) != 2 {
		t.Errorf("/healthz while syncing: %+v, want synced false and what is missing", h)
	}
	if code, _ := m.get(t, "/v2/"); code != http.StatusServiceUnavailable {
		t.Errorf("/v2/ while syncing: %d, want 503", code)
	}
	if code, _ := m.get(t, "/repo/debian/dists/stable/InRelease"); code != http.StatusServiceUnavailable {
		t.Errorf("/repo/ while syncing: %d, want 503", code)
	}
	once.Do(func() { close(release) })
	start := time.Now()
	h = m.waitSynced(t)
	elapsed := time.Since(start)
	if h.Images != 4 || h.Debs != 3 || h.Blobs < 12 || h.Bytes < 8<<20 {
		t.Errorf("/healthz after sync: %+v, want 4 images, 3 debs, >= 12 blobs, >= 8 MiB", h)
	}
	t.Logf("synced %d images, %d blobs, %d debs, %d bytes in %s: %.1f MB/s (incl. hashing and import)",
		h.Images, h.Blobs, h.Debs, h.Bytes, elapsed.Round(time.Millisecond), float64(h.Bytes)/1e6/elapsed.Seconds())
	checkServes(t, u, m)
	if code, _ := m.get(t, "/repo/debian/"); code >= 500 {
		t.Errorf("/repo/debian/: %d", code)
	}
	if err := m.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if logs := m.logs.String(); !strings.Contains(logs, "repository has no tags") || !strings.Contains(logs, "registry.k8s.io/etcd") {
		t.Errorf("the digest-only image registry.k8s.io/etcd was not reported as skipped:\n%s", logs)
	}
	for _, p := range []string{markerFile, "oci/index.json", "registry/docker", "repo/debian/dists/stable/InRelease"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("Dir: %v", err)
		}
	}

	// A restart with the upstream up: not one request reaches it.
	before := u.requests.Load()
	m2 := runMirror(t, ca, dir, u.url)
	if h2 := m2.waitSynced(t); h2.Images != h.Images || h2.Blobs != h.Blobs || h2.Debs != h.Debs || h2.Bytes != h.Bytes {
		t.Errorf("/healthz after restart: %+v, want %+v", h2, h)
	}
	checkServes(t, u, m2)
	if err := m2.stop(); err != nil {
		t.Fatal(err)
	}
	if n := u.requests.Load() - before; n != 0 {
		t.Errorf("a restart over a complete sync sent %d requests to the upstream, want none", n)
	}

	// The appliance is switched off for good: a new Run still serves everything.
	u.stop()
	m3 := runMirror(t, ca, dir, u.url)
	m3.waitSynced(t)
	checkServes(t, u, m3)

	// The real apt-get, as a node runs it after the switch (signed-by the bundle's keyring, the
	// appliance CA for HTTPS), updates from the mirror and downloads every package, verified.
	labns.RequireTool(t, "apt-get")
	aptDir := t.TempDir()
	res, err := debrepo.Resolve(context.Background(), debrepo.Options{
		Sources: []debrepo.Source{{URI: "https://" + m3.addr + "/repo/debian", Suite: "stable", Components: []string{"main"},
			Keyring: filepath.Join(u.dir, "repo", "debian", "appliance-repo.gpg")}},
		Arch: "amd64", Packages: []string{"containerd", "kubelet", "kubeadm"},
		StateDir: filepath.Join(aptDir, "state"), CacheDir: filepath.Join(aptDir, "cache"), CAFile: ca.caFile,
	})
	if err != nil {
		t.Fatalf("apt-get against the cluster mirror: %v", err)
	}
	if len(res.Packages) != 3 {
		t.Errorf("apt-get resolved %d packages, want 3", len(res.Packages))
	}
	for _, p := range res.Packages {
		got, _ := os.ReadFile(p.Path)
		want, _ := os.ReadFile(filepath.Join(u.dir, "repo", "debian", filepath.FromSlash(p.Filename)))
		if !bytes.Equal(got, want) {
			t.Errorf("apt-get downloaded %s: %d bytes, differs from the bundle's %d", p.Filename, len(got), len(want))
		}
	}
}

// TestSyncResumesAfterKill: a sync stopped during the blob copies, and another stopped during the
// .deb copies, each resumed by a new Run, complete without fetching again what was complete: the
// resumed runs fetch fewer blobs and .debs than the bundle has, and everything is served identical.
func TestSyncResumesAfterKill(t *testing.T) {
	ca := newTestPKI(t)
	u := buildUpstream(t, ca)
	u.start(t, "127.0.0.1:0")
	dir := filepath.Join(t.TempDir(), "mirror")

	// First run: stopped at the 6th blob request.
	ctx1, kill1 := context.WithCancel(context.Background())
	u.setHook(func(r *http.Request) {
		if strings.Contains(r.URL.Path, "/blobs/") && u.blobGets.Load() == 6 {
			kill1()
		}
	})
	m := runMirrorCtx(t, ctx1, ca, dir, u.url)
	if err := m.wait(); err != nil {
		t.Fatalf("cancelled Run: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, markerFile)); err == nil {
		t.Fatal("a stopped sync wrote the completion marker")
	}
	firstBlobs := u.blobGets.Load()

	// Second run: stopped at its second .deb request.
	debsBefore := u.debGets.Load()
	ctx2, kill2 := context.WithCancel(context.Background())
	u.setHook(func(r *http.Request) {
		if strings.HasSuffix(r.URL.Path, ".deb") && u.debGets.Load()-debsBefore == 2 {
			kill2()
		}
	})
	m2 := runMirrorCtx(t, ctx2, ca, dir, u.url)
	if err := m2.wait(); err != nil {
		t.Fatalf("cancelled Run: %v", err)
	}
	secondBlobs := u.blobGets.Load() - firstBlobs
	if _, err := os.Stat(filepath.Join(dir, markerFile)); err == nil {
		t.Fatal("a stopped sync wrote the completion marker")
	}

	// Third run: completes.
	u.setHook(func(*http.Request) {})
	debsBefore3, blobsBefore3 := u.debGets.Load(), u.blobGets.Load()
	m3 := runMirror(t, ca, dir, u.url)
	h := m3.waitSynced(t)
	checkServes(t, u, m3)
	thirdDebs, thirdBlobs := u.debGets.Load()-debsBefore3, u.blobGets.Load()-blobsBefore3
	t.Logf("blob requests: run 1 (stopped) %d, run 2 (stopped in .debs) %d, run 3 %d; .deb requests in run 3: %d; bundle: %d blobs, %d debs",
		firstBlobs, secondBlobs, thirdBlobs, thirdDebs, h.Blobs, h.Debs)
	if int(secondBlobs) >= h.Blobs {
		t.Errorf("the resumed run fetched %d blobs again, the bundle has %d: completed blobs were fetched again", secondBlobs, h.Blobs)
	}
	if thirdBlobs != 0 {
		t.Errorf("run 3 fetched %d blobs; all were complete after run 2", thirdBlobs)
	}
	if int(thirdDebs) >= h.Debs {
		t.Errorf("run 3 fetched %d .debs of %d: the one completed in run 2 was fetched again", thirdDebs, h.Debs)
	}
	// No temporary file is left in the served trees.
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && (strings.Contains(d.Name(), ".tmp-") || strings.HasPrefix(d.Name(), ".partial-")) {
			t.Errorf("temporary file left: %s", p)
		}
		return nil
	})
}

// TestCorruptBlobRefused: a layer whose bytes on the upstream no longer match its digest is refused:
// Run ends with ErrMismatch naming the blob, and writes nothing under the blob's name.
func TestCorruptBlobRefused(t *testing.T) {
	ca := newTestPKI(t)
	u := buildUpstream(t, ca)
	// Flip the bytes of the largest layer in place (the registry tree's data file is a hard link).
	var victim string
	var size int64
	ents, _ := os.ReadDir(filepath.Join(u.dir, "oci", "blobs", "sha256"))
	for _, e := range ents {
		fi, _ := e.Info()
		if fi.Size() > size {
			victim, size = e.Name(), fi.Size()
		}
	}
	p := filepath.Join(u.dir, "oci", "blobs", "sha256", victim)
	data, _ := os.ReadFile(p)
	for i := range data[:64] {
		data[i] ^= 0xff
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	u.start(t, "127.0.0.1:0")
	m := runMirror(t, ca, filepath.Join(t.TempDir(), "mirror"), u.url)
	err := m.wait()
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "sha256:"+victim) {
		t.Fatalf("Run: %v, want ErrMismatch naming sha256:%s", err, victim)
	}
	if _, serr := os.Stat(filepath.Join(m.dir, "oci", "blobs", "sha256", victim)); serr == nil {
		t.Errorf("the corrupt blob was written under its name")
	}
	t.Logf("refused: %v", err)
}

// TestCorruptDebRefused: a .deb whose bytes no longer match its Packages entry is refused: Run ends
// with ErrMismatch naming the file.
func TestCorruptDebRefused(t *testing.T) {
	ca := newTestPKI(t)
	u := buildUpstream(t, ca)
	p := filepath.Join(u.dir, "repo", "debian", filepath.FromSlash(u.debs[1]))
	data, _ := os.ReadFile(p)
	data[len(data)-1] ^= 0xff
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	u.start(t, "127.0.0.1:0")
	m := runMirror(t, ca, filepath.Join(t.TempDir(), "mirror"), u.url)
	err := m.wait()
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), u.debs[1]) {
		t.Fatalf("Run: %v, want ErrMismatch naming %s", err, u.debs[1])
	}
}

// TestUnreachableUpstreamRetried: with nothing listening at the upstream address, Run keeps
// retrying and /healthz answers 503 saying why; once the appliance comes up at that address, the
// sync completes.
func TestUnreachableUpstreamRetried(t *testing.T) {
	ca := newTestPKI(t)
	u := buildUpstream(t, ca)
	addr := freePort(t)
	m := runMirror(t, ca, filepath.Join(t.TempDir(), "mirror"), "https://"+addr)
	h := m.waitFor(t, "a retried failure on /healthz", func(code int, h Health) bool {
		return code == http.StatusServiceUnavailable && h.Attempt >= 2 && h.LastError != ""
	})
	if !strings.Contains(h.LastError, "unreachable") || !strings.Contains(h.LastError, "connection refused") {
		t.Errorf("/healthz lastError %q, want it to say the upstream is unreachable", h.LastError)
	}
	u.start(t, addr)
	h = m.waitSynced(t)
	if h.Images != 4 || h.Debs != 3 {
		t.Errorf("/healthz: %+v", h)
	}
	checkServes(t, u, m)
}

// TestConfigErrorsNameFlags: every missing or wrong option is reported at once, each naming its flag.
func TestConfigErrorsNameFlags(t *testing.T) {
	err := Run(context.Background(), Options{Upstream: "http://10.0.0.1:8443/x", Listen: "5443", CAFile: "/nonexistent/ca.crt"})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("Run: %v, want ErrConfig", err)
	}
	for _, want := range []string{"--upstream: \"http://10.0.0.1:8443/x\" is not https://HOST:PORT", "--dir: required", "--listen: \"5443\" is not address:port",
		"--ca-file: open /nonexistent/ca.crt", "--cert-file: required", "--key-file: required"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	// A serving certificate of another CA is refused.
	ca, other := newTestPKI(t), newTestPKI(t)
	err = Run(context.Background(), Options{Upstream: "https://127.0.0.1:1", Listen: "127.0.0.1:0", Dir: t.TempDir(),
		CAFile: ca.caFile, CertFile: other.mirrorCert, KeyFile: other.mirKey})
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "--cert-file: ") || !strings.Contains(err.Error(), "not a serving certificate of the CA in --ca-file") {
		t.Errorf("Run with a foreign certificate: %v", err)
	}
}

// BenchmarkSync measures a complete first sync (catalog, 4 images / 20 blobs, 3 .debs, about 17 MB)
// from the appliance's serving stack on 127.0.0.1 into a fresh directory: MB/s is the whole copy,
// including digest checks, the registry import and the fsyncs (and up to 20 ms of /healthz polling).
func BenchmarkSync(b *testing.B) {
	ca := newTestPKI(b)
	u := buildUpstream(b, ca)
	u.start(b, "127.0.0.1:0")
	var bytes int64
	for i := 0; b.Loop(); i++ {
		m := runMirror(b, ca, filepath.Join(b.TempDir(), "mirror"), u.url)
		bytes = m.waitSynced(b).Bytes
		if err := m.stop(); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(bytes)
}

// TestNoRepositoryUpstream: an appliance whose bundle has no package repository (its /repo/ answers
// 404) is mirrored with its images only: the sync completes with no .deb, and /repo/ answers 404.
func TestNoRepositoryUpstream(t *testing.T) {
	ca := newTestPKI(t)
	u := buildUpstream(t, ca)
	if err := os.RemoveAll(filepath.Join(u.dir, "repo", "debian")); err != nil {
		t.Fatal(err)
	}
	u.start(t, "127.0.0.1:0")
	m := runMirror(t, ca, filepath.Join(t.TempDir(), "mirror"), u.url)
	h := m.waitSynced(t)
	if h.Images != 4 || h.Debs != 0 {
		t.Errorf("/healthz: %+v, want 4 images and no .deb", h)
	}
	if code, _ := m.get(t, "/repo/debian/dists/stable/InRelease"); code != http.StatusNotFound {
		t.Errorf("/repo/debian/dists/stable/InRelease: %d, want 404", code)
	}
	req, _ := http.NewRequest(http.MethodGet, "https://"+m.addr+"/v2/registry.k8s.io/pause/manifests/3.10", nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := m.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("pause manifest: %d", resp.StatusCode)
	}
}

// TestDigestOnlyImagesFromFile: an image the bundle names by digest only is listed by no tag, so
// the mirror copies it only when --images-file names it; then it serves it by digest, byte for byte
// the bundle's manifest, counts it among its images and warns about nothing. A file that is not a
// JSON array of references is refused, naming the flag.
func TestDigestOnlyImagesFromFile(t *testing.T) {
	ca := newTestPKI(t)
	u := buildUpstream(t, ca)
	u.start(t, "127.0.0.1:0")
	imagesFile := filepath.Join(t.TempDir(), "images.json")
	b, _ := json.Marshal([]string{u.digestOnly, "registry.k8s.io/pause:3.10"}) // a listed one too: copied once
	if err := os.WriteFile(imagesFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	m := runMirrorWith(t, context.Background(), ca, filepath.Join(t.TempDir(), "mirror"), u.url, func(o *Options) { o.ImagesFile = imagesFile })
	if h := m.waitSynced(t); h.Images != 5 {
		t.Errorf("/healthz after sync: %d images, want 5 (the 4 tagged and the digest-only one)", h.Images)
	}
	checkServes(t, u, m)
	_, digest, _ := strings.Cut(u.digestOnly, "@")
	ref, err := name.ParseReference(m.addr + "/registry.k8s.io/etcd@" + digest)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(ref, remote.WithTransport(m.client.Transport))
	if err != nil {
		t.Fatalf("pull %s from the mirror: %v", u.digestOnly, err)
	}
	hex := strings.TrimPrefix(digest, "sha256:")
	want, err := os.ReadFile(filepath.Join(u.dir, "oci", "blobs", "sha256", hex))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(desc.Manifest, want) || desc.Digest.String() != digest {
		t.Errorf("the mirror's %s differs from the bundle's manifest", u.digestOnly)
	}
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}
	if logs := m.logs.String(); strings.Contains(logs, "not copied") {
		t.Errorf("a named digest-only image was reported as not copied:\n%s", logs)
	}

	for _, bad := range []string{`{"not": "an array"}`, `["registry.k8s.io/Bad Name"]`} {
		if err := os.WriteFile(imagesFile, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		err := Run(context.Background(), Options{Upstream: u.url, CAFile: ca.caFile, Dir: t.TempDir(), Listen: "127.0.0.1:0",
			CertFile: ca.mirrorCert, KeyFile: ca.mirKey, ImagesFile: imagesFile})
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "--images-file") {
			t.Errorf("images file %s: %v, want a configuration error naming --images-file", bad, err)
		}
	}
}
