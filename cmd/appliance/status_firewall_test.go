package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestStatusFirewallBackend: `appliance status` shows each node's firewall backend, taken from its firewall
// step's report (firewall.Describe), in a FIREWALL column and the JSON "firewall" field; "-" without one.
func TestStatusFirewallBackend(t *testing.T) {
	cfg := config.Example()
	cfg.StateDir = t.TempDir()
	b, err := config.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "bootstrap.yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Nodes) < 3 {
		t.Fatalf("the example has %d nodes, want at least 3", len(cfg.Nodes))
	}
	store := nodestate.Open(statedir.Nodes(cfg.StateDir))
	details := map[string]string{
		cfg.Nodes[0].Name: "replaced firewalld (zone appliance, policy appliance-host): roles [control-plane etcd], 1 node networks, 3 VRRP peers",
		cfg.Nodes[1].Name: "unchanged: nftables (table inet appliance): roles [control-plane etcd], 1 node networks, 3 VRRP peers",
	}
	for node, d := range details {
		if _, _, err := store.Record(node, nil, agentapi.Report{BootID: "b", Step: agentapi.StepFirewall, Status: "done", Detail: d}); err != nil {
			t.Fatal(err)
		}
	}
	run := func(output string) string {
		cmd := newStatusCommand(&globalFlags{output: output})
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs([]string{"--config", path})
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	lines := strings.Split(strings.TrimSpace(run("text")), "\n")
	if !strings.Contains(lines[0], "FIREWALL") {
		t.Fatalf("header %q lacks FIREWALL", lines[0])
	}
	for i, want := range []string{"firewalld", "nftables", "-"} {
		if f := strings.Fields(lines[i+1]); len(f) < 4 || f[3] != want {
			t.Errorf("row %d: %q, want FIREWALL %q", i+1, lines[i+1], want)
		}
	}
	var rows []statusRow
	if err := json.Unmarshal([]byte(run("json")), &rows); err != nil {
		t.Fatal(err)
	}
	if rows[0].Firewall != "firewalld" || rows[1].Firewall != "nftables" || rows[2].Firewall != "" {
		t.Errorf("json firewall fields: %q %q %q", rows[0].Firewall, rows[1].Firewall, rows[2].Firewall)
	}
}
