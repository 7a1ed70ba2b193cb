// Package bundle reads, writes and verifies air-gap bundles: the directory an operator carries into the
// datacenter with every container image and OS package the install needs.
//
// Layout of a bundle directory (all paths relative to it):
//
//	bundle.yaml      Metadata (apiVersion appliance.airgap.dev/v1alpha1, kind Bundle)
//	images/          an OCI image layout (OCI image-spec v1.1 "image-layout"); every manifest descriptor in
//	                 images/index.json carries org.opencontainers.image.ref.name = the FULL reference,
//	                 e.g. registry.k8s.io/pause:3.10
//	repo/debian/     a Debian repository (dists/<suite>/Release, dists/<suite>/<comp>/binary-<arch>/Packages[.gz],
//	                 pool/...) whose metadata is served to apt as-is
//	SHA256SUMS       sha256sum(1) output for every file of the bundle except itself, relative paths, sorted
//
// Verify checks the whole bundle: every file against SHA256SUMS (and no unlisted file), the Debian
// repository's own hash chain (Release → Packages → .deb, as apt checks it), and the OCI layout's
// closure (index.json → manifests → configs and layers, and every blob's name equals its digest).
package bundle

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"go.yaml.in/yaml/v3"
)

// APIVersion and Kind identify a bundle.yaml document.
const (
	APIVersion = "appliance.airgap.dev/v1alpha1"
	Kind       = "Bundle"
)

// Well-known names inside a bundle directory.
const (
	MetadataFile = "bundle.yaml"
	SumsFile     = "SHA256SUMS"
	ImagesPath   = "images"
	RepoPath     = "repo/debian"
	// RepoKeyringPath is the OpenPGP public keyring (binary, as apt's signed-by reads it) whose key
	// signs the Debian repository's InRelease files; nodes get it at provisioning and name it in their
	// apt source's signed-by option. Covered by SHA256SUMS, so the bundle signature vouches for it.
	RepoKeyringPath = RepoPath + "/appliance-repo.gpg"
)

// The node image inside a bundle (`appliance bundle create` with nodeImage.build): its ISO
// (iso/build-node-image.sh's node-amd64.iso), under SHA256SUMS and the signature like every file. It is
// the one form a bundle carries: network boot serves the kernel, initramfs and root filesystem from
// inside it (pkg/nodeiso), and a BMC inserts it whole as virtual media. config's boot.nodeISO defaults
// to NetbootNodeISO.
const (
	NetbootDir     = "netboot"
	NetbootNodeISO = NetbootDir + "/node-amd64.iso"
)

// NodeImageFiles are the node image's files, relative to the bundle's root, as
// iso/build-node-image.sh names them in its output directory (path.Base).
var NodeImageFiles = []string{NetbootNodeISO}

// RefNameAnnotation is the OCI annotation (image-spec annotations.md) that names each image in
// images/index.json. The bundle stores the full reference (registry/repository:tag), not only the tag.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// Sentinel errors; every error returned by this package that concerns bundle content wraps one of them
// (test with errors.Is). File-level problems are *FileError values that also wrap one.
var (
	// ErrMetadata: bundle.yaml is missing, malformed, or has an invalid field.
	ErrMetadata = errors.New("invalid bundle metadata")
	// ErrSums: SHA256SUMS is missing or is not valid sha256sum(1) output.
	ErrSums = errors.New("invalid checksum list")
	// ErrMismatch: a file's SHA-256 (or size) differs from the one recorded for it.
	ErrMismatch = errors.New("checksum mismatch")
	// ErrMissing: a file listed in SHA256SUMS (or in the repository or image index) is absent.
	ErrMissing = errors.New("file missing")
	// ErrUnlisted: a file exists in the bundle but SHA256SUMS does not list it.
	ErrUnlisted = errors.New("file not listed in " + SumsFile)
	// ErrNotRegular: a bundle entry is a symlink, device, socket or other non-regular file.
	ErrNotRegular = errors.New("not a regular file")
	// ErrRepo: the Debian repository metadata is malformed or inconsistent (Release/Packages chain).
	ErrRepo = errors.New("inconsistent Debian repository")
	// ErrImages: the OCI image layout is malformed or incomplete.
	ErrImages = errors.New("inconsistent OCI image layout")
	// ErrNeedsBase: the bundle is differential (bundle.yaml names a base) and lacks the files its base
	// holds; it becomes a bundle only when imported onto that base (Import).
	ErrNeedsBase = errors.New("bundle needs its base")
)

