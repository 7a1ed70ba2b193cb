package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/server"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestNodeApproveAndStatus: with boot.enrolment.approval: operator, w1's enrolment (the real
// pkg/server enrolment over the state directory) waits, and a second machine's claim raises the
// alarm. `appliance status` shows both, with what to run; `appliance node approve` without a
// fingerprint only shows the enrolment, with another fingerprint approves nothing, refuses a node that
// does not enrol or has not enrolled, and with the console's fingerprint approves: w1's next request
// gets its token, the alarm and the pending line go from status, enrol-approved is in w1's history;
// approving again does nothing.
func TestNodeApproveAndStatus(t *testing.T) {
	cfg := config.Example()
	cfg.StateDir = t.TempDir()
	cfg.Boot.Enrolment.Approval = config.EnrolApprovalOperator
	path := writeConfig(t, cfg)
	var names []string
	for _, n := range cfg.Nodes {
		names = append(names, n.Name)
	}
	if _, _, err := pki.EnsureNodeTokens(statedir.PKI(cfg.StateDir), names); err != nil {
		t.Fatal(err)
	}
	rendered, err := agentapi.Configuration{Node: "w1", Roles: []string{"worker"}, ApplianceURL: "https://10.100.0.2:8443", CAPin: "sha256:" + strings.Repeat("0", 64), Token: "rendered"}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(statedir.RenderedNode(cfg.StateDir, "w1"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(statedir.RenderedNode(cfg.StateDir, "w1"), statedir.AgentConfigFile), rendered, 0o600); err != nil {
		t.Fatal(err)
	}
	store := nodestate.Open(statedir.Nodes(cfg.StateDir))
	for _, st := range []string{agentapi.StatePowering, agentapi.StateBooting} {
		if _, err := store.Set("w1", st, ""); err != nil {
			t.Fatal(err)
		}
	}
	e := server.NewEnrollment(statedir.Rendered(cfg.StateDir), statedir.Enrolment(cfg.StateDir), []server.EnrollNode{{Name: "w1", BMC: true, MAC: "52:54:00:00:00:21"}}, store, nil)
	e.PKIDir, e.RequireApproval = statedir.PKI(cfg.StateDir), true
	enrol := func(key ed25519.PrivateKey, from string) error {
		nonce := make([]byte, 16)
		_, _ = rand.Read(nonce)
		r := agentapi.EnrollRequest{MACs: []string{"52:54:00:00:00:21"}, Timestamp: time.Now().UTC(), Nonce: base64.RawURLEncoding.EncodeToString(nonce), CAPin: "sha256:" + strings.Repeat("0", 64)}
		r.Sign(key)
		_, err := e.Enroll(r, from+":40000")
		return err
	}
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	fp := agentapi.KeyFingerprint(key.Public().(ed25519.PublicKey))
	if err := enrol(key, "10.100.0.150"); server.HTTPStatus(err) != 202 {
		t.Fatalf("w1's enrolment: %v, want pending", err)
	}
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	otherFP := agentapi.KeyFingerprint(other.Public().(ed25519.PublicKey))
	if err := enrol(other, "10.100.0.66"); server.HTTPStatus(err) != 409 {
		t.Fatalf("the second machine: %v, want 409", err)
	}

	out, _, err := runCLI("status", "-c", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ALARM w1 (", "a second machine claims node w1", otherFP, "from 10.100.0.66",
		"PENDING w1: enrolment with key " + fp + " from 10.100.0.150", "appliance node approve w1 --config " + path + " --fingerprint " + fp} {
		if !strings.Contains(out, want) {
			t.Errorf("appliance status lacks %q:\n%s", want, out)
		}
	}
	js, _, err := runCLI("status", "-c", path, "-o", "json")
	var rows []statusRow
	if err != nil || json.Unmarshal([]byte(js), &rows) != nil {
		t.Fatalf("status -o json: %v\n%s", err, js)
	}
	for _, r := range rows {
		if (r.Node == "w1") != (r.Alarm != nil && r.PendingEnrolment != nil && r.PendingEnrolment.KeyFingerprint == fp) {
			t.Errorf("JSON row %s: alarm %v, pending %+v", r.Node, r.Alarm, r.PendingEnrolment)
		}
	}

	approval := filepath.Join(statedir.Enrolment(cfg.StateDir), "approved", "w1.json")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"show only", []string{"node", "approve", "w1", "-c", path}, "compare the key above with the line \"enrolling with key sha256:…\" on w1's console"},
		{"another key", []string{"node", "approve", "w1", "-c", path, "--fingerprint", otherFP}, "bound to key " + fp + " (from 10.100.0.150), not to " + otherFP},
		{"an SSH node", []string{"node", "approve", "cp1", "-c", path, "--yes"}, "cp1 is not a node of " + path + " that enrols"},
		{"not enrolled", []string{"node", "approve", "w2", "-c", path, "--yes"}, "w2 has not enrolled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := runCLI(tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q\nstderr: %s", err, tc.want, stderr)
			}
			if _, err := os.Stat(approval); err == nil {
				t.Fatal("a refused approval wrote one")
			}
		})
	}
	_, stderr, _ := runCLI("node", "approve", "w1", "-c", path)
	for _, want := range []string{"node w1: enrolment waits for approval (no token issued)", "key          " + fp, "from         10.100.0.150", "ALARM ("} {
		if !strings.Contains(stderr, want) {
			t.Errorf("node approve's display lacks %q:\n%s", want, stderr)
		}
	}

	_, stderr, err = runCLI("node", "approve", "w1", "-c", path, "--fingerprint", fp[:len("sha256:")+16])
	if err != nil || !strings.Contains(stderr, "approve w1: approved key "+fp+": the machine gets its token at its next request") {
		t.Fatalf("approve: %v\n%s", err, stderr)
	}
	if st, err := os.Stat(approval); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("approval %s: %v %v, want mode 0600", approval, st, err)
	}
	resp, err := func() (agentapi.EnrollResponse, error) {
		nonce := make([]byte, 16)
		_, _ = rand.Read(nonce)
		r := agentapi.EnrollRequest{MACs: []string{"52:54:00:00:00:21"}, Timestamp: time.Now().UTC(), Nonce: base64.RawURLEncoding.EncodeToString(nonce), CAPin: "sha256:" + strings.Repeat("0", 64)}
		r.Sign(key)
		return e.Enroll(r, "10.100.0.150:40001")
	}()
	if err != nil || !strings.Contains(resp.HostagentConfig, "token:") || strings.Contains(resp.HostagentConfig, "token: rendered") {
		t.Errorf("w1's request after the approval: %v, want its new token", err)
	}
	hist, _ := store.History("w1")
	if last := hist[len(hist)-1]; last.Kind != nodestate.TokenRotated || hist[len(hist)-2].Kind != nodestate.EnrolApproved ||
		!strings.Contains(hist[len(hist)-2].Detail, "key "+fp+" from 10.100.0.150 approved by appliance node approve") {
		t.Errorf("w1's history ends %+v, want enrol-approved then token-rotated", hist[len(hist)-2:])
	}
	out, _, _ = runCLI("status", "-c", path)
	if strings.Contains(out, "ALARM") || strings.Contains(out, "PENDING") {
		t.Errorf("appliance status after the approval still shows the alarm or the pending enrolment:\n%s", out)
	}
	_, stderr, err = runCLI("node", "approve", "w1", "-c", path, "--yes")
	if err != nil || !strings.Contains(stderr, "approve w1: nothing to do: it was approved at") {
		t.Errorf("approving again: %v\n%s", err, stderr)
	}
}
