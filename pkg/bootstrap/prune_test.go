package bootstrap

import (
	"slices"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestForgottenNodes: over a real node store, the members the configuration dropped are the nodes
// whose last membership entry is "added", or with reports but no history (recorded before histories
// were kept); a node recorded "removed" or still listed is not one.
func TestForgottenNodes(t *testing.T) {
	dir := t.TempDir()
	store := nodestate.Open(statedir.Nodes(dir))
	if got, err := ForgottenNodes(dir, nil); err != nil || got != nil {
		t.Fatalf("no store yet: %v %v", got, err)
	}
	for _, n := range []string{"cp1", "w1", "w2", "w3"} {
		if err := store.RecordLifecycle(n, nodestate.Added, "test"); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.RecordLifecycle("w2", nodestate.Removed, "appliance node remove"); err != nil {
		t.Fatal(err)
	}
	if err := store.RecordLifecycle("w3", nodestate.Ready, "first ready"); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Set("old", agentapi.StateReady, ""); err != nil { // a status, no history
		t.Fatal(err)
	}
	got, err := ForgottenNodes(dir, []string{"cp1"})
	if want := []string{"old", "w1", "w3"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("ForgottenNodes = %v %v, want %v", got, err, want)
	}
}
