package bootstrap

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"os"
	"path/filepath"
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
	run := func(path string, dryRun bool) string {
		t.Helper()
		var progress strings.Builder
		// The hostagent binary is only read once the CA exists; render needs the option set.
		_, err := runPhases(context.Background(), Options{ConfigPath: path, HostagentBinary: "/nonexistent/hostagent",
			Progress: &progress, DryRun: dryRun}, []Phase{loadPhase{}, renderPhase{}})
		if err != nil {
			t.Fatalf("run: %v\n%s", err, progress.String())
		}
		return progress.String()
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

	dropped := *cfg
	dropped.Nodes = cfg.Nodes[:len(cfg.Nodes)-1]
	path = write(&dropped)
	if out := run(path, false); !strings.Contains(out, "history: removed from the configuration "+last) {
		t.Errorf("render's detail does not name the removed node:\n%s", out)
	}
	if out := run(path, false); strings.Contains(out, "history:") {
		t.Errorf("a rerun without the node recorded history again:\n%s", out)
	}
	if kinds(last) != "added removed" || kinds(first) != "added" {
		t.Fatalf("histories: %s: %q, %s: %q", last, kinds(last), first, kinds(first))
	}
	h, _ := store.History(last)
	if want := "removed from the configuration; bootstrap run with " + path; h[1].Detail != want {
		t.Errorf("removed detail %q, want %q", h[1].Detail, want)
	}
}
