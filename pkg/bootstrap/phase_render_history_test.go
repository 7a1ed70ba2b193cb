package bootstrap

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestRenderRecordsNodeHistory runs the real load and render phases through the runner (render
// stops after the history hook: this state has no CA) over one state directory: the first run
// records "added" for every node, a second run nothing, a run whose configuration dropped a node
// "removed" for it once, and a dry run nothing at all.
func TestRenderRecordsNodeHistory(t *testing.T) {
	cfg := config.Example()
	cfg.StateDir = t.TempDir()
	if len(cfg.Nodes) < 2 {
		t.Fatalf("the example has %d nodes, want at least 2", len(cfg.Nodes))
	}
	// The load phase checks the files the configuration names: a real bundle directory and SSH key.
	dir := t.TempDir()
	cfg.Bundle.Path = filepath.Join(dir, "bundle")
	if err := os.Mkdir(cfg.Bundle.Path, 0o700); err != nil {
		t.Fatal(err)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "appliance")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "id_ed25519")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	hostKey := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub)))
	for i := range cfg.Nodes {
		cfg.Nodes[i].Power = config.Power{Kind: config.PowerSSH, PrivateKeyFile: keyFile, HostKey: hostKey}
	}
	// Every node is reached over SSH now: none boots from the network, so no network boot (the
	// example's defaulted boot.dhcp: proxy would want the bundle's node image).
	cfg.Boot = config.Boot{}
	write := func(c *config.BootstrapConfiguration) string {
		t.Helper()
		b, err := config.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "bootstrap.yaml")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	var prune PruneFunc
	try := func(path string, dryRun bool) (string, error) {
		t.Helper()
		var progress strings.Builder
		// The hostagent binary is only read once the CA exists; render needs the option set.
		_, err := runPhases(context.Background(), Options{ConfigPath: path, HostagentBinary: "/nonexistent/hostagent",
			Progress: &progress, DryRun: dryRun, Prune: prune}, []Phase{loadPhase{}, renderPhase{}})
		return progress.String(), err
	}
	run := func(path string, dryRun bool) string {
		t.Helper()
		out, err := try(path, dryRun)
		if err != nil {
			t.Fatalf("run: %v\n%s", err, out)
		}
		return out
	}
	store := nodestate.Open(statedir.Nodes(cfg.StateDir))
	kinds := func(node string) string {
		t.Helper()
		h, err := store.History(node)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range h {
			out = append(out, string(e.Kind))
		}
		return strings.Join(out, " ")
	}
	path := write(cfg)
	first, last := cfg.Nodes[0].Name, cfg.Nodes[len(cfg.Nodes)-1].Name

	if out := run(path, true); strings.Contains(out, "history:") || kinds(first) != "" {
		t.Fatalf("a dry run recorded history: %s\n%s", kinds(first), out)
	}
	out := run(path, false)
	if !strings.Contains(out, "history: added "+first) {
		t.Errorf("render's detail does not name the added nodes:\n%s", out)
	}
	for _, n := range cfg.Nodes {
		h, err := store.History(n.Name)
		if err != nil || len(h) != 1 || h[0].Kind != nodestate.Added || h[0].Detail != "bootstrap run with "+path {
			t.Errorf("history of %s after the first run: %+v %v", n.Name, h, err)
		}
	}
	if out := run(path, false); strings.Contains(out, "history:") || kinds(first) != "added" {
		t.Errorf("a second run recorded history: %s\n%s", kinds(first), out)
	}

	// The last node joins (its hostagent reports it ready): from now on it is in the cluster.
	if err := store.RecordLifecycle(last, nodestate.Ready, "kubeadm join done"); err != nil {
		t.Fatal(err)
	}
	dropped := *cfg
	dropped.Nodes = cfg.Nodes[:len(cfg.Nodes)-1]
	path = write(&dropped)
	// Without --prune the run refuses to forget a member, before anything is recorded.
	for _, dry := range []bool{true, false} {
		_, err := try(path, dry)
		want := "node " + last + " is in the cluster but not in nodes[]: run `appliance node remove " + last + "` or pass --prune"
		if !errors.Is(err, ErrForgotten) || !strings.Contains(err.Error(), want) {
			t.Fatalf("dry run %v without --prune: %v, want ErrForgotten with %q", dry, err, want)
		}
		if kinds(last) != "added ready" {
			t.Fatalf("a refused run recorded history: %q", kinds(last))
		}
	}
	// A failing removal fails the run and records nothing.
	prune = func(context.Context, *State, string) error { return errors.New("drain timed out") }
	if _, err := try(path, false); err == nil || !strings.Contains(err.Error(), "--prune: remove "+last+": drain timed out") || kinds(last) != "added ready" {
		t.Fatalf("failed prune: %v, history %q", err, kinds(last))
	}
	// With --prune the removal runs for exactly the forgotten node (a dry run only says so).
	var pruned []string
	prune = func(_ context.Context, st *State, node string) error {
		if st.Config == nil || st.StateDir != cfg.StateDir {
			t.Errorf("prune got state %+v", st)
		}
		pruned = append(pruned, node)
		return nil
	}
	if out := run(path, true); !strings.Contains(out, "would remove "+last+" (--prune)") || len(pruned) != 0 {
		t.Fatalf("dry run with --prune: pruned %v\n%s", pruned, out)
	}
	out = run(path, false)
	if !strings.Contains(out, "removed "+last+" (--prune)") || !strings.Contains(out, "history: removed from the configuration "+last) || !slices.Equal(pruned, []string{last}) {
		t.Errorf("run with --prune: pruned %v\n%s", pruned, out)
	}
	prune = nil // removed now: later runs need no --prune
	if out := run(path, false); strings.Contains(out, "history:") {
		t.Errorf("a rerun without the node recorded history again:\n%s", out)
	}
	if kinds(last) != "added ready removed" || kinds(first) != "added" {
		t.Fatalf("histories: %s: %q, %s: %q", last, kinds(last), first, kinds(first))
	}
	h, _ := store.History(last)
	if want := "removed from the configuration; bootstrap run with " + path; h[2].Detail != want {
		t.Errorf("removed detail %q, want %q", h[2].Detail, want)
	}

	// A node `appliance node remove` took out (it records "removed") may leave nodes[] without --prune.
	if len(cfg.Nodes) >= 3 {
		other := cfg.Nodes[len(cfg.Nodes)-2].Name
		if err := store.RecordLifecycle(other, nodestate.Removed, "appliance node remove"); err != nil {
			t.Fatal(err)
		}
		fewer := *cfg
		fewer.Nodes = cfg.Nodes[:len(cfg.Nodes)-2]
		run(write(&fewer), false)
		if kinds(other) != "added removed" {
			t.Errorf("history of %s: %q", other, kinds(other))
		}
	}
}
