package bundlespec

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/airgap-appliance/appliance/pkg/k8sversion"
)

const (
	digest   = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	corpHost = "registry.corp.example:5000"
)

// TestValidateErrors mutates the valid Example one way per case and asserts the exact set of error
// paths Validate returns, and that the error at the first listed path says what it must.
func TestValidateErrors(t *testing.T) {
	host := func(s *BundleSpecification, h string) Registry { return s.Registries.Hosts[h] }
	setHost := func(s *BundleSpecification, h string, r Registry) { s.Registries.Hosts[h] = r }
	mirrors := func(m ...string) func(s *BundleSpecification) {
		return func(s *BundleSpecification) { r := host(s, "docker.io"); r.Mirrors = m; setHost(s, "docker.io", r) }
	}
	extra := func(refs ...string) func(s *BundleSpecification) {
		return func(s *BundleSpecification) { s.Images.Extra = refs }
	}
	source := func(f func(src *AptSource)) func(s *BundleSpecification) {
		return func(s *BundleSpecification) { f(&s.Apt.Sources[0]) }
	}
	tests := []struct {
		name   string
		mutate func(s *BundleSpecification)
		paths  []string // every error path, any order; the first is checked for msg
		msg    string
	}{
		{"valid example", func(s *BundleSpecification) {}, nil, ""},
		{"minimal", func(s *BundleSpecification) {
			*s = BundleSpecification{Kubernetes: s.Kubernetes, Apt: Apt{Sources: s.Apt.Sources[:1]}}
			SetDefaults(s)
		}, nil, ""},

		{"wrong apiVersion", func(s *BundleSpecification) { s.APIVersion = "appliance.airgap.dev/v1" },
			[]string{"apiVersion"}, "set apiVersion: appliance.airgap.dev/v1alpha1"},
		{"wrong kind", func(s *BundleSpecification) { s.Kind = "Bundle" },
			[]string{"kind"}, `"Bundle" is not supported: set kind: BundleSpecification`},

		{"missing kubernetes.version", func(s *BundleSpecification) { s.Kubernetes.Version = "" },
			[]string{"kubernetes.version"}, "is required"},
		{"kubernetes.version without v", func(s *BundleSpecification) { s.Kubernetes.Version = "1.37.2" },
			[]string{"kubernetes.version"}, `"1.37.2" is not a Kubernetes release version (did you mean v1.37.2?)`},
		{"kubernetes.version minor only", func(s *BundleSpecification) { s.Kubernetes.Version = "v1.37" },
			[]string{"kubernetes.version"}, "vMAJOR.MINOR.PATCH"},
		{"kubernetes.version pre-release", func(s *BundleSpecification) { s.Kubernetes.Version = "v1.35.0-rc.1" },
			[]string{"kubernetes.version"}, "is not a Kubernetes release version"},
		{"kubernetes.version leading zero", func(s *BundleSpecification) { s.Kubernetes.Version = "v1.034.4" },
			[]string{"kubernetes.version"}, "is not a Kubernetes release version"},
		// The minor: one of pkg/k8sversion's table, with a pkgs.k8s.io repository of the same minor.
		{"kubernetes.version past its end of life", kubernetesAt("v1.34.4", "v1.34"),
			[]string{"kubernetes.version"}, `"v1.34.4" cannot be bundled: unsupported Kubernetes minor v1.34: ` +
				"the appliance deploys v1.35, v1.36 and v1.37; use e.g. v1.37.2"},
		{"kubernetes.version older minor", kubernetesAt("v1.33.5", "v1.33"),
			[]string{"kubernetes.version"}, `"v1.33.5" cannot be bundled: unsupported Kubernetes minor v1.33`},
		{"kubernetes.version newer minor", kubernetesAt("v1.38.0", "v1.38"),
			[]string{"kubernetes.version"}, `"v1.38.0" cannot be bundled: unsupported Kubernetes minor v1.38`},
		{"kubernetes.version v1.35", kubernetesAt("v1.35.4", "v1.35"), nil, ""},
		{"kubernetes.version v1.36", kubernetesAt("v1.36.3", "v1.36"), nil, ""},
		{"kubernetes.version v1.37", kubernetesAt("v1.37.2", "v1.37"), nil, ""},
		{"kubernetes repository of another minor", kubernetesAt("v1.37.2", "v1.36"),
			[]string{"apt.sources[2].uri"}, `"https://pkgs.k8s.io/core:/stable:/v1.36/deb/" serves the Kubernetes v1.36 packages but kubernetes.version is v1.37.2: ` +
				"the nodes would get kubelet, kubeadm and kubectl of another minor than the bundle's images; use https://pkgs.k8s.io/core:/stable:/v1.37/deb/"},
		{"kubernetes repository left at the example's", func(s *BundleSpecification) { s.Kubernetes.Version = "v1.36.3" },
			[]string{"apt.sources[2].uri"}, "serves the Kubernetes v1.37 packages but kubernetes.version is v1.36.3"},
		{"kubernetes repository without the final slash", func(s *BundleSpecification) {
			kubernetesAt("v1.36.3", "v1.35")(s)
			s.Apt.Sources[2].URI = strings.TrimSuffix(s.Apt.Sources[2].URI, "/")
		}, []string{"apt.sources[2].uri"}, "use https://pkgs.k8s.io/core:/stable:/v1.36/deb/"},
		{"unsupported minor: the repository is not checked", kubernetesAt("v1.33.5", "v1.30"),
			[]string{"kubernetes.version"}, "unsupported Kubernetes minor v1.33"},

		{"image digest only", extra("quay.io/prometheus/node-exporter@" + digest), nil, ""},
		{"image tag and digest", extra("registry.k8s.io/pause:3.10.1@" + digest), nil, ""},
		{"image on localhost and IPv6 registry", extra("localhost/a/b:1", "[fd00::5]:5000/a:1", "10.0.0.5:5000/a/b_c/d__e/f-g:v1.0_rc-1"), nil, ""},
		{"image empty tag and bad digest", extra("quay.io/a/b:1", "busybox:@sha"),
			[]string{"images.extra[1]"}, `"busybox:@sha" is not an image reference: "sha" is not a digest`},
		{"image without registry", extra("busybox:1.37"),
			[]string{"images.extra[0]"}, `"busybox:1.37" does not name its registry: write the full reference with the registry host, e.g. docker.io/library/busybox:1.37`},
		{"image without registry, with namespace", extra("prom/prometheus:v3.0.0"),
			[]string{"images.extra[0]"}, "e.g. docker.io/prom/prometheus:v3.0.0"},
		{"docker hub without library", extra("docker.io/busybox:1.37"),
			[]string{"images.extra[0]"}, "write docker.io/library/busybox:1.37"},
		{"image without tag or digest", extra("quay.io/a/b"),
			[]string{"images.extra[0]"}, "has no tag or digest: pin what the bundle holds, e.g. quay.io/a/b:<tag>"},
		{"image with scheme", extra("https://quay.io/a/b:1"),
			[]string{"images.extra[0]"}, "carries a URL scheme"},
		{"image upper-case repository", extra("quay.io/Prom/b:1"),
			[]string{"images.extra[0]"}, `"Prom" is not a repository path component`},
		{"image bad tag", extra("quay.io/a/b:.1"),
			[]string{"images.extra[0]"}, `".1" is not a tag`},
		{"image empty tag", extra("quay.io/a/b:"),
			[]string{"images.extra[0]"}, "the ':' is followed by no tag"},
		{"image empty path component", extra("quay.io/a//b:1"),
			[]string{"images.extra[0]"}, "has an empty component"},
		{"image bad registry port", extra("quay.io:0/a:1"),
			[]string{"images.extra[0]"}, `the registry "quay.io:0" has an invalid port "0"`},
		{"image registry only", extra("quay.io:1"),
			[]string{"images.extra[0]"}, `names no repository after the registry "quay.io"`},
		{"image two @", extra("quay.io/a@" + digest + "@" + digest),
			[]string{"images.extra[0]"}, "more than one '@'"},
		{"image short sha256 digest", extra("quay.io/a@sha256:abc"),
			[]string{"images.extra[0]"}, "is not an image reference"},
		{"image whitespace", extra("quay.io/a b:1"),
			[]string{"images.extra[0]"}, "whitespace"},
		{"image empty", extra(""),
			[]string{"images.extra[0]"}, "is empty"},
		{"image name too long", extra("quay.io/" + strings.Repeat("a", 250) + ":1"),
			[]string{"images.extra[0]"}, "is longer than 255 characters"},
		{"image twice across lists", func(s *BundleSpecification) {
			s.Images.Install = []string{"quay.io/a/b:1"}
			s.Images.Extra = []string{"quay.io/a/c:1", "quay.io/a/b:1"}
		}, []string{"images.extra[1]"}, `"quay.io/a/b:1" is also images.install[0]`},
		{"bad install image", func(s *BundleSpecification) { s.Images.Install = []string{"ghcr.io/x/y"} },
			[]string{"images.install[0]"}, "has no tag or digest"},

		{"no platforms", func(s *BundleSpecification) { s.Platforms = nil },
			[]string{"platforms"}, "is required"},
		{"platforms all", func(s *BundleSpecification) { s.Platforms = []string{PlatformAll} }, nil, ""},
		{"platforms several", func(s *BundleSpecification) {
			s.Platforms = []string{"linux/amd64", "linux/arm64/v8", "linux/arm/v7", "linux/riscv64"}
		}, nil, ""},
		{"platforms all and others", func(s *BundleSpecification) { s.Platforms = []string{"linux/amd64", "all"} },
			[]string{"platforms[1]"}, `"all" keeps every platform, so it must be the only entry`},
		{"platform duplicate", func(s *BundleSpecification) { s.Platforms = []string{"linux/amd64", "linux/amd64"} },
			[]string{"platforms[1]"}, `"linux/amd64" is also platforms[0]`},
		{"platform windows", func(s *BundleSpecification) { s.Platforms = []string{"windows/amd64"} },
			[]string{"platforms[0]"}, `the operating system "windows" is not linux`},
		{"platform uname name", func(s *BundleSpecification) { s.Platforms = []string{"linux/x86_64"} },
			[]string{"platforms[0]"}, "write linux/amd64"},
		{"platform Debian name", func(s *BundleSpecification) { s.Platforms = []string{"linux/armhf"} },
			[]string{"platforms[0]"}, "write linux/arm/v7"},
		{"platform unknown arch", func(s *BundleSpecification) { s.Platforms = []string{"linux/amd46"} },
			[]string{"platforms[0]"}, `unknown architecture "amd46"`},
		{"platform upper case", func(s *BundleSpecification) { s.Platforms = []string{"Linux/AMD64"} },
			[]string{"platforms[0]"}, "write linux/amd64"},
		{"platform arch only", func(s *BundleSpecification) { s.Platforms = []string{"amd64"} },
			[]string{"platforms[0]"}, "write os/architecture[/variant]"},
		{"platform empty variant", func(s *BundleSpecification) { s.Platforms = []string{"linux/arm/"} },
			[]string{"platforms[0]"}, `"" is not a CPU variant`},

		{"registry hosts IPv6 and IP", func(s *BundleSpecification) {
			s.Registries.Hosts = map[string]Registry{"[fd00::5]:5000": {}, "10.0.0.5": {}, "localhost:5000": {}}
		}, nil, ""},
		{"registry host upper case", func(s *BundleSpecification) { setHost(s, "Quay.io", Registry{}) },
			[]string{"registries.hosts[Quay.io]"}, `"Quay.io" is not lower case: write quay.io; the keys are registry hosts`},
		{"registry host with scheme", func(s *BundleSpecification) { setHost(s, "https://quay.io", Registry{}) },
			[]string{"registries.hosts[https://quay.io]"}, `"https://quay.io" carries a URL scheme: write the host (and :port) only`},
		{"registry host with path", func(s *BundleSpecification) { setHost(s, "quay.io/prometheus", Registry{}) },
			[]string{"registries.hosts[quay.io/prometheus]"}, "without path"},
		{"registry host Docker Hub alias", func(s *BundleSpecification) { setHost(s, "index.docker.io", Registry{}) },
			[]string{"registries.hosts[index.docker.io]"}, "use the key docker.io"},
		{"registry host empty", func(s *BundleSpecification) { setHost(s, "", Registry{}) },
			[]string{"registries.hosts[]"}, "the key is empty"},
		{"registry host bad port", func(s *BundleSpecification) { setHost(s, "quay.io:99999", Registry{}) },
			[]string{"registries.hosts[quay.io:99999]"}, `has an invalid port "99999"`},
		{"registry host bare IPv6", func(s *BundleSpecification) { setHost(s, "fd00::5", Registry{}) },
			[]string{"registries.hosts[fd00::5]"}, "without brackets"},
		{"mirrorsOnly without mirrors", func(s *BundleSpecification) { setHost(s, "quay.io", Registry{MirrorsOnly: true}) },
			[]string{"registries.hosts[quay.io].mirrorsOnly"}, "has no mirrors"},
		{"mirror http", mirrors("http://mirror.corp"),
			[]string{"registries.hosts[docker.io].mirrors[0]"}, "is plain HTTP"},
		{"mirror not a URL", mirrors("mirror.corp"),
			[]string{"registries.hosts[docker.io].mirrors[0]"}, `"mirror.corp" is not a URL`},
		{"mirror with credentials", mirrors("https://u:p@mirror.corp"),
			[]string{"registries.hosts[docker.io].mirrors[0]"}, "carries credentials"},
		{"mirror with query", mirrors("https://mirror.corp/?ns=docker.io"),
			[]string{"registries.hosts[docker.io].mirrors[0]"}, "has a query or fragment"},
		{"mirror duplicate", mirrors("https://mirror.corp/v2/hub", "https://mirror.gcr.io", "https://mirror.corp/v2/hub/"),
			[]string{"registries.hosts[docker.io].mirrors[2]"}, "is also registries.hosts[docker.io].mirrors[0]"},
		{"mirror empty and ftp", mirrors("", "ftp://mirror.corp"),
			[]string{"registries.hosts[docker.io].mirrors[0]", "registries.hosts[docker.io].mirrors[1]"}, "is empty"},
		{"mirror bad host", mirrors("https://mir_ror.corp"),
			[]string{"registries.hosts[docker.io].mirrors[0]"}, `the host "mir_ror.corp" is not a DNS name`},
		{"dockerConfigFile with ~", func(s *BundleSpecification) { s.Registries.Auth.DockerConfigFile = "~/.docker/config.json" },
			[]string{"registries.auth.dockerConfigFile"}, "starts with ~, which is not expanded"},
		{"per-host caFile with control characters", func(s *BundleSpecification) {
			r := host(s, corpHost)
			r.CAFile = "/etc/ca\n.pem"
			setHost(s, corpHost, r)
		}, []string{"registries.hosts[registry.corp.example:5000].caFile"}, "control characters"},

		{"no apt sources", func(s *BundleSpecification) { s.Apt.Sources = nil },
			[]string{"apt.sources"}, "at least one source is required"},
		{"apt source missing everything", func(s *BundleSpecification) { s.Apt.Sources = []AptSource{{}} },
			[]string{"apt.sources[0].components", "apt.sources[0].signedBy", "apt.sources[0].suite", "apt.sources[0].uri"}, "is required"},
		{"apt source unsigned", source(func(src *AptSource) { src.SignedBy = "" }),
			[]string{"apt.sources[0].signedBy"}, "unsigned sources are refused"},
		{"apt uri ftp", source(func(src *AptSource) { src.URI = "ftp://deb.debian.org/debian" }),
			[]string{"apt.sources[0].uri"}, "is not an http:// or https:// URL"},
		{"apt uri plain http", source(func(src *AptSource) { src.URI = "http://deb.debian.org/debian" }), nil, ""},
		{"apt uri with credentials", source(func(src *AptSource) { src.URI = "https://u:p@deb.corp/debian" }),
			[]string{"apt.sources[0].uri"}, "carries credentials"},
		{"apt uri with fragment", source(func(src *AptSource) { src.URI = "https://deb.corp/debian#x" }),
			[]string{"apt.sources[0].uri"}, "has a query or fragment"},
		{"apt uri without host", source(func(src *AptSource) { src.URI = "https:///debian" }),
			[]string{"apt.sources[0].uri"}, "is not an http:// or https:// URL"},
		{"apt suite with space", source(func(src *AptSource) { src.Suite = "trixie trixie-updates" }),
			[]string{"apt.sources[0].suite"}, "one source per suite"},
		{"apt suite with ..", source(func(src *AptSource) { src.Suite = "../x" }),
			[]string{"apt.sources[0].suite"}, `contains ".."`},
		{"apt suite absolute not flat", source(func(src *AptSource) { src.Suite = "/trixie" }),
			[]string{"apt.sources[0].suite"}, "starts with '/'"},
		{"apt flat with components", func(s *BundleSpecification) { s.Apt.Sources[2].Components = []string{"main"} },
			[]string{"apt.sources[2].components"}, "must be empty: suite \"/\" ends in / and so names a flat repository"},
		{"apt flat relative", func(s *BundleSpecification) { s.Apt.Sources[2].Suite = "./" }, nil, ""},
		{"apt no components", source(func(src *AptSource) { src.Components = nil }),
			[]string{"apt.sources[0].components"}, "at least one component is required"},
		{"apt bad components", source(func(src *AptSource) { src.Components = []string{"main", "", "main contrib", "main", "../x"} }),
			[]string{"apt.sources[0].components[1]", "apt.sources[0].components[2]", "apt.sources[0].components[3]", "apt.sources[0].components[4]"}, "is empty"},
		{"apt duplicate source", func(s *BundleSpecification) {
			s.Apt.Sources[1].Suite = "trixie"
			s.Apt.Sources[1].URI += "/"
		}, []string{"apt.sources[1]"}, "is the same repository (uri and suite) as apt.sources[0]"},
		{"apt signedBy with ~", source(func(src *AptSource) { src.SignedBy = "~/k.gpg" }),
			[]string{"apt.sources[0].signedBy"}, "not expanded"},

		{"no packages", func(s *BundleSpecification) { s.Packages = nil },
			[]string{"packages"}, "is required"},
		{"package names", func(s *BundleSpecification) {
			s.Packages = []string{"kubelet", "Kubeadm", "kubectl=1.37.2-1.1", "runc:amd64", "a", "-x", "", "g++", "libstdc++6", "kubelet"}
		}, []string{"packages[1]", "packages[2]", "packages[3]", "packages[4]", "packages[5]", "packages[6]", "packages[9]"}, "package names are lower case, write kubeadm"},
		{"package pinned", func(s *BundleSpecification) { s.ExtraPackages = []string{"vim=2:9.1"} },
			[]string{"extraPackages[0]"}, "version pins are not supported here"},
		{"package arch-qualified", func(s *BundleSpecification) { s.ExtraPackages = []string{"vim:arm64"} },
			[]string{"extraPackages[0]"}, "architecture qualifiers are not supported"},
		{"package too short", func(s *BundleSpecification) { s.ExtraPackages = []string{"a"} },
			[]string{"extraPackages[0]"}, "Debian Policy §5.6.7"},
		{"extra package also a package", func(s *BundleSpecification) { s.ExtraPackages = []string{"vim", "keepalived"} },
			[]string{"extraPackages[1]"}, `"keepalived" is also packages[6]`},

		{"signing keys empty", func(s *BundleSpecification) { s.Signing = Signing{} }, nil, ""},
		{"signing keys the same file", func(s *BundleSpecification) { s.Signing.BundleKeyFile = s.Signing.RepoKeyFile },
			[]string{"signing.bundleKeyFile"}, "is the same file as signing.repoKeyFile"},
		{"signing key with ~", func(s *BundleSpecification) { s.Signing.RepoKeyFile = "~/repo.asc" },
			[]string{"signing.repoKeyFile"}, "not expanded"},

		{"partSize zero", func(s *BundleSpecification) { s.Output.PartSize = 0 }, nil, ""},
		{"partSize minimum", func(s *BundleSpecification) { s.Output.PartSize = MinPartSize }, nil, ""},
		{"partSize too small", func(s *BundleSpecification) { s.Output.PartSize = 1000 },
			[]string{"output.partSize"}, "1kB is too small: parts hold at least 1MiB"},
		{"partSize too large", func(s *BundleSpecification) { s.Output.PartSize = MaxSize + 1 },
			[]string{"output.partSize"}, "is too large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Example()
			tt.mutate(s)
			errs := Validate(s, ValidateOptions{})
			got := errPaths(errs)
			want := slices.Clone(tt.paths)
			if want == nil {
				want = []string{}
			}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("error paths = %q, want %q; errors:\n%v", got, want, errs)
			}
			if len(tt.paths) > 0 {
				if e := findErr(errs, tt.paths[0]); !strings.Contains(e.Msg, tt.msg) {
					t.Errorf("%s: message %q does not contain %q", e.Path, e.Msg, tt.msg)
				}
			}
			for _, e := range errs {
				if e.Msg == "" || e.Line != 0 { // Example is built in Go: no lines
					t.Errorf("error %v: want a message and no line", e)
				}
			}
		})
	}
}

