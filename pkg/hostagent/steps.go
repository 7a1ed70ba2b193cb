package hostagent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/containerd"
)

// stepFirewall installs the node's firewall through the backend firewall.Choose picks: firewalld (zone and
// policy appliance, over D-Bus) when firewalld runs on the node, else our nftables table inet appliance. The
// detail names the backend (firewall.Describe), which `appliance status` shows.
func (a *Agent) stepFirewall(ctx context.Context) (string, error) {
	if a.opts.NoFirewall {
		return "skipped: --no-firewall", nil
	}
	a.mu.Lock()
	nc := a.nc
	a.mu.Unlock()
	spec := firewall.Spec{
		Roles:        firewall.NodeRoles(nc.Roles),
		NodeNetworks: nc.NodeNetworks,
		APIPort:      nc.APIServerPort,
		DNS:          nc.DNS != nil && nc.DNS.Server != nil, // the control planes' CoreDNS (dns step)
		Ingress:      nc.Ingress != nil,                     // HAProxy on the ingress VIP, the ingress routers
		// The pod network's VXLAN between the nodes (the flannel overlay, calico-node).
		VXLAN: nc.Kubernetes != nil && (nc.Kubernetes.CNI == CNIFlannel || nc.Kubernetes.CNI == CNICalico),
	}
	if nc.Keepalived != nil {
		spec.VRRPPeers = nc.Keepalived.Peers
	}
	fw, _, err := firewall.Choose(ctx, firewall.ChooseOptions{NetNSPath: a.nsPath(), Log: a.log})
	if err != nil {
		return "", err
	}
	changed, err := fw.Apply(ctx, spec)
	if err != nil {
		return "", fmt.Errorf("%s: %w", fw.Name(), err)
	}
	detail := firewall.Describe(fw, spec)
	if !changed {
		return "unchanged: " + detail, nil
	}
	return "replaced " + detail, nil
}

// stepContainerd writes the appliance CA and one hosts.toml per mirror under
// ROOT/etc/containerd/certs.d, and sets the CRI registry config_path in ROOT/etc/containerd/config.toml
// when that file exists (it never creates a containerd install). containerd reads hosts.toml on every
// pull; a changed config_path takes effect when containerd restarts (the detail says so).
//
// On a Kubernetes node (nc.Kubernetes set) it writes the whole config.toml instead (CRIConfig: CRI
// for kubelet) and restarts containerd until it runs with it.
func (a *Agent) stepContainerd(ctx context.Context) (string, error) {
	a.mu.Lock()
	nc := a.nc
	a.mu.Unlock()
	changed := 0
	write := func(path string, data []byte) error {
		c, err := atomicfile.Write(a.path(path), data, 0o644)
		if err != nil {
			return fmt.Errorf("write %s: %w", a.path(path), err)
		}
		if c {
			changed++
		}
		return nil
	}
	if err := write(containerd.CAPath, []byte(nc.CAPEM)); err != nil {
		return "", err
	}
	for i, m := range nc.Mirrors {
		if m.Registry == "" || m.Registry != filepath.Base(m.Registry) || strings.HasPrefix(m.Registry, ".") || !strings.HasPrefix(m.Endpoint, "https://") {
			return "", fmt.Errorf("node config mirrors[%d]: registry %q / endpoint %q is not a registry host and https URL", i, m.Registry, m.Endpoint)
		}
		endpoints := m.Endpoints
		if len(endpoints) == 0 {
			endpoints = []string{m.Endpoint}
		}
		for _, e := range endpoints {
			if !strings.HasPrefix(e, "https://") {
				return "", fmt.Errorf("node config mirrors[%d]: endpoint %q is not an https URL", i, e)
			}
		}
		if err := write(containerd.CertsDir+"/"+m.Registry+"/hosts.toml", containerd.HostsTOMLEndpoints(m.Registry, endpoints, containerd.CAPath)); err != nil {
			return "", err
		}
	}
	detail := fmt.Sprintf("%d mirrors in %s", len(nc.Mirrors), containerd.CertsDir)
	if nc.Kubernetes != nil {
		// A Kubernetes node: the whole config.toml is ours (CRI for kubelet), applied by a restart.
		d, err := a.criConfig(ctx, nc.Kubernetes.SandboxImage)
		if err != nil {
			return "", err
		}
		if changed == 0 && strings.HasPrefix(d, "unchanged") {
			return "unchanged: " + detail + "; " + d, nil
		}
		return fmt.Sprintf("wrote %d mirror files: %s; %s", changed, detail, d), nil
	}
	cfgPath := a.path(containerd.ConfigPath)
	data, err := os.ReadFile(cfgPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		detail += "; no " + containerd.ConfigPath + " (containerd not installed?)"
	case err != nil:
		return "", fmt.Errorf("read %s: %w", cfgPath, err)
	default:
		out, c, err := containerd.SetConfigPath(data, containerd.CertsDir)
		if err != nil {
			return "", fmt.Errorf("%s: %w", cfgPath, err)
		}
		if c {
			st, err := os.Stat(cfgPath)
			if err != nil {
				return "", err
			}
			if _, err := atomicfile.Write(cfgPath, out, st.Mode().Perm()); err != nil {
				return "", fmt.Errorf("write %s: %w", cfgPath, err)
			}
			changed++
			detail += "; set config_path in " + containerd.ConfigPath + " (restart containerd to apply)"
		}
	}
	if changed == 0 {
		return "unchanged: " + detail, nil
	}
	return fmt.Sprintf("wrote %d files: %s", changed, detail), nil
}
