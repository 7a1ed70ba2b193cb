package debrepo

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"pault.ag/go/debian/control"
	"pault.ag/go/debian/version"
)

// Package is one binary package: a Packages paragraph (Debian repository format, "Packages Indices")
// and, where known, where it came from and where it lies on disk.
type Package struct {
	// Name, Version and Architecture are the Package, Version (with epoch, e.g. "1:2.3-4") and
	// Architecture fields ("all" for architecture-independent packages).
	Name, Version, Architecture string
	// Filename is the .deb's path relative to the repository root (the URI of the source), e.g.
	// "pool/main/h/hello/hello_2.10-3_amd64.deb".
	Filename string
	// Size is the .deb's size in bytes; SHA256 its lower-case hex SHA-256.
	Size   int64
	SHA256 string
	// Depends and PreDepends are the raw relationship fields (Debian Policy §7.1 syntax), "" when
	// absent.
	Depends, PreDepends string
	// Component is the archive area whose index listed it (e.g. "main"); "" for flat repositories.
	Component string
	// SourceURI and SourceSuite are the repository base URI and suite whose index listed it (FetchIndex,
	// Resolve; "" for BuildRepo).
	SourceURI, SourceSuite string
	// URL is the full download URL (SourceURI + "/" + Filename); "" for BuildRepo.
	URL string
	// Path is the local .deb file, when there is one (Resolve: in the cache directory; BuildRepo: in
	// the repository's pool).
	Path string
}

// pkgNameRE is a Debian package name (Debian Policy §5.6.1).
var pkgNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)

// ParsePackages reads a Packages index (deb822 paragraphs) and returns one Package per paragraph, in
// file order. Package, Version, Architecture, Filename, Size and SHA256 are required in every
// paragraph; Filename must be a clean relative path. Errors wrap ErrPackages and name the paragraph.
func ParsePackages(r io.Reader) ([]Package, error) {
	pr, err := control.NewParagraphReader(r, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPackages, err)
	}
	var out []Package
	for n := 1; ; n++ {
		para, err := pr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: paragraph %d: %w", ErrPackages, n, err)
		}
		v := para.Values
		p := Package{Name: v["Package"], Version: v["Version"], Architecture: v["Architecture"], Filename: v["Filename"],
			SHA256: strings.ToLower(v["SHA256"]), Depends: v["Depends"], PreDepends: v["Pre-Depends"]}
		size, serr := strconv.ParseInt(v["Size"], 10, 64)
		switch {
		case p.Name == "":
			return nil, fmt.Errorf("%w: paragraph %d: no Package field", ErrPackages, n)
		case p.Version == "" || p.Architecture == "":
			return nil, fmt.Errorf("%w: paragraph %d (%s): Version and Architecture are required", ErrPackages, n, p.Name)
		case !cleanRelPath(p.Filename):
			return nil, fmt.Errorf("%w: paragraph %d (%s): Filename %q is not a clean relative path", ErrPackages, n, p.Name, p.Filename)
		case serr != nil || size < 0:
			return nil, fmt.Errorf("%w: paragraph %d (%s): Size %q is not a byte count", ErrPackages, n, p.Name, v["Size"])
		case len(p.SHA256) != 64 || !isHex(p.SHA256):
			return nil, fmt.Errorf("%w: paragraph %d (%s): SHA256 %q is not a hex SHA-256", ErrPackages, n, p.Name, v["SHA256"])
		}
		p.Size = size
		out = append(out, p)
	}
}

// sortPackages orders packages by name, then version (dpkg's order, Debian Policy §5.6.12), then
// architecture.
func sortPackages(ps []Package) {
	sort.SliceStable(ps, func(i, j int) bool {
		a, b := ps[i], ps[j]
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		if a.Version != b.Version {
			va, ea := version.Parse(a.Version)
			vb, eb := version.Parse(b.Version)
			if ea == nil && eb == nil {
				if c := version.Compare(va, vb); c != 0 {
					return c < 0
				}
			}
			return a.Version < b.Version
		}
		return a.Architecture < b.Architecture
	})
}