// FileError reports one wrong file. Path is relative to the bundle directory (slash-separated); Err is
// one of the sentinels above; Want/Got are hex SHA-256 digests (or sizes) when Err is ErrMismatch;
// Detail says where the expectation came from when it is not SHA256SUMS (e.g. "Release of suite stable").
type FileError struct {
	Path   string
	Err    error
	Want   string
	Got    string
	Detail string
}

// Error implements error, e.g. `images/index.json: checksum mismatch (want 3a1f…, got 9b02…)`.
func (e *FileError) Error() string {
	var b bytes.Buffer
	b.WriteString(e.Path)
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	if e.Detail != "" {
		b.WriteString(" (")
		b.WriteString(e.Detail)
		b.WriteString(")")
	}
	if e.Want != "" || e.Got != "" {
		fmt.Fprintf(&b, ": want %s, got %s", e.Want, e.Got)
	}
	return b.String()
}

// Unwrap returns the sentinel error.
func (e *FileError) Unwrap() error { return e.Err }

// Metadata is the content of bundle.yaml.
type Metadata struct {
	// APIVersion must be APIVersion.
	APIVersion string `yaml:"apiVersion"`
	// Kind must be Kind.
	Kind string `yaml:"kind"`
	// Name identifies the bundle for people, e.g. "k8s-1.37.2-bookworm" (1-63 characters of [a-z0-9.-],
	// starting and ending alphanumeric, like a DNS label extended with dots).
	Name string `yaml:"name"`
	// KubernetesVersion is the Kubernetes release the bundle carries, "v" + semantic version (v1.37.2).
	KubernetesVersion string `yaml:"kubernetesVersion"`
	// Created is when the bundle was made (RFC 3339 in the file).
	Created time.Time `yaml:"created"`
	// Base, when set, makes the bundle differential: its SHA256SUMS lists every file of the complete
	// bundle, but its directory holds only the files Base's bundle lacks (Prune), and it is used by
	// importing it onto that base (Import). A bundle made by Import keeps it (bundle.yaml is signed),
	// and then holds every file.
	Base *BaseRef `yaml:"base,omitempty"`
}

// BaseRef names the bundle a differential bundle applies to, by the digest of its checksum list
// (which covers every file of it, bundle.yaml included), so no other bundle of the same name passes.
type BaseRef struct {
	// Name is the base's bundle.yaml name, for people (the digest decides).
	Name string `yaml:"name"`
	// SumsDigest is "sha256:" + the lowercase hex SHA-256 of the base's SHA256SUMS file (SumsDigest).
	SumsDigest string `yaml:"sumsDigest"`
}

// String is e.g. `k8s-1.37.2 (SHA256SUMS sha256:3a1f…)`, the full digest.
func (r BaseRef) String() string { return fmt.Sprintf("%s (%s %s)", r.Name, SumsFile, r.SumsDigest) }

var (
	digestRE  = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	nameRE    = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)
	k8sVerRE  = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
	maxMetaSz = int64(64 << 10)
)

// Validate returns every problem with m at once (errors.Join), each prefixed with its field path, e.g.
// `kubernetesVersion: "1.37" is not a version like v1.37.2`. Each wraps ErrMetadata.
func (m Metadata) Validate() error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrMetadata}, args...)...))
	}
	if m.APIVersion != APIVersion {
		add("apiVersion: %q is not %q", m.APIVersion, APIVersion)
	}
	if m.Kind != Kind {
		add("kind: %q is not %q", m.Kind, Kind)
	}
	if !nameRE.MatchString(m.Name) {
		add("name: %q must be 1-63 characters of a-z, 0-9, '.', '-', starting and ending with a letter or digit", m.Name)
	}
	if !k8sVerRE.MatchString(m.KubernetesVersion) {
		add("kubernetesVersion: %q is not a version like v1.37.2", m.KubernetesVersion)
	}
	if m.Created.IsZero() {
		add("created: required (RFC 3339 time, e.g. 2025-01-31T12:00:00Z)")
	}
	if m.Base != nil {
		if !nameRE.MatchString(m.Base.Name) {
			add("base.name: %q must be 1-63 characters of a-z, 0-9, '.', '-', starting and ending with a letter or digit", m.Base.Name)
		}
		if !digestRE.MatchString(m.Base.SumsDigest) {
			add("base.sumsDigest: %q is not \"sha256:\" followed by 64 lowercase hex digits", m.Base.SumsDigest)
		}
	}
	return errors.Join(errs...)
}

