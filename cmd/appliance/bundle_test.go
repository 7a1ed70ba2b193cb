package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/airgap-appliance/appliance/pkg/bundlecreate"
	"github.com/airgap-appliance/appliance/pkg/bundlespec"
	"github.com/airgap-appliance/appliance/test/upstream"
)

// runCLI runs the appliance command line with args and returns stdout, stderr and the error.
func runCLI(args ...string) (string, string, error) {
	root := newRootCommand()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), errb.String(), err
}

// writeSpec finishes spec for a CLI test in dir (default signing keys under dir/config, no parts,
// defaults), pushes a random image to up for every image it names under registry.k8s.io, and writes
// it to dir/bundle-spec.yaml; it returns that path and the images.
func writeSpec(t *testing.T, up *upstream.Registry, dir string, spec *bundlespec.BundleSpecification) (string, []string) {
	t.Helper()
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config"))
	spec.Signing = bundlespec.Signing{}
	spec.Output = bundlespec.Output{}
	// The node image (a Debian system built with debootstrap) is test/nodeimage's and the fixture
	// bundle's (test/fixtures/build-bundle.sh), not these tests'.
	spec.NodeImage = bundlespec.NodeImage{}
	bundlespec.SetDefaults(spec)
	refs, err := bundlecreate.Images(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refs {
		img, _ := random.Image(512, 1)
		up.Push(t, strings.TrimPrefix(r, "registry.k8s.io/"), img)
	}
	data, err := bundlespec.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	specFile := filepath.Join(dir, "bundle-spec.yaml")
	if err := os.WriteFile(specFile, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return specFile, refs
}

// TestBundleCreateVerifyInspect drives `appliance bundle create`, `verify` and `inspect` against a real
// upstream registry (Debian's docker-registry, TLS + basic auth, registry.k8s.io's only mirror) and a
// signed upstream apt repository, both on loopback.
func TestBundleCreateVerifyInspect(t *testing.T) {
	up := upstream.Start(t, upstream.Options{})
	dir := t.TempDir()
	spec := bundlespec.Example()
	spec.Images.Install, spec.Images.Extra = nil, nil
	spec.Registries = bundlespec.Registries{Hosts: map[string]bundlespec.Registry{
		"registry.k8s.io": {Mirrors: []string{"https://" + up.Host}, MirrorsOnly: true, CAFile: up.CAFile,
			Auth: bundlespec.RegistryAuth{DockerConfigFile: up.DockerConfig(t, up.Password)}}}}
	// Packages from a signed upstream apt repository on loopback (the CLI test never leaves the machine).
	apt := upstream.StartAptRepo(t, []upstream.Deb{{Name: "alpha", Version: "1.0", Arch: "amd64", Extra: "Depends: bravo\n"},
		{Name: "bravo", Version: "2.0", Arch: "all"}})
	spec.Apt = bundlespec.Apt{CAFile: apt.CAFile, Sources: []bundlespec.AptSource{
		{URI: apt.URL, Suite: apt.Suite, Components: []string{"main"}, SignedBy: apt.Keyring}}}
	spec.Packages, spec.ExtraPackages = []string{"alpha"}, nil
	// Signing keys: the defaults, created on first use under the user's configuration directory.
	specFile, refs := writeSpec(t, up, dir, spec)
	out := filepath.Join(dir, "bundle")

	stdout, stderr, err := runCLI("bundle", "create", "--spec", specFile, "--out", out, "-o", "json")
	if err != nil {
		t.Fatalf("bundle create: %v\n%s", err, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var final struct {
		SignedBy, PublicKey string
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &final); err != nil || final.PublicKey == "" {
		t.Fatalf("last JSON line %q: %v", lines[len(lines)-1], err)
	}
	if len(lines) < len(refs) {
		t.Errorf("only %d JSON event lines for %d images", len(lines), len(refs))
	}

	if _, err := os.Stat(filepath.Join(dir, "config", "appliance", "signing", bundlespec.DefaultBundleKeyFileName)); err != nil {
		t.Errorf("the bundle key was not created in the default signing directory: %v", err)
	}
	if _, stderr, err := runCLI("bundle", "verify", out, "--public-key", final.PublicKey); err != nil {
		t.Fatalf("bundle verify with the maker's key: %v\n%s", err, stderr)
	}
	other := "ed25519:F5qGAfHQhD42ze3bnW9x++RWXOTgEedjaTZhyNyqR0U="
	if _, _, err := runCLI("bundle", "verify", out, "--public-key", other); err == nil || !strings.Contains(err.Error(), "not trusted") {
		t.Errorf("bundle verify with another key: %v, want a refusal naming the untrusted key", err)
	}
	stdout, _, err = runCLI("bundle", "inspect", out)
	if err != nil || !strings.Contains(stdout, "registry.k8s.io/kube-apiserver:"+spec.Kubernetes.Version) || !strings.Contains(stdout, final.SignedBy) ||
		!strings.Contains(stdout, "bravo") || !strings.Contains(stdout, "2 packages") {
		t.Errorf("bundle inspect: %v\n%s", err, stdout)
	}
}
