package main

import (
	"bytes"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/hostagent"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/server"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestEnrollCommand runs `hostagent enroll` in-process against the real appliance front
// (pkg/server over TLS with a pkg/pki CA) whose inventory names this test machine by one of its real
// MACs (read by the kernel, as on a booted node): it writes the pinned CA (0644), the key, the
// hostagent configuration with the token and the Ignition config (0600) under --root, and says
// which node it enrolled as. A second run with the same --root (same key) is answered again.
func TestEnrollCommand(t *testing.T) {
	macs, err := hostagent.SystemMACs()
	if err != nil {
		t.Fatal(err)
	}
	if len(macs) == 0 {
		t.Skip("SKIPPED: this machine shows no NIC with a MAC address, so it cannot play a booted node")
	}
	dir := t.TempDir()
	ca, _, err := pki.EnsureCA(filepath.Join(dir, "pki"), "test appliance CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cert, _, err := pki.EnsureServingCert(filepath.Join(dir, "pki"), ca, []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pin := agentapi.PinOf(ca.Cert)
	rendered := filepath.Join(dir, "rendered")
	store := nodestate.Open(filepath.Join(dir, "nodes"))
	s, err := server.New(server.Options{
		Listen: "127.0.0.1:0", Certificate: cert, CAPEM: ca.CertPEM,
		Enroll:   server.NewEnrollment(rendered, filepath.Join(dir, "enrolment"), []server.EnrollNode{{Name: "w1", BMC: true, MAC: macs[len(macs)-1]}}, store, nil),
		Ignition: server.NewIgnitionStore(rendered, map[string]string{"w1": "tok-w1"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(s.Handler())
	ts.TLS = s.TLSConfig()
	ts.StartTLS()
	defer ts.Close()
	cfg, _ := agentapi.Configuration{Node: "w1", Roles: []string{"worker"}, ApplianceURL: ts.URL, CAPin: pin, Token: "tok-w1"}.Marshal()
	for p, data := range map[string][]byte{
		filepath.Join(rendered, "w1", statedir.AgentConfigFile):           cfg,
		filepath.Join(rendered, "w1", statedir.IgnitionDir, "3.3.0.json"): []byte(`{"ignition":{"version":"3.3.0"}}`),
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []string{agentapi.StatePowering, agentapi.StateBooting} {
		if _, err := store.Set("w1", st, ""); err != nil {
			t.Fatal(err)
		}
	}

	root := filepath.Join(dir, "node")
	for run := 1; run <= 2; run++ {
		cmd := newRootCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs([]string{"enroll", "--url", ts.URL, "--pin", pin, "--root", root, "--ignition-out", "/run/ignition.json"})
		if err := cmd.Execute(); err != nil {
			t.Fatalf("run %d: hostagent enroll: %v\n%s", run, err, out.String())
		}
		if !strings.Contains(out.String(), "enrolled as node w1") || strings.Contains(out.String(), "tok-w1") {
			t.Errorf("run %d: output %q, want the node named and no token", run, out.String())
		}
		t.Logf("run %d: %s", run, strings.TrimSpace(out.String()))
	}
	for p, want := range map[string]os.FileMode{
		agentapi.ConfigPath: 0o600, hostagent.CACertPath: 0o644, enrollKeyPath: 0o600, "/run/ignition.json": 0o600,
	} {
		st, err := os.Stat(filepath.Join(root, p))
		if err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want mode %o", p, st, err, want)
		}
	}
	got, _ := os.ReadFile(filepath.Join(root, agentapi.ConfigPath))
	if c, err := agentapi.Parse(got); err != nil || c.Node != "w1" || c.Token != "tok-w1" {
		t.Errorf("written config: %+v %v", c, err)
	}
}
