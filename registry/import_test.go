package registry

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airgap-appliance/appliance/test/labns"
)

func TestImportTreeAndIdempotence(t *testing.T) {
	f := writeFixture(t, t.TempDir())
	root := filepath.Join(t.TempDir(), "registry")
	res, err := Import(context.Background(), f.dir, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := ImportResult{
		Images: []Image{
			{Ref: "docker.io/library/busybox:1.36", Repository: "docker.io/library/busybox", Tag: "1.36", Digest: f.busy.String()},
			{Ref: "myreg:5000/team/app:v1", Repository: "myreg_5000/team/app", Tag: "v1", Digest: f.app.String()},
			{Ref: "registry.k8s.io/pause:3.10", Repository: "registry.k8s.io/pause", Tag: "3.10", Digest: f.pause.String()},
		},
		Registries: []string{"docker.io", "myreg:5000", "registry.k8s.io"},
		Blobs:      f.layers, Linked: f.layers, Changed: true,
	}
	if d := cmp.Diff(want, res); d != "" {
		t.Fatalf("first import (-want +got):\n%s", d)
	}

	// The exact files distribution's path mapper (registry/storage/paths.go) reads.
	v2 := filepath.Join(root, "docker", "registry", "v2")
	link := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(v2, rel))
		if err != nil {
			t.Fatalf("link missing: %v", err)
		}
		return string(b)
	}
	repo := "repositories/registry.k8s.io/pause/_manifests/"
	if got := link(repo + "tags/3.10/current/link"); got != f.pause.String() {
		t.Errorf("tag current link = %q, want %q", got, f.pause)
	}
	if got := link(repo + "tags/3.10/index/sha256/" + f.pause.Hex + "/link"); got != f.pause.String() {
		t.Errorf("tag index link = %q", got)
	}
	if got := link(repo + "revisions/sha256/" + f.pause.Hex + "/link"); got != f.pause.String() {
		t.Errorf("revision link = %q", got)
	}
	m := readManifest(t, f.dir, f.pause)
	for _, d := range append([]v1.Descriptor{m.Config}, m.Layers...) {
		if got := link("repositories/registry.k8s.io/pause/_layers/sha256/" + d.Digest.Hex + "/link"); got != d.Digest.String() {
			t.Errorf("layer link for %s = %q", d.Digest, got)
		}
	}
	// Index children: revision links in the index's repository, their configs and layers in _layers.
	idx := readIndex(t, f.dir, f.busy)
	for _, c := range idx.Manifests {
		if got := link("repositories/docker.io/library/busybox/_manifests/revisions/sha256/" + c.Digest.Hex + "/link"); got != c.Digest.String() {
			t.Errorf("child revision link = %q", got)
		}
		cm := readManifest(t, f.dir, c.Digest)
		if got := link("repositories/docker.io/library/busybox/_layers/sha256/" + cm.Config.Digest.Hex + "/link"); got != cm.Config.Digest.String() {
			t.Errorf("child config link = %q", got)
		}
	}
	// Every blob data file is a hard link to the layout's file (same filesystem here).
	ents, _ := os.ReadDir(filepath.Join(f.dir, "blobs", "sha256"))
	for _, e := range ents {
		src, _ := os.Stat(filepath.Join(f.dir, "blobs", "sha256", e.Name()))
		dst, err := os.Lstat(filepath.Join(v2, "blobs", "sha256", e.Name()[:2], e.Name(), "data"))
		if err != nil {
			t.Fatalf("blob data missing: %v", err)
		}
		if !os.SameFile(src, dst) || dst.Sys().(*syscall.Stat_t).Nlink < 2 {
			t.Errorf("blob %s is not a hard link to the layout file", e.Name())
		}
	}

	again, err := Import(context.Background(), f.dir, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	want.Changed = false
	if d := cmp.Diff(want, again); d != "" {
		t.Fatalf("second import (-want +got):\n%s", d)
	}
	if _, ok, err := Check(f.dir, root); err != nil || !ok {
		t.Fatalf("Check after import: ok=%v err=%v, want true,nil", ok, err)
	}
	var leftovers []string
	_ = filepath.WalkDir(v2, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), ".tmp-") {
			leftovers = append(leftovers, p)
		}
		return nil
	})
	if len(leftovers) != 0 {
		t.Fatalf("temporary files left: %v", leftovers)
	}
}

