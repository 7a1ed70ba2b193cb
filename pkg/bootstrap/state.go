package bootstrap

import (
	"crypto/tls"
	"path/filepath"

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
	// Served is the /healthz answer of the running server (serve phase).
	ServePID int

	unlock func()
}

// Layout of the state directory.
const (
	pkiDirName      = "pki"
	registryDirName = "registry"
	renderedDirName = "rendered"
	serveDirName    = "serve"
	verifyStampName = "bundle-verify.json"
)

func (st *State) path(elem ...string) string {
	return filepath.Join(append([]string{st.StateDir}, elem...)...)
}

// ClusterPKIDir is STATE/pki/kubernetes: the Kubernetes cluster CA and the kubeadm join secrets.
func ClusterPKIDir(stateDir string) string { return filepath.Join(stateDir, pkiDirName, "kubernetes") }

// AdminKubeconfigPath is STATE/kubernetes/admin.conf: a cluster-admin kubeconfig (0600) for the
// operator, server https://VIP:port.
func AdminKubeconfigPath(stateDir string) string {
	return filepath.Join(stateDir, "kubernetes", "admin.conf")
}

// PKIDir is STATE/pki: CA, serving certificate and node tokens.
func PKIDir(stateDir string) string { return filepath.Join(stateDir, pkiDirName) }

// RegistryDir is STATE/registry: the distribution filesystem-driver root.
func RegistryDir(stateDir string) string { return filepath.Join(stateDir, registryDirName) }

// RenderedDir is STATE/rendered: per-node artefacts (<node>/ignition/<version>.json, hostagent.yaml).
func RenderedDir(stateDir string) string { return filepath.Join(stateDir, renderedDirName) }
