package bundle

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"pault.ag/go/debian/control"

	"github.com/airgap-appliance/appliance/pkg/debrepo"
)

// releaseFiles are the files of dists/<suite>/ that a Release file does not list.
var releaseFiles = map[string]bool{"Release": true, "InRelease": true, "Release.gpg": true}

// repoErr builds a FileError that wraps both ErrRepo and kind (ErrMismatch, ErrMissing...).
func repoErr(p string, kind error, detail, want, got string) error {
	return &FileError{Path: p, Err: fmt.Errorf("%w: %w", ErrRepo, kind), Detail: detail, Want: want, Got: got}
}

// checkDebianRepo checks the hash chain apt walks: dists/<suite>/Release (and InRelease) → index files
// beside it (SHA256 field, Debian repository format "Release" section) → .deb files named by each
// Packages paragraph's Filename/Size/SHA256. facts holds the actual digest of every present file,
// keyed by bundle-relative path. It returns one error per problem.
func checkDebianRepo(dir string, facts map[string]*fileFacts) []error {
	const distsPrefix = RepoPath + "/dists/"
	var errs []error
	releases := map[string][]string{} // suite -> Release/InRelease paths
	index := map[string][]string{}    // suite -> paths of index files beside the Release
	for p := range facts {
		rest, ok := strings.CutPrefix(p, distsPrefix)
		if !ok {
			continue
		}
		suite, name, ok := strings.Cut(rest, "/")
		if !ok {
			errs = append(errs, repoErr(p, ErrUnlisted, "a file directly under dists/ belongs to no suite", "", ""))
			continue
		}
		if releaseFiles[name] {
			if name != "Release.gpg" {
				releases[suite] = append(releases[suite], p)
			}
			continue
		}
		index[suite] = append(index[suite], p)
	}
	suites := make([]string, 0, len(index)+len(releases))
	for s := range index {
		suites = append(suites, s)
	}
	for s := range releases {
		if _, ok := index[s]; !ok {
			suites = append(suites, s)
		}
	}
	sort.Strings(suites)
	for _, suite := range suites {
		suiteDir := distsPrefix + suite + "/"
		if len(releases[suite]) == 0 {
			errs = append(errs, repoErr(suiteDir+"Release", ErrMissing, "apt needs a Release file for every suite", "", ""))
			continue
		}
		for _, rel := range releases[suite] {
			listed, err := readReleaseSHA256(filepath.Join(dir, filepath.FromSlash(rel)))
			if err != nil {
				errs = append(errs, repoErr(rel, err, "", "", ""))
				continue
			}
			for name, fh := range listed {
				p := suiteDir + name
				ff, ok := facts[p]
				if !ok || ff.sha256 == "" {
					continue // apt tolerates absent variants (e.g. Packages.xz when Packages.gz is there)
				}
				if ff.key.Size != fh.Size {
					errs = append(errs, repoErr(p, ErrMismatch, "size listed in "+rel, strconv.FormatInt(fh.Size, 10), strconv.FormatInt(ff.key.Size, 10)))
				} else if ff.sha256 != fh.Hash {
					errs = append(errs, repoErr(p, ErrMismatch, "SHA256 listed in "+rel, fh.Hash, ff.sha256))
				}
			}
			for _, p := range index[suite] {
				if _, ok := listed[strings.TrimPrefix(p, suiteDir)]; !ok {
					errs = append(errs, repoErr(p, ErrUnlisted, "not in the SHA256 field of "+rel+"; apt would reject it", "", ""))
				}
			}
		}
		errs = append(errs, checkInRelease(dir, suiteDir, facts)...)
		for _, p := range index[suite] {
			base := path.Base(p)
			if base != "Packages" && base != "Packages.gz" {
				continue
			}
			errs = append(errs, checkPackages(dir, p, facts)...)
		}
	}
	return errs
}

// checkInRelease checks what the nodes' apt checks with signed-by: suiteDir's InRelease is
// clear-signed by a key of the bundle's repository keyring (RepoKeyringPath), and its signed text is
// the Release file beside it. A repository without the keyring or without InRelease is unsigned and
// refused: nodes never trust a repository blindly ([trusted=yes]).
func checkInRelease(dir, suiteDir string, facts map[string]*fileFacts) []error {
	inRelease := suiteDir + "InRelease"
	if _, ok := facts[RepoKeyringPath]; !ok {
		return []error{repoErr(RepoKeyringPath, ErrMissing, "the repository is unsigned: nodes check its InRelease against this keyring (apt signed-by); make the bundle with `appliance bundle create`", "", "")}
	}
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(inRelease)))
	if errors.Is(err, fs.ErrNotExist) {
		return []error{repoErr(inRelease, ErrMissing, "the suite is unsigned: nodes need a clear-signed InRelease (apt signed-by); make the bundle with `appliance bundle create`", "", "")}
	} else if err != nil {
		return []error{repoErr(inRelease, err, "", "", "")}
	}
	kr, err := debrepo.ReadKeyring(filepath.Join(dir, filepath.FromSlash(RepoKeyringPath)))
	if err != nil {
		return []error{repoErr(RepoKeyringPath, err, "", "", "")}
	}
	v, err := debrepo.VerifyInRelease(data, kr, time.Now())
	if err != nil {
		return []error{repoErr(inRelease, err, "nodes' apt would refuse the repository", "", "")}
	}
	if rel, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(suiteDir+"Release"))); err == nil && !bytes.Equal(rel, v.Signed) {
		return []error{repoErr(suiteDir+"Release", ErrMismatch, "differs from the text "+inRelease+" signs", "", "")}
	}
	return nil
}

