package bootstrap

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestHandoffRefusedOnUnhealthyCluster: against a real kube-apiserver where the inventory's nodes are
// not Ready (no kubelet ever registered them), the hand-off is refused naming each node and what is
// missing, and nothing is written (no record, no certificate); without being asked it does nothing;
// once recorded done, a rerun reports it and changes nothing.
func TestHandoffRefusedOnUnhealthyCluster(t *testing.T) {
	now := time.Now()
	api := startClusterAPI(t)
	ca, apiPort := api.CA, api.Port
	cfg := config.Example()
	cfg.APIServer.VIP = netip.MustParseAddr("127.0.0.1")
	cfg.APIServer.Port = uint16(apiPort)
	st := &State{Config: cfg, StateDir: t.TempDir(), CA: ca}
	if _, err := ensureAdminKubeconfig(st, ca, now); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	res, err := handoffPhase{}.Run(ctx, st)
	if err != nil || res.Changed || !strings.Contains(res.Detail, "not asked") {
		t.Fatalf("not asked: %+v %v", res, err)
	}
	st.Options.Handoff = true
	_, err = handoffPhase{}.Run(ctx, st)
	if err == nil || !strings.Contains(err.Error(), "handoff refused: the cluster is not healthy, nothing changed") {
		t.Fatalf("unhealthy cluster: %v, want a refusal", err)
	}
	for _, n := range cfg.Nodes {
		if !strings.Contains(err.Error(), n.Name+": ") {
			t.Errorf("the refusal does not name %s: %v", n.Name, err)
		}
	}
	if _, err := os.Stat(statedir.Handoff(st.StateDir)); !os.IsNotExist(err) {
		t.Errorf("the refused hand-off wrote %s (%v)", statedir.Handoff(st.StateDir), err)
	}

	done := &HandoffRecord{Stage: HandoffDone, Started: now, Done: now}
	if err := writeHandoff(st.StateDir, done); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(handoffRecordPath(st.StateDir))
	res, err = handoffPhase{}.Run(ctx, st)
	if err != nil || res.Changed || !strings.Contains(res.Detail, "handed off at") {
		t.Errorf("after the hand-off: %+v %v", res, err)
	}
	if after, _ := os.ReadFile(handoffRecordPath(st.StateDir)); string(after) != string(before) {
		t.Errorf("a rerun after the hand-off changed its record")
	}
}

// TestRepoSums: the hand-off holds the mirrors' repo files to the bundle's SHA256SUMS, keyed as the
// mirrors serve them (relative to repo/), images and other files left out; a SHA256SUMS without a
// repository is refused, naming bundle.path.
func TestRepoSums(t *testing.T) {
	dir := t.TempDir()
	a, b, c := strings.Repeat("a", 64), strings.Repeat("b", 64), strings.Repeat("c", 64)
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, bundle.SumsFile), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(a + "  images/index.json\n" + b + "  repo/debian/dists/stable/InRelease\n" + c + "  repo/debian/pool/main/k/kubelet.deb\n" + a + "  bundle.yaml\n")
	got, err := repoSums(&bundle.Bundle{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"debian/dists/stable/InRelease": b, "debian/pool/main/k/kubelet.deb": c}
	if len(got) != len(want) || got["debian/dists/stable/InRelease"] != b || got["debian/pool/main/k/kubelet.deb"] != c {
		t.Errorf("repoSums = %v, want %v", got, want)
	}
	write(a + "  images/index.json\n")
	if _, err := repoSums(&bundle.Bundle{Dir: dir}); err == nil || !strings.Contains(err.Error(), "bundle.path") || !strings.Contains(err.Error(), "no package repository") {
		t.Errorf("a bundle without a repository: %v", err)
	}
}
