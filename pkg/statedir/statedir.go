// Package statedir is the layout of the appliance's state directory (bootstrap.yaml stateDir, or
// --state-dir): one function per file or folder, so the phases that write them, `appliance serve`
// that reads them and the commands that show them agree on every path. Nothing here touches the disk.
//
//	STATE/
//	  bootstrap.lock         flock held by a bootstrap run (Lock)
//	  journal.jsonl          0600, one phase outcome per line (Journal)
//	  bundle-verify.json     the bundle verification stamp (BundleVerifyStamp)
//	  pki/                   CA, serving certificate, tokens/<node>, vrrp-auth (PKI)
//	    kubernetes/          the cluster CA and kubeadm join secrets (ClusterPKI)
//	  kubernetes/admin.conf  0600 cluster-admin kubeconfig (AdminKubeconfig)
//	  kubernetes/pod-ranges.json  each node's pod range, allocated once (PodRanges)
//	  registry/              distribution's filesystem-driver root (Registry)
//	  rendered/<node>/       what the render phase writes per node (Rendered, RenderedNode)
//	  nodes/<node>/          pkg/nodestate's records (Nodes)
//	  enrolment/<node>.json  0600, a BMC-booted node's enrolment binding; approved/<node>.json the
//	                         operator's approval of its key (Enrolment)
//	  serve/                 pid and serve.log of a detached `appliance serve` (Serve)
//	  appliance/             the bootstrap host's own rendered firewall.json and keepalived.json (Appliance)
//	  agent-upgrade.json     the node being upgraded by pull (AgentUpgrade)
//	  keepalived/            keepalived's runtime files (config, pid files, running.json, keepalived.log) and the VIP hand-off marker (Keepalived)
package statedir

import "path/filepath"

// Lock is STATE/bootstrap.lock: the flock a bootstrap run holds for its whole run.
func Lock(state string) string { return filepath.Join(state, "bootstrap.lock") }

// Journal is STATE/journal.jsonl: the append-only record of phase outcomes.
func Journal(state string) string { return filepath.Join(state, "journal.jsonl") }

// BundleVerifyStamp is STATE/bundle-verify.json: what the bundle phase last verified (pkg/bundle).
func BundleVerifyStamp(state string) string { return filepath.Join(state, "bundle-verify.json") }

// PKI is STATE/pki: CA (ca.crt, ca.key 0600), serving certificate, tokens/<node> (0600), vrrp-auth (0600).
func PKI(state string) string { return filepath.Join(state, "pki") }

// ClusterPKI is STATE/pki/kubernetes: the Kubernetes cluster CA and the kubeadm join secrets.
func ClusterPKI(state string) string { return filepath.Join(PKI(state), "kubernetes") }

// AdminKubeconfig is STATE/kubernetes/admin.conf: a cluster-admin kubeconfig (0600) for the operator,
// server https://VIP:port.
func AdminKubeconfig(state string) string { return filepath.Join(state, "kubernetes", "admin.conf") }

// PodRanges is STATE/kubernetes/pod-ranges.json: networks.pods and each node's pod range (node name →
// /24 or /64), allocated by the render phase the first time it sees the node and kept while the node
// is in nodes[] (pkg/plan AllocatePodRanges, WritePodRanges; 0600, one atomic write).
func PodRanges(state string) string { return filepath.Join(state, "kubernetes", "pod-ranges.json") }

// Registry is STATE/registry: the distribution filesystem-driver root.
func Registry(state string) string { return filepath.Join(state, "registry") }

// Rendered is STATE/rendered: per-node artefacts of the render phase.
func Rendered(state string) string { return filepath.Join(state, "rendered") }

// RenderedNode is STATE/rendered/<node>: that node's hostagent.yaml, nodeconfig.json,
// kernel-cmdline and ignition/<spec version>.json.
func RenderedNode(state, node string) string { return filepath.Join(Rendered(state), node) }

// Nodes is STATE/nodes: the per-node records of pkg/nodestate (status.json, events.jsonl).
func Nodes(state string) string { return filepath.Join(state, "nodes") }

// Enrolment is STATE/enrolment: the enrolment bindings of BMC-booted nodes, <node>.json, and the
// operator's approvals of their keys, approved/<node>.json (pkg/server.Enrollment, 0600 each).
func Enrolment(state string) string { return filepath.Join(state, "enrolment") }

// Serve is STATE/serve: pid and serve.log of a detached `appliance serve`.
func Serve(state string) string { return filepath.Join(state, "serve") }

// Appliance is STATE/appliance: what the render phase derives for the bootstrap host itself
// (pkg/plan: firewall.json, keepalived.json; 0600, the latter holds the VRRP secret).
func Appliance(state string) string { return filepath.Join(state, "appliance") }

// Keepalived is STATE/keepalived: the bootstrap host's keepalived runtime (config, pid files, the
// running.json record by which the next `appliance serve` adopts it, keepalived.log) and the VIP
// hand-off marker.
func Keepalived(state string) string { return filepath.Join(state, "keepalived") }

// ApplianceImage is STATE/appliance-image: the OCI layout of the appliance's own executable as an image
// (registry.WriteExecutableImage), imported into Registry beside the bundle's images; the hand-off's
// in-cluster mirror runs it as a static pod.
func ApplianceImage(state string) string { return filepath.Join(state, "appliance-image") }

// Handoff is STATE/handoff: the hand-off's record (state.json) and the serving certificates the
// appliance issued for the control planes' in-cluster mirrors.
func Handoff(state string) string { return filepath.Join(state, "handoff") }

// AgentUpgrade is STATE/agent-upgrade.json: the node the upgrade phase is upgrading in place by
// pull (node, version, sha256), which `appliance serve` adds to that node's config as
// agentapi.NodeConfig.AgentUpgrade; removed once the node runs the build.
func AgentUpgrade(state string) string { return filepath.Join(state, "agent-upgrade.json") }

// File and folder names inside RenderedNode (written by the render phase from pkg/plan, read by the
// HTTPS front and the power phase) and inside Appliance.
const (
	AgentConfigFile   = "hostagent.yaml"  // agentapi.Configuration; holds the node token
	NodeConfigFile    = "nodeconfig.json" // agentapi.NodeConfig the agent API serves
	KernelCmdlineFile = "kernel-cmdline"  // BMC-booted nodes only; public data (URL, CA pin), no token
	IgnitionDir       = "ignition"        // <spec version>.json, one per supported Ignition version
	FirewallFile      = "firewall.json"   // Appliance: the bootstrap host's firewall.Spec
	KeepalivedFile    = "keepalived.json" // Appliance: the bootstrap host's keepalived.Config (VRRP secret)
)
