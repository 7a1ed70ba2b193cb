package agentapi

import (
	"net/netip"
	"time"
)

// The agent API: HTTPS on the appliance's front, authenticated with the node's bearer token
// ("Authorization: Bearer <token>"); a node can read and write only its own records.
const (
	// ConfigPathV1: GET → NodeConfig (JSON).
	ConfigPathV1 = "/agent/v1/config"
	// ReportPathV1: POST a Report (JSON) → 204. Reports are idempotent: the same (BootID, Step,
	// Status) twice records once.
	ReportPathV1 = "/agent/v1/report"
)

// NodeConfig is everything a node's hostagent needs to configure the node, derived by the
// appliance from bootstrap.yaml and its state. It holds secrets (VRRP auth): keep it 0600.
type NodeConfig struct {
	Node        string   `json:"node"`
	Roles       []string `json:"roles"`
	ClusterName string   `json:"clusterName"`
	// ControlPlaneCIDRs and WorkloadPlaneCIDRs are tried in order to find the node's own addresses.
	ControlPlaneCIDRs  []netip.Prefix `json:"controlPlaneCIDRs"`
	WorkloadPlaneCIDRs []netip.Prefix `json:"workloadPlaneCIDRs"`
	// NodeNetworks are the sources the node's firewall accepts cluster traffic from.
	NodeNetworks []netip.Prefix `json:"nodeNetworks"`
	// ApplianceAddress is the bootstrap host's control-plane address (a VRRP peer while it holds the VIP).
	ApplianceAddress netip.Addr `json:"applianceAddress"`
	APIServerVIP     netip.Addr `json:"apiServerVIP,omitempty"`
	APIServerPort    uint16     `json:"apiServerPort"`
	// Keepalived is set on control-plane nodes when keepalived is enabled.
	Keepalived *KeepalivedConfig `json:"keepalived,omitempty"`
	// Mirrors are the containerd registry mirrors (hosts.toml) pointing at the appliance.
	Mirrors []Mirror `json:"mirrors"`
	// CAPEM is the appliance CA certificate (PEM).
	CAPEM string `json:"caPEM"`
}

// KeepalivedConfig is the node's VRRP instance for the API VIP (RFC 5798, keepalived unicast).
type KeepalivedConfig struct {
	VirtualRouterID uint8 `json:"virtualRouterID"`
	// AuthPass is the VRRP PASS secret, 1..8 bytes. Secret.
	AuthPass string `json:"authPass"`
	// Priority of this node (1..254); the appliance's own instance outranks control planes until
	// they answer on the API port.
	Priority uint8 `json:"priority"`
	// Peers are the other VRRP speakers' control-plane addresses (unicast_peer): the other control
	// planes and the bootstrap host.
	Peers []netip.Addr `json:"peers"`
}

// Mirror is one containerd registry mirror.
type Mirror struct {
	Registry string `json:"registry"`
	Endpoint string `json:"endpoint"`
}

// Report is one progress record from a node's hostagent.
type Report struct {
	// BootID identifies the node boot (/proc/sys/kernel/random/boot_id): a reboot starts anew.
	BootID string `json:"bootID"`
	// Step is the hostagent step, e.g. "config", "firewall", "containerd", "keepalived", "api".
	Step   string    `json:"step"`
	Status string    `json:"status"` // running, done, failed
	Detail string    `json:"detail,omitempty"`
	Time   time.Time `json:"time"`
}

// Node lifecycle states as the appliance tracks them (`appliance status`).
const (
	StatePending        = "pending"
	StatePowering       = "powering"
	StateBooting        = "booting"
	StateAgentConnected = "agent-connected"
	StateConfigured     = "configured"
	StateReady          = "ready"
	StateFailed         = "failed"
)

// NodeStatus is the appliance's record of one node, STATE/nodes/<node>/status.json.
type NodeStatus struct {
	Node    string    `json:"node"`
	State   string    `json:"state"`
	Reason  string    `json:"reason,omitempty"`
	Updated time.Time `json:"updated"`
	BootID  string    `json:"bootID,omitempty"`
	// Steps is the last report per hostagent step.
	Steps map[string]Report `json:"steps,omitempty"`
}
