package bootstrap

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/ignition"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/server"
	"github.com/airgap-appliance/appliance/registry"
)

// renderPhase writes every node's artefacts into STATE/rendered/<node>/: its hostagent
// configuration (hostagent.yaml, 0600: it holds the node token) and its Ignition config in every
// supported spec version (ignition/<version>.json, 0600), which the server hands out after
// negotiating the version with the client. Nodes no longer in the configuration lose theirs.
type renderPhase struct{}

func (renderPhase) Name() string { return "render" }

func (renderPhase) Run(ctx context.Context, st *State) (Result, error) {
	if st.Options.HostagentBinary == "" {
		return Result{}, errors.New("no hostagent binary to serve: build it (`make build`) or pass --hostagent-binary")
	}
	agentSum, err := fileSHA256(st.Options.HostagentBinary)
	if err != nil {
		return Result{}, fmt.Errorf("hostagent binary: %w", err)
	}
	registries := st.Images.Registries
	if len(registries) == 0 {
		b, err := bundle.Open(st.Config.Bundle.Path)
		if err != nil {
			return Result{}, fmt.Errorf("bundle.path: %w", err)
		}
		ir, _, err := registry.Check(b.ImagesDir(), RegistryDir(st.StateDir))
		if err != nil {
			return Result{}, err
		}
		registries = ir.Registries
	}
	var mirrors []ignition.Mirror
	for _, host := range registries {
		component, err := registry.HostComponent(host)
		if err != nil {
			return Result{}, err
		}
		mirrors = append(mirrors, ignition.Mirror{Registry: host, Endpoint: st.ApplianceURL + "/v2/" + component})
	}
	root := RenderedDir(st.StateDir)
	changed, files := false, 0
	var notes []string
	for _, n := range st.Config.Nodes {
		roles := make([]string, 0, len(n.Roles))
		for _, r := range n.Roles {
			roles = append(roles, string(r))
		}
		agentCfg, err := agentapi.Configuration{
			Node: n.Name, Roles: roles, ApplianceURL: st.ApplianceURL,
			CAPin: pki.PinHash(st.CA.Cert), Token: st.Tokens[n.Name],
		}.Marshal()
		if err != nil {
			return Result{}, err
		}
		c, err := write(filepath.Join(root, n.Name, "hostagent.yaml"), agentCfg)
		if err != nil {
			return Result{}, err
		}
		changed, files = changed || c, files+1
		var agentMirrors []agentapi.Mirror
		for _, m := range mirrors {
			agentMirrors = append(agentMirrors, agentapi.Mirror{Registry: m.Registry, Endpoint: m.Endpoint})
		}
		var cluster *ClusterSecrets
		if st.ClusterCA != nil {
			cluster = &ClusterSecrets{CA: st.ClusterCA, Kubeadm: st.Kubeadm}
		}
		ncv, err := NodeConfigFor(st.Config, n, st.ControlPlane.Prefix.Addr(), st.CA.CertPEM, st.VRRPAuth, agentMirrors, cluster)
		if err != nil {
			return Result{}, fmt.Errorf("node %s: %w", n.Name, err)
		}
		nc, err := json.MarshalIndent(ncv, "", "  ")
		if err != nil {
			return Result{}, err
		}
		if c, err = write(filepath.Join(root, n.Name, server.NodeConfigFile), append(nc, '\n')); err != nil {
			return Result{}, err
		}
		changed, files = changed || c, files+1
		if n.Power.Kind == config.PowerIPMI || n.Power.Kind == config.PowerRedfish {
			// What a BMC-booted node's kernel command line carries (PXE/virtual media hand it over;
			// the lab's BMC reads this file). It holds the node token: 0600.
			c, err = write(filepath.Join(root, n.Name, "kernel-cmdline"), []byte(KernelCmdline(st.ApplianceURL, pki.PinHash(st.CA.Cert), n.Name, st.Tokens[n.Name])+"\n"))
			if err != nil {
				return Result{}, err
			}
			changed, files = changed || c, files+1
		}
		snippets, err := readSnippets(st.Config, n)
		if err != nil {
			return Result{}, err
		}
		doc, err := ignition.Render(ignition.Params{
			Node: n.Name, ApplianceURL: st.ApplianceURL, CAPEM: st.CA.CertPEM, Mirrors: mirrors,
			HostagentURL: st.ApplianceURL + "/artifacts/hostagent", HostagentSHA256: agentSum,
			HostagentConfig: agentCfg, Snippets: snippets,
		})
		if err != nil {
			return Result{}, fmt.Errorf("node %s: %w", n.Name, err)
		}
		for _, v := range ignition.SupportedVersions {
			path := filepath.Join(root, n.Name, "ignition", v+".json")
			data, warnings, err := doc.Marshal(v)
			if errors.Is(err, ignition.ErrNotAcceptable) {
				// A snippet needs a newer spec: clients that only speak v get 406 from the server.
				if rmErr := os.Remove(path); rmErr == nil {
					changed = true
				}
				notes = append(notes, fmt.Sprintf("%s: no spec %s (%v)", n.Name, v, err))
				continue
			} else if err != nil {
				return Result{}, fmt.Errorf("node %s, Ignition spec %s: %w", n.Name, v, err)
			}
			for _, w := range warnings {
				st.Options.Logger.Warn("ignition snippet warning", "node", n.Name, "version", v, "warning", w)
			}
			c, err := write(path, data)
			if err != nil {
				return Result{}, err
			}
			changed, files = changed || c, files+1
		}
	}
	removed, err := pruneNodes(root, st.Config)
	if err != nil {
		return Result{}, err
	}
	detail := fmt.Sprintf("%d nodes, %d files (Ignition %s, hostagent and node configs)", len(st.Config.Nodes), files, strings.Join(ignition.SupportedVersions, "/"))
	if len(removed) > 0 {
		changed = true
		detail += ", removed artefacts of " + strings.Join(removed, ", ")
	}
	if len(notes) > 0 {
		detail += "; " + strings.Join(notes, "; ")
	}
	if !changed {
		detail = "unchanged: " + detail
	}
	return Result{Changed: changed, Detail: detail}, nil
}

