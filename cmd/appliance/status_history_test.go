package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestStatusHistory: `appliance status --history` and `appliance status NODE` print each node's
// day-2 history under the table, one "YYYY-MM-DD HH:MM:SS  kind (detail)" line an entry, and -o json
// carries it as the "history" array; a node removed from the configuration can still be named; the
// default table and JSON stay as they were.
func TestStatusHistory(t *testing.T) {
	cfg := config.Example()
	cfg.StateDir = t.TempDir()
	cfg.Boot = config.Boot{DHCP: config.BootDHCPOff} // no network-boot line (stderr, merged into out below)
	b, err := config.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "bootstrap.yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range cfg.Nodes {
		names = append(names, n.Name)
	}
	first, second := names[0], names[1]
	clock := time.Date(2026, 11, 24, 22, 41, 7, 0, time.UTC)
	store := nodestate.Open(statedir.Nodes(cfg.StateDir))
	store.Now = func() time.Time { return clock }
	// An earlier run knew node "old1"; this configuration no longer lists it.
	if _, _, err := store.SyncMembership(append([]string{"old1"}, names...), "bootstrap run with bootstrap.yaml"); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Minute)
	if _, _, err := store.SyncMembership(names, "bootstrap run with bootstrap.yaml"); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Minute)
	for _, step := range []string{"config", "firewall", "containerd", "ready"} {
		r := agentapi.Report{BootID: "boot-1", Step: step, Status: "done", AgentVersion: "v0.1.0", AgentSHA256: strings.Repeat("ab", 32)}
		if _, _, err := store.Record(first, nil, r); err != nil {
			t.Fatal(err)
		}
	}
	clock = clock.Add(time.Hour)
	r := agentapi.Report{BootID: "boot-1", Step: "ready", Status: "done", AgentVersion: "v0.2.0", AgentSHA256: strings.Repeat("cd", 32)}
	if _, _, err := store.Record(first, nil, r); err != nil {
		t.Fatal(err)
	}

	run := func(output string, args ...string) (string, error) {
		cmd := newStatusCommand(&globalFlags{output: output})
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"--config", path}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	at := func(d time.Duration) string {
		return time.Date(2026, 11, 24, 22, 41, 7, 0, time.UTC).Add(d).Local().Format(time.DateTime)
	}

	// Default table: unchanged, no history.
	table, err := run("text")
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(table), "\n"); len(lines) != len(cfg.Nodes)+1 || strings.Contains(table, "history") {
		t.Errorf("default table changed:\n%s", table)
	}
	if js, _ := run("json"); strings.Contains(js, `"history"`) {
		t.Errorf("default JSON carries history:\n%s", js)
	}

	out, err := run("text", "--history")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		first + " history:",
		"  " + at(0) + "  added (bootstrap run with bootstrap.yaml)",
		"  " + at(2*time.Minute) + "  ready (first ready)",
		"  " + at(2*time.Minute+time.Hour) + "  upgraded from v0.1.0 (sha256 abababababab) to v0.2.0 (sha256 cdcdcdcdcdcd) (hostagent in boot boot-1)",
		"",
		second + " history:",
		"  " + at(0) + "  added (bootstrap run with bootstrap.yaml)",
	}, "\n")
	if !strings.Contains(out, want) {
		t.Errorf("--history output lacks\n%s\ngot:\n%s", want, out)
	}
	if strings.Count(out, " history:") != len(cfg.Nodes) || strings.Contains(out, "old1") {
		t.Errorf("--history shows the configured nodes only:\n%s", out)
	}

	// One node by name: its row and its history only.
	out, err = run("text", second)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[1], second+" ") || lines[4] != "  "+at(0)+"  added (bootstrap run with bootstrap.yaml)" {
		t.Errorf("status %s:\n%s", second, out)
	}
	// A node removed from the configuration keeps its history and can be named.
	out, err = run("text", "old1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "old1  ") || !strings.Contains(out, "  "+at(time.Minute)+"  removed (removed from the configuration; bootstrap run with bootstrap.yaml)") {
		t.Errorf("status old1:\n%s", out)
	}
	if _, err := run("text", "nosuch"); err == nil || !strings.Contains(err.Error(), `node "nosuch" is not in the configuration (nodes[].name)`) ||
		!strings.Contains(err.Error(), first) {
		t.Errorf("unknown node: %v", err)
	}

	js, err := run("json", first, second)
	if err != nil {
		t.Fatal(err)
	}
	var rows []statusRow
	if err := json.Unmarshal([]byte(js), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("json: %v\n%s", err, js)
	}
	var kinds []string
	for _, e := range rows[0].History {
		kinds = append(kinds, string(e.Kind))
	}
	if strings.Join(kinds, " ") != "added ready upgraded" || rows[0].AgentVersion != "v0.2.0" || rows[0].History[2].From.Version != "v0.1.0" {
		t.Errorf("json history of %s: %+v (agent %q)", first, rows[0].History, rows[0].AgentVersion)
	}
	if len(rows[1].History) != 1 || !strings.Contains(js, `"kind": "added"`) {
		t.Errorf("json history of %s: %+v", second, rows[1].History)
	}
}
