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
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/ulikunitz/xz"
)

// Source is one signed Debian repository, one line of sources.list(5) ("deb [signed-by=Keyring] URI
// Suite Components..."); the fields mirror pkg/bundlespec.AptSource.
type Source struct {
	// URI is the repository's base URL, http:// or https://, e.g. https://deb.debian.org/debian.
	URI string
	// Suite is the distribution (e.g. "bookworm"), or for a flat repository an exact path ending
	// in "/" (e.g. "/"), which takes no components.
	Suite string
	// Components are the archive areas, e.g. ["main"]; none for a flat repository.
	Components []string
	// Keyring is the path of the OpenPGP public keyring (binary or ASCII-armored) whose keys sign the
	// repository, and nothing else is trusted for it (apt's Signed-By).
	Keyring string
}

// IsFlat reports whether s is a flat repository (Suite ends in "/").
func (s Source) IsFlat() bool { return strings.HasSuffix(s.Suite, "/") }

// String is the sources.list form without options, e.g. "https://deb.debian.org/debian bookworm main".
func (s Source) String() string {
	return strings.TrimSpace(s.URI + " " + s.Suite + " " + strings.Join(s.Components, " "))
}

// baseURL is the repository root with exactly one trailing slash.
func (s Source) baseURL() string { return strings.TrimRight(s.URI, "/") + "/" }

// distURL is the directory holding the Release files: URI/dists/SUITE/, or URI/SUITE for a flat
// repository (sources.list(5)).
func (s Source) distURL() string {
	if s.IsFlat() {
		return s.baseURL() + strings.TrimPrefix(strings.TrimPrefix(s.Suite, "./"), "/")
	}
	return s.baseURL() + "dists/" + s.Suite + "/"
}

