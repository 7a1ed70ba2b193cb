package registry

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ExecutableImage is an image WriteExecutableImage wrote.
type ExecutableImage struct {
	Ref    string // the tag reference the layout names it by, e.g. "appliance.local/airgap-appliance/appliance:v0.3.0-1a2b3c4d5e6f"
	Digest string // its manifest digest, "sha256:<64 hex>"
	// Pinned is Ref's repository with the digest, e.g. "appliance.local/airgap-appliance/appliance@sha256:…",
	// what a pod spec names so that a tag moved later can never change what runs.
	Pinned string
}

// ExecutableTagDigits is how many hex digits of the layer's digest WriteExecutableImage puts in the
// tag.
const ExecutableTagDigits = 12

// WriteExecutableImage writes an OCI image layout (image-spec image-layout.md) at layoutDir holding one
// image for linux/GOARCH of this build: a single uncompressed layer (application/vnd.oci.image.layer.v1.tar)
// with the static executable binPath as /<base name of binPath> (mode 0755, owner 0:0, mtime the Unix
// epoch) and that path as the entrypoint. The image is named (org.opencontainers.image.ref.name)
// repo:<tagPrefix><the first ExecutableTagDigits hex digits of the layer's SHA-256>, e.g.
// "appliance.local/airgap-appliance/appliance:v0.3.0-1a2b3c4d5e6f": the layer is a function of the
// executable's bytes and name only, so two builds never share a tag and the same executable always
// gives the same tag and digests.
//
// binPath is read once and its bytes hashed once (the layer's digest, which is also its diff ID and
// names the tag): under emulation (the appliance ISO booted in QEMU's TCG) SHA-256 runs at ~45 MB/s,
// and a second pass over a 55 MB executable cost its first boot 1.2 s.
//
// The layout is written under a temporary name and renamed into place, so a kill never leaves a partial
// layout at layoutDir; an existing layoutDir is kept when it already names the same reference with the
// same digest, and replaced otherwise. Errors: binPath unreadable, repo or tagPrefix invalid (wrapping
// ErrInvalidReference), or the layout not writable.
func WriteExecutableImage(layoutDir, repo, tagPrefix, binPath string) (ExecutableImage, error) {
	// The reference is checked before anything is read: a placeholder stands for the digits.
	if _, err := name.NewTag(repo+":"+tagPrefix+strings.Repeat("0", ExecutableTagDigits), name.StrictValidation); err != nil {
		return ExecutableImage{}, fmt.Errorf("%w: %q with tag prefix %q: %v", ErrInvalidReference, repo, tagPrefix, err)
	}
	f, err := os.Open(binPath)
	if err != nil {
		return ExecutableImage{}, fmt.Errorf("executable image: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ExecutableImage{}, fmt.Errorf("executable image: %w", err)
	}
	// The tar stream is built in one buffer straight from the file: one read, one copy.
	base := filepath.Base(binPath)
	var buf bytes.Buffer
	buf.Grow(int(fi.Size()) + 4<<10)
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{Name: base, Mode: 0o755, Size: fi.Size(), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return ExecutableImage{}, err
	}
	if _, err := io.Copy(tw, f); err != nil {
		return ExecutableImage{}, fmt.Errorf("executable image: read %s: %w", binPath, err)
	}
	if err := tw.Close(); err != nil { // also refuses a file that changed size while it was read
		return ExecutableImage{}, fmt.Errorf("executable image: %s: %w", binPath, err)
	}
	layer := static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer)
	layerDigest, err := layer.Digest()
	if err != nil {
		return ExecutableImage{}, err
	}
	tagged, err := name.NewTag(repo+":"+tagPrefix+layerDigest.Hex[:ExecutableTagDigits], name.StrictValidation)
	if err != nil {
		return ExecutableImage{}, fmt.Errorf("%w: %v", ErrInvalidReference, err)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return ExecutableImage{}, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return ExecutableImage{}, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config.Entrypoint = []string{"/" + base}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return ExecutableImage{}, err
	}
	dgst, err := img.Digest()
	if err != nil {
		return ExecutableImage{}, err
	}
	out := ExecutableImage{Ref: tagged.String(), Digest: dgst.String(), Pinned: tagged.Context().Digest(dgst.String()).String()}
	if p, err := readLayout(layoutDir); err == nil {
		for _, im := range p.images {
			if im.Ref == out.Ref && im.Digest == out.Digest {
				return out, nil
			}
		}
	}
	tmp := layoutDir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return ExecutableImage{}, err
	}
	lp, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return ExecutableImage{}, fmt.Errorf("executable image: %w", err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{refNameAnnotation: out.Ref}),
		layout.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH})); err != nil {
		return ExecutableImage{}, fmt.Errorf("executable image: %w", err)
	}
	if err := os.RemoveAll(layoutDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return ExecutableImage{}, err
	}
	if err := os.Rename(tmp, layoutDir); err != nil {
		return ExecutableImage{}, fmt.Errorf("executable image: %w", err)
	}
	if err := syncFS(layoutDir); err != nil {
		return ExecutableImage{}, err
	}
	return out, nil
}
