package registry

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
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

// WriteExecutableImage writes an OCI image layout (image-spec image-layout.md) at layoutDir holding one
// image, named ref (org.opencontainers.image.ref.name), for linux/GOARCH of this build: a single
// uncompressed layer (application/vnd.oci.image.layer.v1.tar) with the static executable binPath as
// /<base name of binPath> (mode 0755, owner 0:0, mtime the Unix epoch) and that path as the entrypoint.
// The same executable always gives the same digests. The appliance uses it to ship its own binary to the
// cluster (the hand-off's in-cluster mirror runs it as a static pod) without any image in the bundle.
//
// The layout is written under a temporary name and renamed into place, so a kill never leaves a partial
// layout at layoutDir; an existing layoutDir is kept when it already names ref with the same digest, and
// replaced otherwise. Errors: binPath unreadable, ref invalid, or the layout not writable.
func WriteExecutableImage(layoutDir, ref, binPath string) (ExecutableImage, error) {
	tagged, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return ExecutableImage{}, fmt.Errorf("%w: %q: %v", ErrInvalidReference, ref, err)
	}
	data, err := os.ReadFile(binPath)
	if err != nil {
		return ExecutableImage{}, fmt.Errorf("executable image: %w", err)
	}
	base := filepath.Base(binPath)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{Name: base, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return ExecutableImage{}, err
	}
	if _, err := tw.Write(data); err != nil {
		return ExecutableImage{}, err
	}
	if err := tw.Close(); err != nil {
		return ExecutableImage{}, err
	}
	layer := static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer)
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
