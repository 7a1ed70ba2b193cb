package registry

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestVerifyMirror pulls the fixture's images (an OCI image, an index of two platforms, a Docker schema2
// image) back from the real handler: every manifest and blob is counted once and hashed; then one
// layer's data file in the served tree is corrupted (same size), and VerifyMirror names the digest.
func TestVerifyMirror(t *testing.T) {
	f, addr, _, client, root := servedFixture(t)
	res, _, err := Check(f.dir, root)
	if err != nil {
		t.Fatal(err)
	}
	c, err := VerifyMirror(context.Background(), client, "https://"+addr, res.Images)
	if err != nil {
		t.Fatal(err)
	}
	// pause: 1 manifest; busybox: index + 2 manifests; app: 1 manifest.
	if c.Manifests != 5 || c.Manifests+c.Blobs != f.layers || c.Bytes <= 0 {
		t.Fatalf("verified %+v, want 5 manifests and %d blobs in all", c, f.layers)
	}
	// Corrupt a layer of pause in the served tree (a fresh file: the tree's data file is a link).
	lp, err := layout.FromPath(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	img, err := lp.Image(f.pause)
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := img.Layers()
	d, _ := layers[0].Digest()
	path := blobDataPath(root, d)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[0] ^= 0xff
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = VerifyMirror(context.Background(), client, "https://"+addr, res.Images)
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("corrupted layer %s: %v, want a digest mismatch", d, err)
	}
}