func (s Source) check() error {
	u, err := url.Parse(s.URI)
	switch {
	case err != nil:
		return fmt.Errorf("source %q: %w", s.URI, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("source %q: scheme must be http or https", s.URI)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("source %q: no credentials, query or fragment", s.URI)
	case s.Suite == "" || strings.ContainsAny(s.Suite, " \t\n]"):
		return fmt.Errorf("source %q: suite %q must be set and free of whitespace", s.URI, s.Suite)
	case s.IsFlat() && len(s.Components) > 0:
		return fmt.Errorf("source %q: flat suite %q takes no components", s.URI, s.Suite)
	case !s.IsFlat() && len(s.Components) == 0:
		return fmt.Errorf("source %q suite %q: at least one component is required", s.URI, s.Suite)
	case s.Keyring == "":
		return fmt.Errorf("source %q suite %q: a keyring is required (unsigned sources are refused)", s.URI, s.Suite)
	}
	for _, c := range s.Components {
		if c == "" || strings.ContainsAny(c, " \t\n/]") {
			return fmt.Errorf("source %q suite %q: component %q is not a single path element", s.URI, s.Suite, c)
		}
	}
	if strings.ContainsAny(s.URI, " \t\n]") {
		return fmt.Errorf("source %q: whitespace or ']' in the URI", s.URI)
	}
	return nil
}

// Index is one source verified for one architecture.
type Index struct {
	// Source is the source as given.
	Source Source
	// Arch is the architecture whose Packages were fetched (e.g. "amd64").
	Arch string
	// Release is the signed Release; SignerFingerprints the keyring keys whose signatures verified.
	Release            *Release
	SignerFingerprints []string
	// Packages are the paragraphs of every component's Packages index (binary-Arch, which includes
	// Architecture: all packages), component by component in Source.Components order, with Component,
	// SourceURI and URL set.
	Packages []Package
}

// maxPackages bounds an uncompressed Packages index when the Release does not list its size
// (Debian's main/binary-amd64 is about 50 MB).
const maxPackages = 1 << 30

// FetchIndex verifies src for architecture arch as apt-secure(8) describes, with client (its
// transport carries any CA the repository needs) and now as the clock:
//
//  1. GET InRelease; if the server answers 404, GET Release and Release.gpg instead.
//  2. Verify the signature against src.Keyring only (VerifyInRelease, VerifyDetached); refuse the
//     source otherwise with a *SignatureError naming the source, the suite and the key IDs seen.
//  3. Refuse a Release whose Valid-Until has passed or whose Date lies in the future (ErrExpired).
//  4. For every component, fetch the Packages index the Release lists for binary-arch
//     (Packages.xz, else Packages.gz, else uncompressed Packages), check its
//     size and SHA-256 against the Release (ErrHashMismatch; the uncompressed text too when the
//     Release lists it) and parse it.
//
// Every error names the source and suite.
func FetchIndex(ctx context.Context, client *http.Client, src Source, arch string, now time.Time) (*Index, error) {
	if err := src.check(); err != nil {
		return nil, err
	}
	if arch == "" || strings.ContainsAny(arch, " \t\n/]") {
		return nil, fmt.Errorf("architecture %q is not a Debian architecture name", arch)
	}
	where := src.URI + " " + src.Suite
	kr, err := ReadKeyring(src.Keyring)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if client == nil {
		client = http.DefaultClient
	}
	dist := src.distURL()
	var v *Verified
	inRelease, found, err := get(ctx, client, dist+"InRelease", maxRelease)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s: %w", where, err)
	case found:
		v, err = VerifyInRelease(inRelease, kr, now)
	default:
		release, found, gerr := get(ctx, client, dist+"Release", maxRelease)
		if gerr == nil && !found {
			gerr = fmt.Errorf("neither %sInRelease nor %sRelease exists (404)", dist, dist)
		}
		if gerr != nil {
			return nil, fmt.Errorf("%s: %w", where, gerr)
		}
		sig, found, gerr := get(ctx, client, dist+"Release.gpg", maxRelease)
		if gerr != nil {
			return nil, fmt.Errorf("%s: %w", where, gerr)
		}
		if !found {
			err = &SignatureError{File: "Release.gpg", Keyring: kr.Path, KeyringIDs: kr.KeyIDs(),
				Err: fmt.Errorf("%sRelease.gpg does not exist (404): the repository is not signed", dist)}
		} else {
			v, err = VerifyDetached(release, sig, kr, now)
		}
	}
	if err != nil {
		var se *SignatureError
		if errors.As(err, &se) {
			se.URI, se.Suite = src.URI, src.Suite
			return nil, se
		}
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	rel, err := ParseRelease(v.Signed)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if err := rel.CheckValid(now); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	idx := &Index{Source: src, Arch: arch, Release: rel, SignerFingerprints: v.SignerFingerprints}
	comps := src.Components
	if src.IsFlat() {
		comps = []string{""}
	}
	for _, comp := range comps {
		ps, err := fetchPackages(ctx, client, src, rel, comp, arch)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		idx.Packages = append(idx.Packages, ps...)
	}
	return idx, nil
}

// fetchPackages fetches, checks and parses the Packages index of one component.
func fetchPackages(ctx context.Context, client *http.Client, src Source, rel *Release, comp, arch string) ([]Package, error) {
	dir := comp + "/binary-" + arch + "/"
	if src.IsFlat() {
		dir = ""
	}
	plain, plainListed := rel.SHA256[dir+"Packages"]
	var text []byte
	for _, name := range []string{dir + "Packages.xz", dir + "Packages.gz", dir + "Packages"} {
		want, ok := rel.SHA256[name]
		if !ok {
			continue
		}
		data, found, err := get(ctx, client, src.distURL()+name, want.Size)
		if err != nil {
			return nil, err
		}
		if !found {
			continue // Debian lists the uncompressed Packages but serves only compressed ones
		}
		if err := checkHash(name, data, want); err != nil {
			return nil, err
		}
		if strings.HasSuffix(name, ".gz") || strings.HasSuffix(name, ".xz") {
			limit := int64(maxPackages)
			if plainListed {
				limit = plain.Size
			}
			if data, err = decompress(name, data, limit); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if plainListed {
				if err := checkHash(dir+"Packages (uncompressed "+name+")", data, plain); err != nil {
					return nil, err
				}
			}
		}
		text = data
		break
	}
	if text == nil {
		return nil, fmt.Errorf("%w: the Release lists no fetchable %sPackages.xz, %sPackages.gz or %sPackages (component %q, architecture %s)",
			ErrRelease, dir, dir, dir, comp, arch)
	}
	ps, err := ParsePackages(bytes.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("%sPackages: %w", dir, err)
	}
	for i := range ps {
		ps[i].Component = comp
		ps[i].SourceURI, ps[i].SourceSuite = src.URI, src.Suite
		ps[i].URL = src.baseURL() + ps[i].Filename
	}
	return ps, nil
}

func checkHash(name string, data []byte, want FileHash) error {
	sum := sha256.Sum256(data)
	got := hex.EncodeToString(sum[:])
	if int64(len(data)) != want.Size || got != want.SHA256 {
		return fmt.Errorf("%s: %w: the signed Release lists %d bytes SHA256 %s, got %d bytes SHA256 %s",
			name, ErrHashMismatch, want.Size, want.SHA256, len(data), got)
	}
	return nil
}

// decompress decompresses data by name's suffix (.xz: github.com/ulikunitz/xz, as Debian's archive
// serves most indexes; .gz: compress/gzip), refusing more than limit bytes of output.
func decompress(name string, data []byte, limit int64) ([]byte, error) {
	var r io.Reader
	if strings.HasSuffix(name, ".xz") {
		xr, err := xz.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, err
		}
		r = xr
	} else {
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		r = zr
	}
	out, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(out)) > limit {
		return nil, fmt.Errorf("%w: decompresses to more than %d bytes", ErrHashMismatch, limit)
	}
	return out, nil
}

// get fetches u; found=false (and no error) on 404/410. Bodies longer than limit bytes are cut at
// limit+1 bytes (the hash check then fails).
func get(ctx context.Context, client *http.Client, u string, limit int64) (data []byte, found bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, false, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, false, fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return nil, false, nil
	case resp.StatusCode != http.StatusOK:
		return nil, false, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	data, err = io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, false, fmt.Errorf("GET %s: %w", u, err)
	}
	return data, true, nil
}
