package debrepo

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"pault.ag/go/debian/control"
	"pault.ag/go/debian/version"
)

// ErrDeb: a .deb given to BuildRepo cannot be read, lacks a required control field, is for another
// architecture, or conflicts with another .deb or a pool file of the same name.
var ErrDeb = errors.New("unusable .deb")

// RepoOptions are BuildRepo's optional settings.
type RepoOptions struct {
	// Date is the Release's Date field and the signatures' creation time (UTC, whole seconds), so
	// that the same inputs give the same bytes. Required. (A signature cannot predate its key:
	// when Date is before the key's creation, the signatures carry the key's creation time.)
	Date time.Time
	// ValidFor, when positive, writes Valid-Until = Date + ValidFor. apt refuses a Release past its
	// Valid-Until (apt-secure(8)), so the zero default writes none: an air-gapped bundle is installed
	// long after it was made.
	ValidFor time.Duration
	// Origin, Label and Description are the Release fields of those names. Defaults: Origin and Label
	// "airgap-appliance", no Description.
	Origin, Label, Description string
	// Origins, keyed by a .deb path as given to BuildRepo, is where that .deb came from ("URI SUITE"
	// of its upstream repository), written into its Packages paragraph as OriginField for the
	// bundle's bill of materials. apt ignores fields it does not know. Optional.
	Origins map[string]string
	// DpkgDeb is the dpkg-deb binary that reads each .deb's control file. Default "dpkg-deb" from
	// PATH.
	DpkgDeb string
}

// OriginField is the Packages field that records a .deb's upstream repository (RepoOptions.Origins).
const OriginField = "X-Appliance-Origin"

// Repo describes a repository BuildRepo wrote.
type Repo struct {
	// Dir is the repository root (the URI apt's sources.list names, e.g. file:/srv/repo).
	Dir string
	// Suite, Component and Arch are what the one Packages index is for.
	Suite, Component, Arch string
	// Packages are the indexed packages in Packages order (name, version, architecture) with
	// Filename (pool/COMPONENT/…), Size, SHA256, Depends, PreDepends, Component and Path (the pool
	// file).
	Packages []Package
	// Release is the content of dists/SUITE/Release.
	Release *Release
	// KeyID is the long key ID of the signing key.
	KeyID string
}

