package bootstrap

import (
	"context"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/config"
)

// signedBundle builds a real signed bundle with two images in its OCI layout (go-containerregistry
// random images) and returns its directory and the configuration section pinning its key.
func signedBundle(t *testing.T) (string, config.Bundle) {
	t.Helper()
	dir := t.TempDir()
	lp, err := layout.Write(filepath.Join(dir, bundle.ImagesPath), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"docker.io/library/busybox:1.36", "registry.k8s.io/pause:3.10"} {
		img, err := random.Image(1024, 3)
		if err != nil {
			t.Fatal(err)
		}
		if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{bundle.RefNameAnnotation: ref})); err != nil {
			t.Fatal(err)
		}
	}
	meta := bundle.Metadata{APIVersion: bundle.APIVersion, Kind: bundle.Kind, Name: "t", KubernetesVersion: "v1.37.2", Created: time.Now().UTC()}
	if err := bundle.Create(context.Background(), dir, meta); err != nil {
		t.Fatal(err)
	}
	priv, err := bundle.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := bundle.Sign(dir, priv); err != nil {
		t.Fatal(err)
	}
	pub := bundle.PublicKeyString(priv.Public().(ed25519.PublicKey))
	return dir, config.Bundle{Path: dir, PublicKeys: []string{pub}}
}

var hashedRE = regexp.MustCompile(`; (\d+) hashed, (\d+) unchanged since last check`)

// runBundle runs the real bundle phase (signature, Verify with the stamp, registry.Import) on stateDir
// and returns how many files it hashed, read from its detail.
func runBundle(t *testing.T, b config.Bundle, stateDir string) (string, error) {
	t.Helper()
	st := &State{Config: &config.BootstrapConfiguration{Bundle: b}, StateDir: stateDir}
	res, err := bundlePhase{}.Run(context.Background(), st)
	if err != nil {
		return "", err
	}
	m := hashedRE.FindStringSubmatch(res.Detail)
	if m == nil {
		t.Fatalf("bundle phase detail %q does not say how many files it hashed", res.Detail)
	}
	return m[1], nil
}

// TestBundlePhaseRerunHashesNothing (issue 16, class 6): a second bundle phase right after the first
// hashes no file, also after another state directory imported the same bundle (hard-linking its
// blobs) and was removed again; a blob damaged afterwards is re-hashed and the phase fails naming it.
func TestBundlePhaseRerunHashesNothing(t *testing.T) {
	dir, b := signedBundle(t)
	state := t.TempDir()
	if _, err := runBundle(t, b, state); err != nil {
		t.Fatal(err)
	}
	if n, err := runBundle(t, b, state); err != nil || n != "0" {
		t.Errorf("second run hashed %s files (err %v), want 0", n, err)
	}
	other := filepath.Join(t.TempDir(), "other")
	if _, err := runBundle(t, b, other); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(other); err != nil {
		t.Fatal(err)
	}
	if n, err := runBundle(t, b, state); err != nil || n != "0" {
		t.Errorf("run after another state directory linked and unlinked the blobs hashed %s files (err %v), want 0", n, err)
	}
	blobs, _ := filepath.Glob(filepath.Join(dir, bundle.ImagesPath, "blobs", "sha256", "*"))
	var victim string
	for _, p := range blobs {
		if st, err := os.Stat(p); err == nil && st.Size() > 1000 {
			victim = p
		}
	}
	if victim == "" {
		t.Fatal("no layer blob in the test bundle")
	}
	f, err := os.OpenFile(victim, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("damage"), 100); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	_ = os.Chtimes(victim, time.Now().Add(time.Hour), time.Now().Add(time.Hour)) // surely a new mtime
	_, err = runBundle(t, b, state)
	if !errors.Is(err, bundle.ErrMismatch) {
		t.Errorf("run after damaging %s: %v, want ErrMismatch", filepath.Base(victim), err)
	}
}
