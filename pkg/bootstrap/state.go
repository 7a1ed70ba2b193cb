package bootstrap

import (
	"crypto/tls"

	"github.com/airgap-appliance/appliance/pkg/plan"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/netresolve"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/registry"
)

// State is what the phases learn and build during one run, passed from phase to phase.
type State struct {
	Options  Options
	Config   *config.BootstrapConfiguration
	StateDir string
	Warnings []string

	// ControlPlane and WorkloadPlane are this host's addresses on the two networks (resolve phase).
	ControlPlane, WorkloadPlane netresolve.Address
	// ApplianceURL is https://<control-plane address>:<server.port>, what nodes are given.
	ApplianceURL string

	CA          *pki.CA
	ServingCert tls.Certificate
	// Tokens maps node name → bearer token (secret: never print or log).
	Tokens map[string]string
	// VRRPAuth is the keepalived PASS secret shared by the VIP's VRRP speakers (secret).
	VRRPAuth string
	// ClusterCA is the Kubernetes cluster CA (kubeadm's /etc/kubernetes/pki/ca.{crt,key}) and
	// Kubeadm the join secrets; both nil/zero when kubernetes is disabled.
	ClusterCA *pki.CA
	Kubeadm   pki.KubeadmSecrets

	// Images is what the registry serves (bundle phase).
	Images registry.ImportResult
	// ApplianceImage is the appliance's own executable as an image in that registry (bundle phase).
	ApplianceImage registry.ExecutableImage
	// Plan is every artefact the render phase derived and wrote (pkg/plan).
	Plan *plan.Plan
	// Served is the /healthz answer of the running server (serve phase).
	ServePID int

	// vipPreflight receives the result of the VRRP pre-flight started ahead of the serve phase
	// (startVIPPreflight); nil when none was started.
	vipPreflight chan error
	// hostagentSum memoizes hostagentSHA256: the served hostagent's hash, keyed by its path, size and
	// modification time.
	hostagentSum struct{ key, sum string }

	unlock func()
}
