package bundle

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// listTree returns every regular file under dir (slash paths relative to it), sorted.
func listTree(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// copyTree copies every regular file of src into dst.
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	for _, rel := range listTree(t, src) {
		data, err := os.ReadFile(filepath.Join(src, filepath.FromSlash(rel)))
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dst, filepath.FromSlash(rel)), data)
	}
}

// update is a bundle made on top of a signed base the way `bundle create --since` makes one: the
// base's content plus one more image (images/index.json changes, the image's manifest, config and
// layer are added), bundle.yaml naming the base, signed with the base's key. Full is a copy of the
// complete update (before Prune); Added lists the paths of the new image's blobs.
type update struct {
	Base, Dir, Full string
	Priv            ed25519.PrivateKey
	Added           []string
}

func newUpdate(t *testing.T) update {
	t.Helper()
	baseDir, priv := signedBundle(t)
	u := update{Base: baseDir, Dir: t.TempDir(), Full: t.TempDir(), Priv: priv}
	copyTree(t, baseDir, u.Dir)
	for _, f := range []string{SumsFile, SignatureFile} {
		if err := os.Remove(filepath.Join(u.Dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	lp, err := layout.FromPath(filepath.Join(u.Dir, ImagesPath))
	if err != nil {
		t.Fatal(err)
	}
	img, err := random.Image(300, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{RefNameAnnotation: "registry.k8s.io/coredns/coredns:v1.12.0"})); err != nil {
		t.Fatal(err)
	}
	m, _ := img.Manifest()
	dg, _ := img.Digest()
	for _, h := range []string{dg.Hex, m.Config.Digest.Hex, m.Layers[0].Digest.Hex} {
		u.Added = append(u.Added, ImagesPath+"/blobs/sha256/"+h)
	}
	digest, err := SumsDigest(baseDir)
	if err != nil {
		t.Fatal(err)
	}
	meta := testMeta
	meta.Name = "test-bundle-2"
	meta.Base = &BaseRef{Name: testMeta.Name, SumsDigest: digest}
	if err := Create(context.Background(), u.Dir, meta); err != nil {
		t.Fatal(err)
	}
	if err := Sign(u.Dir, priv); err != nil {
		t.Fatal(err)
	}
	copyTree(t, u.Dir, u.Full)
	return u
}

func TestPruneImport(t *testing.T) {
	ctx := context.Background()
	u := newUpdate(t)
	all := listTree(t, u.Full)

	res, err := Prune(u.Dir, u.Base)
	if err != nil {
		t.Fatalf("Prune: %v", err)
	}
	want := append([]string{MetadataFile, SumsFile, SignatureFile, ImagesPath + "/index.json"}, u.Added...)
	slices.Sort(want)
	if got := listTree(t, u.Dir); !slices.Equal(got, want) {
		t.Fatalf("after Prune the update holds\n%s\nwant only what the base lacks\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if res.Kept != 5 || res.Dropped != len(all)-2-5 || res.KeptBytes <= 0 || res.DroppedBytes <= 0 {
		t.Errorf("PruneResult %+v, want 5 kept and %d dropped", res, len(all)-7)
	}
	if _, err := os.Stat(filepath.Join(u.Dir, "repo")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the emptied repo/ directory is still there: %v", err)
	}
	if again, err := Prune(u.Dir, u.Base); err != nil || again != (PruneResult{Kept: 5, KeptBytes: res.KeptBytes, Dropped: res.Dropped}) {
		t.Errorf("Prune again = %+v, %v; want the same files kept and nothing more removed", again, err)
	}

	// The update alone: one clear error naming its base, no pile of missing files.
	diff, err := Open(u.Dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = diff.Verify(ctx, "")
	if !errors.Is(err, ErrNeedsBase) || errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), diff.Meta.Base.SumsDigest) ||
		!strings.Contains(err.Error(), "appliance bundle import") || strings.Count(err.Error(), "\n") > 0 {
		t.Errorf("Verify of the update alone: %v\nwant one line wrapping ErrNeedsBase, naming the base's digest and `appliance bundle import`", err)
	}
	pub := u.Priv.Public().(ed25519.PublicKey)
	if _, err := diff.VerifySignature([]ed25519.PublicKey{pub}); err != nil {
		t.Errorf("the update's signature (over the complete checksum list): %v", err)
	}

	out := filepath.Join(t.TempDir(), "merged")
	ir, err := Import(ctx, u.Dir, u.Base, out)
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	if ir.FromDiff != 5 || ir.FromBase != len(all)-7 || ir.Linked != len(all)-2 || ir.Verify.Files != len(all)-2 {
		t.Errorf("ImportResult %+v, want 5 files from the update, %d from the base, all linked", ir, len(all)-7)
	}
	merged, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := merged.Verify(ctx, ""); err != nil {
		t.Errorf("the imported bundle does not verify: %v", err)
	}
	if _, err := merged.VerifySignature([]ed25519.PublicKey{pub}); err != nil {
		t.Errorf("the imported bundle's signature: %v", err)
	}
	if got := listTree(t, out); !slices.Equal(got, all) {
		t.Fatalf("imported bundle holds\n%s\nwant the complete update\n%s", strings.Join(got, "\n"), strings.Join(all, "\n"))
	}
	for _, rel := range all {
		a, _ := os.ReadFile(filepath.Join(u.Full, filepath.FromSlash(rel)))
		b, _ := os.ReadFile(filepath.Join(out, filepath.FromSlash(rel)))
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from the complete update's", rel)
		}
	}
	// Base files are shared, not copied.
	st1, _ := os.Stat(filepath.Join(u.Base, "repo/debian/dists/stable/Release"))
	st2, _ := os.Stat(filepath.Join(out, "repo/debian/dists/stable/Release"))
	if st1.Sys().(*syscall.Stat_t).Ino != st2.Sys().(*syscall.Stat_t).Ino {
		t.Error("a file from the base was copied, not hard-linked")
	}
	if _, err := os.Stat(out + ".tmp"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s.tmp left behind: %v", out, err)
	}
	if bom, err := merged.BillOfMaterials(); err != nil || bom.Base == nil || len(bom.Images) != 3 {
		t.Errorf("BOM of the imported bundle: base %v, %d images, %v; want the base named and 3 images", bom.Base, len(bom.Images), err)
	}
	if _, err := Import(ctx, u.Dir, u.Base, out); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("Import over an existing bundle: %v, want a refusal", err)
	}
	// The base is untouched and still verifies.
	if b, err := Open(u.Base); err != nil {
		t.Fatal(err)
	} else if _, err := b.Verify(ctx, ""); err != nil {
		t.Errorf("the base after Import: %v", err)
	}
}

