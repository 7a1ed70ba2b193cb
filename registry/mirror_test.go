package registry

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/test/labns"
	"github.com/airgap-appliance/appliance/test/upstream"
)

// ---- real peer: Debian's docker-registry (distribution 2.8) as a separate process ----

// mtOptions returns MirrorOptions trusting r's CA with the right credentials.
func mtOptions(t testing.TB, r *upstream.Registry, c *mtCounter) MirrorOptions {
	t.Helper()
	kc, err := DockerConfigKeychain(r.DockerConfig(t, r.Password))
	if err != nil {
		t.Fatal(err)
	}
	o := MirrorOptions{RootCAs: r.Pool, Keychain: kc}
	if c != nil {
		o.WrapTransport = c.wrap
	}
	return o
}

// ---- request counting, around Mirror's transport ----

type mtCounter struct {
	mu   sync.Mutex
	reqs []string // "GET https://host/v2/repo/blobs/sha256:..."
}

type mtRoundTripFunc func(*http.Request) (*http.Response, error)

func (f mtRoundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (c *mtCounter) wrap(next http.RoundTripper) http.RoundTripper {
	return mtRoundTripFunc(func(r *http.Request) (*http.Response, error) {
		c.mu.Lock()
		c.reqs = append(c.reqs, r.Method+" "+r.URL.Scheme+"://"+r.URL.Host+r.URL.Path)
		c.mu.Unlock()
		return next.RoundTrip(r)
	})
}

// count returns how many requests contain every substring.
func (c *mtCounter) count(subs ...string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.reqs {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(r, s)
		}
		if ok {
			n++
		}
	}
	return n
}

func (c *mtCounter) reset() {
	c.mu.Lock()
	c.reqs = nil
	c.mu.Unlock()
}

// ---- images ----

// mtImage is a random OCI image with gzip tar layers (so skopeo can copy it), declaring platform in
// its config when platform is not "".
func mtImage(t testing.TB, platform string, layers int, size int64) v1.Image {
	t.Helper()
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	if platform != "" {
		p, err := v1.ParsePlatform(platform)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			t.Fatal(err)
		}
	}
	for range layers {
		l, err := random.Layer(size, types.OCILayer)
		if err != nil {
			t.Fatal(err)
		}
		var aerr error
		if img, aerr = mutate.AppendLayers(img, l); aerr != nil {
			t.Fatal(aerr)
		}
	}
	return img
}

// mtBigImage is an OCI image of n uncompressed layers of size random bytes each (static layers: no
// gzip, so large images build fast).
func mtBigImage(t testing.TB, seed uint64, n, size int, shared ...v1.Layer) v1.Image {
	t.Helper()
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	ls := slices.Clone(shared)
	rng := rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 0xa9}))
	for range n {
		b := make([]byte, size)
		for i := 0; i+8 <= len(b); i += 8 {
			v := rng.Uint64()
			for k := range 8 {
				b[i+k] = byte(v >> (8 * k))
			}
		}
		ls = append(ls, static.NewLayer(b, types.OCIUncompressedLayer))
	}
	img, err := mutate.AppendLayers(img, ls...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// mtIndex is an OCI index with one small image per platform.
func mtIndex(t testing.TB, platforms ...string) v1.ImageIndex {
	t.Helper()
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, s := range platforms {
		p, _ := v1.ParsePlatform(s)
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        mtImage(t, s, 1, 1024),
			Descriptor: v1.Descriptor{Platform: p},
		})
	}
	return idx
}

// ---- layout checks ----

func mtReadIndexJSON(t testing.TB, dir string) v1.IndexManifest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatalf("index.json: %v\n%s", err, b)
	}
	return idx
}

// mtEntry returns index.json's descriptor named ref.
func mtEntry(t testing.TB, dir, ref string) v1.Descriptor {
	t.Helper()
	for _, d := range mtReadIndexJSON(t, dir).Manifests {
		if d.Annotations[refNameAnnotation] == ref {
			return d
		}
	}
	t.Fatalf("index.json has no entry named %q", ref)
	return v1.Descriptor{}
}

// mtCheckBlobs asserts that every file under blobs/sha256 hashes to its name (".partial-" files are
// allowed only with partialOK) and returns the number of blobs.
func mtCheckBlobs(t testing.TB, dir string, partialOK bool) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0
		}
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), partialPrefix) {
			if !partialOK {
				t.Errorf("temporary file left: %s", e.Name())
			}
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if got := sha256Hex(b); got != e.Name() {
			t.Errorf("blob %s holds %d bytes hashing to %s", e.Name(), len(b), got)
		}
		n++
	}
	return n
}