// kubernetesAt sets kubernetes.version to version and Example's pkgs.k8s.io source (apt.sources[2],
// which the cases' error paths name) to the repository of repoMinor.
func kubernetesAt(version, repoMinor string) func(s *BundleSpecification) {
	return func(s *BundleSpecification) {
		s.Kubernetes.Version = version
		s.Apt.Sources[2].URI = k8sversion.Release{Minor: repoMinor}.AptRepository()
	}
}

// TestKubernetesRepositoryLine: the refusal of a pkgs.k8s.io repository of another minor carries the
// line of its uri.
func TestKubernetesRepositoryLine(t *testing.T) {
	s := mustDecode(t, header+`kubernetes:
  version: v1.37.2
apt:
  sources:
  - uri: https://deb.debian.org/debian
    suite: trixie
    components: [main]
    signedBy: /usr/share/keyrings/debian-archive-keyring.gpg
  - uri: https://pkgs.k8s.io/core:/stable:/v1.36/deb/
    suite: /
    signedBy: /etc/apt/keyrings/kubernetes-apt-keyring.gpg
`)
	errs := Validate(s, ValidateOptions{})
	if got := errPaths(errs); !slices.Equal(got, []string{"apt.sources[1].uri"}) {
		t.Fatalf("error paths %q; errors:\n%v", got, errs)
	}
	requireErr(t, errs, "apt.sources[1].uri", "use https://pkgs.k8s.io/core:/stable:/v1.37/deb/", 11)
}

