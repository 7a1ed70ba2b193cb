package provision

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestStartScriptRestartsReplacedExecutable runs startScript with /bin/sh against a real process
// whose executable is then replaced the way provisioning replaces hostagent (a new file renamed over
// it): a run killed between installing a new hostagent and restarting it must not leave the old
// build running for good. systemctl is a stub (no systemd runs as PID 1 here): it answers MainPID
// with the real process's PID and logs what it was asked; /proc/PID/exe is the kernel's.
func TestStartScriptRestartsReplacedExecutable(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(dir, "hostagent")
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatalf("sleep: %v", err)
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(agent, b, 0o755); err != nil {
		t.Fatal(err)
	}
	proc := exec.Command(agent, "600")
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proc.Process.Kill(); _ = proc.Wait() })

	bin := filepath.Join(dir, "bin")
	log := filepath.Join(dir, "systemctl.log")
	stub := "#!/bin/sh\necho \"$*\" >> " + log + "\ncase \"$*\" in\n  show*) echo \"$MAINPID\";;\nesac\nexit 0\n"
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "systemctl"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func() (string, string) {
		t.Helper()
		_ = os.Remove(log)
		cmd := exec.Command("/bin/sh", "-c", startScript("hostagent.service", agent))
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "MAINPID="+strconv.Itoa(proc.Process.Pid))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("start script: %v\n%s", err, out)
		}
		calls, _ := os.ReadFile(log)
		return string(out), string(calls)
	}

	out, calls := run()
	if strings.Contains(out, staleRestarted) || strings.Contains(calls, "restart") {
		t.Errorf("current executable: restarted anyway (output %q, systemctl calls %q)", out, calls)
	}
	if !strings.Contains(calls, "is-active --quiet hostagent.service") {
		t.Errorf("current executable: systemctl calls %q, want an is-active check", calls)
	}

	// Replace the executable as WriteFile does (new file, rename over the old one).
	if err := os.WriteFile(agent+".new", b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(agent+".new", agent); err != nil {
		t.Fatal(err)
	}
	out, calls = run()
	if !strings.Contains(out, staleRestarted) || !strings.Contains(calls, "restart --no-block hostagent.service") {
		t.Errorf("replaced executable: output %q, systemctl calls %q; want a restart", out, calls)
	}
}