// mtClosure walks d strictly (every referenced blob must exist with its size) and returns its blobs.
func mtClosure(t testing.TB, dir string, d v1.Descriptor) []v1.Hash {
	t.Helper()
	p := filepath.Join(dir, "blobs", "sha256", d.Digest.Hex)
	b, err := os.ReadFile(p)
	if err != nil || int64(len(b)) != d.Size {
		t.Fatalf("blob %s (%s): %d bytes, want %d: %v", d.Digest, d.MediaType, len(b), d.Size, err)
	}
	out := []v1.Hash{d.Digest}
	switch {
	case d.MediaType.IsIndex():
		idx, err := v1.ParseIndexManifest(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range idx.Manifests {
			out = append(out, mtClosure(t, dir, c)...)
		}
	case d.MediaType.IsImage():
		m, err := v1.ParseManifest(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range append([]v1.Descriptor{m.Config}, m.Layers...) {
			out = append(out, mtClosure(t, dir, c)...)
		}
	}
	return out
}

func mtSkopeo(t testing.TB, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(labns.RequireTool(t, "skopeo"), args...).CombinedOutput()
	return string(out), err
}

// mtSkopeoInspect runs `skopeo --override-arch ARCH inspect oci:DIR:REF` and returns the digest of
// the top-level manifest (index or image) and the architecture of the image skopeo chose.
func mtSkopeoInspect(t testing.TB, dir, ref, arch string) (digest, chosen string, err error) {
	t.Helper()
	args := []string{"--override-os", "linux", "--override-arch", arch, "inspect", "oci:" + dir + ":" + ref}
	out, err := mtSkopeo(t, args...)
	if err != nil {
		return "", "", fmt.Errorf("skopeo %v: %w\n%s", args, err, out)
	}
	var v struct{ Digest, Architecture string }
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return "", "", fmt.Errorf("skopeo inspect output: %w\n%s", err, out)
	}
	return v.Digest, v.Architecture, nil
}

func mtWrite(t testing.TB, p string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// ---- tests ----

// TestMirrorPullsByTagAndDigest pulls one image by tag and one by digest from a real registry over
// TLS with basic auth, checks the layout with skopeo and the appliance's own Import, and checks that a
// rerun downloads nothing.
func TestMirrorPullsByTagAndDigest(t *testing.T) {
	reg := upstream.Start(t, upstream.Options{})
	app := mtImage(t, "linux/amd64", 2, 4096)
	appDigest := reg.Push(t, "team/app:v1", app)
	toolDigest := reg.Push(t, "lib/tool:2", mtImage(t, "", 2, 2048))
	docker, err := random.Image(2048, 2) // Docker schema 2 media types
	if err != nil {
		t.Fatal(err)
	}
	dockerDigest := reg.Push(t, "lib/docker:1", docker)

	byTag := reg.Host + "/team/app:v1"
	byDigest := reg.Host + "/lib/tool@" + toolDigest.String()
	dockerRef := reg.Host + "/lib/docker:1"
	dir := filepath.Join(t.TempDir(), "images")
	c := &mtCounter{}
	o := mtOptions(t, reg, c)
	var mu sync.Mutex
	var events []Event
	o.Progress = func(e Event) { mu.Lock(); events = append(events, e); mu.Unlock() }

	refs := []string{byTag, byDigest, dockerRef}
	res, err := Mirror(t.Context(), dir, refs, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Images) != 3 {
		t.Fatalf("result images = %+v", res.Images)
	}
	want := map[string]v1.Hash{byTag: appDigest, byDigest: toolDigest, dockerRef: dockerDigest}
	for _, img := range res.Images {
		d := want[img.Ref]
		if img.Digest != d.String() || img.SourceDigest != d.String() {
			t.Errorf("%s: digest %s (source %s), want %s", img.Ref, img.Digest, img.SourceDigest, d)
		}
		e := mtEntry(t, dir, img.Ref)
		if e.Digest != d {
			t.Errorf("index.json pins %s for %s, want %s", e.Digest, img.Ref, d)
		}
		blobs := mtClosure(t, dir, e)
		if img.Blobs != len(blobs) || img.Fetched.Blobs != len(blobs) || img.Reused.Blobs != 0 {
			t.Errorf("%s: Blobs=%d Fetched=%d Reused=%d, want %d,%d,0", img.Ref, img.Blobs, img.Fetched.Blobs, img.Reused.Blobs, len(blobs), len(blobs))
		}
	}
	for _, img := range res.Images {
		if img.Ref == byTag && !slices.Equal(img.Platforms, []string{"linux/amd64"}) {
			t.Errorf("platforms of %s = %v", byTag, img.Platforms)
		}
		if img.Ref == dockerRef && img.MediaType != string(types.DockerManifestSchema2) {
			t.Errorf("media type of %s = %s", dockerRef, img.MediaType)
		}
	}
	if res.Fetched.Blobs != res.Blobs || res.Reused.Blobs != 0 || res.Fetched.Bytes != res.Size {
		t.Errorf("totals %+v", res)
	}
	mtCheckBlobs(t, dir, false)

	// Events: start, resolved, done for each image; one fetched event per fetched blob; progress
	// reaching each layer's size.
	kinds := map[EventKind]int{}
	progress := map[string]int64{}
	for _, e := range events {
		kinds[e.Kind]++
		if e.Kind == EventBlobProgress {
			progress[e.Digest] = max(progress[e.Digest], e.Done)
		}
		if e.Kind == EventBlobFetched && e.Size > 100000 {
			t.Errorf("unexpected large blob %v", e)
		}
	}
	if kinds[EventImageStart] != 3 || kinds[EventImageResolved] != 3 || kinds[EventImageDone] != 3 || kinds[EventBlobFetched] != res.Fetched.Blobs {
		t.Errorf("event counts %v, fetched %d", kinds, res.Fetched.Blobs)
	}
	for _, e := range events {
		if e.Kind == EventBlobFetched && e.Endpoint != "" && progress[e.Digest] != e.Size {
			t.Errorf("progress of %s reached %d of %d", e.Digest, progress[e.Digest], e.Size)
		}
	}

	// skopeo reads the layout by the full references (its oci: transport only considers index.json
	// entries of OCI media types, so not the Docker schema 2 image; Import below covers that one).
	for _, ref := range []string{byTag, byDigest} {
		d := want[ref]
		got, _, err := mtSkopeoInspect(t, dir, ref, "amd64")
		if err != nil {
			t.Fatal(err)
		}
		if got != d.String() {
			t.Errorf("skopeo sees %s as %s, want %s", ref, got, d)
		}
	}
	if out, err := mtSkopeo(t, "copy", "--insecure-policy", "oci:"+dir+":"+byTag, "dir:"+t.TempDir()); err != nil {
		t.Fatalf("skopeo copy from the layout: %v\n%s", err, out)
	}
	// The appliance's Import accepts it.
	if _, err := Import(t.Context(), dir, t.TempDir(), nil); err != nil {
		t.Fatalf("Import of the mirrored layout: %v", err)
	}

	// Rerun: no blob downloaded, one manifest GET per tag (the digest reference needs no request),
	// and an identical index.json.
	before, _ := os.ReadFile(filepath.Join(dir, "index.json"))
	c.reset()
	o.Progress = nil
	again, err := Mirror(t.Context(), dir, refs, o)
	if err != nil {
		t.Fatal(err)
	}
	if again.Fetched.Blobs != 0 || again.Reused.Blobs != res.Blobs || again.Reused.Bytes != res.Size {
		t.Errorf("rerun totals: fetched %+v reused %+v, want 0 and %d blobs", again.Fetched, again.Reused, res.Blobs)
	}
	if n := c.count("/blobs/"); n != 0 {
		t.Errorf("rerun made %d blob requests: %v", n, c.reqs)
	}
	if n := c.count("GET", "/manifests/"); n != 2 {
		t.Errorf("rerun made %d manifest GETs, want 2 (the tags): %v", n, c.reqs)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "index.json"))
	if !bytes.Equal(before, after) {
		t.Errorf("index.json changed on rerun:\n%s\n%s", before, after)
	}
}

// TestMirrorPlatformFilter mirrors a two-platform index: by default only linux/amd64 is kept in a
// filtered index that skopeo, pkg/bundle's verifier and the appliance (Import + handler) accept;
// "all" and a digest reference keep the registry's index unchanged.
func TestMirrorPlatformFilter(t *testing.T) {
	reg := upstream.Start(t, upstream.Options{})
	idx := mtIndex(t, "linux/amd64", "linux/arm64")
	upstream := reg.PushIndex(t, "multi:1", idx)
	im, _ := idx.IndexManifest()
	amd64, arm64 := im.Manifests[0], im.Manifests[1]
	ref := reg.Host + "/multi:1"

	bdir := t.TempDir()
	dir := filepath.Join(bdir, bundle.ImagesPath)
	res, err := Mirror(t.Context(), dir, []string{ref}, mtOptions(t, reg, nil))
	if err != nil {
		t.Fatal(err)
	}
	img := res.Images[0]
	if img.SourceDigest != upstream.String() || img.Digest == upstream.String() || !slices.Equal(img.Platforms, []string{"linux/amd64"}) {
		t.Fatalf("filtered image %+v, upstream %s", img, upstream)
	}
	e := mtEntry(t, dir, ref)
	if e.Digest.String() != img.Digest || e.MediaType != types.OCIImageIndex {
		t.Fatalf("index.json entry %+v", e)
	}
	fb, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", e.Digest.Hex))
	if err != nil {
		t.Fatal(err)
	}
	filtered, err := v1.ParseIndexManifest(bytes.NewReader(fb))
	if err != nil {
		t.Fatal(err)
	}
	if len(filtered.Manifests) != 1 || filtered.Manifests[0].Digest != amd64.Digest || filtered.Manifests[0].Platform.Architecture != "amd64" {
		t.Fatalf("filtered index %+v", filtered)
	}
	armManifest, _ := idx.Image(arm64.Digest)
	armLayers, _ := armManifest.Layers()
	armLayer, _ := armLayers[0].Digest()
	for _, h := range []v1.Hash{arm64.Digest, armLayer} {
		if _, err := os.Stat(filepath.Join(dir, "blobs", "sha256", h.Hex)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("arm64 blob %s is in the layout (err %v)", h, err)
		}
	}
	if n := len(mtClosure(t, dir, e)); n != img.Blobs {
		t.Errorf("closure %d blobs, result %d", n, img.Blobs)
	}

	// skopeo reads the filtered index, picks the amd64 image and finds no arm64 one.
	if got, arch, err := mtSkopeoInspect(t, dir, ref, "amd64"); err != nil || got != img.Digest || arch != "amd64" {
		t.Errorf("skopeo amd64: %s %s, %v; want %s amd64", got, arch, err, img.Digest)
	}
	if _, arch, err := mtSkopeoInspect(t, dir, ref, "arm64"); err == nil {
		t.Errorf("skopeo found an image (%s) for arm64 in the filtered index", arch)
	}

	// pkg/bundle's verifier accepts the layout inside a bundle.
	meta := bundle.Metadata{APIVersion: bundle.APIVersion, Kind: bundle.Kind, Name: "mirror-test", KubernetesVersion: labns.KubernetesVersion, Created: time.Now()}
	if err := bundle.Create(t.Context(), bdir, meta); err != nil {
		t.Fatal(err)
	}
	b, err := bundle.Open(bdir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Verify(t.Context(), ""); err != nil {
		t.Fatalf("bundle.Verify of a mirrored layout: %v", err)
	}

	// The appliance serves it: Import, the registry handler over TLS, skopeo pulls by tag.
	root := t.TempDir()
	if _, err := Import(t.Context(), dir, root, nil); err != nil {
		t.Fatal(err)
	}
	h, err := NewHandler(t.Context(), root, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	caPEM, leaf := pkitest.Issue(t)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	certDir := t.TempDir()
	mtWrite(t, filepath.Join(certDir, "ca.crt"), caPEM)
	repo, tag, err := RepositoryFor(ref)
	if err != nil {
		t.Fatal(err)
	}
	served := "docker://" + srv.Listener.Addr().String() + "/" + repo + ":" + tag
	if out, err := mtSkopeo(t, "--override-os", "linux", "--override-arch", "amd64", "copy", "--insecure-policy", "--src-cert-dir", certDir, served, "oci:"+t.TempDir()+":x"); err != nil {
		t.Fatalf("skopeo pull of the filtered image through the appliance: %v\n%s", err, out)
	}

	// "all" keeps the registry's index; so does a reference pinning the index digest.
	pinnedRef := reg.Host + "/multi@" + upstream.String()
	for name, tc := range map[string]struct {
		ref       string
		platforms []string
	}{"all": {ref, []string{"all"}}, "pinned digest": {pinnedRef, nil}} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			o := mtOptions(t, reg, nil)
			o.Platforms = tc.platforms
			res, err := Mirror(t.Context(), dir, []string{tc.ref}, o)
			if err != nil {
				t.Fatal(err)
			}
			img := res.Images[0]
			if img.Digest != upstream.String() || !slices.Equal(img.Platforms, []string{"linux/amd64", "linux/arm64"}) {
				t.Fatalf("image %+v, want the whole index %s", img, upstream)
			}
			if e := mtEntry(t, dir, tc.ref); e.Digest != upstream {
				t.Fatalf("index.json pins %s", e.Digest)
			}
			if got, arch, err := mtSkopeoInspect(t, dir, tc.ref, "arm64"); err != nil || got != upstream.String() || arch != "arm64" {
				t.Errorf("skopeo arm64: %s %s, %v", got, arch, err)
			}
		})
	}

	t.Run("no matching platform", func(t *testing.T) {
		o := mtOptions(t, reg, nil)
		o.Platforms = []string{"linux/s390x"}
		_, err := Mirror(t.Context(), t.TempDir(), []string{ref}, o)
		if !errors.Is(err, ErrNoPlatform) || !strings.Contains(err.Error(), "linux/amd64, linux/arm64") || !strings.HasPrefix(err.Error(), ref+": ") {
			t.Fatalf("err = %v, want ErrNoPlatform naming the offered platforms", err)
		}
	})
	t.Run("single image of another platform", func(t *testing.T) {
		reg.Push(t, "armonly:1", mtImage(t, "linux/arm64", 1, 512))
		_, err := Mirror(t.Context(), t.TempDir(), []string{reg.Host + "/armonly:1"}, mtOptions(t, reg, nil))
		if !errors.Is(err, ErrNoPlatform) || !strings.Contains(err.Error(), "linux/arm64") {
			t.Fatalf("err = %v, want ErrNoPlatform", err)
		}
	})
}