func TestImportRefuses(t *testing.T) {
	ctx := context.Background()
	u := newUpdate(t)
	if _, err := Prune(u.Dir, u.Base); err != nil {
		t.Fatal(err)
	}
	baseDigest, _ := SumsDigest(u.Base)

	noOut := func(t *testing.T, out string) {
		t.Helper()
		for _, p := range []string{out, out + ".tmp"} {
			if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s exists after a failed import: %v", p, err)
			}
		}
	}

	t.Run("wrong base", func(t *testing.T) {
		other := newBundle(t)
		otherDigest, _ := SumsDigest(other.Dir)
		out := filepath.Join(t.TempDir(), "merged")
		_, err := Import(ctx, u.Dir, other.Dir, out)
		if err == nil || !strings.Contains(err.Error(), baseDigest) || !strings.Contains(err.Error(), otherDigest) || !strings.Contains(err.Error(), "test-bundle") {
			t.Errorf("Import onto another bundle: %v\nwant an error naming both digests (%s, %s) and the base to use", err, baseDigest, otherDigest)
		}
		noOut(t, out)
		if _, err := Prune(u.Dir, other.Dir); err == nil || !strings.Contains(err.Error(), otherDigest) {
			t.Errorf("Prune against another bundle: %v, want a refusal naming its digest", err)
		}
	})

	t.Run("not differential", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "merged")
		if _, err := Import(ctx, u.Base, u.Base, out); err == nil || !strings.Contains(err.Error(), "not a differential bundle") {
			t.Errorf("Import of a complete bundle: %v", err)
		}
		noOut(t, out)
	})

	t.Run("file in neither", func(t *testing.T) {
		dir := t.TempDir()
		copyTree(t, u.Dir, dir)
		lost := u.Added[1]
		if err := os.Remove(filepath.Join(dir, filepath.FromSlash(lost))); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "merged")
		_, err := Import(ctx, dir, u.Base, out)
		var fe *FileError
		if !errors.Is(err, ErrMissing) || !errors.As(err, &fe) || fe.Path != lost || !strings.Contains(err.Error(), "get the differential bundle again") {
			t.Errorf("Import with %s in neither: %v, want ErrMissing naming it", lost, err)
		}
		noOut(t, out)
	})

	t.Run("corrupt file fails verification", func(t *testing.T) {
		dir := t.TempDir()
		copyTree(t, u.Dir, dir)
		p := filepath.Join(dir, filepath.FromSlash(u.Added[2]))
		data, _ := os.ReadFile(p)
		data[0] ^= 0xff
		write(t, p, data)
		out := filepath.Join(t.TempDir(), "merged")
		_, err := Import(ctx, dir, u.Base, out)
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), u.Added[2]) {
			t.Errorf("Import with a corrupt file: %v, want ErrMismatch naming %s", err, u.Added[2])
		}
		noOut(t, out)
	})

	t.Run("unlisted file", func(t *testing.T) {
		dir := t.TempDir()
		copyTree(t, u.Dir, dir)
		write(t, filepath.Join(dir, "images", "stray"), []byte("x"))
		out := filepath.Join(t.TempDir(), "merged")
		if _, err := Import(ctx, dir, u.Base, out); !errors.Is(err, ErrUnlisted) || !strings.Contains(err.Error(), "images/stray") {
			t.Errorf("Import with an unlisted file: %v, want ErrUnlisted naming it", err)
		}
		noOut(t, out)
	})
}

