package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/bundle"
)

// TestBundleSplitJoin drives `appliance bundle split`, `join` and `verify` over a signed bundle of a
// few MiB with the smallest part size: the parts join back into a bundle that verifies under the
// maker's key, and a damaged part is named.
func TestBundleSplitJoin(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bundle")
	data := make([]byte, 5<<19) // 2.5 MiB: three parts of 1 MiB
	rand.Read(data)
	if err := os.MkdirAll(filepath.Join(dir, "extra"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "extra", "data"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	meta := bundle.Metadata{APIVersion: bundle.APIVersion, Kind: bundle.Kind, Name: "cli-parts", KubernetesVersion: "v1.37.2",
		Created: time.Date(2025, 1, 31, 12, 0, 0, 0, time.UTC)}
	if err := bundle.Create(context.Background(), dir, meta); err != nil {
		t.Fatal(err)
	}
	priv, _, err := bundle.EnsureSigningKey(filepath.Join(t.TempDir(), "bundle.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := bundle.Sign(dir, priv); err != nil {
		t.Fatal(err)
	}

	if _, _, err := runCLI("bundle", "split", dir, "--part-size", "1000"); err == nil || !strings.Contains(err.Error(), "at least 1MiB") {
		t.Errorf("split with 1000-byte parts: %v, want a refusal", err)
	}
	stdout, stderr, err := runCLI("bundle", "split", dir, "--part-size", "1MiB")
	if err != nil {
		t.Fatalf("bundle split: %v\n%s", err, stderr)
	}
	parts := dir + ".parts"
	if !strings.Contains(stdout, "in 3 parts") || !strings.Contains(stdout, "cli-parts.part003") {
		t.Errorf("bundle split printed:\n%s", stdout)
	}
	out := filepath.Join(t.TempDir(), "joined")
	stdout, stderr, err = runCLI("bundle", "join", parts, "--out", out)
	if err != nil || !strings.Contains(stdout, "joined from 3 parts and verified") {
		t.Fatalf("bundle join: %v\n%s%s", err, stdout, stderr)
	}
	pub := bundle.PublicKeyString(priv.Public().(ed25519.PublicKey))
	if _, stderr, err := runCLI("bundle", "verify", out, "--public-key", pub); err != nil {
		t.Errorf("bundle verify of the joined bundle: %v\n%s", err, stderr)
	}

	p2 := filepath.Join(parts, "cli-parts.part002")
	part, _ := os.ReadFile(p2)
	part[7] ^= 1
	if err := os.WriteFile(p2, part, 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = runCLI("bundle", "join", parts, "--out", filepath.Join(t.TempDir(), "again"))
	if err == nil || !strings.Contains(err.Error(), p2) || !strings.Contains(err.Error(), "copy it again from the medium") {
		t.Errorf("bundle join with a damaged part: %v, want an error naming %s", err, p2)
	}
}
