package bundlespec

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestDecodeErrors asserts the path, line and message of every decoding error class.
func TestDecodeErrors(t *testing.T) {
	type want struct {
		path string
		line int
		msg  string
	}
	tests := []struct {
		name string
		doc  string
		want []want // exactly these errors, in order
	}{
		{"empty file", "", []want{{"", 0, "the bundle specification is empty"}}},
		{"only comments", "# nothing\n\n# here\n", []want{{"", 0, "the bundle specification is empty"}}},
		{"null document", "~\n", []want{{"", 1, "the bundle specification is empty"}}},
		{"two documents", header + "kubernetes: {version: v1.37.2}\n---\n" + header, []want{{"", 5, "a second YAML document starts here"}}},
		{"syntax error", header + "platforms: [a\npackages: x\n", []want{{"", 0, "invalid YAML"}}},
		{"tab indentation", header + "kubernetes:\n\tversion: v1.37.2\n", []want{{"", 4, "invalid YAML: found character that cannot start any token"}}},
		{"list at the root", "- a\n- b\n", []want{{"", 1, "the document must be a mapping"}}},
		{"missing apiVersion and kind", "kubernetes: {version: v1.37.2}\n", []want{
			{"apiVersion", 1, "is required: add `apiVersion: appliance.airgap.dev/v1alpha1`"},
			{"kind", 1, "is required: add `kind: BundleSpecification`"}}},
		{"wrong kind", "apiVersion: appliance.airgap.dev/v1alpha1\nkind: BootstrapConfiguration\nbogus: 1\n", []want{
			{"kind", 2, `"BootstrapConfiguration" is not supported: this appliance reads BundleSpecification only`}}},
		{"unknown top-level key", header + "kubernetes: {version: v1.37.2}\nplatform: [linux/amd64]\n", []want{
			{"platform", 4, `unknown field "platform": did you mean "platforms"?`}}},
		{"unknown top-level key, case", header + "extrapackages: [vim]\n", []want{
			{"extrapackages", 3, `unknown field "extrapackages": did you mean "extraPackages"?`}}},
		{"unknown nested key", header + "kubernetes:\n  verison: v1.37.2\n", []want{
			{"kubernetes.verison", 4, `unknown field "verison": did you mean "version"?`}}},
		{"unknown key in a list item", header + "apt:\n  sources:\n  - uri: https://deb.debian.org/debian\n    suite: trixie\n    component: [main]\n", []want{
			{"apt.sources[0].component", 7, `unknown field "component": did you mean "components"?`}}},
		{"apt's name for the keyring", header + "apt:\n  sources:\n  - uri: https://deb.debian.org/debian\n    keyring: /k.gpg\n", []want{
			{"apt.sources[0].keyring", 6, `unknown field "keyring": did you mean "signedBy"?`}}},
		{"prefix of a key", header + "registries:\n  auth:\n    dockerConfig: /c.json\n", []want{
			{"registries.auth.dockerConfig", 5, `unknown field "dockerConfig": did you mean "dockerConfigFile"?`}}},
		{"unknown key in a registry host", header + "registries:\n  hosts:\n    quay.io:\n      mirors: [https://m]\n", []want{
			{"registries.hosts[quay.io].mirors", 6, `unknown field "mirors": did you mean "mirrors"?`}}},
		{"unknown key without suggestion", header + "output:\n  format: tar\n", []want{
			{"output.format", 4, `unknown field "format": valid keys here are partSize`}}},
		{"duplicate key", header + "packages: [a]\npackages: [b]\n", []want{
			{"packages", 4, "duplicate key (first set at line 3)"}}},
		{"duplicate registry host", header + "registries:\n  hosts:\n    quay.io: {}\n    quay.io: {}\n", []want{
			{"registries.hosts[quay.io]", 6, "duplicate key (first set at line 5)"}}},
		{"merge key", header + "kubernetes:\n  <<: {version: v1}\n", []want{{"kubernetes.<<", 4, "merge keys (<<) are not supported"}}},
		{"non-string key", header + "? [a, b]\n: c\n", []want{{"", 3, "keys must be plain strings, not a list"}}},
		{"list as string", header + "platforms: linux/amd64\n", []want{{"platforms", 3, "must be a list"}}},
		{"mapping as list", header + "apt:\n  sources: {uri: x}\n", []want{{"apt.sources", 4, "must be a list"}}},
		{"string as mapping", header + "kubernetes:\n  version: {major: 1}\n", []want{{"kubernetes.version", 4, "must be a string, not a mapping"}}},
		{"mapping as string", header + "registries: docker.io\n", []want{{"registries", 3, "must be a mapping of key: value"}}},
		{"hosts as list", header + "registries:\n  hosts: [docker.io]\n", []want{{"registries.hosts", 4, "must be a mapping of key: value, not a list"}}},
		{"list item as list", header + "images:\n  extra:\n  - [a]\n", []want{{"images.extra[0]", 5, "must be a string, not a list"}}},
		{"size without number", header + "output:\n  partSize: GiB\n", []want{{"output.partSize", 4, `"GiB" is not a size: write a whole number of bytes`}}},
		{"size unknown unit", header + "output:\n  partSize: 4 GByte\n", []want{{"output.partSize", 4, `unknown unit "GByte"`}}},
		{"size wrong case", header + "output:\n  partSize: 4gib\n", []want{{"output.partSize", 4, `did you mean "GiB"?`}}},
		{"size fraction of a byte", header + "output:\n  partSize: 1.1KiB\n", []want{{"output.partSize", 4, "is not a whole number of bytes (1126.400 bytes)"}}},
		{"size negative", header + "output:\n  partSize: -1\n", []want{{"output.partSize", 4, "-1 is not a size"}}},
		{"size too large", header + "output:\n  partSize: 10000000TB\n", []want{{"output.partSize", 4, "larger than 9223372036854775807 bytes"}}},
		{"size as list", header + "output:\n  partSize: [1]\n", []want{{"output.partSize", 4, "must be a size such as 4GiB, not a list"}}},
		{"alias to nothing", header + "packages: *nope\n", []want{{"", 0, "invalid YAML: unknown anchor 'nope' referenced"}}},
		{"several at once", header + "kubernetes:\n  versoin: v1\nplatforms: linux/amd64\noutput:\n  partSize: huge\napt:\n  sources:\n  - suites: [trixie]\n", []want{
			{"kubernetes.versoin", 4, `did you mean "version"?`},
			{"platforms", 5, "must be a list"},
			{"output.partSize", 7, `"huge" is not a size`},
			{"apt.sources[0].suites", 10, `did you mean "suite"?`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Decode([]byte(tt.doc))
			if s != nil {
				t.Errorf("Decode returned a specification along with errors")
			}
			var list ErrorList
			if !errors.As(err, &list) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Decode error = %v (%T), want an ErrorList matching ErrInvalid", err, err)
			}
			if len(list) != len(tt.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(list), len(tt.want), list)
			}
			for i, w := range tt.want {
				g := list[i]
				if g.Path != w.path || (w.line != 0 && g.Line != w.line) || !strings.Contains(g.Msg, w.msg) {
					t.Errorf("error %d = {%q, line %d, %q}, want {%q, line %d, containing %q}", i, g.Path, g.Line, g.Msg, w.path, w.line, w.msg)
				}
			}
		})
	}
}