// readReleaseSHA256 parses a Release (or clear-signed InRelease; the signature is not checked here)
// and returns its SHA256 field as name → (hash, size).
func readReleaseSHA256(p string) (map[string]control.FileHash, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseReleaseSHA256(f)
}

// parseReleaseSHA256 reads the first deb822 paragraph of r and returns its SHA256 field: lines of
// `<64 hex> <size> <name>` relative to the Release file's directory.
func parseReleaseSHA256(r io.Reader) (map[string]control.FileHash, error) {
	pr, err := control.NewParagraphReader(io.LimitReader(r, 64<<20), nil)
	if err != nil {
		return nil, fmt.Errorf("parse Release: %w", err)
	}
	para, err := pr.Next()
	if err != nil {
		return nil, fmt.Errorf("parse Release: %w", err)
	}
	field, ok := para.Values["SHA256"]
	if !ok {
		return nil, errors.New("no SHA256 field (apt requires SHA256 checksums)")
	}
	out := map[string]control.FileHash{}
	for i, line := range strings.Split(strings.TrimSpace(field), "\n") {
		var fh control.SHA256FileHash
		if err := fh.UnmarshalControl(line); err != nil || len(fh.Hash) != 64 || fh.Size < 0 || fh.Filename == "" {
			return nil, fmt.Errorf("SHA256 line %d: %q is not `<sha256> <size> <name>`", i+1, strings.TrimSpace(line))
		}
		if _, err := hex.DecodeString(fh.Hash); err != nil {
			return nil, fmt.Errorf("SHA256 line %d: %q is not a hex SHA-256", i+1, fh.Hash)
		}
		if err := checkRelPath(fh.Filename); err != nil {
			return nil, fmt.Errorf("SHA256 line %d: %w", i+1, err)
		}
		out[fh.Filename] = fh.FileHash
	}
	return out, nil
}

// packageEntry is the part of a Packages paragraph the chain check needs.
type packageEntry struct {
	Package      string
	Version      string
	Architecture string
	Filename     string
	Size         int64
	SHA256       string
	// Origin is the upstream repository ("URI SUITE", debrepo.OriginField), "" when not recorded.
	Origin string
}

// parsePackages reads a Packages index (deb822 paragraphs, Debian Policy §5.3 / repository format)
// and returns each paragraph's Package, Filename, Size and SHA256, all required.
func parsePackages(r io.Reader) ([]packageEntry, error) {
	pr, err := control.NewParagraphReader(r, nil)
	if err != nil {
		return nil, err
	}
	var out []packageEntry
	for n := 1; ; n++ {
		para, err := pr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("paragraph %d: %w", n, err)
		}
		e := packageEntry{Package: para.Values["Package"], Version: para.Values["Version"], Architecture: para.Values["Architecture"],
			Filename: para.Values["Filename"], SHA256: para.Values["SHA256"], Origin: para.Values[debrepo.OriginField]}
		size, serr := strconv.ParseInt(para.Values["Size"], 10, 64)
		switch {
		case e.Package == "":
			return nil, fmt.Errorf("paragraph %d: no Package field", n)
		case e.Filename == "":
			return nil, fmt.Errorf("paragraph %d (%s): no Filename field", n, e.Package)
		case serr != nil || size < 0:
			return nil, fmt.Errorf("paragraph %d (%s): Size %q is not a byte count", n, e.Package, para.Values["Size"])
		case len(e.SHA256) != 64:
			return nil, fmt.Errorf("paragraph %d (%s): SHA256 %q is not a hex SHA-256", n, e.Package, e.SHA256)
		}
		if err := checkRelPath(e.Filename); err != nil {
			return nil, fmt.Errorf("paragraph %d (%s): Filename: %w", n, e.Package, err)
		}
		e.Size = size
		out = append(out, e)
	}
}

// checkPackages checks every .deb a Packages (or Packages.gz) index names against the actual files.
func checkPackages(dir, p string, facts map[string]*fileFacts) []error {
	f, err := os.Open(filepath.Join(dir, filepath.FromSlash(p)))
	if err != nil {
		return []error{repoErr(p, err, "", "", "")}
	}
	defer f.Close()
	var r io.Reader = bufio.NewReader(f)
	if strings.HasSuffix(p, ".gz") {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return []error{repoErr(p, err, "not gzip", "", "")}
		}
		defer zr.Close()
		r = zr
	}
	entries, err := parsePackages(r)
	if err != nil {
		return []error{repoErr(p, err, "", "", "")}
	}
	var errs []error
	for _, e := range entries {
		deb := RepoPath + "/" + e.Filename
		ff, ok := facts[deb]
		switch {
		case !ok:
			errs = append(errs, repoErr(deb, ErrMissing, "package "+e.Package+" listed in "+p, "", ""))
		case ff.sha256 == "":
		case ff.key.Size != e.Size:
			errs = append(errs, repoErr(deb, ErrMismatch, "Size listed in "+p, strconv.FormatInt(e.Size, 10), strconv.FormatInt(ff.key.Size, 10)))
		case ff.sha256 != e.SHA256:
			errs = append(errs, repoErr(deb, ErrMismatch, "SHA256 listed in "+p, e.SHA256, ff.sha256))
		}
	}
	return errs
}