func TestSeedUnseedBlobs(t *testing.T) {
	base := newBundle(t)
	dir := t.TempDir()
	res, err := SeedBlobs(dir, base.Dir)
	if err != nil {
		t.Fatal(err)
	}
	baseBlobs, _ := os.ReadDir(filepath.Join(base.Dir, filepath.FromSlash(blobsPath)))
	if res.Linked != len(baseBlobs) || res.Copied != 0 {
		t.Fatalf("SeedBlobs = %+v, want all %d base blobs linked", res, len(baseBlobs))
	}
	if again, err := SeedBlobs(dir, base.Dir); err != nil || again != (SeedResult{}) {
		t.Errorf("SeedBlobs again = %+v, %v; want nothing to do", again, err)
	}
	// The new layout keeps only the base's first image: the rest of the seed goes.
	var idx ocispec.Index
	if err := readJSON(filepath.Join(base.ImagesDir(), "index.json"), &idx); err != nil {
		t.Fatal(err)
	}
	keep := ocispec.Descriptor{MediaType: "none"}
	for _, d := range idx.Manifests {
		if d.MediaType == ocispec.MediaTypeImageManifest || d.MediaType == dockerManifest {
			keep = d
		}
	}
	if keep.MediaType == "none" {
		t.Fatalf("the base has no single-image manifest: %+v", idx.Manifests)
	}
	idx.Manifests = []ocispec.Descriptor{keep}
	data, _ := json.Marshal(idx)
	write(t, filepath.Join(dir, ImagesPath, "index.json"), data)
	write(t, filepath.Join(dir, filepath.FromSlash(blobsPath), strings.Repeat("ab", 32)), []byte("not from the base"))
	n, err := UnseedBlobs(dir, base.Dir)
	if err != nil {
		t.Fatal(err)
	}
	left, _ := os.ReadDir(filepath.Join(dir, filepath.FromSlash(blobsPath)))
	// manifest, config, 2 layers of the kept image, and the blob the base does not have.
	if len(left) != 5 || n != len(baseBlobs)-4 {
		t.Errorf("UnseedBlobs removed %d, left %d blobs; want %d removed, 5 left", n, len(left), len(baseBlobs)-4)
	}
}

func TestMetadataBase(t *testing.T) {
	tests := []struct {
		base *BaseRef
		want string
	}{
		{&BaseRef{Name: "k8s-1.37.2", SumsDigest: "sha256:" + strings.Repeat("0a", 32)}, ""},
		{&BaseRef{Name: "K8S", SumsDigest: "sha256:" + strings.Repeat("0a", 32)}, `base.name: "K8S"`},
		{&BaseRef{Name: "k8s", SumsDigest: strings.Repeat("0a", 32)}, `base.sumsDigest: "0a0a`},
		{&BaseRef{Name: "k8s", SumsDigest: "sha256:" + strings.Repeat("0A", 32)}, `base.sumsDigest:`},
	}
	for _, tc := range tests {
		m := testMeta
		m.Base = tc.base
		err := m.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("Validate(%+v) = %v", tc.base, err)
			}
			continue
		}
		if !errors.Is(err, ErrMetadata) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error containing %q", tc.base, err, tc.want)
		}
	}
	// It round-trips through bundle.yaml.
	m := testMeta
	m.Base = tests[0].base
	data, err := MarshalMetadata(m)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "base:\n  name: k8s-1.37.2\n  sumsDigest: sha256:") {
		t.Errorf("bundle.yaml:\n%s", data)
	}
	got, err := ParseMetadata(data)
	if err != nil || got.Base == nil || *got.Base != *m.Base {
		t.Errorf("ParseMetadata = %+v, %v", got.Base, err)
	}
}
