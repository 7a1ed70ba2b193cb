package escrow

import (
	"path"
	"path/filepath"

	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// Item is one kind of file of the state directory that the escrow keeps.
type Item struct {
	// Pattern is the path relative to the state directory, slash-separated; "*" matches one path
	// element (path.Match).
	Pattern string
	// Required: Seal refuses a state directory without a match.
	Required bool
	// Why a future appliance needs it.
	Why string
}

// Excluded is a part of the state directory the escrow leaves out, and why.
type Excluded struct {
	Pattern string
	Why     string
}

// rel is a statedir path relative to the state directory, slash-separated (statedir's functions with
// an empty root give exactly that).
func rel(p string, elem ...string) string {
	return filepath.ToSlash(filepath.Join(append([]string{p}, elem...)...))
}

// Contents is everything the escrow keeps, in one place: what a new appliance needs to manage the
// running cluster as the old one did, and cannot make again without touching every node. It is the
// allow-list of Seal (nothing else is read) and of Open (an entry outside it is refused, so a blob
// can never write elsewhere in the state directory).
var Contents = []Item{
	{rel(statedir.PKI(""), pki.CACertFile), true,
		"the appliance CA: every node pins it (agentapi.PinOf on the kernel command line, in Ignition and hostagent.yaml); a new CA would strand every node"},
	{rel(statedir.PKI(""), pki.CAKeyFile), true,
		"its key: signs the serving certificate of a new appliance on any address, and the in-cluster mirrors' certificates"},
	{rel(statedir.PKI(""), pki.TokensDir, "*"), false,
		"each node's bearer token: the node holds it (hostagent.yaml) and authenticates with it; without it every node would have to be enrolled or provisioned again"},
	{rel(statedir.PKI(""), pki.VRRPAuthFile), false,
		"the VRRP PASS secret of a cluster recorded with VRRPv2: the control planes' keepalived runs with it"},
	{rel(statedir.ClusterPKI(""), pki.CACertFile), false,
		"the Kubernetes cluster CA: kubeadm join discovery pins it and every kubeconfig trusts it; its pin is the escrow's cluster identity (Manifest.ClusterCAPin)"},
	{rel(statedir.ClusterPKI(""), pki.CAKeyFile), false,
		"its key: the appliance issues admin.conf with it (the operator's way into the cluster)"},
	{rel(statedir.ClusterPKI(""), pki.KubeadmSecretsFile), false,
		"the kubeadm join secrets (bootstrap token, certificate key; each worker's token derives from the key): until they expire the cluster holds them and joining nodes carry them; the pki phase renews expired ones"},
	{filepath.ToSlash(statedir.PodRanges("")), false,
		"each node's pod range, allocated once: running nodes route them; a new allocation would move ranges under running pods"},
	{rel(statedir.Nodes(""), "*", nodestate.StatusFile), false,
		"each node's last known state: the power phase leaves configured and ready nodes alone; without it a restored appliance would provision every node again"},
	{rel(statedir.Nodes(""), "*", nodestate.KubeadmFile), false,
		"whether each node has run kubeadm: decides which secrets the appliance still hands out (agentapi.WithholdSecrets) and who renews the join secrets"},
	{rel(statedir.Nodes(""), "*", nodestate.HistoryFile), false,
		"each node's day-2 history (added, ready, upgraded, token rotated or revoked, removed): what `appliance status NODE` shows"},
	{rel(statedir.Enrolment(""), "*.json"), false,
		"the enrolment bindings of BMC-booted nodes (machine key, token hash): without them the next enrolment of such a node would be trusted on first use again"},
	{rel(statedir.Enrolment(""), "approved", "*.json"), false,
		"the operator's approvals of those machine keys"},
	{rel(statedir.Appliance(""), statedir.KeepalivedFile), false,
		"the VRRP instance the cluster runs (VRID, version, interval, secret): reruns keep it (pkg/plan ReadRecorded), since changing it on live speakers splits the VIP"},
	// pkg/bootstrap handoffRecordPath and handoffCertDir.
	{rel(statedir.Handoff(""), "state.json"), false,
		"the hand-off's progress: once done, nodes use the in-cluster mirrors and the bootstrap host may be gone"},
	{rel(statedir.Handoff(""), "certs", "*", "*"), false,
		"the in-cluster mirrors' serving certificates and keys: issuing new ones would roll every mirror"},
	// pkg/applianced handedOffName.
	{rel(statedir.Keepalived(""), "handed-off"), false,
		"the VIP hand-off marker: a restored appliance must never claim the VIP the control planes hold"},
}

// Excludes is what the escrow leaves out of the state directory on purpose (the documentation of
// Contents' other half; everything not in Contents is left out).
var Excludes = []Excluded{
	{filepath.ToSlash(statedir.Lock("")), "a lock of one run"},
	{filepath.ToSlash(statedir.Journal("")), "the record of past runs' phases, not the source of truth; a new appliance starts its own"},
	{filepath.ToSlash(statedir.BundleVerifyStamp("")), "a cache of the bundle check; the bundle phase verifies the new appliance's bundle again"},
	{rel(statedir.PKI(""), pki.ServingCertFile), "re-issued from the CA for the new appliance's own addresses (with its key)"},
	{filepath.ToSlash(statedir.AdminKubeconfig("")), "issued again from the cluster CA by the pki phase"},
	{filepath.ToSlash(statedir.Registry("")) + "/", "the bundle's images: gigabytes, imported again from the bundle"},
	{filepath.ToSlash(statedir.Rendered("")) + "/", "derived by the render phase from bootstrap.yaml and the escrowed state"},
	{rel(statedir.Nodes(""), "*", nodestate.EventsFile+"*"), "a debug log of reports, megabytes per node"},
	{filepath.ToSlash(statedir.Serve("")) + "/", "pid and log of one serve process"},
	{rel(statedir.Appliance(""), statedir.FirewallFile), "derived by the render phase"},
	{filepath.ToSlash(statedir.Keepalived("")) + "/ (but handed-off)", "the bootstrap host's keepalived runtime files"},
	{filepath.ToSlash(statedir.ApplianceImage("")) + "/", "made again from the appliance's own executable"},
	{filepath.ToSlash(statedir.AgentUpgrade("")), "the upgrade in progress of one run; the upgrade phase decides again"},
}

// escrowed reports whether the relative, slash-separated path p is in Contents.
func escrowed(p string) bool {
	for _, it := range Contents {
		if ok, _ := path.Match(it.Pattern, p); ok {
			return true
		}
	}
	return false
}
