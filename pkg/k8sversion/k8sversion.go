// Package k8sversion is the one table of the Kubernetes minor releases the appliance deploys, with
// the versions of the images kubeadm of each minor adds to Kubernetes' own: etcd, CoreDNS and pause.
// Everything that depends on the minor reads it from here: configuration validation (pkg/config), the
// nodes' sandbox and CoreDNS images (pkg/plan), kubeadm's image list (kubeadm-manifests.Images),
// bundle creation (pkg/bundlespec, pkg/bundlecreate) and its pkgs.k8s.io repository.
//
// The package is pure data with nothing beyond the standard library, so that both the appliance and
// the connected side's bundle tooling import it.
//
// Shape of the table (Releases, oldest first): the three minors the Kubernetes project maintains.
//
//	minor  read from k8s.io/kubernetes  etcd      CoreDNS  pause
//	v1.35  v1.35.4                      3.6.6-0   v1.13.1  3.10.1
//	v1.36  v1.36.3                      3.6.8-0   v1.14.2  3.10.2
//	v1.37  v1.37.2                      3.7.0-0   v1.14.6  3.10.2
//
// Any other minor is refused (Lookup, ErrUnsupported), also one that has just left the table: a
// minor past its end of life gets no fixes, and the appliance deploys only what it tests.
//
// Source of every version: cmd/kubeadm/app/constants/constants.go of the k8s.io/kubernetes module
// named in Release.Source (`go mod download -json k8s.io/kubernetes@vX.Y.Z`, the Go module proxy):
// DefaultEtcdVersion, CoreDNSVersion and PauseVersion. The etcd tag kubeadm deploys is the entry of
// SupportedEtcdVersion for the cluster's minor, or the nearest entry when the map lacks it
// (constants.EtcdSupportedVersion; kubeadm v1.37.2's map stops at 36); for each minor here that is
// DefaultEtcdVersion. TestTableMatchesKubeadm re-reads all of it from the module cache and fails on
// any difference, so the table cannot drift from kubeadm silently.
package k8sversion

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Release is one Kubernetes minor release the appliance knows.
type Release struct {
	// Minor is "v1.MINOR", e.g. "v1.37".
	Minor string
	// Source is the k8s.io/kubernetes module version the image versions below were read from, a
	// release of Minor, e.g. "v1.37.2".
	Source string
	// Etcd is the etcd image tag kubeadm of Minor deploys, "3.7.0-0" (constants.DefaultEtcdVersion).
	Etcd string
	// CoreDNS is the CoreDNS image tag kubeadm of Minor deploys, "v1.14.6" (constants.CoreDNSVersion).
	CoreDNS string
	// Pause is the pause (sandbox) image tag kubeadm of Minor expects, "3.10.2"
	// (constants.PauseVersion); containerd's CRI sandbox_image must be the same.
	Pause string
}

// releases is the table, oldest first: the Kubernetes project's maintained minors and nothing else.
var releases = []Release{
	{Minor: "v1.35", Source: "v1.35.4", Etcd: "3.6.6-0", CoreDNS: "v1.13.1", Pause: "3.10.1"},
	{Minor: "v1.36", Source: "v1.36.3", Etcd: "3.6.8-0", CoreDNS: "v1.14.2", Pause: "3.10.2"},
	{Minor: "v1.37", Source: "v1.37.2", Etcd: "3.7.0-0", CoreDNS: "v1.14.6", Pause: "3.10.2"},
}

// Releases returns a copy of the table, oldest minor first.
func Releases() []Release {
	return append([]Release(nil), releases...)
}

// Minors returns the table's minors, oldest first: ["v1.35", "v1.36", "v1.37"].
func Minors() []string {
	out := make([]string, 0, len(releases))
	for _, r := range releases {
		out = append(out, r.Minor)
	}
	return out
}

// Newest is the newest minor of the table.
func Newest() Release { return releases[len(releases)-1] }

// Errors Lookup wraps.
var (
	// ErrNotAVersion: the string is not "v" + a semantic version.
	ErrNotAVersion = errors.New("not a Kubernetes version")
	// ErrUnsupported: the version's minor is not in the table.
	ErrUnsupported = errors.New("unsupported Kubernetes minor")
)

