package bundlespec

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// Image references follow the grammar of github.com/distribution/reference (which only registry/ may
// import): every element is checked here with a message naming the part that is wrong, then the whole
// reference must also parse with go-containerregistry's strict validation, which bundle create uses to
// pull it.
var (
	// pathComponentRE is one component of a repository path: lower-case alphanumerics separated by
	// '.', '_', '__' or runs of '-'.
	pathComponentRE = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)
	// tagRE is a tag: a word character then up to 127 word characters, '.' or '-'.
	tagRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	// digestRE is algorithm:encoded (OCI image-spec descriptor digest grammar).
	digestRE = regexp.MustCompile(`^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$`)
	// dnsLabelRE is one label of a host name (RFC 1123), either case.
	dnsLabelRE = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?$`)
)

// maxNameLength is the longest repository name, registry host included (distribution's
// NameTotalLengthMax).
const maxNameLength = 255

// dockerHub is the registry host of Docker Hub as image references write it.
const dockerHub = "docker.io"

// imageRefRule says what an image reference looks like, for error messages.
const imageRefRule = "write registry/repository:tag or registry/repository@sha256:<64 hex digits>, e.g. registry.k8s.io/pause:3.10.1"

// checkImageReference returns "" when ref is a fully qualified image reference (see Images), else why
// not, as a sentence fragment that follows `"ref" `.
func checkImageReference(ref string) string {
	notRef := func(format string, args ...any) string {
		return "is not an image reference: " + fmt.Sprintf(format, args...) + "; " + imageRefRule
	}
	switch {
	case ref == "":
		return "is empty: " + imageRefRule
	case strings.Contains(ref, "://"):
		return notRef("it carries a URL scheme (image references have none, and the registry is always reached over HTTPS)")
	case strings.ContainsFunc(ref, func(r rune) bool { return r <= ' ' || r >= 0x7f }):
		return notRef("it contains whitespace or a non-ASCII character")
	}
	rest, digest, hasDigest := strings.Cut(ref, "@")
	if hasDigest {
		switch {
		case strings.Contains(digest, "@"):
			return notRef("it has more than one '@'")
		case !digestRE.MatchString(digest):
			return notRef("%q is not a digest (algorithm:hex, e.g. sha256:<64 hex digits>)", digest)
		}
	}
	repo, tag, hasTag := rest, "", false
	if i := strings.LastIndexByte(rest, ':'); i > strings.LastIndexByte(rest, '/') {
		repo, tag, hasTag = rest[:i], rest[i+1:], true
		if !tagRE.MatchString(tag) {
			if tag == "" {
				return notRef("the ':' is followed by no tag")
			}
			return notRef("%q is not a tag (a letter, digit or '_', then up to 127 letters, digits, '_', '.' or '-')", tag)
		}
	}
	host, path, ok := strings.Cut(repo, "/")
	if !ok && (strings.Contains(repo, ".") || repo == "localhost") {
		return notRef("it names no repository after the registry %q", repo)
	}
	if !ok || (!strings.ContainsAny(host, ".:") && host != "localhost") {
		return "does not name its registry: write the full reference with the registry host, e.g. " + qualify(ref)
	}
	if why := checkHostPort(host, true); why != "" {
		return notRef("the registry %q %s", host, why)
	}
	if len(repo) > maxNameLength {
		return notRef("the name %q is longer than %d characters", repo, maxNameLength)
	}
	for _, c := range strings.Split(path, "/") {
		if !pathComponentRE.MatchString(c) {
			if c == "" {
				return notRef("the repository path %q has an empty component", path)
			}
			return notRef("%q is not a repository path component (lower-case letters and digits, separated by '.', '_', '__' or '-')", c)
		}
	}
	if host == dockerHub && !strings.Contains(path, "/") {
		return "is not fully qualified: Docker Hub's official images live under library/, write " +
			dockerHub + "/library/" + strings.TrimPrefix(ref, dockerHub+"/")
	}
	if !hasTag && !hasDigest {
		return "has no tag or digest: pin what the bundle holds, e.g. " + ref + ":<tag> or " + ref + "@sha256:<64 hex digits>"
	}
	// The last word: the library bundle create pulls with must accept it too (it checks the digest's
	// algorithm and length).
	if _, err := name.ParseReference(ref, name.StrictValidation); err != nil {
		return notRef("%v", err)
	}
	return ""
}

// qualify guesses the fully qualified form of a reference that omits its registry, the way docker
// reads it (Docker Hub, official images under library/).
func qualify(ref string) string {
	rest, _, _ := strings.Cut(ref, "@")
	if strings.Contains(strings.SplitN(rest, ":", 2)[0], "/") {
		return dockerHub + "/" + ref
	}
	return dockerHub + "/library/" + ref
}

// checkHostPort returns "" when s is host or host:port — a DNS name, an IPv4 address or a bracketed
// IPv6 address, port 1..65535 — else why not, as a fragment that follows `"s" `. DNS names must be
// lower case unless upper is set.
func checkHostPort(s string, upper bool) string {
	switch {
	case strings.Contains(s, "://"):
		return "carries a URL scheme: write the host (and :port) only"
	case strings.ContainsAny(s, "/@?#"):
		return "is not a host: write the host (and :port) only, without path or credentials"
	}
	host, port := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "has an unclosed '[': write an IPv6 address as [fd00::1]"
		}
		host, port = s[1:end], s[end+1:]
		if port != "" && !strings.HasPrefix(port, ":") {
			return "has characters after its IPv6 address: write [address] or [address]:port"
		}
		port = strings.TrimPrefix(port, ":")
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return "is not a bracketed IPv6 address (no %zone)"
		}
	} else {
		if i := strings.LastIndexByte(s, ':'); i >= 0 {
			host, port = s[:i], s[i+1:]
			if port == "" {
				return "has an empty port"
			}
		}
		if host == "" {
			return "has no host"
		}
		if strings.Contains(host, ":") {
			return "is an IPv6 address without brackets: write [address] or [address]:port"
		}
		if a, err := netip.ParseAddr(host); err == nil {
			if !a.Is4() {
				return "is not a valid host"
			}
		} else if why := checkDNSName(host, upper); why != "" {
			return why
		}
	}
	if port != "" || strings.HasSuffix(s, ":") {
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return fmt.Sprintf("has an invalid port %q: use 1..65535", port)
		}
	}
	return ""
}

// checkDNSName returns "" when host is a DNS name (RFC 1123 labels, at most 253 characters), else why
// not. Upper-case letters are allowed only when upper is set.
func checkDNSName(host string, upper bool) string {
	if len(host) > 253 {
		return "is longer than 253 characters"
	}
	for _, label := range strings.Split(host, ".") {
		if len(label) > 63 || !dnsLabelRE.MatchString(label) {
			return "is not a DNS name (dot-separated labels of letters, digits and '-', not starting or ending with '-')"
		}
	}
	if !upper && strings.ToLower(host) != host {
		return "is not lower case: write " + strings.ToLower(host)
	}
	return ""
}
