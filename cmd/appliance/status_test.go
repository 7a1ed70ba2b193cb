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

func TestStatusCommand(t *testing.T) {
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
	first := cfg.Nodes[0].Name
	store := nodestate.Open(statedir.Nodes(cfg.StateDir))
	if _, _, err := store.Record(first, nil, agentapi.Report{BootID: "b", Step: "firewall", Status: "failed", Detail: "nft:\nno permission"}); err != nil {
		t.Fatal(err)
	}
	run := func(output string) string {
		g := &globalFlags{output: output}
		cmd := newStatusCommand(g)
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs([]string{"--config", path})
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	table := run("text")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != len(cfg.Nodes)+1 || !strings.HasPrefix(lines[0], "NODE") {
		t.Fatalf("table:\n%s", table)
	}
	if !strings.Contains(lines[1], "failed") || !strings.Contains(lines[1], "firewall: nft: no permission") {
		t.Errorf("first row: %q", lines[1])
	}
	if !strings.Contains(lines[2], "pending") {
		t.Errorf("a node without a record should be pending: %q", lines[2])
	}
	var rows []statusRow
	if err := json.Unmarshal([]byte(run("json")), &rows); err != nil || len(rows) != len(cfg.Nodes) || rows[0].State != "failed" || rows[0].Node != first {
		t.Errorf("json: %+v, %v", rows, err)
	}
}