func write(path string, data []byte) (bool, error) { return atomicfile.Write(path, data, 0o600) }

// KernelCmdline is the kernel command line of a node booted by its BMC: the appliance URL and CA
// pin (the node fetches the CA and accepts it only if its SubjectPublicKeyInfo hashes to the pin),
// and Ignition's config URL with the node token.
func KernelCmdline(applianceURL, caPin, node, token string) string {
	return "appliance.url=" + applianceURL + " appliance.ca_pin=" + caPin +
		" ignition.config.url=" + applianceURL + "/ignition/" + node + "?token=" + token
}

// readSnippets gathers the user's Ignition snippets for a node: ignition.all, then the role lists,
// then the node's own, in that order (later ones merge over earlier ones).
func readSnippets(c *config.BootstrapConfiguration, n config.Node) ([]ignition.Snippet, error) {
	files := slices.Clone(c.Ignition.All)
	if slices.Contains(n.Roles, config.RoleControlPlane) {
		files = append(files, c.Ignition.ControlPlane...)
	}
	if slices.Contains(n.Roles, config.RoleWorker) {
		files = append(files, c.Ignition.Worker...)
	}
	files = append(files, n.Ignition...)
	var out []ignition.Snippet
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("node %s: Ignition snippet: %w", n.Name, err)
		}
		out = append(out, ignition.Snippet{Name: f, Data: b})
	}
	return out, nil
}

// pruneNodes removes rendered directories of nodes that are no longer configured.
func pruneNodes(root string, c *config.BootstrapConfiguration) ([]string, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, nil
	}
	var removed []string
	for _, e := range ents {
		if !e.IsDir() || slices.ContainsFunc(c.Nodes, func(n config.Node) bool { return n.Name == e.Name() }) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			return removed, err
		}
		removed = append(removed, e.Name())
	}
	return removed, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
