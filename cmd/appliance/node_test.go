package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestNodeRemoveRefusals: `appliance node remove` refuses, non-zero and with what to fix, before it
// contacts anything: without --yes, a configuration error (named by field path), a state directory
// that is not there, a node nobody knows, the last control plane, unreadable power secrets, a
// state directory without the cluster's admin kubeconfig. Nothing is written to the node records.
func TestNodeRemoveRefusals(t *testing.T) {
	cfg := config.Example()
	cfg.StateDir = t.TempDir()
	path := writeConfig(t, cfg)

	bad := config.Example()
	bad.StateDir = cfg.StateDir
	bad.Nodes[1].Name = "Not_A_Name"
	badPath := writeConfig(t, bad)

	one := config.Example()
	one.StateDir = cfg.StateDir
	var kept []config.Node
	for _, n := range one.Nodes {
		if n.Name == "cp1" || !n.HasRole(config.RoleControlPlane) {
			kept = append(kept, n)
		}
	}
	one.Nodes = kept
	onePath := writeConfig(t, one)

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no --yes", []string{"node", "remove", "w1", "-c", path}, "removing w1 drains it, runs kubeadm reset on it and deletes it from the cluster: pass --yes to do it, or --dry-run to see what it would do"},
		{"no node", []string{"node", "remove", "-c", path, "--yes"}, "accepts 1 arg(s), received 0"},
		{"no config", []string{"node", "remove", "w1", "--yes"}, `required flag(s) "config" not set`},
		{"config error names the field", []string{"node", "remove", "w1", "-c", badPath, "--yes"}, "nodes[1].name"},
		{"bad drain timeout", []string{"node", "remove", "w1", "-c", path, "--yes", "--drain-timeout", "0s"}, "--drain-timeout 0s: give a positive duration"},
		{"no state directory", []string{"node", "remove", "w1", "-c", path, "--yes", "-s", filepath.Join(cfg.StateDir, "absent")}, "is not there: run appliance bootstrap first, or name the right one (stateDir, --state-dir)"},
		{"unknown node", []string{"node", "remove", "nope", "-c", path, "--yes"}, `node "nope" is not in nodes[] of ` + path + ` and the state directory ` + cfg.StateDir + ` has no record of it: name one of cp1, cp2, cp3, w1, w2 (nothing was changed)`},
		{"last control plane", []string{"node", "remove", "cp1", "-c", onePath, "--dry-run"}, "refused: cp1 is the last control plane in nodes[] of " + onePath + ": removing it would destroy the cluster; add another control plane first (nothing was changed)"},
		{"power secret unreadable", []string{"node", "remove", "cp2", "-c", path, "--yes"}, "node cp2: power.privateKeyFile"},
		{"never bootstrapped", []string{"node", "remove", "w1", "-c", path, "--dry-run"}, "no admin kubeconfig at " + statedir.AdminKubeconfig(cfg.StateDir)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "never bootstrapped" {
				// w1's BMC password file must be readable for the check to get as far as the kubeconfig.
				pw := filepath.Join(t.TempDir(), "bmc-password")
				if err := os.WriteFile(pw, []byte("secret\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				c := config.Example()
				c.StateDir = cfg.StateDir
				for i := range c.Nodes {
					if c.Nodes[i].Name == "w1" {
						c.Nodes[i].Power.PasswordFile = pw
					}
				}
				p := writeConfig(t, c)
				tc.args[4] = p
			}
			out, stderr, err := runCLI(tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q\nstderr: %s", err, tc.want, stderr)
			}
			if out != "" {
				t.Errorf("stdout %q, want nothing", out)
			}
		})
	}
	if ents, err := os.ReadDir(statedir.Nodes(cfg.StateDir)); err == nil && len(ents) > 0 {
		t.Errorf("refused removals wrote node records: %v", ents)
	}
}