// TestValidateAllAtOnce: one specification with a mistake in every section gets one error per
// mistake, every one with its path and line.
func TestValidateAllAtOnce(t *testing.T) {
	s := mustDecode(t, header+`kubernetes:
  version: "1.37"
images:
  extra:
  - quay.io/ok/image:1
  - busybox:@sha
platforms: [linux/amd64, all]
registries:
  hosts:
    Quay.io:
      mirrors: [http://mirror.corp]
apt:
  sources:
  - uri: ftp://deb.debian.org/debian
    suite: trixie
    components: [main]
packages: [Kubelet]
extraPackages: [kubelet]
signing:
  repoKeyFile: ~/repo.asc
output:
  partSize: 1kB
`)
	errs := Validate(s, ValidateOptions{})
	want := []struct {
		path string
		line int
		msg  string
	}{
		{"kubernetes.version", 4, `"1.37" is not a Kubernetes release version`},
		{"images.extra[1]", 8, `"busybox:@sha" is not an image reference: "sha" is not a digest`},
		{"platforms[1]", 9, "must be the only entry"},
		{"registries.hosts[Quay.io]", 12, "is not lower case"},
		{"registries.hosts[Quay.io].mirrors[0]", 13, "is plain HTTP"},
		{"apt.sources[0].uri", 16, "is not an http:// or https:// URL"},
		{"apt.sources[0].signedBy", 16, "is required"}, // absent: the line of its source
		{"packages[0]", 19, "write kubelet"},
		{"signing.repoKeyFile", 22, "not expanded"},
		{"output.partSize", 24, "is too small"},
	}
	for _, w := range want {
		requireErr(t, errs, w.path, w.msg, w.line)
	}
	if len(errs) != len(want) {
		t.Errorf("got %d errors, want %d:\n%v", len(errs), len(want), errs)
	}
	// extraPackages[0] "kubelet" is not reported as a duplicate of the invalid "Kubelet".
	if e := findErr(errs, "extraPackages[0]"); e != nil {
		t.Errorf("unexpected %v", e)
	}
}