func TestImportSymlinksAcrossFilesystems(t *testing.T) {
	shm, err := os.MkdirTemp("/dev/shm", "layout-")
	if err != nil {
		if labns.InCI() {
			t.Fatalf("need /dev/shm (tmpfs) to hold a layout on another filesystem: %v", err)
		}
		t.Skipf("SKIPPED: no /dev/shm for a second filesystem: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(shm) })
	root := t.TempDir()
	a, _ := os.Stat(shm)
	b, _ := os.Stat(root)
	if a.Sys().(*syscall.Stat_t).Dev == b.Sys().(*syscall.Stat_t).Dev {
		t.Fatalf("/dev/shm and %s are on one filesystem; this test needs two", root)
	}
	f := writeFixture(t, shm)
	res, err := Import(context.Background(), f.dir, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Linked != f.layers || res.Copied != 0 {
		t.Fatalf("Linked=%d Copied=%d, want %d,0", res.Linked, res.Copied, f.layers)
	}
	data := filepath.Join(root, "docker/registry/v2/blobs/sha256", f.pause.Hex[:2], f.pause.Hex, "data")
	target, err := os.Readlink(data)
	if err != nil || target != filepath.Join(shm, "blobs/sha256", f.pause.Hex) {
		t.Fatalf("blob data is not a symlink to the layout: %q %v", target, err)
	}
	if _, ok, err := Check(f.dir, root); err != nil || !ok {
		t.Fatalf("Check: ok=%v err=%v", ok, err)
	}
	pullAll(t, root, f)
}

// TestImportRepairs damages the tree the ways a kill or a careless operator would and checks that
// Check notices and Import repairs it.
func TestImportRepairs(t *testing.T) {
	f := writeFixture(t, t.TempDir())
	v2 := func(root string) string { return filepath.Join(root, "docker", "registry", "v2") }
	cases := []struct {
		name   string
		damage func(root string) error
	}{
		{"tag current link removed", func(root string) error {
			return os.Remove(filepath.Join(v2(root), "repositories/registry.k8s.io/pause/_manifests/tags/3.10/current/link"))
		}},
		{"tag link truncated", func(root string) error {
			return os.Truncate(filepath.Join(v2(root), "repositories/registry.k8s.io/pause/_manifests/tags/3.10/current/link"), 0)
		}},
		{"layers dir removed", func(root string) error {
			return os.RemoveAll(filepath.Join(v2(root), "repositories/docker.io/library/busybox/_layers"))
		}},
		{"repository tree cut mid-way", func(root string) error {
			return os.RemoveAll(filepath.Join(v2(root), "repositories/myreg_5000"))
		}},
		{"blob data removed", func(root string) error {
			return os.Remove(filepath.Join(v2(root), "blobs/sha256", f.pause.Hex[:2], f.pause.Hex, "data"))
		}},
		{"blob data truncated copy", func(root string) error {
			p := filepath.Join(v2(root), "blobs/sha256", f.busy.Hex[:2], f.busy.Hex, "data")
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.WriteFile(p, []byte("{"), 0o644)
		}},
		{"blob data dangling symlink", func(root string) error {
			p := filepath.Join(v2(root), "blobs/sha256", f.app.Hex[:2], f.app.Hex, "data")
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.Symlink("/nonexistent/layout/blob", p)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if _, err := Import(context.Background(), f.dir, root, nil); err != nil {
				t.Fatal(err)
			}
			if err := tc.damage(root); err != nil {
				t.Fatal(err)
			}
			if res, ok, err := Check(f.dir, root); err != nil || ok || !res.Changed {
				t.Fatalf("Check after damage: ok=%v changed=%v err=%v, want false,true,nil", ok, res.Changed, err)
			}
			res, err := Import(context.Background(), f.dir, root, nil)
			if err != nil || !res.Changed {
				t.Fatalf("repair: changed=%v err=%v", res.Changed, err)
			}
			if _, ok, err := Check(f.dir, root); err != nil || !ok {
				t.Fatalf("Check after repair: ok=%v err=%v", ok, err)
			}
			pullAll(t, root, f)
		})
	}
}

// TestImportInterrupted stops Import after each possible number of writes (what a kill does, since
// every write is a rename) and checks through distribution itself that every tag that resolves pulls
// completely — a tag never points at missing content — and that a rerun completes the tree.
func TestImportInterrupted(t *testing.T) {
	f := writeFixture(t, t.TempDir())
	errKilled := errors.New("killed")
	for n := 0; ; n++ {
		root := t.TempDir()
		writes := 0
		testHookBeforeWrite = func() error {
			if writes == n {
				return errKilled
			}
			writes++
			return nil
		}
		_, err := Import(context.Background(), f.dir, root, nil)
		testHookBeforeWrite = nil
		if err == nil {
			if n < 10 {
				t.Fatalf("import finished after %d writes; the hook is not wired", n)
			}
			break
		}
		if !errors.Is(err, errKilled) {
			t.Fatal(err)
		}
		resolved := pullResolvable(t, root, f)
		if n == 0 && resolved != 0 {
			t.Fatalf("nothing written yet but %d tags resolve", resolved)
		}
		if _, err := Import(context.Background(), f.dir, root, nil); err != nil {
			t.Fatalf("rerun after kill at write %d: %v", n, err)
		}
		if got := pullResolvable(t, root, f); got != 3 {
			t.Fatalf("after rerun %d of 3 tags resolve", got)
		}
	}
}

func TestImportRefusesBadLayouts(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(t *testing.T, f fixture)
		want   error
		msg    string
	}{
		{"no oci-layout", func(t *testing.T, f fixture) { must(t, os.Remove(filepath.Join(f.dir, "oci-layout"))) }, ErrLayout, "oci-layout"},
		{"missing annotation", func(t *testing.T, f fixture) { editIndex(t, f, refNameAnnotation, "x-other") }, ErrLayout, "no org.opencontainers.image.ref.name annotation"},
		{"unqualified reference", func(t *testing.T, f fixture) { editIndex(t, f, `"registry.k8s.io/pause:3.10"`, `"pause:3.10"`) }, ErrInvalidReference, "not fully qualified"},
		{"duplicate tag", func(t *testing.T, f fixture) {
			editIndex(t, f, `"myreg:5000/team/app:v1"`, `"registry.k8s.io/pause:3.10"`)
		}, ErrLayout, "twice"},
		{"missing layer", func(t *testing.T, f fixture) {
			m := readManifest(t, f.dir, f.pause)
			must(t, os.Remove(filepath.Join(f.dir, "blobs/sha256", m.Layers[0].Digest.Hex)))
		}, ErrLayout, "missing from the layout"},
		{"short layer", func(t *testing.T, f fixture) {
			m := readManifest(t, f.dir, f.pause)
			must(t, os.Truncate(filepath.Join(f.dir, "blobs/sha256", m.Layers[1].Digest.Hex), 3))
		}, ErrLayout, "is 3 bytes"},
		{"corrupt manifest", func(t *testing.T, f fixture) {
			p := filepath.Join(f.dir, "blobs/sha256", f.app.Hex)
			b, _ := os.ReadFile(p)
			b[len(b)-2] ^= 1
			must(t, os.WriteFile(p, b, 0o644))
		}, ErrLayout, "does not match its digest"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := writeFixture(t, t.TempDir())
			tc.mutate(t, f)
			root := t.TempDir()
			_, err := Import(context.Background(), f.dir, root, nil)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Import error = %v, want %v containing %q", err, tc.want, tc.msg)
			}
			if _, _, err := Check(f.dir, root); !errors.Is(err, tc.want) {
				t.Fatalf("Check error = %v, want %v", err, tc.want)
			}
			if ents, _ := os.ReadDir(root); len(ents) != 0 {
				t.Fatalf("a refused layout wrote %v", ents)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func editIndex(t *testing.T, f fixture, old, new string) {
	t.Helper()
	p := filepath.Join(f.dir, "index.json")
	b, err := os.ReadFile(p)
	must(t, err)
	s := strings.Replace(string(b), old, new, 1)
	if s == string(b) {
		t.Fatalf("index.json has no %q", old)
	}
	must(t, os.WriteFile(p, []byte(s), 0o644))
}

func readManifest(t testing.TB, dir string, h v1.Hash) *v1.Manifest {
	t.Helper()
	r, err := os.Open(filepath.Join(dir, "blobs", "sha256", h.Hex))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m, err := v1.ParseManifest(r)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func readIndex(t testing.TB, dir string, h v1.Hash) *v1.IndexManifest {
	t.Helper()
	r, err := os.Open(filepath.Join(dir, "blobs", "sha256", h.Hex))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m, err := v1.ParseIndexManifest(r)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// pullResolvable serves root with a fresh Handler (plain HTTP, in-process) and, for each fixture tag
// that resolves, pulls it completely with go-containerregistry (every layer read, digests verified).
// It returns how many tags resolved.
func pullResolvable(t *testing.T, root string, f fixture) int {
	t.Helper()
	h, err := NewHandler(context.Background(), root, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	srv := httptest.NewServer(h)
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	resolved := 0
	for _, tc := range []struct {
		repo string
		want v1.Hash
	}{{"registry.k8s.io/pause:3.10", f.pause}, {"docker.io/library/busybox:1.36", f.busy}, {"myreg_5000/team/app:v1", f.app}} {
		ref, err := name.ParseReference(host+"/"+tc.repo, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		desc, err := remote.Head(ref)
		if err != nil {
			continue // not resolvable (yet): fine
		}
		resolved++
		if desc.Digest != tc.want {
			t.Fatalf("%s resolves to %s, want %s", tc.repo, desc.Digest, tc.want)
		}
		pullRef(t, ref)
	}
	return resolved
}

func pullAll(t *testing.T, root string, f fixture) {
	t.Helper()
	if n := pullResolvable(t, root, f); n != 3 {
		t.Fatalf("%d of 3 tags resolve", n)
	}
}

// pullRef pulls an image or every child of an index, reading all layer bytes.
func pullRef(t *testing.T, ref name.Reference, opts ...remote.Option) {
	t.Helper()
	desc, err := remote.Get(ref, opts...)
	if err != nil {
		t.Fatalf("get %s: %v", ref, err)
	}
	var imgs []v1.Image
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			t.Fatal(err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range im.Manifests {
			img, err := idx.Image(c.Digest)
			if err != nil {
				t.Fatalf("%s child %s: %v", ref, c.Digest, err)
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
		if _, err := img.RawConfigFile(); err != nil {
			t.Fatalf("%s config: %v", ref, err)
		}
		ls, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			rc, err := l.Compressed()
			if err != nil {
				t.Fatalf("%s layer: %v", ref, err)
			}
			if _, err := readAllClose(rc); err != nil {
				t.Fatalf("%s layer read (digest verified by ggcr): %v", ref, err)
			}
		}
	}
}

func TestRegistriesAndRepositoryFor(t *testing.T) {
	cases := []struct {
		ref, repo, tag string
		err            error
	}{
		{"registry.k8s.io/pause:3.10", "registry.k8s.io/pause", "3.10", nil},
		{"docker.io/library/busybox:1.36", "docker.io/library/busybox", "1.36", nil},
		{"docker.io/busybox", "docker.io/library/busybox", "latest", nil},
		{"index.docker.io/library/busybox:1", "docker.io/library/busybox", "1", nil},
		{"myreg:5000/team/app:v1", "myreg_5000/team/app", "v1", nil},
		{"Registry.Example.COM:443/a/b:c", "registry.example.com_443/a/b", "c", nil},
		{"10.0.0.5:5000/x:1", "10.0.0.5_5000/x", "1", nil},
		{"localhost/x:1", "localhost/x", "1", nil},
		{"quay.io/a/b@sha256:" + strings.Repeat("a", 64), "quay.io/a/b", "", nil},
		{"quay.io/a/b:t@sha256:" + strings.Repeat("a", 64), "quay.io/a/b", "t", nil},
		{"busybox:1.36", "", "", ErrInvalidReference},
		{"library/busybox", "", "", ErrInvalidReference},
		{"3.10", "", "", ErrInvalidReference},
		{"[::1]:5000/x:1", "", "", ErrInvalidReference},
		{"registry.k8s.io/Pause:1", "", "", ErrInvalidReference},
		{"my_reg.io/x:1", "", "", ErrInvalidReference},
		{"a.io/" + strings.Repeat("x", 260) + ":1", "", "", ErrInvalidReference},
	}
	for _, tc := range cases {
		t.Run(tc.ref[:min(len(tc.ref), 40)], func(t *testing.T) {
			repo, tag, err := RepositoryFor(tc.ref)
			if !errors.Is(err, tc.err) || repo != tc.repo || tag != tc.tag {
				t.Fatalf("RepositoryFor(%q) = %q, %q, %v; want %q, %q, %v", tc.ref, repo, tag, err, tc.repo, tc.tag, tc.err)
			}
		})
	}
}

// Grammar of the OCI distribution spec (spec.md, "Pulling manifests").
var (
	specName = regexp.MustCompile(`^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*$`)
	specTag  = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)
)

func readAllClose(rc io.ReadCloser) (int64, error) {
	defer rc.Close()
	return io.Copy(io.Discard, rc)
}

func FuzzRepositoryFor(f *testing.F) {
	for _, s := range []string{"registry.k8s.io/pause:3.10", "myreg:5000/x", "[::1]:5/x", "a.b/c@sha256:" + strings.Repeat("0", 64), "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ref string) {
		repo, tag, err := RepositoryFor(ref)
		if err != nil {
			if !errors.Is(err, ErrInvalidReference) {
				t.Fatalf("error %v does not wrap ErrInvalidReference", err)
			}
			return
		}
		if strings.Contains(repo, ":") || len(repo) > 255 {
			t.Fatalf("%q -> invalid repository %q", ref, repo)
		}
		if !specName.MatchString(repo) {
			t.Fatalf("%q -> repository %q does not match the OCI distribution spec <name> grammar", ref, repo)
		}
		if tag != "" && !specTag.MatchString(tag) {
			t.Fatalf("%q -> tag %q does not match the OCI distribution spec <reference> grammar", ref, tag)
		}
	})
}