// TestMirrorErrors checks that each failure is one line naming the image and its cause, that 401 and
// 404 are not retried, that nothing is fetched for invalid input, and that other images still land.
func TestMirrorErrors(t *testing.T) {
	reg := upstream.Start(t, upstream.Options{})
	reg.Push(t, "team/app:v1", mtImage(t, "", 1, 512))
	good := reg.Host + "/team/app:v1"

	oneLine := func(t *testing.T, err error, ref string, subs ...string) {
		t.Helper()
		if err == nil {
			t.Fatal("no error")
		}
		s := err.Error()
		t.Logf("error line: %s", s)
		if strings.Contains(s, "\n") || !strings.HasPrefix(s, ref+": ") {
			t.Errorf("error is not one line starting with %q: %q", ref, s)
		}
		for _, sub := range subs {
			if !strings.Contains(s, sub) {
				t.Errorf("error %q does not mention %q", s, sub)
			}
		}
		var ie *MirrorImageError
		if !errors.As(err, &ie) || ie.Ref != ref {
			t.Errorf("error is not a *MirrorImageError for %s: %#v", ref, err)
		}
	}

	t.Run("wrong password", func(t *testing.T) {
		c := &mtCounter{}
		kc, err := DockerConfigKeychain(reg.DockerConfig(t, "wrong"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = Mirror(t.Context(), t.TempDir(), []string{good}, MirrorOptions{RootCAs: reg.Pool, Keychain: kc, WrapTransport: c.wrap})
		if !errors.Is(err, ErrUpstreamAuth) {
			t.Fatalf("err = %v, want ErrUpstreamAuth", err)
		}
		oneLine(t, err, good, "401", "credentials")
		if n := c.count("/manifests/"); n != 1 {
			t.Errorf("%d manifest requests, want 1 (no retry on 401): %v", n, c.reqs)
		}
	})
	t.Run("no credentials", func(t *testing.T) {
		_, err := Mirror(t.Context(), t.TempDir(), []string{good}, MirrorOptions{RootCAs: reg.Pool})
		if !errors.Is(err, ErrUpstreamAuth) {
			t.Fatalf("err = %v, want ErrUpstreamAuth", err)
		}
		oneLine(t, err, good, "401")
	})
	t.Run("missing tag", func(t *testing.T) {
		c := &mtCounter{}
		ref := reg.Host + "/team/app:nope"
		_, err := Mirror(t.Context(), t.TempDir(), []string{ref}, mtOptions(t, reg, c))
		if !errors.Is(err, ErrUpstreamNotFound) {
			t.Fatalf("err = %v, want ErrUpstreamNotFound", err)
		}
		oneLine(t, err, ref, `tag "nope"`, "404", "MANIFEST_UNKNOWN")
		if n := c.count("/manifests/"); n != 1 {
			t.Errorf("%d manifest requests, want 1 (no retry on 404)", n)
		}
	})
	t.Run("missing repository", func(t *testing.T) {
		ref := reg.Host + "/nobody/here:1"
		_, err := Mirror(t.Context(), t.TempDir(), []string{ref}, mtOptions(t, reg, nil))
		if !errors.Is(err, ErrUpstreamNotFound) {
			t.Fatalf("err = %v, want ErrUpstreamNotFound", err)
		}
		oneLine(t, err, ref, "404")
	})
	t.Run("unknown CA", func(t *testing.T) {
		o := mtOptions(t, reg, nil)
		o.RootCAs = nil // the system's roots do not know the test CA
		_, err := Mirror(t.Context(), t.TempDir(), []string{good}, o)
		if !errors.Is(err, ErrUpstreamUnreachable) {
			t.Fatalf("err = %v, want ErrUpstreamUnreachable", err)
		}
		oneLine(t, err, good, "TLS", "x509")
	})
	t.Run("registry down", func(t *testing.T) {
		l, _ := net.Listen("tcp", "127.0.0.1:0")
		host := l.Addr().String()
		_ = l.Close()
		ref := host + "/x/y:1"
		_, err := Mirror(t.Context(), t.TempDir(), []string{ref}, MirrorOptions{Retries: -1})
		if !errors.Is(err, ErrUpstreamUnreachable) {
			t.Fatalf("err = %v, want ErrUpstreamUnreachable", err)
		}
		oneLine(t, err, ref, "cannot reach", "connection refused")
	})
	t.Run("one bad image does not stop the others", func(t *testing.T) {
		dir := t.TempDir()
		bad := reg.Host + "/team/app:missing"
		res, err := Mirror(t.Context(), dir, []string{bad, good}, mtOptions(t, reg, nil))
		if !errors.Is(err, ErrUpstreamNotFound) || strings.Contains(err.Error(), good+":") {
			t.Fatalf("err = %v", err)
		}
		if len(res.Images) != 1 || res.Images[0].Ref != good {
			t.Fatalf("result %+v", res.Images)
		}
		mtEntry(t, dir, good)
		if n := len(mtReadIndexJSON(t, dir).Manifests); n != 1 {
			t.Fatalf("index.json has %d entries", n)
		}
	})
	t.Run("invalid input reported at once, nothing fetched", func(t *testing.T) {
		c := &mtCounter{}
		o := mtOptions(t, reg, c)
		o.Platforms = []string{"linux"}
		o.Upstreams = map[string]Upstream{reg.Host: {Mirrors: []string{"ftp://x"}}}
		_, err := Mirror(t.Context(), t.TempDir(), []string{good, "busybox:1.36", "registry.k8s.io/Pause:1"}, o)
		for _, want := range []string{"platforms[0]:", "upstreams[" + reg.Host + "].mirrors[0]:", "refs[1]:", "refs[2]:"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("err = %v, want it to contain %q", err, want)
			}
		}
		if !errors.Is(err, ErrInvalidReference) {
			t.Errorf("err does not wrap ErrInvalidReference")
		}
		if len(c.reqs) != 0 {
			t.Errorf("requests made: %v", c.reqs)
		}
	})
	t.Run("layout locked", func(t *testing.T) {
		dir := t.TempDir()
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			t.Fatal(err)
		}
		if _, err := Mirror(t.Context(), dir, []string{good}, mtOptions(t, reg, nil)); !errors.Is(err, ErrLayoutBusy) {
			t.Fatalf("err = %v, want ErrLayoutBusy", err)
		}
	})
}

