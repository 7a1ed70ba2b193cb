package ignition

import "github.com/airgap-appliance/appliance/pkg/containerd"

// hostsTOML renders the hosts.toml for one mirror (validated by checkParams) with pkg/containerd,
// which the hostagent uses too, so first boot and later boots write the same bytes.
func hostsTOML(m Mirror) []byte {
	return containerd.HostsTOML(m.Registry, m.Endpoint, ContainerdCAPath)
}

// tomlString quotes s as a TOML basic string (containerd.TOMLString).
func tomlString(s string) string { return containerd.TOMLString(s) }
