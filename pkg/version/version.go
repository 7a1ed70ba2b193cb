// Package version carries the build's version, set at link time:
//
//	go build -ldflags "-X github.com/airgap-appliance/appliance/pkg/version.Version=v0.1.0"
package version

import "runtime/debug"

// Version is the release version; "dev" in builds without -ldflags.
var Version = "dev"

// String returns Version plus the VCS revision when the binary carries one.
func String() string {
	v := Version
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += "+" + s.Value[:12]
			}
		}
	}
	return v
}