// ParseMetadata decodes one bundle.yaml document strictly: an unknown key, a second document, or a
// field of the wrong type is an error (with the YAML line), and the result must pass Validate.
// Errors wrap ErrMetadata.
func ParseMetadata(data []byte) (Metadata, error) {
	var m Metadata
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&m); err != nil {
		if errors.Is(err, io.EOF) {
			return Metadata{}, fmt.Errorf("%w: empty document", ErrMetadata)
		}
		return Metadata{}, fmt.Errorf("%w: %w", ErrMetadata, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Metadata{}, fmt.Errorf("%w: more than one YAML document (a bundle.yaml holds exactly one)", ErrMetadata)
	}
	if err := m.Validate(); err != nil {
		return Metadata{}, err
	}
	return m, nil
}

// MarshalMetadata renders m as bundle.yaml (2-space indented YAML, Created in UTC), deterministically.
func MarshalMetadata(m Metadata) ([]byte, error) {
	m.Created = m.Created.UTC()
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("encode %s: %w", MetadataFile, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode %s: %w", MetadataFile, err)
	}
	return buf.Bytes(), nil
}

// Bundle is an opened bundle directory. Open checks only bundle.yaml; call Verify before trusting content.
type Bundle struct {
	// Dir is the bundle directory as given to Open, made absolute with symlinks resolved (so a stable
	// symlink such as /var/cache/appliance/bundle → bundle-1 works and the stamp names the real directory).
	Dir string
	// Meta is the decoded bundle.yaml.
	Meta Metadata
}

// Open reads DIR/bundle.yaml. Errors name the file and wrap ErrMetadata (for a missing or invalid
// file) or the *fs.PathError of the failing read.
func Open(dir string) (*Bundle, error) {
	abs, err := resolveDir(dir)
	if err != nil {
		return nil, err
	}
	p := filepath.Join(abs, MetadataFile)
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w: not found (is %s a bundle directory?)", p, ErrMetadata, abs)
		}
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxMetaSz+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if int64(len(data)) > maxMetaSz {
		return nil, fmt.Errorf("%s: %w: larger than %d bytes", p, ErrMetadata, maxMetaSz)
	}
	m, err := ParseMetadata(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return &Bundle{Dir: abs, Meta: m}, nil
}

// ImagesDir is the OCI image layout directory, DIR/images.
func (b *Bundle) ImagesDir() string { return filepath.Join(b.Dir, ImagesPath) }

// RepoDir is the Debian repository root, DIR/repo/debian (the directory apt's sources.list URI points to).
func (b *Bundle) RepoDir() string { return filepath.Join(b.Dir, filepath.FromSlash(RepoPath)) }

// RepoKeyring returns the repository's signing keyring (RepoKeyringPath), the bytes nodes install for
// apt's signed-by. Errors: ErrMissing when the bundle has none (an unsigned repository, or none at
// all), saying how to make a signed one. Verify checks that it signs every suite.
func (b *Bundle) RepoKeyring() ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(b.Dir, filepath.FromSlash(RepoKeyringPath)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, &FileError{Path: RepoKeyringPath, Err: ErrMissing, Detail: "the bundle carries no signed Debian repository; make it with `appliance bundle create`"}
	}
	return data, err
}

// resolveDir makes dir absolute and resolves symlinks in it.
func resolveDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return "", fmt.Errorf("bundle directory %s: %w", dir, err)
	}
	return abs, nil
}
