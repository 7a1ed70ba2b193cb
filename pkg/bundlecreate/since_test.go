package bundlecreate

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/test/upstream"
)

// TestCreateSince makes a bundle, changes one image upstream, and makes a differential bundle on top
// of the first one: only the changed image's blobs are fetched, the update holds none of the base's
// blobs, refuses to verify alone, and imported onto its base gives the complete, signed bundle.
func TestCreateSince(t *testing.T) {
	ctx := context.Background()
	up := upstream.Start(t, upstream.Options{})
	spec := labSpec(t, up)
	pushAll(t, up, spec)
	var blobGets atomic.Int64
	wrap := func(next http.RoundTripper) http.RoundTripper { return countingTransport{next, &blobGets} }
	baseOut := filepath.Join(t.TempDir(), "base")
	baseRes, err := Create(ctx, Options{Spec: spec, Out: baseOut, WrapTransport: wrap})
	if err != nil {
		t.Fatalf("Create base: %v", err)
	}
	oldTool := bomDigest(t, baseRes.BOM, "registry.k8s.io/extra/tool:1.0")

	// extra/tool:1.0 now names another image (a config and two layers).
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	newTool := up.Push(t, "extra/tool:1.0", img)

	diffOut := filepath.Join(t.TempDir(), "update")
	blobGets.Store(0)
	res, err := Create(ctx, Options{Spec: spec, Out: diffOut, Since: baseOut, WrapTransport: wrap})
	if err != nil {
		t.Fatalf("Create --since: %v", err)
	}
	if got := blobGets.Load(); got != 3 || res.Images.Fetched.Blobs != 4 {
		t.Errorf("the update fetched %d blobs (%d per Mirror, manifests included); want only the changed image's config and 2 layers (and its manifest)",
			got, res.Images.Fetched.Blobs)
	}
	if res.Base == nil || res.Base.Name != baseRes.BOM.Name || res.Seeded.Linked == 0 || res.Pruned.Kept == 0 || res.Pruned.Dropped == 0 {
		t.Fatalf("result: base %v, seeded %+v, pruned %+v", res.Base, res.Seeded, res.Pruned)
	}
	// Nothing of the base is in the update.
	blobs := filepath.Join(bundle.ImagesPath, "blobs", "sha256")
	baseBlobs, err := os.ReadDir(filepath.Join(baseOut, blobs))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range baseBlobs {
		if _, err := os.Stat(filepath.Join(diffOut, blobs, e.Name())); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the update holds the base's blob %s", e.Name())
		}
	}
	if _, err := os.Stat(filepath.Join(diffOut, blobs, newTool.Hex)); err != nil {
		t.Errorf("the update lacks the new image's manifest: %v", err)
	}
	diff, err := bundle.Open(diffOut)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := diff.Verify(ctx, ""); !errors.Is(err, bundle.ErrNeedsBase) {
		t.Errorf("Verify of the update alone: %v, want ErrNeedsBase", err)
	}

	merged := filepath.Join(t.TempDir(), "merged")
	if _, err := bundle.Import(ctx, diffOut, baseOut, merged); err != nil {
		t.Fatalf("Import: %v", err)
	}
	b := openSigned(t, merged, spec)
	bom, err := b.BillOfMaterials()
	if err != nil {
		t.Fatal(err)
	}
	if got := bomDigest(t, bom, "registry.k8s.io/extra/tool:1.0"); got != newTool.String() || len(bom.Images) != 8 {
		t.Errorf("imported bundle: %d images, extra/tool at %s; want 8 and %s", len(bom.Images), got, newTool)
	}
	// The old tool image is not carried along.
	if _, err := os.Stat(filepath.Join(merged, blobs, strings.TrimPrefix(oldTool, "sha256:"))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the imported bundle still holds the replaced image's manifest %s: %v", oldTool, err)
	}

	if _, err := Create(ctx, Options{Spec: spec, Out: baseOut, Since: baseOut}); err == nil || !strings.Contains(err.Error(), "output directory") {
		t.Errorf("Create --since its own output: %v, want a refusal", err)
	}
	if _, err := Create(ctx, Options{Spec: spec, Out: filepath.Join(t.TempDir(), "u2"), Since: diffOut}); !errors.Is(err, bundle.ErrNeedsBase) {
		t.Errorf("Create --since an update that was not imported: %v, want ErrNeedsBase", err)
	}
}

func bomDigest(t *testing.T, bom bundle.BOM, ref string) string {
	t.Helper()
	for _, im := range bom.Images {
		if im.Ref == ref {
			return im.Digest
		}
	}
	t.Fatalf("bill of materials lacks %s", ref)
	return ""
}