func TestValidateNil(t *testing.T) {
	errs := Validate(nil, ValidateOptions{})
	if len(errs) != 1 || !errors.Is(errs, ErrInvalid) {
		t.Fatalf("Validate(nil) = %v, want one error matching ErrInvalid", errs)
	}
}

// TestValidateDoesNotMutate: Validate is a pure check.
func TestValidateDoesNotMutate(t *testing.T) {
	s := Example()
	s.Platforms = []string{"Linux/AMD64"}
	s.Packages = append(s.Packages, "Vim")
	before := Example()
	before.Platforms = []string{"Linux/AMD64"}
	before.Packages = append(before.Packages, "Vim")
	Validate(s, ValidateOptions{CheckFiles: true})
	if diff := cmp.Diff(before, s, cmpSpec...); diff != "" {
		t.Fatalf("Validate changed the specification (-before +after):\n%s", diff)
	}
}

func TestParentPath(t *testing.T) {
	for in, want := range map[string]string{
		"a":                                   "",
		"a.b":                                 "a",
		"a.b[1]":                              "a.b",
		"registries.hosts[registry.k8s.io]":   "registries.hosts",
		"registries.hosts[a.b].mirrors[0]":    "registries.hosts[a.b].mirrors",
		"registries.hosts[a.b].mirrors":       "registries.hosts[a.b]",
		"registries.hosts[[fd00::1]:5000]":    "registries.hosts",
		"registries.hosts[[fd00::1]:5000].ca": "registries.hosts[[fd00::1]:5000]",
		"registries.hosts[a]b]":               "",
		"":                                    "",
	} {
		if got := parentPath(in); got != want {
			t.Errorf("parentPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParsePlatform(t *testing.T) {
	for in, want := range map[string]Platform{
		"linux/amd64":    {OS: "linux", Architecture: "amd64"},
		"linux/arm/v7":   {OS: "linux", Architecture: "arm", Variant: "v7"},
		"linux/arm64/v8": {OS: "linux", Architecture: "arm64", Variant: "v8"},
	} {
		got, err := ParsePlatform(in)
		if err != nil || got != want || got.String() != in {
			t.Errorf("ParsePlatform(%q) = %+v (%q), %v; want %+v", in, got, got.String(), err, want)
		}
	}
	for _, in := range []string{PlatformAll, "", "linux", "linux/amd64/v2/x", "linux//v7", "linux/arm/V7"} {
		if _, err := ParsePlatform(in); !errors.Is(err, ErrPlatform) {
			t.Errorf("ParsePlatform(%q) err = %v, want ErrPlatform", in, err)
		}
	}
}
