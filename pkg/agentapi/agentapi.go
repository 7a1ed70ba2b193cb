// Package agentapi holds what the appliance and hostagent exchange: the per-node hostagent
// configuration (delivered in Ignition or over SSH as /etc/hostagent/config.yaml, mode 0600), the
// agent API (api.go), the enrolment (enroll.go), the steps and pin format (contract.go), the
// boot contract: the node image's kernel arguments (bootargs.go: BootArgs, RootDeviceHints), and
// which secrets each node class is served when (secrets.go: WithholdSecrets, with its table).
package agentapi

import (
	"bytes"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// APIVersion and Kind of the hostagent configuration document.
const (
	APIVersion = "appliance.airgap.dev/v1alpha1"
	Kind       = "HostagentConfiguration"
	// ConfigPath is where nodes keep the document.
	ConfigPath = "/etc/hostagent/config.yaml"
)

// Configuration tells a node's hostagent who it is and how to reach the appliance.
type Configuration struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	// Node is the node's name in bootstrap.yaml.
	Node string `yaml:"node"`
	// Roles are "control-plane" and/or "worker".
	Roles []string `yaml:"roles"`
	// ApplianceURL is https://host:port of the appliance's HTTPS front.
	ApplianceURL string `yaml:"applianceURL"`
	// CAPin is "sha256:<hex>" of the appliance CA's SubjectPublicKeyInfo (kubeadm's pin format).
	CAPin string `yaml:"caPin"`
	// Token is the node's bearer token. Secret.
	Token string `yaml:"token"`
}

// Marshal renders the document deterministically.
func (c Configuration) Marshal() ([]byte, error) {
	c.APIVersion, c.Kind = APIVersion, Kind
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("marshal hostagent configuration: %w", err)
	}
	return buf.Bytes(), enc.Close()
}

// Parse strictly decodes a hostagent configuration.
func Parse(data []byte) (Configuration, error) {
	var c Configuration
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("hostagent configuration: %w", err)
	}
	if c.APIVersion != APIVersion || c.Kind != Kind {
		return c, fmt.Errorf("hostagent configuration: want apiVersion %s kind %s, got %s %s", APIVersion, Kind, c.APIVersion, c.Kind)
	}
	return c, nil
}

// The appliance's apt trust on Debian-family nodes, installed at provisioning (pkg/provision) and used
// by hostagent's packages step as the only source.
const (
	// RepoKeyringPath is the OpenPGP public keyring that signs the bundle's Debian repository (0644;
	// /etc/apt/keyrings is Debian's place for keyrings an administrator adds, apt-secure(8)).
	RepoKeyringPath = "/etc/apt/keyrings/appliance-repo.gpg"
	// AptSourcePath is the appliance's apt source: one line, deb [signed-by=RepoKeyringPath]
	// https://APPLIANCE/repo/debian stable main.
	AptSourcePath = "/etc/apt/sources.list.d/appliance.list"
)

// HostagentUnitContents is the systemd unit (hostagent.service) that runs hostagent on every node,
// installed by Ignition on booted nodes and over SSH on pre-installed ones. hostagent tells systemd
// it is ready with sd_notify (Type=notify) once the node is configured. KillMode=process: stopping
// or restarting the agent (an upgrade) leaves the API VIP's keepalived running (it is detached:
// hostagent.Options.DetachKeepalived) and the next agent adopts it, so the VIP does not move (the
// same choice as containerd.service for its shims, and appliance.service for the bootstrap host's
// keepalived).
const HostagentUnitContents = `[Unit]
Description=Air-gap appliance host agent
Documentation=https://github.com/airgap-appliance/appliance
Wants=network-online.target
After=network-online.target

[Service]
Type=notify
NotifyAccess=main
ExecStart=/usr/local/bin/hostagent run --config ` + ConfigPath + `
Restart=always
RestartSec=2s
TimeoutStartSec=15min
KillMode=process

[Install]
WantedBy=multi-user.target
`