// BuildRepo writes a signed Debian repository of debs into dir:
//
//	pool/COMPONENT/P/SOURCE/NAME_VERSION_ARCH.deb          (P: first letter, or lib + letter; VERSION
//	                                                         without epoch; the Debian archive layout)
//	dists/SUITE/COMPONENT/binary-ARCH/Packages, Packages.gz (sorted by name, version, architecture)
//	dists/SUITE/Release                                     (Origin, Label, Suite, Codename = SUITE,
//	                                                         Date, [Valid-Until], Architectures = ARCH,
//	                                                         Components = COMPONENT, SHA256)
//	dists/SUITE/Release.gpg                                 (armored detached signature of Release)
//	dists/SUITE/InRelease                                   (Release clear-signed)
//
// Each .deb's control file is read with dpkg-deb --field; its Architecture must be arch or "all". The
// Packages paragraph is the control file (Package first) plus Filename, Size and SHA256. .debs are
// hard-linked into the pool when possible, copied otherwise; a pool file already present with the
// same content is kept, one with other content is an ErrDeb conflict (as is the same name, version
// and architecture twice with different content). Index and Release files are written atomically,
// InRelease last; other files in dir are left alone. Same inputs and key → same bytes.
//
// apt uses it with `deb [signed-by=KEYRING] file:DIR SUITE COMPONENT` (or over HTTP), KEYRING being
// the file signer.WritePublicKeyring writes.
func BuildRepo(ctx context.Context, dir string, debs []string, suite, component, arch string, signer *Signer, opt RepoOptions) (*Repo, error) {
	for _, f := range []struct{ name, v string }{{"suite", suite}, {"component", component}, {"architecture", arch}} {
		if f.v == "" || strings.ContainsAny(f.v, " \t\n/]\\") || f.v == "." || f.v == ".." {
			return nil, fmt.Errorf("build repository: %s %q must be one path element without whitespace", f.name, f.v)
		}
	}
	if signer == nil {
		return nil, errors.New("build repository: no signer")
	}
	if opt.Date.IsZero() {
		return nil, errors.New("build repository: RepoOptions.Date is required (reproducible Release Date)")
	}
	date := opt.Date.UTC().Truncate(time.Second)
	if opt.Origin == "" {
		opt.Origin = "airgap-appliance"
	}
	if opt.Label == "" {
		opt.Label = "airgap-appliance"
	}
	if opt.DpkgDeb == "" {
		opt.DpkgDeb = "dpkg-deb"
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	repo := &Repo{Dir: abs, Suite: suite, Component: component, Arch: arch, KeyID: signer.KeyID()}

	type entry struct {
		pkg    Package
		fields []ctlField
		src    string
	}
	byPool := map[string]*entry{}
	for _, deb := range debs {
		fields, err := debControl(ctx, opt.DpkgDeb, deb)
		if err != nil {
			return nil, err
		}
		p, source, err := packageFromControl(deb, fields, arch)
		if err != nil {
			return nil, err
		}
		if p.SHA256, p.Size, err = hashFile(deb); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrDeb, deb, err)
		}
		p.Filename = poolPath(component, source, p)
		p.Component = component
		p.Path = filepath.Join(abs, filepath.FromSlash(p.Filename))
		if prev, ok := byPool[p.Filename]; ok {
			if prev.pkg.SHA256 != p.SHA256 {
				return nil, fmt.Errorf("%w: %s and %s are both %s %s (%s) but differ", ErrDeb, prev.src, deb, p.Name, p.Version, p.Architecture)
			}
			continue
		}
		byPool[p.Filename] = &entry{pkg: p, fields: fields, src: deb}
	}
	for _, e := range byPool {
		if err := placeDeb(e.src, e.pkg); err != nil {
			return nil, err
		}
		repo.Packages = append(repo.Packages, e.pkg)
	}
	sortPackages(repo.Packages)

	var idx bytes.Buffer
	for i, p := range repo.Packages {
		if i > 0 {
			idx.WriteByte('\n')
		}
		e := byPool[p.Filename]
		writeParagraph(&idx, e.fields, p, opt.Origins[e.src])
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression) // no name, no mtime: reproducible
	_, _ = zw.Write(idx.Bytes())
	if err := zw.Close(); err != nil {
		return nil, err
	}
	distDir := filepath.Join(abs, "dists", suite)
	binDir := component + "/binary-" + arch + "/"
	rel := &Release{
		Origin: opt.Origin, Label: opt.Label, Suite: suite, Codename: suite, Description: opt.Description,
		Date: date, Architectures: []string{arch}, Components: []string{component},
		SHA256: map[string]FileHash{},
	}
	if opt.ValidFor > 0 {
		rel.ValidUntil = date.Add(opt.ValidFor)
	}
	for name, data := range map[string][]byte{binDir + "Packages": idx.Bytes(), binDir + "Packages.gz": gz.Bytes()} {
		sum := sha256.Sum256(data)
		rel.SHA256[name] = FileHash{Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
		if err := writeRepoFile(filepath.Join(distDir, filepath.FromSlash(name)), data); err != nil {
			return nil, err
		}
	}
	release := rel.Marshal()
	detached, err := signer.DetachSign(release, date)
	if err != nil {
		return nil, err
	}
	inRelease, err := signer.ClearSign(release, date)
	if err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{"Release", release}, {"Release.gpg", detached}, {"InRelease", inRelease}} {
		if err := writeRepoFile(filepath.Join(distDir, f.name), f.data); err != nil {
			return nil, err
		}
	}
	repo.Release = rel
	return repo, nil
}

// writeRepoFile writes a world-readable repository file, creating its directories 0755.
func writeRepoFile(p string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return writeFile(p, data, 0o644)
}

// ctlField is one field of a control file as dpkg-deb prints it: its name and its raw text (the
// "Name: value" line and any continuation lines, each ending in "\n").
type ctlField struct {
	name, raw string
}

// fieldsAdded are the Packages fields BuildRepo computes; a control file must not carry them.
var fieldsAdded = map[string]bool{"filename": true, "size": true, "md5sum": true, "sha1": true, "sha256": true, "sha512": true}

// debControl returns the control file of deb (dpkg-deb --field DEB), field by field.
func debControl(ctx context.Context, dpkgDeb, deb string) ([]ctlField, error) {
	cmd := exec.CommandContext(ctx, dpkgDeb, "--field", deb)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: dpkg-deb --field: %v: %s", ErrDeb, deb, err, strings.TrimSpace(stderr.String()))
	}
	return splitControl(deb, string(out))
}

// splitControl cuts one deb822 paragraph into fields, keeping their text as is.
func splitControl(deb, text string) ([]ctlField, error) {
	text = strings.TrimRight(strings.ReplaceAll(text, "\r\n", "\n"), "\n") + "\n"
	var fields []ctlField
	for _, line := range strings.SplitAfter(text, "\n") {
		switch {
		case line == "":
		case strings.TrimSpace(line) == "":
			return nil, fmt.Errorf("%w: %s: control file has more than one paragraph", ErrDeb, deb)
		case line[0] == ' ' || line[0] == '\t':
			if len(fields) == 0 {
				return nil, fmt.Errorf("%w: %s: control file starts with a continuation line", ErrDeb, deb)
			}
			fields[len(fields)-1].raw += line
		default:
			name, _, ok := strings.Cut(line, ":")
			if !ok || name == "" || strings.ContainsAny(name, " \t") {
				return nil, fmt.Errorf("%w: %s: control line %q is not `Field: value`", ErrDeb, deb, strings.TrimSpace(line))
			}
			if fieldsAdded[strings.ToLower(name)] {
				return nil, fmt.Errorf("%w: %s: control file carries %s, which only a Packages index may", ErrDeb, deb, name)
			}
			fields = append(fields, ctlField{name: name, raw: line})
		}
	}
	return fields, nil
}

