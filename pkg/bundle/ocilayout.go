package bundle

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/distribution/reference"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Docker media types that an OCI layout may hold besides the OCI ones (Docker Image Manifest V2 Schema 2).
const (
	dockerManifestList = "application/vnd.docker.distribution.manifest.list.v2+json"
	dockerManifest     = "application/vnd.docker.distribution.manifest.v2+json"
)

// maxManifestSize bounds manifests and indexes read into memory (registries use 4 MiB too).
const maxManifestSize = 4 << 20

func imagesErr(p string, kind error, detail, want, got string) error {
	return &FileError{Path: p, Err: fmt.Errorf("%w: %w", ErrImages, kind), Detail: detail, Want: want, Got: got}
}

// checkImages checks the OCI layout (image-spec image-layout.md) under images/: every blob is named by
// its own digest, and everything reachable from index.json exists with the described size and digest.
// Every manifest descriptor in index.json must carry a fully qualified, tagged or digested ref.name.
// It returns nil when the bundle has no images/ directory.
func checkImages(dir string, facts map[string]*fileFacts) []error {
	const prefix = ImagesPath + "/"
	any := false
	var errs []error
	for p, ff := range facts {
		rest, ok := strings.CutPrefix(p, prefix)
		if !ok {
			continue
		}
		any = true
		blob, ok := strings.CutPrefix(rest, "blobs/")
		if !ok {
			continue
		}
		alg, hexd, ok := strings.Cut(blob, "/")
		if !ok || alg != "sha256" || strings.Contains(hexd, "/") {
			errs = append(errs, imagesErr(p, ErrUnlisted, "only blobs/sha256/<hex> files may be under blobs/", "", ""))
			continue
		}
		if ff.sha256 != "" && ff.sha256 != hexd {
			errs = append(errs, imagesErr(p, ErrMismatch, "a blob's content must hash to its name", hexd, ff.sha256))
		}
	}
	if !any {
		return nil
	}
	if _, ok := facts[prefix+ocispec.ImageLayoutFile]; !ok {
		errs = append(errs, imagesErr(prefix+ocispec.ImageLayoutFile, ErrMissing, "required by the OCI image layout", "", ""))
	} else {
		var l ocispec.ImageLayout
		if err := readJSON(filepath.Join(dir, ImagesPath, ocispec.ImageLayoutFile), &l); err != nil || l.Version != ocispec.ImageLayoutVersion {
			errs = append(errs, imagesErr(prefix+ocispec.ImageLayoutFile, errors.New("malformed"),
				fmt.Sprintf("want {\"imageLayoutVersion\": %q}", ocispec.ImageLayoutVersion), "", ""))
		}
	}
	indexPath := prefix + ocispec.ImageIndexFile
	if _, ok := facts[indexPath]; !ok {
		return append(errs, imagesErr(indexPath, ErrMissing, "required by the OCI image layout", "", ""))
	}
	var idx ocispec.Index
	if err := readJSON(filepath.Join(dir, ImagesPath, ocispec.ImageIndexFile), &idx); err != nil {
		return append(errs, imagesErr(indexPath, err, "", "", ""))
	}
	for i, d := range idx.Manifests {
		ref := d.Annotations[ocispec.AnnotationRefName]
		if err := checkFullRef(ref); err != nil {
			errs = append(errs, imagesErr(indexPath, err, fmt.Sprintf("manifests[%d] (%s)", i, d.Digest), "", ""))
		}
		errs = append(errs, walkDescriptor(dir, facts, d, fmt.Sprintf("%s manifests[%d]", indexPath, i), 0)...)
	}
	return errs
}

// checkFullRef accepts a fully qualified reference with a tag or digest, e.g. registry.k8s.io/pause:3.10
// (distribution/reference's canonical form: "busybox:1.36" is refused, "docker.io/library/busybox:1.36" accepted).
func checkFullRef(ref string) error {
	if ref == "" {
		return fmt.Errorf("no %s annotation (want the full image reference, e.g. registry.k8s.io/pause:3.10)", ocispec.AnnotationRefName)
	}
	named, err := reference.ParseNamed(ref)
	if err != nil {
		return fmt.Errorf("%s %q is not a fully qualified image reference: %w", ocispec.AnnotationRefName, ref, err)
	}
	_, tagged := named.(reference.Tagged)
	_, digested := named.(reference.Digested)
	if !tagged && !digested {
		return fmt.Errorf("%s %q has neither a tag nor a digest", ocispec.AnnotationRefName, ref)
	}
	return nil
}

// walkDescriptor checks that d names an existing blob of d.Size bytes and, for indexes and manifests,
// recurses into what they reference (depth-bounded).
func walkDescriptor(dir string, facts map[string]*fileFacts, d ocispec.Descriptor, from string, depth int) []error {
	if err := d.Digest.Validate(); err != nil {
		return []error{imagesErr(ImagesPath+"/"+ocispec.ImageIndexFile, err, from, "", "")}
	}
	if d.Digest.Algorithm() != "sha256" {
		return []error{imagesErr(ImagesPath+"/"+ocispec.ImageIndexFile, errors.New("unsupported digest algorithm"), from+" "+d.Digest.String(), "", "")}
	}
	p := ImagesPath + "/blobs/sha256/" + d.Digest.Encoded()
	ff, ok := facts[p]
	if !ok {
		if len(d.URLs) > 0 {
			return nil // foreign layer, fetched from its URLs by design
		}
		return []error{imagesErr(p, ErrMissing, "referenced by "+from, "", "")}
	}
	if ff.key.Size != d.Size {
		return []error{imagesErr(p, ErrMismatch, "size in descriptor of "+from, strconv.FormatInt(d.Size, 10), strconv.FormatInt(ff.key.Size, 10))}
	}
	if depth > 4 {
		return []error{imagesErr(p, errors.New("indexes nested deeper than 4 levels"), from, "", "")}
	}
	full := filepath.Join(dir, filepath.FromSlash(p))
	var errs []error
	switch d.MediaType {
	case ocispec.MediaTypeImageIndex, dockerManifestList:
		var idx ocispec.Index
		if err := readJSON(full, &idx); err != nil {
			return []error{imagesErr(p, err, "index referenced by "+from, "", "")}
		}
		for i, c := range idx.Manifests {
			errs = append(errs, walkDescriptor(dir, facts, c, fmt.Sprintf("%s manifests[%d]", p, i), depth+1)...)
		}
	case ocispec.MediaTypeImageManifest, dockerManifest:
		var m ocispec.Manifest
		if err := readJSON(full, &m); err != nil {
			return []error{imagesErr(p, err, "manifest referenced by "+from, "", "")}
		}
		errs = append(errs, walkDescriptor(dir, facts, m.Config, p+" config", depth+1)...)
		for i, l := range m.Layers {
			errs = append(errs, walkDescriptor(dir, facts, l, fmt.Sprintf("%s layers[%d]", p, i), depth+1)...)
		}
	}
	return errs
}

func readJSON(p string, v any) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() > maxManifestSize {
		return fmt.Errorf("larger than %d bytes", maxManifestSize)
	}
	if err := json.NewDecoder(f).Decode(v); err != nil {
		return fmt.Errorf("malformed JSON: %w", err)
	}
	return nil
}