func TestDecodeAccepts(t *testing.T) {
	tests := []struct {
		name  string
		doc   string
		check func(t *testing.T, s *BundleSpecification)
	}{
		{"nulls and empty values leave fields unset", header + "kubernetes:\nimages: {extra: ~}\nplatforms: []\noutput: {partSize: null}\nsigning:\n",
			func(t *testing.T, s *BundleSpecification) {
				if s.Kubernetes.Version != "" || s.Images.Extra != nil || len(s.Platforms) != 0 || s.Output.PartSize != 0 {
					t.Errorf("null/empty values were not left unset: %+v", s)
				}
			}},
		{"aliases", header + "apt:\n  sources:\n  - &deb {uri: https://deb.debian.org/debian, suite: trixie, components: [main], signedBy: /k}\n  - *deb\n",
			func(t *testing.T, s *BundleSpecification) {
				if len(s.Apt.Sources) != 2 || s.Apt.Sources[1].Suite != "trixie" {
					t.Errorf("alias not followed: %+v", s.Apt.Sources)
				}
			}},
		{"sizes", header + "output:\n  partSize: 4.7GB\n",
			func(t *testing.T, s *BundleSpecification) {
				if s.Output.PartSize != 4_700_000_000 {
					t.Errorf("partSize = %d", s.Output.PartSize)
				}
			}},
		{"size as a plain integer", header + "output:\n  partSize: 1048576\n",
			func(t *testing.T, s *BundleSpecification) {
				if s.Output.PartSize != 1<<20 {
					t.Errorf("partSize = %d", s.Output.PartSize)
				}
			}},
		{"registry hosts with dots, ports and IPv6", header + "registries:\n  hosts:\n    registry.k8s.io: {mirrors: [https://m.corp]}\n    \"[fd00::5]:5000\": {caFile: /ca.pem}\n    empty.example:\n",
			func(t *testing.T, s *BundleSpecification) {
				h := s.Registries.Hosts
				if len(h) != 3 || h["registry.k8s.io"].Mirrors[0] != "https://m.corp" || h["[fd00::5]:5000"].CAFile != "/ca.pem" {
					t.Errorf("hosts = %+v", h)
				}
				if s.lines["registries.hosts[[fd00::5]:5000].caFile"] != 6 || s.lines["registries.hosts[empty.example]"] != 7 {
					t.Errorf("lines = %v", s.lines)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Decode([]byte(tt.doc))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			tt.check(t, s)
		})
	}
}

// TestLoadReportsEverythingAtOnce: decoding errors (wrong shape, unknown key, bad size) and validation errors
// (bad image, missing keyring, duplicate package) come out of one Load, in document order, with
// lines; a field that failed to decode is not reported a second time.
func TestLoadReportsEverythingAtOnce(t *testing.T) {
	doc := header + `kubernetes:
  version: [v1.37.2]
images:
  extra:
  - busybox:latest
platforms: linux/amd64
apt:
  sources:
  - uri: https://deb.debian.org/debian
    suite: trixie
    components: [main]
    keyring: /usr/share/keyrings/debian-archive-keyring.gpg
packages: [kubelet, kubelet]
output:
  partSize: 4 gigabytes
`
	path := filepath.Join(t.TempDir(), "bundle.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Load(path, ValidateOptions{})
	if s != nil {
		t.Error("Load returned a specification along with errors")
	}
	var list ErrorList
	if !errors.As(err, &list) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("Load error = %v (%T), want ErrorList", err, err)
	}
	want := []struct {
		path string
		line int
		msg  string
	}{
		// Not also "kubernetes.version: is required": the value is there, in the wrong shape.
		{"kubernetes.version", 4, "must be a string, not a list"},
		{"images.extra[0]", 7, `"busybox:latest" does not name its registry`},
		{"platforms", 8, "must be a list"},
		{"apt.sources[0].signedBy", 11, "is required"},
		{"apt.sources[0].keyring", 14, `did you mean "signedBy"?`},
		{"packages[1]", 15, `"kubelet" is also packages[0]`},
		{"output.partSize", 17, `"4 gigabytes" is not a size`},
	}
	if len(list) != len(want) {
		t.Errorf("got %d errors, want %d:\n%v", len(list), len(want), list)
	}
	for i, w := range want {
		if i < len(list) && (list[i].Path != w.path || list[i].Line != w.line || !strings.Contains(list[i].Msg, w.msg)) {
			t.Errorf("error %d = %v, want %s (line %d) containing %q", i, list[i], w.path, w.line, w.msg)
		}
	}
}

func TestLoadReadErrors(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "missing.yaml"), ValidateOptions{})
	if !errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrInvalid) {
		t.Errorf("missing file: err = %v, want one wrapping fs.ErrNotExist and not ErrInvalid", err)
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, make([]byte, MaxFileSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big, ValidateOptions{}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized file: err = %v", err)
	}
}

