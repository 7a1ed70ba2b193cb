package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
)

// TestPowerTableOneLinePerNode: `appliance power status` prints one table row per node however long
// or multi-line a BMC's error is (bmclib joins its providers' errors with newlines), RESULT last so
// the columns before it stay aligned; -o json keeps the whole message. The BMC is a Redfish address
// on 127.0.0.1 where nothing listens (connection refused): no fake server.
func TestPowerTableOneLinePerNode(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // now refused
	dir := t.TempDir()
	caPEM, _ := pkitest.Issue(t)
	for name, data := range map[string]string{"ca.pem": string(caPEM), "bmc.password": "secret\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "bundle"), 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := config.Example()
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Bundle.Path = filepath.Join(dir, "bundle")
	cfg.Boot = config.Boot{}
	var nodes []config.Node
	for _, n := range cfg.Nodes {
		if n.Name != "cp1" && n.Name != "w2" {
			continue
		}
		n.MAC = ""
		n.Power = config.Power{Kind: config.PowerRedfish, Address: "https://" + addr, Username: "admin",
			PasswordFile: filepath.Join(dir, "bmc.password"), CAFile: filepath.Join(dir, "ca.pem")}
		nodes = append(nodes, n)
	}
	cfg.Nodes = nodes
	config.SetDefaults(cfg)
	path := writeConfig(t, cfg)

	out, errOut, err := runCLI("power", "status", "-c", path, "--attempts", "1")
	if err == nil || !strings.Contains(err.Error(), "power status failed for 2 of 2 nodes") {
		t.Fatalf("power status: %v, want both nodes failed\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	t.Logf("table:\n%s", out)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NODE") {
		t.Fatalf("want a header and one line per node, got %d lines:\n%s", len(lines), out)
	}
	col := strings.Index(lines[0], "RESULT")
	for _, l := range lines[1:] {
		if len(l) < col || !strings.HasPrefix(l[col:], "FAILED: ") || !strings.Contains(l, "no Redfish answer from "+addr) {
			t.Errorf("row %q: RESULT column (at %d) is not the one-line failure naming the BMC", l, col)
		}
	}

	out, _, _ = runCLI("power", "status", "-c", path, "--attempts", "1", "-o", "json")
	var rows []powerRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("json: %v\n%s", err, out)
	}
	for _, r := range rows {
		if r.OK || !strings.Contains(r.Error, "connection refused") {
			t.Errorf("json row %+v: want the whole error", r)
		}
	}
}
