package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/statedir"

	"github.com/airgap-appliance/appliance/pkg/pki"
)

// pkiPhase creates or reuses the appliance CA, the serving certificate (SANs: the resolved
// addresses, the VIP, loopback and the configured names) and one bearer token per node.
type pkiPhase struct{}

func (pkiPhase) Name() string { return "pki" }

func (pkiPhase) Run(_ context.Context, st *State) (Result, error) {
	return runPKI(st, st.Options.DryRun)
}

// Load, for a skipped pki phase: the CA, serving certificate, tokens and secrets read back (the
// checks run on a scratch copy); a state that would need any change is refused.
func (pkiPhase) Load(_ context.Context, st *State) error {
	res, err := runPKI(st, true)
	if err != nil {
		return err
	}
	if res.Changed {
		return fmt.Errorf("%s is incomplete or out of date (%s): run without --skip-phases pki", statedir.PKI(st.StateDir), res.Detail)
	}
	return nil
}

// runPKI ensures everything; with scratch, on a copy of STATE/pki that is thrown away.
func runPKI(st *State, scratch bool) (Result, error) {
	dir := statedir.PKI(st.StateDir)
	if scratch {
		// The real checks run on a scratch copy inside the state directory (secrets never leave it),
		// so they report exactly what they would change; the copy is removed afterwards.
		tmp, cleanup, err := scratchCopy(st.StateDir, dir)
		if err != nil {
			return Result{}, err
		}
		defer cleanup()
		dir = tmp
	}
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
	vrrp, vrrpChanged, err := vrrpAuth(st.Config, dir)
	if err != nil {
		return Result{}, err
	}
	st.CA, st.ServingCert, st.Tokens, st.VRRPAuth = ca, cert, tokens, vrrp
	parts := []string{caOut.Detail, certOut.Detail, tokOut.Detail, "CA pin " + agentapi.PinOf(ca.Cert)}
	if vrrpChanged {
		parts = append(parts, "created VRRP auth secret")
	}
	k8sChanged := false
	if st.Config.Kubernetes.IsEnabled() {
		kdir := filepath.Join(dir, "kubernetes") // statedir.ClusterPKI, or its scratch copy
		cca, ccaOut, err := pki.EnsureCA(kdir, "kubernetes", now)
		if err != nil {
			return Result{}, fmt.Errorf("cluster CA: %w", err)
		}
		secrets, secOut, err := pki.EnsureKubeadmSecrets(kdir, pki.BootstrapTokenTTL, now)
		if err != nil {
			return Result{}, err
		}
		adminChanged := false
		if scratch {
			adminChanged = !adminKubeconfigCurrent(st, cca, now)
		} else if adminChanged, err = ensureAdminKubeconfig(st, cca, now); err != nil {
			return Result{}, err
		}
		st.ClusterCA, st.Kubeadm = cca, secrets
		parts = append(parts, "cluster "+ccaOut.Detail, secOut.Detail)
		if adminChanged {
			parts = append(parts, "wrote "+statedir.AdminKubeconfig(st.StateDir))
		}
		k8sChanged = ccaOut.Changed || secOut.Changed || adminChanged
	}
	res := Result{
		Changed: caOut.Changed || certOut.Changed || tokOut.Changed || vrrpChanged || k8sChanged,
		Detail:  strings.Join(slices.DeleteFunc(parts, func(s string) bool { return s == "" }), ", "),
	}
	if scratch && res.Changed {
		res.Detail = "would change (checked on a scratch copy): " + res.Detail
	}
	return res, nil
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

// vrrpAuth is the VRRP PASS secret: the file apiServer.keepalived.authPasswordFile names, else
// pkiDir/vrrp-auth, created when missing (pki.EnsureVRRPAuth).
func vrrpAuth(c *config.BootstrapConfiguration, pkiDir string) (string, bool, error) {
	if f := c.APIServer.Keepalived.AuthPasswordFile; f != "" {
		b, err := config.ReadSecretFile(f)
		if err != nil {
			return "", false, fmt.Errorf("apiServer.keepalived.authPasswordFile: %w", err)
		}
		return string(b), false, nil
	}
	return pki.EnsureVRRPAuth(pkiDir, true)
}

// scratchCopy copies dir (and everything below it, modes kept) to a new 0700 directory inside
// stateDir and returns its path and a cleanup that removes it. A missing dir gives an empty copy.
func scratchCopy(stateDir, dir string) (string, func(), error) {
	if _, err := os.Stat(stateDir); errors.Is(err, fs.ErrNotExist) {
		// A fresh state: nothing to copy, and the dry run must not create the state directory.
		tmp, err := os.MkdirTemp("", "appliance-dry-run-")
		return tmp, func() { os.RemoveAll(tmp) }, err
	}
	tmp, err := os.MkdirTemp(stateDir, ".dry-run-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { os.RemoveAll(tmp) }
	err = os.CopyFS(tmp, os.DirFS(dir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		cleanup()
		return "", nil, fmt.Errorf("dry run: copy %s: %w", dir, err)
	}
	// os.CopyFS makes files 0644-or-0755-based; secrets must stay 0600 and reuse checks look at modes.
	_ = filepath.WalkDir(tmp, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == tmp {
			return err
		}
		rel, _ := filepath.Rel(tmp, path)
		if fi, err := os.Stat(filepath.Join(dir, rel)); err == nil {
			_ = os.Chmod(path, fi.Mode().Perm())
		}
		return nil
	})
	return tmp, cleanup, nil
}