// versionRE is "v" + a semantic version: major, minor, patch, optional pre-release and build.
var versionRE = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)([-+][0-9A-Za-z.+-]*)?$`)

// Minor returns the minor release of version ("v1.37.2" → "v1.37"; pre-release and build suffixes
// are allowed, "v1.37.0-rc.1" → "v1.37"). The error wraps ErrNotAVersion.
func Minor(version string) (string, error) {
	m := versionRE.FindStringSubmatch(version)
	if m == nil {
		return "", fmt.Errorf("%q is %w: write v + MAJOR.MINOR.PATCH, e.g. %s", version, ErrNotAVersion, Newest().Source)
	}
	return "v" + m[1] + "." + m[2], nil
}

// Lookup returns the table's entry for version's minor ("v1.37.2" → the v1.37 entry). The error wraps
// ErrNotAVersion or ErrUnsupported and says which minors are supported, e.g.
// `unsupported Kubernetes minor v1.34: the appliance deploys v1.35, v1.36 and v1.37; use e.g. v1.37.2`.
func Lookup(version string) (Release, error) {
	minor, err := Minor(version)
	if err != nil {
		return Release{}, err
	}
	for _, r := range releases {
		if r.Minor == minor {
			return r, nil
		}
	}
	return Release{}, fmt.Errorf("%w %s: %s", ErrUnsupported, minor, SupportedText())
}

// SupportedText says which minors the appliance deploys, for messages: "the appliance deploys v1.35,
// v1.36 and v1.37; use e.g. v1.37.2".
func SupportedText() string {
	return "the appliance deploys " + joinAnd(Minors()) + "; use e.g. " + Newest().Source
}

// joinAnd joins "a", "a and b", "a, b and c".
func joinAnd(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// DefaultImageRepository is kubeadm's default image repository (kubeadm v1beta4
// DefaultImageRepository), whose CoreDNS image lives one path level down.
const DefaultImageRepository = "registry.k8s.io"

// EtcdImage is the etcd image kubeadm deploys from repository repo: "registry.k8s.io/etcd:3.7.0-0"
// (kubeadm images.GetEtcdImage).
func (r Release) EtcdImage(repo string) string { return repo + "/etcd:" + r.Etcd }

// PauseImage is the pause image kubeadm expects from repo: "registry.k8s.io/pause:3.10.2" (kubeadm
// images.GetPauseImage).
func (r Release) PauseImage(repo string) string { return repo + "/pause:" + r.Pause }

// CoreDNSImage is the CoreDNS image kubeadm deploys from repo: under registry.k8s.io one level down,
// "registry.k8s.io/coredns/coredns:v1.14.6", elsewhere "REPO/coredns:v1.14.6" (kubeadm
// images.GetDNSImage).
func (r Release) CoreDNSImage(repo string) string {
	if repo == DefaultImageRepository {
		repo += "/coredns"
	}
	return repo + "/coredns:" + r.CoreDNS
}

// AptRepository is the Kubernetes project's Debian repository of the minor's kubelet, kubeadm and
// kubectl, a flat repository (suite "/"): "https://pkgs.k8s.io/core:/stable:/v1.37/deb/". Each minor
// has its own; its key is published beside it (Release.key).
func (r Release) AptRepository() string {
	return "https://pkgs.k8s.io/core:/stable:/" + r.Minor + "/deb/"
}

// aptRepositoryRE matches AptRepository's URLs, with or without the final "/".
var aptRepositoryRE = regexp.MustCompile(`^https?://pkgs\.k8s\.io/core:/stable:/(v[0-9]+\.[0-9]+)/deb/?$`)

// AptRepositoryMinor returns the minor a pkgs.k8s.io stable repository URL serves
// ("https://pkgs.k8s.io/core:/stable:/v1.36/deb/" → "v1.36", true); false for any other URL.
func AptRepositoryMinor(uri string) (string, bool) {
	m := aptRepositoryRE.FindStringSubmatch(uri)
	if m == nil {
		return "", false
	}
	return m[1], true
}
