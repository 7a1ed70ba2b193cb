package bundle

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// BOM is a bundle's bill of materials: what it carries, read from its own metadata (bundle.yaml, the
// OCI index and manifests, the Debian Packages indexes). It says what is there, not that it is intact:
// Verify and VerifySignature do that.
type BOM struct {
	Name              string `json:"name"`
	KubernetesVersion string `json:"kubernetesVersion"`
	Created           string `json:"created"`
	// SignedBy is the key ID SHA256SUMS.sig names ("" when unsigned); not a verification.
	SignedBy string `json:"signedBy,omitempty"`
	// Base is the bundle a differential bundle applies to (Metadata.Base); nil for a complete one.
	// A differential bundle that is not imported yet lists only what it holds itself: images whose
	// manifests are in the base show the sizes their descriptors give, packages whose index is
	// unchanged are not listed.
	Base     *BaseRef     `json:"base,omitempty"`
	Images   []BOMImage   `json:"images"`
	Packages []BOMPackage `json:"packages"`
}

// BOMImage is one image of images/index.json.
type BOMImage struct {
	// Ref is the full reference (org.opencontainers.image.ref.name), Digest the pinned manifest or
	// index digest, MediaType its media type.
	Ref, Digest, MediaType string
	// Platforms are "os/arch[/variant]" of an index's manifests, or of the image's config.
	Platforms []string
	// Size is the bytes of every blob the image references (manifests, configs, layers), shared
	// blobs counted in each image.
	Size int64
}

// BOMPackage is one .deb of the Debian repository.
type BOMPackage struct {
	Name, Version, Architecture, SHA256, Filename string
	Size                                          int64
	// Suite is the dists/<suite>/ whose Packages index lists it.
	Suite string
	// Origin is the upstream repository bundle create took it from, "URI SUITE" (the Packages
	// field debrepo.OriginField); "" for bundles made without it.
	Origin string `json:",omitempty"`
}

// BillOfMaterials reads the bundle's contents. Errors name the file that could not be read.
func (b *Bundle) BillOfMaterials() (BOM, error) {
	bom := BOM{Name: b.Meta.Name, KubernetesVersion: b.Meta.KubernetesVersion, Created: b.Meta.Created.Format("2006-01-02T15:04:05Z07:00"), Base: b.Meta.Base}
	if line, err := os.ReadFile(filepath.Join(b.Dir, SignatureFile)); err == nil {
		if f := strings.Fields(string(line)); len(f) == 3 {
			bom.SignedBy = f[1]
		}
	}
	if _, err := os.Stat(b.ImagesDir()); err == nil {
		var idx ocispec.Index
		if err := readJSON(filepath.Join(b.ImagesDir(), ocispec.ImageIndexFile), &idx); err != nil && !(b.Meta.Base != nil && os.IsNotExist(err)) {
			return bom, fmt.Errorf("%s/%s: %w", ImagesPath, ocispec.ImageIndexFile, err)
		}
		for _, d := range idx.Manifests {
			im := BOMImage{Ref: d.Annotations[RefNameAnnotation], Digest: d.Digest.String(), MediaType: d.MediaType}
			if err := b.measure(d, &im, 0); err != nil {
				return bom, fmt.Errorf("image %s: %w", im.Ref, err)
			}
			slices.Sort(im.Platforms)
			bom.Images = append(bom.Images, im)
		}
		slices.SortFunc(bom.Images, func(x, y BOMImage) int { return strings.Compare(x.Ref, y.Ref) })
	}
	dists := filepath.Join(b.RepoDir(), "dists")
	err := filepath.WalkDir(dists, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "Packages" {
			return err
		}
		rel, _ := filepath.Rel(dists, p)
		suite, _, _ := strings.Cut(filepath.ToSlash(rel), "/")
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		entries, err := parsePackages(f)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		for _, e := range entries {
			bom.Packages = append(bom.Packages, BOMPackage{Name: e.Package, Version: e.Version, Architecture: e.Architecture,
				SHA256: e.SHA256, Filename: e.Filename, Size: e.Size, Suite: suite, Origin: e.Origin})
		}
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		return bom, err
	}
	slices.SortFunc(bom.Packages, func(x, y BOMPackage) int { return strings.Compare(x.Name+" "+x.Version, y.Name+" "+y.Version) })
	return bom, nil
}

// measure adds d's blob and everything it references to im.Size, and records platforms.
func (b *Bundle) measure(d ocispec.Descriptor, im *BOMImage, depth int) error {
	if depth > 4 {
		return fmt.Errorf("index nesting deeper than 4")
	}
	im.Size += d.Size
	blob := filepath.Join(b.ImagesDir(), "blobs", d.Digest.Algorithm().String(), d.Digest.Encoded())
	if _, err := os.Stat(blob); err != nil && b.Meta.Base != nil && os.IsNotExist(err) {
		return nil // a differential bundle: the base holds it
	}
	switch d.MediaType {
	case ocispec.MediaTypeImageIndex, "application/vnd.docker.distribution.manifest.list.v2+json":
		var idx ocispec.Index
		if err := readJSON(blob, &idx); err != nil {
			return err
		}
		for _, m := range idx.Manifests {
			if m.Platform != nil {
				p := m.Platform.OS + "/" + m.Platform.Architecture
				if m.Platform.Variant != "" {
					p += "/" + m.Platform.Variant
				}
				im.Platforms = append(im.Platforms, p)
			}
			if err := b.measure(m, im, depth+1); err != nil {
				return err
			}
		}
	case ocispec.MediaTypeImageManifest, "application/vnd.docker.distribution.manifest.v2+json":
		var m ocispec.Manifest
		if err := readJSON(blob, &m); err != nil {
			return err
		}
		im.Size += m.Config.Size
		for _, l := range m.Layers {
			im.Size += l.Size
		}
		if depth == 0 {
			var cfg ocispec.Image
			if err := readJSON(filepath.Join(b.ImagesDir(), "blobs", m.Config.Digest.Algorithm().String(), m.Config.Digest.Encoded()), &cfg); err == nil && cfg.OS != "" {
				p := cfg.OS + "/" + cfg.Architecture
				if cfg.Variant != "" {
					p += "/" + cfg.Variant
				}
				im.Platforms = append(im.Platforms, p)
			}
		}
	}
	return nil
}
