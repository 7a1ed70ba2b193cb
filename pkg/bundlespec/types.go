// Package bundlespec defines BundleSpecification (apiVersion appliance.airgap.dev/v1alpha1), the one
// document `appliance bundle create --spec F --out DIR` reads to build an air-gap bundle (see
// pkg/bundle for the bundle itself): which Kubernetes release, which extra images and for which
// platforms, where to pull them from and with which credentials, which Debian sources and packages,
// which keys sign the result and how to split it.
//
// It follows pkg/config, the model for the appliance's configuration documents:
//
//  1. Decode: strict YAML decoding (pkg/strictyaml, shared with pkg/config). Unknown keys (with a "did
//     you mean"), duplicate keys, values of the wrong shape and sizes that do not parse are reported
//     together, each a FieldError with its field path and line, e.g.
//     `registries.hosts[docker.io].mirors: unknown field "mirors": did you mean "mirrors"? (line 12)`.
//  2. SetDefaults: an explicit, idempotent function that fills every unset field that has a default.
//  3. Validate: semantic checks over the whole document, returning every error at once, e.g.
//     `images.extra[1]: "busybox:@sha" is not an image reference: … (line 9)`.
//
// Load runs the three on a file; Marshal renders a specification deterministically; Example returns
// a complete one (testdata/example.yaml is Marshal(Example())).
//
// Field paths use YAML keys: struct fields are joined with '.', list items are [index] and map entries
// [key] (Kubernetes field.Path style), e.g. "apt.sources[0].components[1]" or
// "registries.hosts[registry.k8s.io].mirrors[0]".
//
// Paths of files (keyrings, keys, CA bundles, Docker config files) are used as written: relative
// paths are relative to the working directory of the process reading the specification, and "~" is
// not expanded.
package bundlespec

import "github.com/airgap-appliance/appliance/pkg/strictyaml"

// APIVersion is the only apiVersion this package accepts.
const APIVersion = "appliance.airgap.dev/v1alpha1"

// Kind is the only kind this package accepts.
const Kind = "BundleSpecification"

// BundleSpecification is the whole input of `appliance bundle create`. The YAML keys are the yaml tags
// below; the zero value is not valid (run SetDefaults, then Validate).
type BundleSpecification struct {
	// APIVersion must be APIVersion. Default APIVersion.
	APIVersion string `yaml:"apiVersion"`
	// Kind must be Kind. Default Kind.
	Kind string `yaml:"kind"`
	// Kubernetes selects the Kubernetes release the bundle is for.
	Kubernetes Kubernetes `yaml:"kubernetes"`
	// Images lists the container images the bundle holds beyond the ones kubeadm needs for
	// Kubernetes.Version (those are derived from kubeadm and never listed here).
	Images Images `yaml:"images,omitempty"`
	// Platforms selects which platforms of multi-platform images (OCI image indexes) the bundle keeps.
	// Either exactly one entry, PlatformAll ("all"), which keeps every index whole, or one or more
	// "os/architecture[/variant]" (OCI image-spec platform: os "linux"; architecture a Go GOARCH name
	// Debian runs on, e.g. amd64, arm64, arm; variant e.g. v7 or v8; see ParsePlatform), without
	// duplicates. Single-platform images are kept as they are. Default DefaultPlatforms
	// (["linux/amd64"]).
	Platforms []string `yaml:"platforms"`
	// Registries says how to reach the upstream registries the images come from: mirrors, CAs and
	// credentials. Optional: without an entry a registry is reached directly, over HTTPS verified
	// against the system roots, anonymously (unless Registries.Auth applies).
	Registries Registries `yaml:"registries,omitempty"`
	// Apt lists the Debian package sources the packages are downloaded from.
	Apt Apt `yaml:"apt"`
	// Packages are the Debian binary packages the install itself puts on every node (names only, no
	// version pins or architecture qualifiers); bundle create adds their dependencies. Each must be a
	// Debian package name (Debian Policy §5.6.7: lower-case letters, digits, '+', '-' and '.', at least
	// two characters, starting with a letter or digit), no duplicates. An absent or empty list gets
	// DefaultPackages, what the appliance installs today; replace it only to substitute a package
	// (e.g. another containerd build): nodes fail to install if one the install runs is missing.
	Packages []string `yaml:"packages"`
	// ExtraPackages are further Debian packages to carry for the operator's own use (e.g. nfs-common),
	// same rules as Packages, none also in Packages. Optional.
	ExtraPackages []string `yaml:"extraPackages,omitempty"`
	// Signing names the keys that sign the bundle.
	Signing Signing `yaml:"signing,omitempty"`
	// NodeImage says whether the bundle carries the node image that BMC-booted machines boot.
	NodeImage NodeImage `yaml:"nodeImage,omitempty"`
	// Output shapes the bundle written to --out.
	Output Output `yaml:"output,omitempty"`

	// lines maps a field path ("apt.sources[0].uri") to the 1-based line it was read from; nil for a
	// specification not produced by Decode. Validate uses it to put lines on its errors.
	lines strictyaml.Lines
}