// TestMirrorRefetchesDamagedBlobs damages blobs the ways a crash or a careless hand would and checks
// that a rerun fetches exactly those again.
// With a VerifiedStamp the same holds: the stamp trusts a blob only while its file identity (ctime,
// inode…) is unchanged, and any damage changes it.
func TestMirrorRefetchesDamagedBlobs(t *testing.T) {
	reg := upstream.Start(t, upstream.Options{})
	img := mtImage(t, "", 3, 8192)
	reg.Push(t, "team/app:v1", img)
	for _, withStamp := range []bool{false, true} {
		t.Run(fmt.Sprintf("stamp=%v", withStamp), func(t *testing.T) { mtRefetchDamaged(t, reg, img, withStamp) })
	}
}

func mtRefetchDamaged(t *testing.T, reg *upstream.Registry, img v1.Image, withStamp bool) {
	ref := reg.Host + "/team/app:v1"
	dir := t.TempDir()
	c := &mtCounter{}
	o := mtOptions(t, reg, c)
	if withStamp {
		o.VerifiedStamp = filepath.Join(t.TempDir(), "verified.json")
	}
	first, err := Mirror(t.Context(), dir, []string{ref}, o)
	if err != nil {
		t.Fatal(err)
	}
	if withStamp {
		var f blobStampFile
		data, err := os.ReadFile(o.VerifiedStamp)
		ls, _ := img.Layers()
		// The config and the layers; the manifest is resolved anew by every call.
		if err != nil || json.Unmarshal(data, &f) != nil || len(f.Blobs) != len(ls)+1 {
			t.Fatalf("stamp after the first call: %v, %d blobs recorded, want %d: %s", err, len(f.Blobs), len(ls)+1, data)
		}
		// A rerun with nothing changed trusts every blob from the stamp and fetches nothing.
		if again, err := Mirror(t.Context(), dir, []string{ref}, o); err != nil || again.Fetched.Blobs != 0 || again.Reused.Blobs != first.Blobs {
			t.Fatalf("rerun with the stamp: %v, fetched %+v reused %+v", err, again.Fetched, again.Reused)
		}
	}
	ls, _ := img.Layers()
	flip, _ := ls[0].Digest()
	short, _ := ls[1].Digest()
	p := filepath.Join(dir, "blobs", "sha256", flip.Hex)
	b, _ := os.ReadFile(p)
	b[len(b)/2] ^= 0xff // same size, wrong content
	mtWrite(t, p, b)
	if err := os.Truncate(filepath.Join(dir, "blobs", "sha256", short.Hex), 10); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "blobs", "sha256", partialPrefix+"0123456789ab-left-by-a-kill")
	mtWrite(t, stale, []byte("partial"))

	c.reset()
	res, err := Mirror(t.Context(), dir, []string{ref}, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Fetched.Blobs != 2 || res.Reused.Blobs != first.Blobs-2 {
		t.Fatalf("fetched %+v reused %+v, want 2 fetched", res.Fetched, res.Reused)
	}
	if n := c.count("GET", "/blobs/"); n != 2 {
		t.Errorf("%d blob GETs, want 2: %v", n, c.reqs)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale partial file not removed: %v", err)
	}
	mtCheckBlobs(t, dir, false)
	mtClosure(t, dir, mtEntry(t, dir, ref))
}

