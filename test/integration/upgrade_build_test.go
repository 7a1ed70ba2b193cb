package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// upgradeVersion is the version the second build of appliance + hostagent carries (-ldflags -X of
// pkg/version), so that its hostagent's SHA-256 differs from the first build's.
const upgradeVersion = "v0.0.0-e2e-upgrade"

// buildUpgrade builds appliance and hostagent with Version upgradeVersion into a new directory.
func buildUpgrade(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, b := range []string{"appliance", "hostagent"} {
		cmd := exec.Command("go", "build", "-ldflags", "-X github.com/airgap-appliance/appliance/pkg/version.Version="+upgradeVersion,
			"-o", filepath.Join(dir, b), "./cmd/"+b)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b, err, out)
		}
	}
	return dir
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// swapBinaries puts dir's appliance and hostagent in binDir's place (the old ones kept as *.old)
// and returns the function that puts the old ones back, for the tests that run after.
func swapBinaries(t *testing.T, dir string) (restore func()) {
	t.Helper()
	for _, b := range []string{"appliance", "hostagent"} {
		if err := os.Rename(filepath.Join(binDir, b), filepath.Join(binDir, b+".old")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, b), filepath.Join(binDir, b)); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		for _, b := range []string{"appliance", "hostagent"} {
			if err := os.Rename(filepath.Join(binDir, b+".old"), filepath.Join(binDir, b)); err != nil {
				t.Errorf("put the first build's %s back: %v", b, err)
			}
		}
	}
}