// Kubernetes selects the Kubernetes release.
type Kubernetes struct {
	// Version is the Kubernetes release, "vMAJOR.MINOR.PATCH" without pre-release or build suffix
	// (e.g. v1.37.2): the control-plane images are those `kubeadm config images list` gives for it,
	// with the etcd, CoreDNS and pause images of kubeadm of its minor. The minor must be one the
	// appliance deploys (pkg/k8sversion: v1.35, v1.36 or v1.37), and a Kubernetes project
	// repository among apt.sources must be that minor's (https://pkgs.k8s.io/core:/stable:/v1.37/deb/ for v1.37.2).
	// Required; no default, so that a bundle is never built for a version nobody chose.
	Version string `yaml:"version"`
}

// Images lists container images by reference. Every entry is a fully qualified reference:
// registry host, repository path and a tag and/or a digest ("registry.k8s.io/pause:3.10.1",
// "quay.io/prometheus/node-exporter@sha256:<64 hex>", "docker.io/library/busybox:1.37.0@sha256:…",
// the registry host never left implicit, Docker Hub's official images with their "library/" path),
// in the grammar of github.com/distribution/reference. No reference may appear twice across Install
// and Extra.
type Images struct {
	// Install are the images the install itself runs beyond kubeadm's (e.g. a CNI or keepalived
	// image). An absent or empty list gets DefaultInstallImages, which is empty today: keepalived
	// and the CNI plugins come as Debian packages.
	Install []string `yaml:"install,omitempty"`
	// Extra are further images the operator wants in the cluster's registry mirror (workloads,
	// tools). Optional.
	Extra []string `yaml:"extra,omitempty"`
}

// PlatformAll is the Platforms value that keeps every platform of every image index.
const PlatformAll = "all"

// Registries configures access to upstream registries.
type Registries struct {
	// Auth is the default for every registry whose entry in Hosts sets no auth of its own (and for
	// registries without an entry). Optional: without it pulls are anonymous.
	Auth RegistryAuth `yaml:"auth,omitempty"`
	// Hosts configures individual registries, keyed by the registry host exactly as it appears in
	// image references: a DNS name or IP address, lower case, with ":port" when not 443, e.g.
	// "registry.k8s.io", "docker.io" (Docker Hub: not index.docker.io), "registry.corp:5000",
	// "[fd00::5]:5000". Optional.
	Hosts map[string]Registry `yaml:"hosts,omitempty"`
}

// Registry configures one upstream registry.
type Registry struct {
	// Mirrors are registry endpoints to pull this registry's images from instead, tried in order
	// before the registry itself (as containerd's hosts.toml does): https:// URLs of the registry API
	// root, optionally with a path prefix ("https://mirror.corp.example",
	// "https://harbor.corp.example/v2/proxy-k8s"), without credentials, query or fragment, no
	// duplicates. Optional.
	Mirrors []string `yaml:"mirrors,omitempty"`
	// MirrorsOnly: never contact the registry itself, only its mirrors (a build host that may reach
	// nothing but the corporate mirror). Requires mirrors.
	MirrorsOnly bool `yaml:"mirrorsOnly,omitempty"`
	// CAFile is a PEM file of CA certificates trusted, in addition to the system roots, for TLS to
	// this registry and its mirrors. Optional.
	CAFile string `yaml:"caFile,omitempty"`
	// Auth are the credentials for this registry and its mirrors; unset means Registries.Auth.
	Auth RegistryAuth `yaml:"auth,omitempty"`
}

// RegistryAuth says where registry credentials come from.
type RegistryAuth struct {
	// DockerConfigFile is the path of a Docker CLI config file (the config.json that `docker login`
	// writes; note the file, not the $DOCKER_CONFIG directory): credentials are looked up in it for
	// the registry host (and for each mirror's host), the way docker does. Optional.
	DockerConfigFile string `yaml:"dockerConfigFile,omitempty"`
}

