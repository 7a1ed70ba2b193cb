package bundlespec

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Platform is one entry of platforms other than PlatformAll: an OCI image-spec platform.
type Platform struct {
	// OS is the operating system, always "linux": the appliance's nodes run Debian.
	OS string
	// Architecture is the CPU architecture as Go's GOARCH names it (amd64, arm64, arm, 386, ...).
	Architecture string
	// Variant is the CPU variant (e.g. v7 for arm, v8 for arm64), "" when unspecified.
	Variant string
}

// String renders p as "os/architecture[/variant]".
func (p Platform) String() string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// platformOS is the only operating system the nodes run.
const platformOS = "linux"

// platformArchitectures are the GOARCH names of the architectures Debian builds for.
var platformArchitectures = []string{"386", "amd64", "arm", "arm64", "loong64", "mips64le", "ppc64le", "riscv64", "s390x"}

// architectureAliases maps other names of an architecture (uname -m, Debian) to the GOARCH name OCI
// platforms use, with the variant when the alias implies one.
var architectureAliases = map[string]string{
	"x86_64": "amd64", "x86-64": "amd64", "x64": "amd64", "aarch64": "arm64", "armhf": "arm/v7", "armel": "arm/v5",
	"armv7": "arm/v7", "armv7l": "arm/v7", "armv6": "arm/v6", "i386": "386", "i686": "386", "x86": "386",
	"ppc64el": "ppc64le", "mips64el": "mips64le", "loongarch64": "loong64",
}

// variantRE is a CPU variant: lower-case alphanumerics, dot-separated ("v7", "v8.2").
var variantRE = regexp.MustCompile(`^[a-z0-9]+(?:\.[a-z0-9]+)*$`)

// ErrPlatform is wrapped by every error of ParsePlatform.
var ErrPlatform = errors.New("not a platform")

// ParsePlatform parses "os/architecture[/variant]" (see BundleSpecification.Platforms); it does not
// accept PlatformAll. Errors wrap ErrPlatform and say what to write instead.
func ParsePlatform(s string) (Platform, error) {
	bad := func(format string, args ...any) (Platform, error) {
		return Platform{}, fmt.Errorf("%w: %s", ErrPlatform, fmt.Sprintf(format, args...))
	}
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 {
		return bad("write os/architecture[/variant], e.g. linux/amd64 or linux/arm/v7")
	}
	p := Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	if lower := strings.ToLower(s); lower != s {
		return bad("platforms are lower case: write %s", lower)
	}
	if p.OS != platformOS {
		return bad("the operating system %q is not %s: the appliance's nodes run Debian GNU/Linux", p.OS, platformOS)
	}
	if !slices.Contains(platformArchitectures, p.Architecture) {
		if alias, ok := architectureAliases[p.Architecture]; ok {
			return bad("OCI platforms name the architecture as Go does: write %s/%s", platformOS, alias)
		}
		return bad("unknown architecture %q: use one of %s", p.Architecture, strings.Join(platformArchitectures, ", "))
	}
	if len(parts) == 3 && !variantRE.MatchString(p.Variant) {
		return bad("%q is not a CPU variant (e.g. v7, v8)", p.Variant)
	}
	return p, nil
}

// AllPlatforms reports whether s keeps every platform (platforms is [PlatformAll]).
func (s *BundleSpecification) AllPlatforms() bool {
	return len(s.Platforms) == 1 && s.Platforms[0] == PlatformAll
}