// TestMirrorConcurrentImages mirrors 5 images sharing a base layer at once (run it with -race): every
// image lands, and the shared layer is downloaded once.
func TestMirrorConcurrentImages(t *testing.T) {
	reg := upstream.Start(t, upstream.Options{})
	base := static.NewLayer(bytes.Repeat([]byte("shared base layer "), 1<<15), types.OCIUncompressedLayer)
	baseDigest, _ := base.Digest()
	var refs []string
	want := map[string]v1.Hash{}
	for i := range 5 {
		ref := fmt.Sprintf("%s/team/app%d:v%d", reg.Host, i, i)
		want[ref] = reg.Push(t, fmt.Sprintf("team/app%d:v%d", i, i), mtBigImage(t, uint64(i), 2, 256<<10, base))
		refs = append(refs, ref)
	}
	dir := t.TempDir()
	c := &mtCounter{}
	o := mtOptions(t, reg, c)
	o.Concurrency = 5
	var events sync.Map
	o.Progress = func(e Event) { events.Store(e.Kind, true) } // exercised concurrently under -race
	res, err := Mirror(t.Context(), dir, refs, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Images) != 5 {
		t.Fatalf("%d images", len(res.Images))
	}
	for ref, d := range want {
		if e := mtEntry(t, dir, ref); e.Digest != d {
			t.Errorf("%s pinned %s, want %s", ref, e.Digest, d)
		}
	}
	if n := c.count("GET", "/blobs/"+baseDigest.String()); n != 1 {
		t.Errorf("shared layer downloaded %d times", n)
	}
	// 5 × (manifest, config, 2 own layers) + the shared layer.
	if res.Blobs != 21 || res.Fetched.Blobs != 21 {
		t.Errorf("totals %+v", res)
	}
	mtCheckBlobs(t, dir, false)
}

