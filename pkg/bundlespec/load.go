package bundlespec

import (
	"bytes"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"

	"github.com/airgap-appliance/appliance/pkg/k8sversion"
)

// MaxFileSize bounds the specification file Load reads (a real one is a few KiB).
const MaxFileSize = 4 << 20

// Load reads the file at path, strictly decodes it (Decode), applies SetDefaults and runs Validate. It
// returns the defaulted specification, or an error that is either a read error (wrapping the
// *fs.PathError) or an ErrorList (errors.Is(err, ErrInvalid)) holding every decoding and validation
// problem at once, in document order.
func Load(path string, opts ValidateOptions) (*BundleSpecification, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read bundle specification: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read bundle specification %s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return nil, ErrorList{{Msg: fmt.Sprintf("%s is larger than %d bytes: this is not a bundle specification", path, MaxFileSize)}}
	}
	s, errs := load(data, opts)
	if len(errs) > 0 {
		return nil, errs
	}
	return s, nil
}

// load is Load on bytes: decode, default, validate, and merge the errors. A validation error on a
// field whose value could not be decoded is dropped (the decoding error already says what is wrong).
func load(data []byte, opts ValidateOptions) (*BundleSpecification, ErrorList) {
	s, r := decode(data)
	if s == nil {
		return nil, r.Errors
	}
	SetDefaults(s)
	return s, r.Merge(Validate(s, opts))
}

// fieldComments are the comments Marshal puts above keys, by field path: enough to read a printed
// specification without the documentation at hand.
var fieldComments = map[string]string{
	"kubernetes": "The Kubernetes release: the bundle holds the images `kubeadm config images list` gives for it.",
	"images": "Images beyond kubeadm's, as fully qualified references: registry/repository:tag and/or @digest.\n" +
		"install: what the install runs besides kubeadm's images (default: none); extra: the operator's own.",
	"platforms": "Platforms kept from multi-platform images: os/architecture[/variant], or [all] to keep every index whole.",
	"registries": "How to reach upstream registries; a registry without an entry is pulled from directly.\n" +
		"auth.dockerConfigFile: a Docker config.json (as `docker login` writes it), the default for every registry.\n" +
		"hosts: per registry host as image references name it: https mirrors tried first, extra CAs, credentials.",
	"apt": "Signed Debian repositories the packages come from (apt's sources.list); signedBy is the OpenPGP\n" +
		"keyring that signs each. A suite ending in / is a flat repository, which has no components.",
	"packages":      "Node packages the install needs (default: what the appliance installs); dependencies are added.",
	"extraPackages": "Further Debian packages to carry, for the operator's own use.",
	"signing": "Private keys that sign the bundle: repoKeyFile an OpenPGP key (repository metadata), bundleKeyFile an\n" +
		"ed25519 PKCS#8 PEM key (bundle manifest). Empty: created on first use in $XDG_CONFIG_HOME/appliance/signing\n" +
		"(~/.config/appliance/signing) and reused from there.",
	"nodeImage": "build: build the node image BMC-booted machines boot (an ISO holding its kernel, initramfs and\n" +
		"root filesystem) into netboot/node-amd64.iso, from this bundle's own packages (needs root, debootstrap\n" +
		"and the Debian mirror).",
	"output": "partSize splits the bundle into parts of at most that size (e.g. 4GiB, 4.7GB); 0 or absent: one part.",
}

// Marshal renders s as YAML: keys in the order of the struct fields (registry hosts sorted), two-space
// indentation, empty optional fields left out, a comment above each top-level section. The same
// specification always renders to the same bytes, and Decode(Marshal(s)) gives s back.
func Marshal(s *BundleSpecification) ([]byte, error) {
	if s == nil {
		return nil, fmt.Errorf("marshal bundle specification: %w", ErrInvalid)
	}
	var root yaml.Node
	if err := root.Encode(s); err != nil {
		return nil, fmt.Errorf("marshal bundle specification: %w", err)
	}
	if root.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(root.Content); i += 2 {
			root.Content[i].HeadComment = fieldComments[root.Content[i].Value]
		}
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&root); err != nil {
		return nil, fmt.Errorf("marshal bundle specification: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("marshal bundle specification: %w", err)
	}
	return buf.Bytes(), nil
}

// Example returns a complete, defaulted specification that uses every field and passes Validate
// without CheckFiles (the files it names are where they would be on a build host): Kubernetes
// v1.37.2 with its kubelet, kubeadm and kubectl from the minor's pkgs.k8s.io repository (a flat
// repository, k8sversion.Release.AptRepository) with Debian trixie, two extra images, Docker Hub
// through a mirror, a corporate registry with its own CA and credentials, keys kept under
// /etc/appliance/signing and 4 GiB parts. testdata/example.yaml is Marshal(Example()).
//
// Its version is the appliance's default (pkg/config DefaultKubernetesVersion, which this package
// does not import; test/fixtures/kubernetes' TestDefaultVersionEverywhere keeps the two equal). Any
// supported minor works the same way: set kubernetes.version and the repository of its minor.
func Example() *BundleSpecification {
	const version = "v1.37.2"
	rel, _ := k8sversion.Lookup(version) // TestExampleGolden fails if the table lost the minor
	s := &BundleSpecification{
		Kubernetes: Kubernetes{Version: version},
		Images: Images{
			Extra: []string{
				"quay.io/prometheus/node-exporter:v1.9.1",
				"docker.io/library/busybox:1.37.0",
				"registry.corp.example:5000/platform/ingress-controller:2.4.0",
			},
		},
		Platforms: []string{"linux/amd64"},
		Registries: Registries{
			Auth: RegistryAuth{DockerConfigFile: "/root/.docker/config.json"},
			Hosts: map[string]Registry{
				"docker.io": {Mirrors: []string{"https://mirror.gcr.io"}},
				"registry.corp.example:5000": {
					CAFile: "/etc/appliance/build/corp-ca.pem",
					Auth:   RegistryAuth{DockerConfigFile: "/etc/appliance/build/corp-registry.json"},
				},
			},
		},
		Apt: Apt{Sources: []AptSource{
			{
				URI:        "https://deb.debian.org/debian",
				Suite:      "trixie",
				Components: []string{"main"},
				SignedBy:   "/usr/share/keyrings/debian-archive-keyring.gpg",
			},
			{
				URI:        "https://deb.debian.org/debian",
				Suite:      "trixie-updates",
				Components: []string{"main"},
				SignedBy:   "/usr/share/keyrings/debian-archive-keyring.gpg",
			},
			{
				URI:      rel.AptRepository(),
				Suite:    "/",
				SignedBy: "/etc/apt/keyrings/kubernetes-apt-keyring.gpg",
			},
		}},
		ExtraPackages: []string{"nfs-common", "open-iscsi"},
		Signing: Signing{
			RepoKeyFile:   "/etc/appliance/signing/repo-signing.asc",
			BundleKeyFile: "/etc/appliance/signing/bundle-signing.pem",
		},
		NodeImage: NodeImage{Build: true},
		Output:    Output{PartSize: 4 << 30},
	}
	SetDefaults(s)
	return s
}
