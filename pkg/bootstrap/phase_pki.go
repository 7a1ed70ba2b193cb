package bootstrap

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/pki"
)

// pkiPhase creates or reuses the appliance CA, the serving certificate (SANs: the resolved
// addresses, the VIP, loopback and the configured names) and one bearer token per node.
type pkiPhase struct{}

func (pkiPhase) Name() string { return "pki" }

func (pkiPhase) Run(_ context.Context, st *State) (Result, error) {
	dir := PKIDir(st.StateDir)
	now := st.Options.Now()
	ca, caOut, err := pki.EnsureCA(dir, "appliance CA "+st.Config.ClusterName, now)
	if err != nil {
		return Result{}, err
	}
	ips, names := ServingSANs(st)
	cert, certOut, err := pki.EnsureServingCert(dir, ca, ips, names, now)
	if err != nil {
		return Result{}, err
	}
	var nodes []string
	for _, n := range st.Config.Nodes {
		nodes = append(nodes, n.Name)
	}
	tokens, tokOut, err := pki.EnsureNodeTokens(dir, nodes)
	if err != nil {
		return Result{}, err
	}
	vrrp, vrrpChanged, err := vrrpAuth(st.Config, st.StateDir, true)
	if err != nil {
		return Result{}, err
	}
	st.CA, st.ServingCert, st.Tokens, st.VRRPAuth = ca, cert, tokens, vrrp
	parts := []string{caOut.Detail, certOut.Detail, tokOut.Detail, "CA pin " + pki.PinHash(ca.Cert)}
	if vrrpChanged {
		parts = append(parts, "created VRRP auth secret")
	}
	k8sChanged := false
	if st.Config.Kubernetes.IsEnabled() {
		kdir := ClusterPKIDir(st.StateDir)
		cca, ccaOut, err := pki.EnsureCA(kdir, "kubernetes", now)
		if err != nil {
			return Result{}, fmt.Errorf("cluster CA: %w", err)
		}
		secrets, secOut, err := pki.EnsureKubeadmSecrets(kdir, BootstrapTokenTTL, now)
		if err != nil {
			return Result{}, err
		}
		adminChanged, err := ensureAdminKubeconfig(st, cca, now)
		if err != nil {
			return Result{}, err
		}
		st.ClusterCA, st.Kubeadm = cca, secrets
		parts = append(parts, "cluster "+ccaOut.Detail, secOut.Detail)
		if adminChanged {
			parts = append(parts, "wrote "+AdminKubeconfigPath(st.StateDir))
		}
		k8sChanged = ccaOut.Changed || secOut.Changed || adminChanged
	}
	return Result{
		Changed: caOut.Changed || certOut.Changed || tokOut.Changed || vrrpChanged || k8sChanged,
		Detail:  strings.Join(slices.DeleteFunc(parts, func(s string) bool { return s == "" }), ", "),
	}, nil
}

// ServingSANs lists the serving certificate's IP and DNS subject alternative names.
func ServingSANs(st *State) ([]netip.Addr, []string) {
	ips := []netip.Addr{st.ControlPlane.Prefix.Addr()}
	if a := st.WorkloadPlane.Prefix.Addr(); a.IsValid() && a != ips[0] {
		ips = append(ips, a)
	}
	if vip := st.Config.APIServer.VIP; vip.IsValid() {
		ips = append(ips, vip)
	}
	ips = append(ips, netip.MustParseAddr("127.0.0.1"))
	names := append([]string{"localhost"}, st.Config.Server.Names...)
	return ips, names
}