// TestMirrorThroughMirrorsAndPlainHTTP serves images through a plain-HTTP pull-through-style mirror
// (another docker-registry) in front of the TLS upstream.
func TestMirrorThroughMirrorsAndPlainHTTP(t *testing.T) {
	up := upstream.Start(t, upstream.Options{})
	cache := upstream.Start(t, upstream.Options{Plain: true})
	inCache := mtImage(t, "", 1, 4096)
	up.Push(t, "team/app:v1", inCache)
	cache.Push(t, "proxy/team/app:v1", inCache)
	up.Push(t, "team/other:v1", mtImage(t, "", 1, 4096))
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := l.Addr().String()
	_ = l.Close()

	refA, refB := up.Host+"/team/app:v1", up.Host+"/team/other:v1"
	c := &mtCounter{}
	o := mtOptions(t, up, c)
	o.Retries = -1
	o.Upstreams = map[string]Upstream{up.Host: {Mirrors: []string{"https://" + dead, "http://" + cache.Host + "/proxy"}}}
	res, err := Mirror(t.Context(), t.TempDir(), []string{refA, refB}, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Images) != 2 {
		t.Fatalf("images %+v", res.Images)
	}
	if n := c.count("GET", cache.Host+"/v2/proxy/team/app/blobs/"); n != 2 {
		t.Errorf("%d blob GETs from the mirror for the cached image, want 2: %v", n, c.reqs)
	}
	if n := c.count("GET", up.Host, "/team/app/blobs/"); n != 0 {
		t.Errorf("the cached image's blobs came from the upstream: %v", c.reqs)
	}
	if n := c.count("GET", up.Host, "/team/other/blobs/"); n != 2 {
		t.Errorf("%d upstream blob GETs for the uncached image, want 2 (fallback): %v", n, c.reqs)
	}

	t.Run("mirror without http:// is never used over plain HTTP", func(t *testing.T) {
		c := &mtCounter{}
		o := mtOptions(t, up, c)
		o.Retries = -1
		o.Upstreams = map[string]Upstream{up.Host: {Mirrors: []string{cache.Host + "/proxy"}}}
		if _, err := Mirror(t.Context(), t.TempDir(), []string{refA}, o); err != nil {
			t.Fatal(err)
		}
		if n := c.count("http://"); n != 0 {
			t.Errorf("plain HTTP requests were made: %v", c.reqs)
		}
	})
	t.Run("plain HTTP registry needs PlainHTTP", func(t *testing.T) {
		ref := cache.Host + "/proxy/team/app:v1"
		_, err := Mirror(t.Context(), t.TempDir(), []string{ref}, MirrorOptions{Retries: -1})
		if !errors.Is(err, ErrUpstreamUnreachable) || !strings.Contains(err.Error(), "plain HTTP") {
			t.Fatalf("err = %v, want a refusal of plain HTTP", err)
		}
		res, err := Mirror(t.Context(), t.TempDir(), []string{ref}, MirrorOptions{Upstreams: map[string]Upstream{cache.Host: {PlainHTTP: true}}})
		if err != nil || len(res.Images) != 1 {
			t.Fatalf("with PlainHTTP: %v", err)
		}
	})
}

