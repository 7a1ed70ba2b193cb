package ignition

import (
	"errors"
	"fmt"
	"mime"
	"strconv"
	"strings"

	"github.com/coreos/go-semver/semver"
)

// MediaType is the media type of an Ignition config. Ignition announces the spec version it
// speaks as a "version" parameter of this type in its Accept header, and a server answers with
// Content-Type ContentType(version).
const MediaType = "application/vnd.coreos.ignition+json"

// SupportedVersions are the Ignition spec versions Marshal can produce, oldest first. 3.3.0 is the
// newest spec Debian 12's ignition 2.14 parses; 3.5.0 is the newest stable spec of ignition/v2
// v2.24.0.
var SupportedVersions = []string{"3.3.0", "3.4.0", "3.5.0"}

// DefaultVersion is what Negotiate picks when a request has no Accept header, or an Accept header
// that names no Ignition version (e.g. curl's "*/*"): the oldest supported spec, because every
// Ignition client from 2.14 on parses it, and an old client that announces nothing cannot be
// assumed to parse anything newer.
const DefaultVersion = "3.3.0"

// ErrNotAcceptable is returned (wrapped) when the client accepts none of SupportedVersions, or when
// a snippet needs a newer spec than the negotiated one. An HTTP handler answers it with
// 406 Not Acceptable and the error text.
var ErrNotAcceptable = errors.New("no acceptable Ignition spec version")

// ContentType returns the Content-Type for a config of the given spec version, e.g.
// "application/vnd.coreos.ignition+json;version=3.3.0".
func ContentType(version string) string { return MediaType + ";version=" + version }

// qImplicit ranks a version the client did not name but is guaranteed to parse: lower than the
// smallest qvalue a client can write (0.001, RFC 9110 §12.4.2), so any explicit preference wins.
const qImplicit = 0.0005

// Negotiate picks the spec version to serve from an HTTP Accept header (all Accept field lines
// joined with ", "). Ignition sends its one spec version plus a wildcard, e.g. ignition 2.14:
// "application/vnd.coreos.ignition+json;version=3.3.0, */*;q=0.1" (ignition/v2
// internal/resource/url.go, configHeaders).
//
// Rules: each supported version gets the q of the most specific media range matching it
// (RFC 9110 §12.5.1: type with equal version > type without version > application/* > */*).
// Ignition parses every spec up to the one it announces and none newer, so the highest version
// the client names with q > 0 is a ceiling: newer versions are not acceptable even if */* matches,
// and older ones are acceptable even if no range matches. The highest q wins; ties go to the newest
// version when the client named one, else to the oldest (DefaultVersion). An empty header yields
// DefaultVersion. Malformed elements are ignored. Errors wrap ErrNotAcceptable.
func Negotiate(accept string) (string, error) {
	if strings.TrimSpace(accept) == "" {
		return DefaultVersion, nil
	}
	var ranges []mediaRange
	for _, elem := range splitAccept(accept) {
		if r, ok := parseMediaRange(elem); ok {
			ranges = append(ranges, r)
		}
	}
	if len(ranges) == 0 {
		return "", fmt.Errorf("%w: Accept header %q has no valid media range", ErrNotAcceptable, accept)
	}

	var ceiling *semver.Version
	for _, r := range ranges {
		if r.version != nil && r.q > 0 && (ceiling == nil || ceiling.LessThan(*r.version)) {
			ceiling = r.version
		}
	}

	best, bestQ := "", 0.0
	for _, v := range SupportedVersions {
		sv := semver.New(v)
		if ceiling != nil && ceiling.LessThan(*sv) {
			continue
		}
		q, matched := qFor(ranges, *sv)
		if !matched && ceiling != nil {
			q = qImplicit
		}
		if q <= 0 {
			continue
		}
		// SupportedVersions is oldest first: ">=" lets a newer version win ties when the client named
		// a version, ">" keeps the oldest otherwise.
		if q > bestQ || (q == bestQ && ceiling != nil) {
			best, bestQ = v, q
		}
	}
	if best == "" {
		if ceiling != nil {
			return "", fmt.Errorf("%w: the client speaks Ignition spec up to %s, this appliance serves %s to %s: boot the node with Ignition 2.14 or newer",
				ErrNotAcceptable, ceiling, SupportedVersions[0], SupportedVersions[len(SupportedVersions)-1])
		}
		return "", fmt.Errorf("%w: Accept header %q allows none of %s (media type %s)",
			ErrNotAcceptable, accept, strings.Join(SupportedVersions, ", "), MediaType)
	}
	return best, nil
}

// mediaRange is one parsed element of an Accept header.
type mediaRange struct {
	typ     string          // lower-cased "type/subtype", "type/*" or "*/*"
	version *semver.Version // the "version" parameter of MediaType, nil if absent
	q       float64         // weight 0..1, default 1
}

// specificity ranks how precisely r names Ignition spec v (RFC 9110 §12.5.1); -1: no match.
func (r mediaRange) specificity(v semver.Version) int {
	switch r.typ {
	case MediaType:
		if r.version == nil {
			return 2
		}
		if r.version.Equal(v) {
			return 3
		}
		return -1
	case "application/*":
		return 1
	case "*/*":
		return 0
	}
	return -1
}

// qFor returns the weight of the most specific ranges matching v (the largest q among equally
// specific duplicates) and whether any range matched.
func qFor(ranges []mediaRange, v semver.Version) (float64, bool) {
	bestSpec, q := -1, 0.0
	for _, r := range ranges {
		s := r.specificity(v)
		switch {
		case s > bestSpec:
			bestSpec, q = s, r.q
		case s == bestSpec && s >= 0 && r.q > q:
			q = r.q
		}
	}
	return q, bestSpec >= 0
}

func parseMediaRange(elem string) (mediaRange, bool) {
	typ, params, err := mime.ParseMediaType(elem)
	if err != nil || !strings.Contains(typ, "/") {
		return mediaRange{}, false
	}
	r := mediaRange{typ: typ, q: 1}
	if s, ok := params["q"]; ok {
		q, err := strconv.ParseFloat(s, 64)
		if err != nil || q < 0 || q > 1 {
			return mediaRange{}, false
		}
		r.q = q
	}
	if s, ok := params["version"]; ok && typ == MediaType {
		v, err := semver.NewVersion(s)
		if err != nil {
			return mediaRange{}, false
		}
		r.version = v
	}
	return r, true
}

// splitAccept splits an Accept header at the commas that are outside quoted strings (RFC 9110
// §5.6.1 lists, §5.6.4 quoted-string with backslash escapes).
func splitAccept(s string) []string {
	var out []string
	start, quoted, escaped := 0, false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case escaped:
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		case c == ',' && !quoted:
			out = append(out, strings.TrimSpace(s[start:i]))
			start = i + 1
		}
	}
	out = append(out, strings.TrimSpace(s[start:]))
	return out
}
