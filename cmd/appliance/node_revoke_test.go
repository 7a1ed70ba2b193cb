package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestNodeRevoke: `appliance node revoke` refuses, with what to fix, an unknown node, a run without
// --yes and a missing state directory, changing nothing; with --yes it removes the node's token,
// records token-revoked in its history and fails the node with a reason naming the way back (for an
// SSH node: appliance bootstrap), which `appliance status NODE` shows; a second revocation says
// there is no token. The other nodes' tokens stay.
func TestNodeRevoke(t *testing.T) {
	cfg := config.Example()
	cfg.StateDir = t.TempDir()
	path := writeConfig(t, cfg)
	pkiDir := statedir.PKI(cfg.StateDir)
	var names []string
	for _, n := range cfg.Nodes {
		names = append(names, n.Name)
	}
	toks, _, err := pki.EnsureNodeTokens(pkiDir, names)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no --yes", []string{"node", "revoke", "cp1", "-c", path}, "revoking cp1's token stops its hostagent talking to the appliance until it is enrolled or installed again: pass --yes to do it"},
		{"unknown node", []string{"node", "revoke", "nope", "-c", path, "--yes"}, "nope is not in nodes[] of " + path + " and has no token in " + pkiDir},
		{"no state directory", []string{"node", "revoke", "cp1", "-c", path, "--yes", "-s", filepath.Join(cfg.StateDir, "absent")}, "is not there: run appliance bootstrap first"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := runCLI(tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q\nstderr: %s", err, tc.want, stderr)
			}
			if tok, found, _ := pki.ReadNodeToken(pkiDir, "cp1"); !found || tok != toks["cp1"] {
				t.Fatal("a refused revocation changed cp1's token")
			}
		})
	}

	_, stderr, err := runCLI("node", "revoke", "cp1", "-c", path, "--yes")
	if err != nil {
		t.Fatalf("revoke: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "revoke cp1: removed its token") || !strings.Contains(stderr, "appliance bootstrap --config "+path) || strings.Contains(stderr, toks["cp1"]) {
		t.Errorf("stderr %q: want the removal and, for the SSH node cp1, appliance bootstrap as the way back; no token", stderr)
	}
	if _, err := os.Stat(pki.NodeTokenPath(pkiDir, "cp1")); !os.IsNotExist(err) {
		t.Errorf("cp1's token file after revoke: %v, want it gone", err)
	}
	for _, n := range names[1:] {
		if tok, _, _ := pki.ReadNodeToken(pkiDir, n); tok != toks[n] {
			t.Errorf("revoking cp1 changed %s's token", n)
		}
	}
	store := nodestate.Open(statedir.Nodes(cfg.StateDir))
	st, err := store.Get("cp1")
	if err != nil || st.State != agentapi.StateFailed || !strings.Contains(st.Reason, "token revoked by appliance node revoke") {
		t.Errorf("cp1's record after revoke: %+v %v, want failed with the revocation as reason", st, err)
	}
	out, _, err := runCLI("status", "-c", path, "cp1")
	if err != nil || !strings.Contains(out, "token-revoked (appliance node revoke with "+path+")") || !strings.Contains(out, "token revoked by appliance node revoke") {
		t.Errorf("appliance status cp1: %v\n%s\nwant the revocation in the history and the reason", err, out)
	}

	_, stderr, err = runCLI("node", "revoke", "cp1", "-c", path, "--yes")
	if err != nil || !strings.Contains(stderr, "it has no token (already revoked, or never issued)") {
		t.Errorf("second revoke: %v, stderr %q", err, stderr)
	}
	hist, _ := store.History("cp1")
	if n := len(hist); n != 1 || hist[0].Kind != nodestate.TokenRevoked {
		t.Errorf("cp1's history after two revocations: %+v, want one token-revoked", hist)
	}
}
