package registry

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ErrLayout is wrapped by every error about the OCI image layout given to Import or Check: a missing or
// unreadable oci-layout/index.json, a manifest whose bytes do not match its digest, a blob missing or
// of the wrong size, an unsupported manifest type, or two images claiming the same tag.
var ErrLayout = errors.New("invalid OCI image layout")

// refNameAnnotation is the OCI image-layout annotation naming an image (image-spec annotations.md).
const refNameAnnotation = "org.opencontainers.image.ref.name"

// blobSrc is one content-addressed file of the layout.
type blobSrc struct {
	path string // absolute path of blobs/sha256/<hex> in the layout, symlinks resolved
	size int64
}

// repoPlan lists what one mirror repository must hold.
type repoPlan struct {
	layers    map[v1.Hash]bool // _layers links: configs and layers of every image manifest
	manifests []v1.Hash        // _manifests/revisions links, children before their index
	seen      map[v1.Hash]bool
	tags      map[string]v1.Hash // tag -> top-level manifest digest
}

// plan is everything Import must make true, computed from the layout alone.
type plan struct {
	images []Image
	hosts  []string
	blobs  map[v1.Hash]blobSrc
	repos  map[string]*repoPlan
}

// readLayout validates the OCI image layout at dir (image-spec image-layout.md) and computes the plan.
// Manifests and indexes are read and verified against their digests; configs and layers are checked
// for presence and size only (the bundle's per-file checksums are verified before import, and hashing
// every layer would dominate the import time). A child manifest of an index that is absent from the
// layout (a platform filtered out by the bundle builder) is skipped: that platform is then not pullable.
func readLayout(dir string) (*plan, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrLayout, dir, err)
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	ol, err := os.ReadFile(filepath.Join(abs, "oci-layout"))
	if err != nil {
		return nil, fmt.Errorf("%w: %s is not an OCI image layout (no readable oci-layout file): %w", ErrLayout, dir, err)
	}
	var hdr struct {
		Version string `json:"imageLayoutVersion"`
	}
	if err := json.Unmarshal(ol, &hdr); err != nil || hdr.Version != "1.0.0" {
		return nil, fmt.Errorf("%w: %s/oci-layout: want imageLayoutVersion 1.0.0, got %q", ErrLayout, dir, ol)
	}
	raw, err := os.ReadFile(filepath.Join(abs, "index.json"))
	if err != nil {
		return nil, fmt.Errorf("%w: %s/index.json: %w", ErrLayout, dir, err)
	}
	top, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%w: %s/index.json: %w", ErrLayout, dir, err)
	}
	p := &plan{blobs: map[v1.Hash]blobSrc{}, repos: map[string]*repoPlan{}}
	hosts := map[string]bool{}
	w := walker{dir: abs, p: p}
	for i, d := range top.Manifests {
		ref := d.Annotations[refNameAnnotation]
		if ref == "" {
			return nil, fmt.Errorf("%w: %s/index.json manifests[%d] (%s) has no %s annotation; the bundle must name every image", ErrLayout, dir, i, d.Digest, refNameAnnotation)
		}
		pr, err := parseRef(ref)
		if err != nil {
			return nil, fmt.Errorf("%s/index.json manifests[%d]: %w", dir, i, err)
		}
		if pr.digest != "" && pr.digest != d.Digest.String() {
			return nil, fmt.Errorf("%w: %s/index.json manifests[%d]: reference %q pins %s but the descriptor is %s", ErrLayout, dir, i, ref, pr.digest, d.Digest)
		}
		rp := p.repos[pr.repository]
		if rp == nil {
			rp = &repoPlan{layers: map[v1.Hash]bool{}, seen: map[v1.Hash]bool{}, tags: map[string]v1.Hash{}}
			p.repos[pr.repository] = rp
		}
		if err := w.manifest(rp, d, true); err != nil {
			return nil, fmt.Errorf("%s (%s): %w", ref, d.Digest, err)
		}
		if pr.tag != "" {
			if old, ok := rp.tags[pr.tag]; ok && old != d.Digest {
				return nil, fmt.Errorf("%w: %s/index.json names %s:%s twice, with %s and %s", ErrLayout, dir, pr.repository, pr.tag, old, d.Digest)
			}
			rp.tags[pr.tag] = d.Digest
		}
		hosts[pr.host] = true
		p.images = append(p.images, Image{Ref: ref, Repository: pr.repository, Tag: pr.tag, Digest: d.Digest.String()})
	}
	for h := range hosts {
		p.hosts = append(p.hosts, h)
	}
	sort.Strings(p.hosts)
	sort.Slice(p.images, func(i, j int) bool { return p.images[i].Ref < p.images[j].Ref })
	return p, nil
}

