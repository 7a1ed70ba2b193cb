package bootstrap

import (
	"context"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
)

// TestPowerRefusesBMCNodeWithoutMAC: a BMC-booted node without nodes[].mac could never enrol, so the
// power phase refuses to power it on, naming the field path and what to write, before it contacts the
// BMC (the address here answers nothing: contacting it would fail differently) and without recording
// a power-on.
func TestPowerRefusesBMCNodeWithoutMAC(t *testing.T) {
	c := &config.BootstrapConfiguration{Nodes: []config.Node{
		{Name: "cp1", Power: config.Power{Kind: config.PowerSSH}},
		{Name: "w2", Power: config.Power{Kind: config.PowerIPMI, Address: "127.0.0.1:1", Username: "admin", PasswordFile: "/nonexistent"}},
	}}
	store := nodestate.Open(t.TempDir())
	st := &State{Config: c}
	_, _, err := powerBMC(context.Background(), st, store, c.Nodes[1])
	if err == nil || !strings.HasPrefix(err.Error(), "nodes[1].mac is not set") || !strings.Contains(err.Error(), "/agent/v1/enroll") ||
		!strings.Contains(err.Error(), "nodes[1].systemUUID") {
		t.Fatalf("powerBMC without a MAC: %v", err)
	}
	if _, err := store.Get("w2"); err == nil {
		t.Error("a refused power-on left a record")
	}
	c.Nodes[1].MAC = "52:54:00:00:00:22"
	if err := canEnrol(c, c.Nodes[1]); err != nil {
		t.Errorf("with a MAC: %v", err)
	}
}
