// Package integration runs the real `appliance` binary inside a namespace lab (test/lab/lab.sh) and
// checks it with real clients from node namespaces: skopeo, containerd (ctr), Debian's ignition,
// apt-get, nft and plain TCP. It needs root and the bundle fixture (`make fixtures`); under CI a
// missing prerequisite fails instead of skipping.
package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/airgap-appliance/appliance/test/labns"
)

var (
	binDir     string // built appliance + hostagent
	repoRoot   string
	bundlePath string
	// bundleKey is the file holding the fixture bundle's public key (test/fixtures/build-bundle.sh).
	bundleKey string
)

func TestMain(m *testing.M) {
	_, file, _, _ := runtime.Caller(0)
	repoRoot = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	bundlePath = os.Getenv("APPLIANCE_BUNDLE")
	if bundlePath == "" {
		bundlePath = filepath.Join(labns.FixtureCache(), "bundle")
	}
	bundleKey = os.Getenv("APPLIANCE_BUNDLE_KEY")
	if bundleKey == "" {
		bundleKey = filepath.Join(labns.FixtureCache(), "bundle-signing.pub")
	}
	dir, err := os.MkdirTemp("", "appliance-it-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	binDir = dir
	for _, b := range []string{"appliance", "hostagent"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, b), "./cmd/"+b)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b, err, out)
			os.Exit(2)
		}
	}
	code := m.Run()
	os.RemoveAll(binDir)
	os.Exit(code)
}