// TestMirrorRetriesTransientErrors starts Mirror while the registry is down and brings it back: the
// connection refusals are retried with backoff and the pull completes.
func TestMirrorRetriesTransientErrors(t *testing.T) {
	reg := upstream.Start(t, upstream.Options{})
	reg.Push(t, "team/app:v1", mtImage(t, "", 1, 1024))
	reg.Stop()
	ref := reg.Host + "/team/app:v1"
	o := mtOptions(t, reg, nil)
	var mu sync.Mutex
	var retries []Event
	o.Progress = func(e Event) {
		if e.Kind == EventRetry {
			mu.Lock()
			retries = append(retries, e)
			mu.Unlock()
		}
	}
	type outcome struct {
		res MirrorResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := Mirror(t.Context(), t.TempDir(), []string{ref}, o)
		done <- outcome{res, err}
	}()
	var out outcome
wait:
	for {
		select {
		case out = <-done:
			t.Fatalf("Mirror ended while the registry was down: %v", out.err)
		case <-time.After(20 * time.Millisecond):
			mu.Lock()
			n := len(retries)
			mu.Unlock()
			if n > 0 {
				break wait
			}
		}
	}
	reg.Run(t)
	out = <-done
	if out.err != nil || len(out.res.Images) != 1 {
		t.Fatalf("Mirror across a registry restart: %v", out.err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(retries[0].Error, "connection refused") || retries[0].Delay <= 0 {
		t.Errorf("retry event %+v", retries[0])
	}
}

// TestMirrorTimesOutOnSilentPeer points Mirror at a TCP peer that accepts and never answers.
func TestMirrorTimesOutOnSilentPeer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ref := l.Addr().String() + "/x/y:1"
	_, err = Mirror(ctx, t.TempDir(), []string{ref}, MirrorOptions{Timeout: 300 * time.Millisecond, Retries: -1})
	if !errors.Is(err, ErrUpstreamUnreachable) || ctx.Err() != nil {
		t.Fatalf("err = %v (ctx %v), want ErrUpstreamUnreachable from the request timeout", err, ctx.Err())
	}
	if !strings.Contains(err.Error(), "timeout") && !strings.Contains(err.Error(), "no answer") {
		t.Errorf("error does not say it timed out: %v", err)
	}
}

// ---- child processes: kill -9 and a full disk ----

const mtChildEnv = "APPLIANCE_MIRROR_TEST_CHILD"

type mtChildParams struct {
	Layout       string
	Refs         []string
	CAFile       string
	DockerConfig string
}

type mtChildOutcome struct {
	Result MirrorResult
	Error  string
}

// mtChild runs Mirror as the child process of a test (re-executed test binary) and exits.
func mtChild() {
	var p mtChildParams
	if err := json.Unmarshal([]byte(os.Getenv(mtChildEnv)), &p); err != nil {
		fmt.Fprintln(os.Stderr, "child params:", err)
		os.Exit(2)
	}
	ca, err := os.ReadFile(p.CAFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	kc, err := DockerConfigKeychain(p.DockerConfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	res, err := Mirror(context.Background(), p.Layout, p.Refs, MirrorOptions{RootCAs: pool, Keychain: kc})
	out := mtChildOutcome{Result: res}
	if err != nil {
		out.Error = err.Error()
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
	os.Exit(0)
}

func mtChildCmd(t *testing.T, reg *upstream.Registry, test string, p mtChildParams, wrap ...string) *exec.Cmd {
	t.Helper()
	p.CAFile, p.DockerConfig = reg.CAFile, reg.DockerConfig(t, reg.Password)
	b, _ := json.Marshal(p)
	argv := append(slices.Clone(wrap), os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), mtChildEnv+"="+string(b))
	return cmd
}

// TestMirrorKillResume SIGKILLs a Mirror child process after growing delays while it pulls a 60 MB
// image; after every kill no blob in the layout mismatches its name and index.json is whole, and a
// final run completes the layout, reusing what the killed runs fetched.
func TestMirrorKillResume(t *testing.T) {
	if os.Getenv(mtChildEnv) != "" {
		mtChild()
	}
	reg := upstream.Start(t, upstream.Options{})
	img := mtBigImage(t, 42, 3, 20<<20)
	want := reg.Push(t, "big/image:v1", img)
	ref := reg.Host + "/big/image:v1"
	dir := t.TempDir()

	completed, maxBlobs, midBlob := false, 0, 0
	delay := 20 * time.Millisecond
	for i := 0; i < 16 && !completed; i++ {
		cmd := mtChildCmd(t, reg, "TestMirrorKillResume", mtChildParams{Layout: dir, Refs: []string{ref}})
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("child failed: %v\n%s", err, out.String())
			}
			completed = true
		case <-time.After(delay):
			_ = cmd.Process.Signal(syscall.SIGKILL) // the child this test started, by PID
			<-exited
		}
		n := mtCheckBlobs(t, dir, true)
		maxBlobs = max(maxBlobs, n)
		partial, _ := filepath.Glob(filepath.Join(dir, "blobs", "sha256", partialPrefix+"*"))
		if len(partial) > 0 {
			midBlob++
		}
		if _, err := os.Stat(filepath.Join(dir, "index.json")); err == nil {
			for _, e := range mtReadIndexJSON(t, dir).Manifests {
				mtClosure(t, dir, e) // an entry is only written once its image is complete
			}
		}
		if completed {
			t.Logf("run %d: completed within %v", i, delay)
		} else {
			t.Logf("run %d: killed after %v: %d blobs in place, %d partial files", i, delay, n, len(partial))
		}
		delay = min(delay*3/2, 4*time.Second)
	}
	t.Logf("%d kills landed in the middle of a blob", midBlob)

	res, err := Mirror(t.Context(), dir, []string{ref}, mtOptions(t, reg, nil))
	if err != nil {
		t.Fatal(err)
	}
	if res.Images[0].Digest != want.String() || res.Blobs != 5 {
		t.Fatalf("final result %+v", res)
	}
	switch {
	case completed && res.Fetched.Blobs != 0:
		t.Errorf("final run after a completed child fetched %+v", res.Fetched)
	case maxBlobs > 0 && res.Reused.Blobs == 0:
		t.Errorf("final run reused nothing although killed runs left %d blobs", maxBlobs)
	}
	if got := len(mtClosure(t, dir, mtEntry(t, dir, ref))); got != 5 {
		t.Fatalf("closure %d blobs", got)
	}
	mtCheckBlobs(t, dir, false)
	if _, err := Import(t.Context(), dir, t.TempDir(), nil); err != nil {
		t.Fatalf("Import of the resumed layout: %v", err)
	}
}

// TestMirrorDiskFull runs Mirror in a child process with the layout on a 1 MiB tmpfs mounted in a
// private mount namespace of its own (unshare), so the write fails with ENOSPC.
func TestMirrorDiskFull(t *testing.T) {
	if os.Getenv(mtChildEnv) != "" {
		mtChild()
	}
	labns.RequireRoot(t)
	unshare := labns.RequireTool(t, "unshare")
	reg := upstream.Start(t, upstream.Options{})
	reg.Push(t, "big/image:v1", mtBigImage(t, 7, 3, 1<<20))
	ref := reg.Host + "/big/image:v1"
	dir := t.TempDir()
	cmd := mtChildCmd(t, reg, "TestMirrorDiskFull", mtChildParams{Layout: dir, Refs: []string{ref}},
		unshare, "--mount", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs -o size=1m appliance-mirror-test "$0" && exec "$@"`, dir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var o mtChildOutcome
	if err := json.Unmarshal(out, &o); err != nil {
		t.Fatalf("child output: %v\n%s", err, out)
	}
	t.Logf("error line: %s", o.Error)
	for _, want := range []string{ref + ": ", "disk full", "no space left on device"} {
		if !strings.Contains(o.Error, want) {
			t.Errorf("error %q does not contain %q", o.Error, want)
		}
	}
	if strings.Contains(o.Error, "\n") {
		t.Errorf("error is not one line: %q", o.Error)
	}
}

// ---- benchmark ----

// BenchmarkMirror pulls 3 images of 2×8 MiB layers from a local docker-registry over TLS: "cold" into
// an empty layout each time, "warm" over a complete layout (a rerun: hashing only). MB/s is of image
// bytes.
func BenchmarkMirror(b *testing.B) {
	reg := upstream.Start(b, upstream.Options{})
	var refs []string
	for i := range 3 {
		reg.Push(b, fmt.Sprintf("bench/img%d:v1", i), mtBigImage(b, uint64(100+i), 2, 8<<20))
		refs = append(refs, fmt.Sprintf("%s/bench/img%d:v1", reg.Host, i))
	}
	o := mtOptions(b, reg, nil)
	warm := b.TempDir()
	res, err := Mirror(b.Context(), warm, refs, o)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("cold", func(b *testing.B) {
		b.SetBytes(res.Size)
		for b.Loop() {
			b.StopTimer()
			dir, err := os.MkdirTemp(b.TempDir(), "cold-")
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if _, err := Mirror(b.Context(), dir, refs, o); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			_ = os.RemoveAll(dir)
			b.StartTimer()
		}
	})
	b.Run("warm", func(b *testing.B) {
		b.SetBytes(res.Size)
		for b.Loop() {
			r, err := Mirror(b.Context(), warm, refs, o)
			if err != nil || r.Fetched.Blobs != 0 {
				b.Fatalf("warm rerun fetched %+v: %v", r.Fetched, err)
			}
		}
	})
}
