package registry

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/distribution/reference"
)

// ErrInvalidReference is wrapped by every error about an image reference that cannot be served by the
// mirror (not fully qualified, malformed, IPv6 literal host, name too long).
var ErrInvalidReference = errors.New("invalid image reference")

// HostComponent returns the first repository path component under which images from the source
// registry host are served. The rule is the identity for plain DNS names and IPv4 addresses, lowercased
// (DNS names are case-insensitive), except that the port separator ':' becomes '_':
//
//	registry.k8s.io  -> registry.k8s.io
//	docker.io        -> docker.io
//	myreg:5000       -> myreg_5000
//	10.0.0.5:5000    -> 10.0.0.5_5000
//
// A repository path component may hold '_' but no ':' (OCI distribution spec, "Pulling manifests",
// <name> grammar), and a host name may hold ':' but never '_', so the mapping is injective: no two
// hosts share a component. containerd mirrors therefore use
// `[host."https://APPLIANCE/v2/" + HostComponent(host)] override_path = true` in certs.d/<host>/hosts.toml.
// IPv6 literal hosts ("[::1]:5000") are refused with ErrInvalidReference.
func HostComponent(host string) (string, error) {
	if host == "" {
		return "", fmt.Errorf("%w: empty registry host", ErrInvalidReference)
	}
	if strings.HasPrefix(host, "[") {
		return "", fmt.Errorf("%w: registry host %q is an IPv6 literal; give the source registry a DNS name in the bundle", ErrInvalidReference, host)
	}
	name, port, hasPort := strings.Cut(strings.ToLower(host), ":")
	if _, err := netip.ParseAddr(name); err != nil && !validHostName(name) {
		return "", fmt.Errorf("%w: registry host %q is not a DNS name or IPv4 address", ErrInvalidReference, host)
	}
	if !hasPort {
		return name, nil
	}
	if port == "" || strings.Trim(port, "0123456789") != "" {
		return "", fmt.Errorf("%w: registry host %q has a malformed port", ErrInvalidReference, host)
	}
	return name + "_" + port, nil
}

// validHostName reports whether s is a dot-separated sequence of labels of [a-z0-9-] that neither start
// nor end with '-' (RFC 1123 host names; s is already lowercased).
func validHostName(s string) bool {
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
				return false
			}
		}
	}
	return true
}

// parsedRef is a fully qualified image reference split the way the mirror serves it.
type parsedRef struct {
	host       string // source registry host as written, lowercased, e.g. "registry.k8s.io", "myreg:5000"
	repository string // mirror repository, e.g. "registry.k8s.io/pause", "myreg_5000/team/app"
	tag        string // "" when the reference carries only a digest
	digest     string // "" unless the reference pins one ("sha256:...")
}

// parseRef parses a fully qualified reference: the first path component must be a registry host (it
// contains '.' or ':' or is "localhost", Docker's rule), so "busybox:1.36" and "library/busybox" are
// refused while "docker.io/busybox:1.36" is accepted and normalised to "docker.io/library/busybox". A
// reference with neither tag nor digest gets the tag "latest".
func parseRef(ref string) (parsedRef, error) {
	first, _, ok := strings.Cut(ref, "/")
	if !ok || (!strings.ContainsAny(first, ".:") && first != "localhost") {
		return parsedRef{}, fmt.Errorf("%w: %q is not fully qualified; the bundle must name images with their registry host, e.g. registry.k8s.io/pause:3.10 or docker.io/library/busybox:1.36", ErrInvalidReference, ref)
	}
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return parsedRef{}, fmt.Errorf("%w: %q: %w", ErrInvalidReference, ref, err)
	}
	host := strings.ToLower(reference.Domain(named))
	comp, err := HostComponent(host)
	if err != nil {
		return parsedRef{}, fmt.Errorf("%q: %w", ref, err)
	}
	p := parsedRef{host: host, repository: comp + "/" + reference.Path(named)}
	if len(p.repository) > reference.RepositoryNameTotalLengthMax {
		return parsedRef{}, fmt.Errorf("%w: %q maps to repository %q, longer than %d characters", ErrInvalidReference, ref, p.repository, reference.RepositoryNameTotalLengthMax)
	}
	if _, err := reference.WithName(p.repository); err != nil {
		return parsedRef{}, fmt.Errorf("%w: %q maps to invalid repository %q: %w", ErrInvalidReference, ref, p.repository, err)
	}
	if t, ok := named.(reference.Tagged); ok {
		p.tag = t.Tag()
	}
	if d, ok := named.(reference.Digested); ok {
		p.digest = d.Digest().String()
	}
	if p.tag == "" && p.digest == "" {
		p.tag = "latest"
	}
	return p, nil
}

// RepositoryFor maps a fully qualified image reference to the repository and tag under which the mirror
// serves it: "registry.k8s.io/pause:3.10" -> ("registry.k8s.io/pause", "3.10");
// "docker.io/busybox" -> ("docker.io/library/busybox", "latest"); "myreg:5000/x:1" -> ("myreg_5000/x", "1")
// (see HostComponent for the host rule). A digest-only reference returns tag "". Errors wrap
// ErrInvalidReference.
func RepositoryFor(ref string) (repository, tag string, err error) {
	p, err := parseRef(ref)
	if err != nil {
		return "", "", err
	}
	return p.repository, p.tag, nil
}