type walker struct {
	dir string
	p   *plan
}

// blob records the layout file of d after checking that it exists with d's size.
func (w walker) blob(d v1.Descriptor) error {
	if d.Digest.Algorithm != "sha256" || len(d.Digest.Hex) != 64 {
		return fmt.Errorf("%w: digest %q: only sha256 is supported", ErrLayout, d.Digest)
	}
	if _, ok := w.p.blobs[d.Digest]; ok {
		return nil
	}
	path := filepath.Join(w.dir, "blobs", "sha256", d.Digest.Hex)
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: blob %s (%s) missing from the layout: %w", ErrLayout, d.Digest, d.MediaType, err)
	}
	if !st.Mode().IsRegular() || st.Size() != d.Size {
		return fmt.Errorf("%w: blob %s is %d bytes, its descriptor says %d; the bundle is damaged", ErrLayout, path, st.Size(), d.Size)
	}
	w.p.blobs[d.Digest] = blobSrc{path: path, size: d.Size}
	return nil
}

// manifest walks the manifest or index d, recording its blobs and its revision link (after those of
// its children). required=false tolerates a missing index child.
func (w walker) manifest(rp *repoPlan, d v1.Descriptor, required bool) error {
	if rp.seen[d.Digest] {
		return nil
	}
	if err := w.blob(d); err != nil {
		if !required && errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	raw, err := os.ReadFile(w.p.blobs[d.Digest].path)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrLayout, err)
	}
	sum := sha256.Sum256(raw)
	if hex.EncodeToString(sum[:]) != d.Digest.Hex {
		return fmt.Errorf("%w: manifest blob %s does not match its digest; the bundle is damaged", ErrLayout, d.Digest)
	}
	// distribution's manifestStore.Get accepts schemaVersion 2 with these media types, or none (OCI).
	var head struct {
		SchemaVersion int             `json:"schemaVersion"`
		MediaType     types.MediaType `json:"mediaType"`
		Manifests     json.RawMessage `json:"manifests"`
	}
	if err := json.Unmarshal(raw, &head); err != nil || head.SchemaVersion != 2 {
		return fmt.Errorf("%w: manifest %s is not a schemaVersion 2 manifest (Docker schema 1 is not served)", ErrLayout, d.Digest)
	}
	mt := head.MediaType
	if mt == "" {
		mt = types.OCIManifestSchema1
		if head.Manifests != nil {
			mt = types.OCIImageIndex
		}
	}
	switch mt {
	case types.OCIImageIndex, types.DockerManifestList:
		idx, err := v1.ParseIndexManifest(bytes.NewReader(raw))
		if err != nil {
			return fmt.Errorf("%w: index %s: %w", ErrLayout, d.Digest, err)
		}
		for _, c := range idx.Manifests {
			if !c.MediaType.IsIndex() && !c.MediaType.IsImage() {
				continue // artifacts other than images are not mirrored
			}
			if err := w.manifest(rp, c, false); err != nil {
				return fmt.Errorf("child %s: %w", c.Digest, err)
			}
		}
	case types.OCIManifestSchema1, types.DockerManifestSchema2:
		m, err := v1.ParseManifest(bytes.NewReader(raw))
		if err != nil {
			return fmt.Errorf("%w: manifest %s: %w", ErrLayout, d.Digest, err)
		}
		for _, b := range append([]v1.Descriptor{m.Config}, m.Layers...) {
			if len(b.URLs) > 0 {
				if _, err := os.Stat(filepath.Join(w.dir, "blobs", "sha256", b.Digest.Hex)); err != nil {
					continue // foreign layer fetched by clients from its URLs
				}
			}
			if err := w.blob(b); err != nil {
				return err
			}
			rp.layers[b.Digest] = true
		}
	default:
		return fmt.Errorf("%w: manifest %s has media type %q, which the registry does not serve", ErrLayout, d.Digest, strings.TrimSpace(string(mt)))
	}
	rp.seen[d.Digest] = true
	rp.manifests = append(rp.manifests, d.Digest)
	return nil
}
