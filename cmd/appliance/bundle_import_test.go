package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/airgap-appliance/appliance/pkg/bundlespec"
	"github.com/airgap-appliance/appliance/pkg/debrepo"
	"github.com/airgap-appliance/appliance/test/upstream"
)

// TestBundleSinceImport drives `appliance bundle create --since` and `bundle import` against a real
// upstream registry (images only): the update names its base, refuses to verify alone, is refused
// under an untrusted key, and imports onto its base into a bundle that `bundle verify` accepts.
func TestBundleSinceImport(t *testing.T) {
	up := upstream.Start(t, upstream.Options{})
	dir := t.TempDir()
	spec := bundlespec.Example()
	spec.Images.Install, spec.Images.Extra = nil, []string{"registry.k8s.io/extra/tool:1.0"}
	spec.Registries = bundlespec.Registries{Hosts: map[string]bundlespec.Registry{
		"registry.k8s.io": {Mirrors: []string{"https://" + up.Host}, MirrorsOnly: true, CAFile: up.CAFile,
			Auth: bundlespec.RegistryAuth{DockerConfigFile: up.DockerConfig(t, up.Password)}}}}
	// --images-only: the apt source is never contacted, only validated.
	keyring := filepath.Join(dir, "keyring.gpg")
	signer, err := debrepo.GenerateRepoKey(time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := signer.WritePublicKeyring(keyring); err != nil {
		t.Fatal(err)
	}
	spec.Apt = bundlespec.Apt{Sources: []bundlespec.AptSource{{URI: "https://deb.example.invalid/debian", Suite: "trixie", Components: []string{"main"}, SignedBy: keyring}}}
	specFile, _ := writeSpec(t, up, dir, spec)
	base, update, merged := filepath.Join(dir, "base"), filepath.Join(dir, "update"), filepath.Join(dir, "merged")

	stdout, stderr, err := runCLI("bundle", "create", "--spec", specFile, "--out", base, "--images-only", "-o", "json")
	if err != nil {
		t.Fatalf("bundle create: %v\n%s", err, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var final struct{ PublicKey string }
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &final); err != nil || final.PublicKey == "" {
		t.Fatalf("last JSON line %q: %v", lines[len(lines)-1], err)
	}
	img, _ := random.Image(512, 1)
	up.Push(t, "extra/tool:1.0", img)
	if _, stderr, err := runCLI("bundle", "create", "--spec", specFile, "--out", update, "--images-only", "--since", base); err != nil ||
		!strings.Contains(stderr, "differential on top of k8s-") {
		t.Fatalf("bundle create --since: %v\n%s", err, stderr)
	}
	if stdout, _, err := runCLI("bundle", "inspect", update); err != nil || !strings.Contains(stdout, "base") || !strings.Contains(stdout, "sha256:") {
		t.Errorf("bundle inspect of the update: %v\n%s", err, stdout)
	}
	if _, _, err := runCLI("bundle", "verify", update, "--public-key", final.PublicKey); err == nil || !strings.Contains(err.Error(), "appliance bundle import") {
		t.Errorf("bundle verify of the update alone: %v, want a pointer to bundle import", err)
	}
	other := "ed25519:F5qGAfHQhD42ze3bnW9x++RWXOTgEedjaTZhyNyqR0U="
	if _, _, err := runCLI("bundle", "import", update, "--base", base, "--out", merged, "--public-key", other); err == nil || !strings.Contains(err.Error(), "not trusted") {
		t.Errorf("bundle import under an untrusted key: %v, want a refusal", err)
	}
	if _, err := os.Stat(merged); !os.IsNotExist(err) {
		t.Errorf("a refused import created %s: %v", merged, err)
	}
	stdout, stderr, err = runCLI("bundle", "import", update, "--base", base, "--out", merged, "--public-key", final.PublicKey)
	if err != nil || !strings.Contains(stdout, "from the base") {
		t.Fatalf("bundle import: %v\n%s%s", err, stdout, stderr)
	}
	if _, stderr, err := runCLI("bundle", "verify", merged, "--public-key", final.PublicKey); err != nil {
		t.Fatalf("bundle verify of the imported bundle: %v\n%s", err, stderr)
	}
}