// packageFromControl reads Package, Version, Architecture, Depends, Pre-Depends and the source
// package name from a control file.
func packageFromControl(deb string, fields []ctlField, arch string) (Package, string, error) {
	var b strings.Builder
	for _, f := range fields {
		b.WriteString(f.raw)
	}
	pr, err := control.NewParagraphReader(strings.NewReader(b.String()), nil)
	if err != nil {
		return Package{}, "", fmt.Errorf("%w: %s: %w", ErrDeb, deb, err)
	}
	para, err := pr.Next()
	if err != nil {
		return Package{}, "", fmt.Errorf("%w: %s: control file: %w", ErrDeb, deb, err)
	}
	v := para.Values
	p := Package{Name: v["Package"], Version: v["Version"], Architecture: v["Architecture"], Depends: v["Depends"], PreDepends: v["Pre-Depends"]}
	if !pkgNameRE.MatchString(p.Name) {
		return Package{}, "", fmt.Errorf("%w: %s: Package %q is not a Debian package name", ErrDeb, deb, p.Name)
	}
	if _, err := version.Parse(p.Version); err != nil || p.Version == "" || strings.ContainsAny(p.Version, "/ ") {
		return Package{}, "", fmt.Errorf("%w: %s (%s): Version %q is not a Debian version", ErrDeb, deb, p.Name, p.Version)
	}
	if p.Architecture != arch && p.Architecture != "all" {
		return Package{}, "", fmt.Errorf("%w: %s (%s): Architecture %q belongs in no binary-%s index", ErrDeb, deb, p.Name, p.Architecture, arch)
	}
	source := p.Name
	if s := strings.Fields(v["Source"]); len(s) > 0 {
		source = s[0]
	}
	if !pkgNameRE.MatchString(source) {
		return Package{}, "", fmt.Errorf("%w: %s (%s): Source %q is not a Debian package name", ErrDeb, deb, p.Name, source)
	}
	return p, source, nil
}

// poolPath is pool/COMPONENT/PREFIX/SOURCE/NAME_VERSION_ARCH.deb, PREFIX being the source's first
// letter, or its first four for lib* sources (the Debian archive's layout).
func poolPath(component, source string, p Package) string {
	prefix := source[:1]
	if strings.HasPrefix(source, "lib") && len(source) > 3 {
		prefix = source[:4]
	}
	ver := p.Version
	if _, after, ok := strings.Cut(ver, ":"); ok {
		ver = after
	}
	return path.Join("pool", component, prefix, source, p.Name+"_"+ver+"_"+p.Architecture+".deb")
}

// writeParagraph writes a Packages paragraph: Package, the other control fields in their order, then
// Filename, Size and SHA256.
func writeParagraph(w *bytes.Buffer, fields []ctlField, p Package, origin string) {
	for _, f := range fields {
		if f.name == "Package" {
			w.WriteString(f.raw)
		}
	}
	for _, f := range fields {
		if f.name != "Package" {
			w.WriteString(f.raw)
		}
	}
	fmt.Fprintf(w, "Filename: %s\nSize: %s\nSHA256: %s\n", p.Filename, strconv.FormatInt(p.Size, 10), p.SHA256)
	if origin = strings.Join(strings.Fields(origin), " "); origin != "" {
		fmt.Fprintf(w, "%s: %s\n", OriginField, origin)
	}
}

func hashFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// placeDeb puts src at p.Path: kept if already there with the same content, else hard-linked, else
// copied (temp file + rename).
func placeDeb(src string, p Package) error {
	if sum, _, err := hashFile(p.Path); err == nil {
		if sum != p.SHA256 {
			return fmt.Errorf("%w: %s already exists with SHA256 %s, %s has %s", ErrDeb, p.Path, sum, src, p.SHA256)
		}
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p.Path), 0o755); err != nil {
		return err
	}
	if err := os.Link(src, p.Path); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(p.Path), "."+filepath.Base(p.Path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err = io.Copy(tmp, in); err == nil {
		if err = tmp.Chmod(0o644); err == nil {
			err = tmp.Sync()
		}
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, p.Path, err)
	}
	return os.Rename(tmp.Name(), p.Path)
}
