package bundlespec

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/airgap-appliance/appliance/pkg/plan"
)

// TestSetDefaults: a minimal document gets every default, written out here in full.
func TestSetDefaults(t *testing.T) {
	s := mustDecode(t, header+`kubernetes: {version: v1.37.2}
apt:
  sources:
  - {uri: https://deb.debian.org/debian, suite: trixie, components: [main], signedBy: /k.gpg}
`)
	want := &BundleSpecification{
		APIVersion: APIVersion,
		Kind:       Kind,
		Kubernetes: Kubernetes{Version: "v1.37.2"},
		Platforms:  []string{"linux/amd64"},
		Apt: Apt{Sources: []AptSource{{URI: "https://deb.debian.org/debian", Suite: "trixie",
			Components: []string{"main"}, SignedBy: "/k.gpg"}}},
		Packages: []string{"containerd", "runc", "containernetworking-plugins", "kubelet", "kubeadm", "kubectl", "keepalived", "haproxy"},
	}
	if diff := cmp.Diff(want, s, cmpSpec...); diff != "" {
		t.Errorf("SetDefaults (-want +got):\n%s", diff)
	}
	// The defaults are copies: changing the specification does not change them.
	s.Packages[0], s.Platforms[0] = "x", "y"
	if DefaultPackages()[0] != "containerd" || DefaultPlatforms()[0] != "linux/amd64" {
		t.Error("SetDefaults aliases the default lists")
	}
}

// TestSetDefaultsIdempotentAndKeepsSetValues: running it again changes nothing, and set values stay,
// even invalid ones (Validate reports them as written).
func TestSetDefaultsIdempotentAndKeepsSetValues(t *testing.T) {
	s := &BundleSpecification{APIVersion: "v0", Kind: "K", Platforms: []string{"Linux/AMD64"}, Packages: []string{"Vim"},
		Images: Images{Install: []string{"x"}}}
	SetDefaults(s)
	once := *s
	SetDefaults(s)
	if diff := cmp.Diff(&once, s, cmpSpec...); diff != "" {
		t.Errorf("second SetDefaults changed (-first +second):\n%s", diff)
	}
	want := &BundleSpecification{APIVersion: "v0", Kind: "K", Platforms: []string{"Linux/AMD64"}, Packages: []string{"Vim"},
		Images: Images{Install: []string{"x"}}}
	if diff := cmp.Diff(want, s, cmpSpec...); diff != "" {
		t.Errorf("SetDefaults changed set values (-want +got):\n%s", diff)
	}
	SetDefaults(nil) // must not panic
}

// TestDefaultPackagesFollowThePlan: the default packages hold everything hostagent installs on a node
// (pkg/plan.KubernetesPackages), plus keepalived; a package added there must be carried by bundles.
func TestDefaultPackagesFollowThePlan(t *testing.T) {
	def := DefaultPackages()
	for _, p := range plan.KubernetesPackages {
		if !slices.Contains(def, p) {
			t.Errorf("DefaultPackages() lacks %q, which pkg/plan installs on every node", p)
		}
	}
	if !slices.Contains(def, "keepalived") {
		t.Error("DefaultPackages() lacks keepalived")
	}
	for i, p := range def {
		if why := checkPackageName(p); why != "" {
			t.Errorf("DefaultPackages()[%d] %q %s", i, p, why)
		}
	}
	for _, p := range DefaultPlatforms() {
		if _, err := ParsePlatform(p); err != nil {
			t.Errorf("DefaultPlatforms(): %v", err)
		}
	}
	if len(DefaultInstallImages()) != 0 {
		t.Error("DefaultInstallImages() is documented as empty")
	}
}

func TestDefaultSigningDir(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", "/xdg")
	dir, err := DefaultSigningDir()
	if err != nil || dir != filepath.Join("/xdg", "appliance", "signing") {
		t.Errorf("DefaultSigningDir() = %q, %v", dir, err)
	}
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("HOME", "")
	if _, err := DefaultSigningDir(); err == nil || !strings.Contains(err.Error(), "default signing key directory") {
		t.Errorf("without HOME: err = %v", err)
	}
}
