package csrapprove

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
)

// TestFromConfig: a node is provisioned once a hostagent reported from its current boot (a real
// nodestate store in a temp dir), not while it is only being powered, and again not after the power
// phase powers it anew.
func TestFromConfig(t *testing.T) {
	dir := t.TempDir()
	store := nodestate.Open(dir)
	nodes := []config.Node{
		{Name: "cp1", Addresses: []netip.Addr{netip.MustParseAddr("10.100.0.11"), netip.MustParseAddr("10.200.0.11")}},
		{Name: "w1", Addresses: []netip.Addr{netip.MustParseAddr("10.100.0.21")}},
		{Name: "w2"},
	}
	if _, _, err := store.Record("cp1", nil, agentapi.Report{BootID: "b1", Step: agentapi.StepConfig, Status: agentapi.StatusDone, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Set("w1", agentapi.StatePowering, ""); err != nil {
		t.Fatal(err)
	}
	inv, err := FromConfig(nodes, store)()
	if err != nil {
		t.Fatal(err)
	}
	if n := inv["cp1"]; !n.Provisioned || n.Name != "cp1" || len(n.Addresses) != 2 || n.Addresses[1] != netip.MustParseAddr("10.200.0.11") {
		t.Errorf("cp1 = %+v, want provisioned with both addresses", n)
	}
	if inv["w1"].Provisioned || inv["w2"].Provisioned {
		t.Errorf("w1 (powering) or w2 (no record) provisioned: %+v", inv)
	}
	if len(inv) != 3 {
		t.Errorf("inventory has %d nodes, want 3", len(inv))
	}
	if _, err := store.Set("cp1", agentapi.StatePowering, ""); err != nil {
		t.Fatal(err)
	}
	if inv, _ := FromConfig(nodes, store)(); inv["cp1"].Provisioned {
		t.Error("cp1 still provisioned after the power phase powered it anew")
	}

	// A corrupt record is an error naming the file, not a silently unprovisioned node.
	if err := os.WriteFile(filepath.Join(dir, "w1", nodestate.StatusFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := FromConfig(nodes, store)(); err == nil || !strings.Contains(err.Error(), "w1") {
		t.Errorf("corrupt record: error %v, want one naming w1's record", err)
	}
}

// TestFromFile: the hand-off's inventory file (agentapi.InventoryNode JSON) gives every listed node,
// provisioned, with its addresses; a missing or malformed file is an error naming it.
func TestFromFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "inventory.json")
	if err := os.WriteFile(path, []byte(`[{"name":"cp1","addresses":["10.100.0.11","10.200.0.11"]},{"name":"w2","addresses":["10.100.0.22"]}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	inv, err := FromFile(path)()
	if err != nil {
		t.Fatal(err)
	}
	if len(inv) != 2 || !inv["cp1"].Provisioned || len(inv["cp1"].Addresses) != 2 || inv["w2"].Addresses[0].String() != "10.100.0.22" {
		t.Errorf("inventory %+v", inv)
	}
	if _, err := FromFile(filepath.Join(dir, "missing.json"))(); err == nil {
		t.Errorf("a missing inventory file was accepted")
	}
	if err := os.WriteFile(path, []byte(`{"cp1":`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := FromFile(path)(); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("malformed inventory: %v, want an error naming %s", err, path)
	}
}
