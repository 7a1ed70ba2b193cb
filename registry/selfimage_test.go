package registry

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestExecutableImagePulledThroughMirror: the image WriteExecutableImage makes of an executable is
// imported like a bundle's and pulled back through the real handler by its pinned digest reference;
// its one layer holds the executable's bytes, mode 0755, and the config names it as the entrypoint.
// A second write of the same executable keeps the layout (same digest, same files).
func TestExecutableImagePulledThroughMirror(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "appliance")
	content := bytes.Repeat([]byte("\x7fELF not really, but bytes all the same\n"), 1000)
	if err := os.WriteFile(bin, content, 0o755); err != nil {
		t.Fatal(err)
	}
	lay := filepath.Join(dir, "layout")
	const repo, prefix = "appliance.local/airgap-appliance/appliance", "v1.2.3-"
	img, err := WriteExecutableImage(lay, repo, prefix, bin)
	if err != nil {
		t.Fatal(err)
	}
	// The tag's digits are the layer's digest: the tar of the executable, hashed once.
	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	_ = tw.WriteHeader(&tar.Header{Name: "appliance", Mode: 0o755, Size: int64(len(content)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0), Format: tar.FormatPAX})
	_, _ = tw.Write(content)
	_ = tw.Close()
	sum := sha256.Sum256(tarball.Bytes())
	if want := repo + ":" + prefix + hex.EncodeToString(sum[:])[:ExecutableTagDigits]; img.Ref != want {
		t.Errorf("ref %s, want %s", img.Ref, want)
	}
	st1, _ := os.Stat(filepath.Join(lay, "index.json"))
	again, err := WriteExecutableImage(lay, repo, prefix, bin)
	if err != nil || again != img {
		t.Fatalf("second write: %+v %v, want %+v", again, err, img)
	}
	if st2, _ := os.Stat(filepath.Join(lay, "index.json")); !os.SameFile(st1, st2) {
		t.Errorf("the second write of the same executable rewrote the layout")
	}
	root := filepath.Join(dir, "tree")
	res, err := Import(context.Background(), lay, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Registries) != 1 || res.Registries[0] != "appliance.local" || len(res.Images) != 1 || res.Images[0].Digest != img.Digest {
		t.Fatalf("import: %+v, want one image %s from appliance.local", res, img.Digest)
	}
	h, err := NewHandler(context.Background(), root, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	ca := newTestCA(t)
	addr, client := ca.serveTLS(t, h)
	pinned, err := name.ParseReference(addr + "/" + img.Pinned)
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Image(pinned, remote.WithTransport(client.Transport))
	if err != nil {
		t.Fatalf("pull %s: %v", img.Pinned, err)
	}
	cf, err := got.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/appliance" || cf.OS != "linux" {
		t.Errorf("config: entrypoint %v os %s", cf.Config.Entrypoint, cf.OS)
	}
	layers, err := got.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	hdr, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(tr)
	if hdr.Name != "appliance" || hdr.Mode != 0o755 || !bytes.Equal(body, content) {
		t.Errorf("layer entry %s mode %o, %d bytes; want appliance 0755 with the executable's %d bytes", hdr.Name, hdr.Mode, len(body), len(content))
	}
	for _, bad := range [][2]string{{"Not A Ref", prefix}, {repo, "no spaces "}} {
		if _, err := WriteExecutableImage(filepath.Join(dir, "bad"), bad[0], bad[1], bin); !errors.Is(err, ErrInvalidReference) {
			t.Errorf("repository %q, tag prefix %q: %v, want ErrInvalidReference", bad[0], bad[1], err)
		}
	}
}