// TestLoadExampleFile: testdata/example.yaml loads clean and gives Example back.
func TestLoadExampleFile(t *testing.T) {
	s, err := Load(filepath.Join("testdata", "example.yaml"), ValidateOptions{})
	if err != nil {
		t.Fatalf("Load(example.yaml): %v", err)
	}
	if diff := cmp.Diff(Example(), s, cmpSpec...); diff != "" {
		t.Errorf("example.yaml differs from Example() (-want +got):\n%s", diff)
	}
	if s.AllPlatforms() || s.Apt.Sources[0].IsFlat() || !s.Apt.Sources[2].IsFlat() {
		t.Errorf("AllPlatforms/IsFlat wrong for %+v", s)
	}
	s.Platforms = []string{PlatformAll}
	if !s.AllPlatforms() {
		t.Error("AllPlatforms() false for [all]")
	}
}

func TestPathCovers(t *testing.T) {
	for _, tt := range []struct {
		p, q string
		want bool
	}{
		{"apt.sources[0]", "apt.sources[0].uri", true},
		{"apt.sources[0]", "apt.sources[0]", true},
		{"apt.sources[0]", "apt.sources[01]", false},
		{"apt.sources", "apt.sources[1]", true},
		{"packages", "packagesX", false},
		{"kubernetes", "images", false},
		{"", "anything", true},
	} {
		if got := pathCovers(tt.p, tt.q); got != tt.want {
			t.Errorf("pathCovers(%q, %q) = %v", tt.p, tt.q, got)
		}
	}
}
