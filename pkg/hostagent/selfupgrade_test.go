package hostagent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/test/labns"
)

// selfUpgradeVersion is the version the test's second hostagent build carries.
const selfUpgradeVersion = "v0.0.0-selfupgrade-test"

// buildHostagent builds ./cmd/hostagent with version v (-ldflags -X, CGO off as `make build` does)
// into a temporary directory and returns the executable's path.
func buildHostagent(t *testing.T, v string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "hostagent")
	cmd := exec.Command("go", "build", "-ldflags", "-X github.com/airgap-appliance/appliance/pkg/version.Version="+v, "-o", out, "./cmd/hostagent")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build hostagent %s: %v\n%s", v, err, b)
	}
	return out
}

func sumOf(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestAgentSelfUpgrade is the pull side of issue 15's upgrade (the way for BMC-booted nodes): a
// worker's agent, ready and re-checking only every hour, is given NodeConfig.AgentUpgrade three
// times by rewriting the config the appliance serves, and must notice each at once through its
// config watch (with an hour's resync, nothing else would bring it):
//  1. the real new build with a wrong SHA-256: refused, the config step reported failed saying so,
//     its executable untouched;
//  2. a file with the right SHA-256 that does not run here: refused the same way ("does not run");
//  3. the real new build (a second `go build` with another version) with its SHA-256: the agent
//     replaces its executable with exactly those bytes (0755, no temporary file left) and Run
//     returns ErrRestart, on which `hostagent run` execs the new one.
//
// Real parts: the appliance's HTTPS front and agent API (pkg/server) with its artifact route, a real
// network namespace with nftables for the worker's steps, the real hostagent executable.
func TestAgentSelfUpgrade(t *testing.T) {
	labns.RequireRoot(t)
	newBin := buildHostagent(t, selfUpgradeVersion)
	newBytes, err := os.ReadFile(newBin)
	if err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(t.TempDir(), "broken")
	brokenBytes := []byte("#!/nonexistent/interpreter\n")
	if err := os.WriteFile(broken, brokenBytes, 0o644); err != nil {
		t.Fatal(err)
	}

	ns, _ := nodeNS(t, "10.78.0.2/24", "10.78.0.1/24")
	nc := workerNodeConfig("10.78.0")
	app := newApplianceWith(t, nc, map[string]string{"hostagent": newBin, "broken": broken})
	nc.CAPEM = string(app.ca.CertPEM)
	serve := func(up *agentapi.AgentUpgrade) {
		t.Helper()
		c := nc
		c.AgentUpgrade = up
		b, _ := json.Marshal(c)
		if err := os.WriteFile(filepath.Join(app.stateD, "rendered", "w1", statedir.NodeConfigFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	root, _ := nodeRoot(t, "version = 2\n")
	// The executable the agent replaces: not this test binary (which the agent reports as its own
	// build), a file of its own in a directory of its own.
	exeDir := t.TempDir()
	exe := filepath.Join(exeDir, "hostagent")
	oldBytes := []byte("the old hostagent executable\n")
	if err := os.WriteFile(exe, oldBytes, 0o755); err != nil {
		t.Fatal(err)
	}
	ag := startAgent(t, Options{Config: app.config(), Root: root, NetNS: ns.Name, BootID: "boot-1", Executable: exe,
		RetryInitial: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, Resync: time.Hour})
	waitFor(t, "w1 ready", func() bool { st, _ := app.store.Get("w1"); return st.State == agentapi.StateReady })

	unchanged := func(when string) {
		t.Helper()
		if b, _ := os.ReadFile(exe); !bytes.Equal(b, oldBytes) {
			t.Errorf("%s: the executable was replaced (%d bytes)", when, len(b))
		}
		// The agent retries the upgrade with backoff, so a retry's download may be in progress when
		// the failure is seen; a failed attempt's file is removed before its failure is reported, so
		// between attempts there is none. A leaked file would stay (each attempt only removes older
		// ones when it starts, then makes its own), and no such moment would come within the bound.
		var left []string
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if left, _ = filepath.Glob(filepath.Join(exeDir, ".hostagent.upgrade-*")); len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(left) > 0 {
			t.Errorf("%s: temporary files left: %v", when, left)
		}
	}
	failedWith := func(what string) {
		t.Helper()
		// The failure report itself is checked, not a second read of the store: the agent retries
		// with backoff, and a retry's first report ("unchanged: fetched node config; …") may have
		// replaced it by then (CI at dc8f25f).
		var detail string
		waitFor(t, "w1 failed with "+what, func() bool {
			st, _ := app.store.Get("w1")
			detail = st.Steps[agentapi.StepConfig].Detail
			return st.State == agentapi.StateFailed && strings.Contains(detail, what)
		})
		if !strings.HasPrefix(detail, "hostagent upgrade to "+selfUpgradeVersion) {
			t.Errorf("config step detail %q does not say which upgrade failed", detail)
		}
	}

	serve(&agentapi.AgentUpgrade{Version: selfUpgradeVersion, SHA256: sumOf(brokenBytes), Path: agentapi.HostagentArtifactPath})
	failedWith("with SHA-256 " + sumOf(newBytes))
	unchanged("a download with another SHA-256")

	serve(&agentapi.AgentUpgrade{Version: selfUpgradeVersion, SHA256: sumOf(brokenBytes), Path: "/artifacts/broken"})
	failedWith("does not run here")
	unchanged("a download that does not run")

	serve(&agentapi.AgentUpgrade{Version: selfUpgradeVersion, SHA256: sumOf(newBytes), Path: agentapi.HostagentArtifactPath})
	var runErr error
	select {
	case runErr = <-ag.done:
		ag.done <- nil // the cleanup's stop returns at once
	case <-time.After(2 * time.Minute): // a hang guard, not a timing assertion
		st, _ := app.store.Get("w1")
		t.Fatalf("the agent did not return after the third upgrade was served: w1 %s (%s)", st.State, st.Reason)
	}
	if !errors.Is(runErr, ErrRestart) {
		t.Fatalf("Run returned %v, want ErrRestart", runErr)
	}
	got, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if sumOf(got) != sumOf(newBytes) {
		t.Errorf("the executable is %s after the upgrade, want the served build %s", sumOf(got)[:12], sumOf(newBytes)[:12])
	}
	if fi, err := os.Stat(exe); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("the new executable's mode: %v %v, want 0755", fi.Mode(), err)
	}
	if left, _ := filepath.Glob(filepath.Join(exeDir, ".hostagent.upgrade-*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
	if out, err := exec.Command(exe, "version").Output(); err != nil || !strings.HasPrefix(strings.TrimSpace(string(out)), selfUpgradeVersion) {
		t.Errorf("the installed executable's version: %q %v, want %s", out, err, selfUpgradeVersion)
	}
	evs, err := app.store.Events("w1")
	if err != nil {
		t.Fatal(err)
	}
	var started int
	for _, e := range evs {
		if e.Step == agentapi.StepConfig && e.Status == agentapi.StatusRunning && strings.HasPrefix(e.Detail, "upgrading hostagent from ") {
			started++
		}
	}
	if started < 3 { // a refused upgrade is retried with backoff, each attempt reported
		t.Errorf("%d reports of an upgrade starting, want at least 3 (one per served upgrade)", started)
	}
}
