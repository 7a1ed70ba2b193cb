package bundlespec

import (
	"fmt"
	"os"
	"path/filepath"
)

// Defaults applied by SetDefaults, as functions returning fresh copies so that no caller can change
// them.

// DefaultPlatforms is platforms when unset: the appliance's nodes are x86-64 Linux machines.
func DefaultPlatforms() []string { return []string{"linux/amd64"} }

// DefaultPackages is packages when unset: what hostagent installs on every node today
// (pkg/plan.KubernetesPackages: the container runtime, the CNI plugins of the bridge network and the
// Kubernetes node binaries) plus keepalived, which carries the API VIP on control planes, and haproxy,
// their API load balancer (pkg/plan.APILoadBalancerPackages).
func DefaultPackages() []string {
	return []string{"containerd", "runc", "containernetworking-plugins", "kubelet", "kubeadm", "kubectl", "keepalived", "haproxy"}
}

// DefaultInstallImages is images.install when unset: none, since everything the install runs beyond
// kubeadm's images comes as a Debian package.
func DefaultInstallImages() []string { return nil }

// Default locations of the signing keys (see Signing): created there on first use when
// signing.repoKeyFile or signing.bundleKeyFile is empty.
const (
	// DefaultRepoKeyFileName is the repository signing key's file name in DefaultSigningDir.
	DefaultRepoKeyFileName = "repo-signing.asc"
	// DefaultBundleKeyFileName is the bundle manifest signing key's file name in DefaultSigningDir.
	DefaultBundleKeyFileName = "bundle-signing.pem"
)

// DefaultSigningDir is where bundle create keeps the signing keys it creates: "appliance/signing"
// under the user's configuration directory (os.UserConfigDir: $XDG_CONFIG_HOME, else ~/.config; so
// /root/.config/appliance/signing for root). The keys stay on the build host across bundles; back
// the directory up, as appliances that trust its keys refuse bundles signed by new ones.
func DefaultSigningDir() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("default signing key directory: %w", err)
	}
	return filepath.Join(dir, "appliance", "signing"), nil
}

// SetDefaults fills every unset field of s that has a default, in place: apiVersion and kind,
// platforms DefaultPlatforms, packages DefaultPackages, images.install DefaultInstallImages. A list
// is unset when absent or empty. Everything else is left alone: kubernetes.version and apt.sources are
// required, and empty signing keys and output.partSize mean "the default location" and "one part"
// (see their fields), decided by bundle create. It is idempotent; a nil s is a no-op.
func SetDefaults(s *BundleSpecification) {
	if s == nil {
		return
	}
	if s.APIVersion == "" {
		s.APIVersion = APIVersion
	}
	if s.Kind == "" {
		s.Kind = Kind
	}
	if len(s.Platforms) == 0 {
		s.Platforms = DefaultPlatforms()
	}
	if len(s.Packages) == 0 {
		s.Packages = DefaultPackages()
	}
	if len(s.Images.Install) == 0 {
		if def := DefaultInstallImages(); len(def) > 0 {
			s.Images.Install = def
		}
	}
}