// Apt configures the Debian package sources.
type Apt struct {
	// Sources are searched for Packages and their dependencies, like the entries of apt's
	// sources.list: at least one, no two with the same URI and suite.
	Sources []AptSource `yaml:"sources"`
	// CAFile is a PEM file of extra CA certificates that https sources may chain to (besides the
	// system's roots), e.g. a corporate mirror's CA. Optional.
	CAFile string `yaml:"caFile,omitempty"`
}

// AptSource is one signed Debian repository (one line of sources.list, deb822 "Types: deb").
type AptSource struct {
	// URI is the repository's base URL, http:// or https:// (apt checks the signature either way),
	// without credentials, query or fragment, e.g. https://deb.debian.org/debian. Required.
	URI string `yaml:"uri"`
	// Suite is the distribution (codename or suite, e.g. "trixie", "trixie-updates"), or, for a flat
	// repository, an exact path ending in "/" (e.g. "/" for https://pkgs.k8s.io/core:/stable:/v1.37/deb/).
	// No whitespace. Required.
	Suite string `yaml:"suite"`
	// Components are the archive areas to use, e.g. [main] or [main, contrib]: required (at least
	// one, no duplicates, no whitespace) unless Suite is an exact path, when there must be none
	// (sources.list(5)).
	Components []string `yaml:"components,omitempty"`
	// SignedBy is the path of the OpenPGP public keyring (binary .gpg or ASCII-armored .asc) whose keys
	// sign this repository's Release files, as apt's Signed-By option. Required: unsigned sources are
	// refused.
	SignedBy string `yaml:"signedBy"`
}

// IsFlat reports whether the source is a flat repository (Suite is an exact path ending in "/").
func (s AptSource) IsFlat() bool { return len(s.Suite) > 0 && s.Suite[len(s.Suite)-1] == '/' }

// Signing names the private keys that sign the bundle. An empty field means: use the key at the
// default location (DefaultSigningDir), creating it there on first use, so that successive bundles
// are signed by the same key and appliances that trust it keep trusting new bundles.
type Signing struct {
	// RepoKeyFile is the OpenPGP private key (unencrypted; binary or ASCII-armored) that signs the
	// bundle's Debian repository metadata (InRelease, Release.gpg). Default, created on first use:
	// DefaultSigningDir()/DefaultRepoKeyFileName.
	RepoKeyFile string `yaml:"repoKeyFile,omitempty"`
	// BundleKeyFile is the ed25519 private key, PKCS#8 PEM ("-----BEGIN PRIVATE KEY-----", as
	// `openssl genpkey -algorithm ed25519` writes), that signs the bundle manifest. Default, created on
	// first use: DefaultSigningDir()/DefaultBundleKeyFileName.
	BundleKeyFile string `yaml:"bundleKeyFile,omitempty"`
}

// NodeImage is the node image a blank machine boots (network boot, or a Redfish BMC's virtual media)
// to enrol with the appliance and install itself: iso/build-node-image.sh, carried inside the
// appliance binary (package iso), run by `appliance bundle create` after the packages step against
// the bundle's own repository, so kubelet, kubeadm, containerd and the rest in the image are the
// versions the bundle serves, with the hostagent beside the appliance executable. Its ISO goes to the
// bundle's netboot/node-amd64.iso (config's boot.nodeISO default) under the bundle's checksums and
// signature: the one form of the image a bundle carries, as network boot serves the kernel, initramfs
// and root filesystem from inside it.
type NodeImage struct {
	// Build makes bundle create build the node image into the bundle. The build needs root,
	// debootstrap, squashfs-tools, GRUB for BIOS and EFI, xorriso, mtools, busybox-static, kmod and
	// cpio, and Debian's mirror (the machine's apt sources); its Debian system is cached by content
	// under $APPLIANCE_CACHE (default /var/cache/appliance). Default false: a bundle for
	// pre-installed hosts only needs none.
	Build bool `yaml:"build,omitempty"`
}

// Output shapes the written bundle.
type Output struct {
	// PartSize splits the bundle into parts of at most this many bytes (for media of that size),
	// written as a whole number of bytes with an optional unit: "4GiB", "700MB", "4.7GB", "1073741824"
	// (see ParseSize). At least MinPartSize. 0 or absent: one part.
	PartSize Size `yaml:"partSize,omitempty"`
}
