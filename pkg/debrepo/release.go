package debrepo

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"pault.ag/go/debian/control"
)

// FileHash is one line of a Release file's SHA256 field.
type FileHash struct {
	// Size in bytes.
	Size int64
	// SHA256 is the lower-case hex SHA-256 of the file.
	SHA256 string
}

// Release is the part of a Release file (Debian repository format, "Release files") this package
// reads and writes.
type Release struct {
	// Origin, Label, Suite, Codename, Version and Description are the single-line fields of those
	// names ("" when absent); apt matches Suite or Codename against the sources.list suite.
	Origin, Label, Suite, Codename, Version, Description string
	// Date is when the Release was made; ValidUntil when apt stops trusting it. Zero when absent.
	Date, ValidUntil time.Time
	// Architectures and Components are the space-separated fields of the same names.
	Architectures, Components []string
	// SHA256 maps each index file's path relative to the Release's directory (e.g.
	// "main/binary-amd64/Packages.gz") to its size and SHA-256.
	SHA256 map[string]FileHash
}

// ReleaseTimeFormat is how Date and Valid-Until are written (RFC 1123 in UTC, as dak and
// apt-ftparchive write them: "Sat, 11 Jul 2026 10:16:37 UTC").
const ReleaseTimeFormat = "Mon, 02 Jan 2006 15:04:05 UTC"

var releaseTimeLayouts = []string{
	time.RFC1123, time.RFC1123Z,
	"Mon, _2 Jan 2006 15:04:05 MST", "Mon, _2 Jan 2006 15:04:05 -0700",
	"Mon, 2 Jan 2006 15:04:05 MST", "Mon, 2 Jan 2006 15:04:05 -0700",
}

func parseReleaseTime(s string) (time.Time, error) {
	for _, l := range releaseTimeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not an RFC 1123 date like %q", s, ReleaseTimeFormat)
}

// maxRelease bounds a Release/InRelease download; Debian's InRelease is about 150 KiB.
const maxRelease = 16 << 20

// ParseRelease parses the (unsigned) text of a Release file: its first deb822 paragraph. The SHA256
// field is required (apt ignores repositories without a secure hash); its names must be clean
// relative paths. Errors wrap ErrRelease.
func ParseRelease(data []byte) (*Release, error) {
	pr, err := control.NewParagraphReader(bytes.NewReader(data), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRelease, err)
	}
	para, err := pr.Next()
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: empty", ErrRelease)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRelease, err)
	}
	v := para.Values
	r := &Release{
		Origin: v["Origin"], Label: v["Label"], Suite: v["Suite"], Codename: v["Codename"],
		Version: v["Version"], Description: v["Description"],
		Architectures: strings.Fields(v["Architectures"]), Components: strings.Fields(v["Components"]),
		SHA256: map[string]FileHash{},
	}
	for _, f := range []struct {
		name string
		dst  *time.Time
	}{{"Date", &r.Date}, {"Valid-Until", &r.ValidUntil}} {
		if s := v[f.name]; s != "" {
			t, err := parseReleaseTime(s)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %w", ErrRelease, f.name, err)
			}
			*f.dst = t
		}
	}
	field, ok := v["SHA256"]
	if !ok {
		return nil, fmt.Errorf("%w: no SHA256 field (apt requires SHA-256 checksums)", ErrRelease)
	}
	for i, line := range strings.Split(strings.TrimSpace(field), "\n") {
		fs := strings.Fields(line)
		if len(fs) == 0 {
			continue
		}
		size, serr := strconv.ParseInt(safeIndex(fs, 1), 10, 64)
		if len(fs) != 3 || len(fs[0]) != 64 || !isHex(fs[0]) || serr != nil || size < 0 {
			return nil, fmt.Errorf("%w: SHA256 line %d: %q is not `<sha256> <size> <name>`", ErrRelease, i+1, strings.TrimSpace(line))
		}
		if !cleanRelPath(fs[2]) {
			return nil, fmt.Errorf("%w: SHA256 line %d: %q is not a clean relative path", ErrRelease, i+1, fs[2])
		}
		r.SHA256[fs[2]] = FileHash{Size: size, SHA256: strings.ToLower(fs[0])}
	}
	return r, nil
}

func safeIndex(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return ""
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}

// cleanRelPath reports whether p is a slash-separated relative path without "." or ".." elements.
func cleanRelPath(p string) bool {
	return p != "" && !strings.HasPrefix(p, "/") && path.Clean(p) == p && p != "." && !strings.HasPrefix(p, "../") && p != ".." &&
		!strings.ContainsAny(p, "\\\x00")
}

// Marshal renders r as a Release file: Origin, Label, Suite, Version, Codename, Date, Valid-Until,
// Architectures, Components, Description (each only when set), then SHA256 sorted by name. The
// output is deterministic.
func (r *Release) Marshal() []byte {
	var b bytes.Buffer
	field := func(name, value string) {
		if value != "" {
			fmt.Fprintf(&b, "%s: %s\n", name, value)
		}
	}
	field("Origin", r.Origin)
	field("Label", r.Label)
	field("Suite", r.Suite)
	field("Version", r.Version)
	field("Codename", r.Codename)
	if !r.Date.IsZero() {
		field("Date", r.Date.UTC().Format(ReleaseTimeFormat))
	}
	if !r.ValidUntil.IsZero() {
		field("Valid-Until", r.ValidUntil.UTC().Format(ReleaseTimeFormat))
	}
	field("Architectures", strings.Join(r.Architectures, " "))
	field("Components", strings.Join(r.Components, " "))
	field("Description", r.Description)
	names := make([]string, 0, len(r.SHA256))
	for n := range r.SHA256 {
		names = append(names, n)
	}
	sort.Strings(names)
	b.WriteString("SHA256:\n")
	for _, n := range names {
		fmt.Fprintf(&b, " %s %8d %s\n", r.SHA256[n].SHA256, r.SHA256[n].Size, n)
	}
	return b.Bytes()
}

// CheckValid refuses (ErrExpired) a Release whose Valid-Until lies before now or whose Date lies after
// now, as apt does with its default Acquire::Check-Valid-Until and Acquire::Check-Date.
func (r *Release) CheckValid(now time.Time) error {
	if !r.ValidUntil.IsZero() && now.After(r.ValidUntil) {
		return fmt.Errorf("%w: expired at %s (Valid-Until), %s ago", ErrExpired, r.ValidUntil.Format(time.RFC3339), now.Sub(r.ValidUntil).Round(time.Second))
	}
	if !r.Date.IsZero() && r.Date.After(now) {
		return fmt.Errorf("%w: its Date %s lies %s in the future (check the clock)", ErrExpired, r.Date.Format(time.RFC3339), r.Date.Sub(now).Round(time.Second))
	}
	return nil
}
