package lab

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

// nodesPrefix keeps this test's lab apart from lab_test.go's ("labt") and a person's ("lab").
const nodesPrefix = "labn"

// nodesLabDir holds this test's credentials and node state; fixed (not t.TempDir) so that a rerun
// can stop what an interrupted run left behind.
var nodesLabDir = filepath.Join(os.TempDir(), "appliance-lab-"+nodesPrefix)

// bound is the limit on any one command: a hang fails the test instead of blocking it (not a speed assertion).
const bound = 3 * time.Minute

type nodesEnv struct{ t *testing.T }

// cmd runs argv with the test lab's environment and a bound; it returns combined output.
func (e nodesEnv) cmd(argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	c := exec.CommandContext(ctx, argv[0], argv[1:]...)
	c.Env = append(os.Environ(), "LAB_PREFIX="+nodesPrefix, "LAB_DIR="+nodesLabDir)
	out, err := c.CombinedOutput()
	return string(out), err
}

func (e nodesEnv) must(argv ...string) string {
	e.t.Helper()
	out, err := e.cmd(argv...)
	if err != nil {
		e.t.Fatalf("%v: %v\n%s", argv, err, out)
	}
	return out
}

// inBoot runs argv in the lab's bootstrap namespace, where the appliance runs.
func (e nodesEnv) inBoot(argv ...string) (string, error) {
	return e.cmd(append([]string{"ip", "netns", "exec", nodesPrefix + "-boot"}, argv...)...)
}

func (e nodesEnv) ssh(knownHosts, ip string, argv ...string) (string, error) {
	return e.inBoot(append([]string{"ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
		"-o", "UserKnownHostsFile=" + knownHosts, "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5",
		"-i", filepath.Join(nodesLabDir, "ssh/id_ed25519"), "root@" + ip}, argv...)...)
}

func (e nodesEnv) ipmi(passFile string, args ...string) (string, error) {
	return e.inBoot(append([]string{"ipmitool", "-I", "lanplus", "-C", "3", "-H", "10.100.0.121", "-U", "admin",
		"-f", passFile}, args...)...)
}

// leftovers lists what must be gone after `nodes.sh down`: processes in the node namespaces, mounts
// under the lab directory, the nspawn tmpfs nodes.sh mounted, and the BMC namespace.
func (e nodesEnv) leftovers() []string {
	var left []string
	for _, n := range []string{"cp1", "cp2", "cp3", "w1"} {
		ns := nodesPrefix + "-" + n
		if _, err := os.Stat("/run/netns/" + ns); err != nil {
			continue // deleted (lab.sh down): nothing runs in it (ip netns pids would print its error)
		}
		out, err := e.cmd("ip", "netns", "pids", ns)
		if err != nil {
			left = append(left, "ip netns pids "+ns+": "+strings.TrimSpace(out))
		} else if strings.TrimSpace(out) != "" {
			left = append(left, "processes in "+n+": "+strings.Join(strings.Fields(out), ","))
		}
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	// The nspawn tmpfs stays, rightly, while another lab's containers run (nodes.sh down removes the
	// directories of machines no systemd-nspawn runs, so what is left under propagate/ is live).
	others, _ := filepath.Glob("/run/systemd/nspawn/propagate/*")
	others = slices.DeleteFunc(others, func(p string) bool { return strings.HasPrefix(filepath.Base(p), nodesPrefix+"-") })
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) <= 4 {
			continue
		}
		if strings.HasPrefix(fields[4], nodesLabDir) || (strings.Contains(sc.Text(), "appliance-lab-nspawn") && len(others) == 0) {
			left = append(left, "mount "+fields[4])
		}
	}
	if len(others) > 0 {
		e.t.Logf("the nspawn tmpfs is in use by other labs' machines (%v): its unmount is not checked", others)
	}
	if _, err := os.Stat("/run/netns/" + nodesPrefix + "-bmc1"); err == nil {
		left = append(left, "namespace "+nodesPrefix+"-bmc1")
	}
	return left
}

// TestNodes boots the lab's hosts for real: cp1..cp3 as systemd-nspawn Debian containers that
// answer SSH with the pinned lab host key, and w1 as a QEMU VM behind an ipmi_sim BMC at
// 10.100.0.121 that powers on over IPMI-over-LAN and reaches the bootstrap host's network.
func TestNodes(t *testing.T) {
	labns.RequireRoot(t)
	for _, tool := range []string{"ip", "systemd-nspawn", "debootstrap", "ssh", "ssh-keygen", "ipmi_sim",
		"ipmitool", "qemu-system-x86_64", "busybox", "cpio", "ignition", "nsenter", "setsid"} {
		labns.RequireTool(t, tool)
	}
	e := nodesEnv{t}
	// Leftovers of an interrupted run: stop its nodes, then its namespaces.
	e.must("bash", "nodes.sh", "down")
	e.must("bash", "lab.sh", "down")
	if err := os.RemoveAll(nodesLabDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if out, err := e.cmd("bash", "nodes.sh", "down"); err != nil {
			t.Errorf("cleanup: nodes.sh down: %v\n%s", err, out)
		}
		_, _ = e.cmd("bash", "lab.sh", "down")
		if left := e.leftovers(); len(left) == 0 {
			_ = os.RemoveAll(nodesLabDir)
		} else {
			t.Logf("cleanup: %s kept (the next run purges it) because of: %s", nodesLabDir, strings.Join(left, "; "))
		}
	})
	before := rootNetState(t)
	e.must("bash", "lab.sh", "up", "3", "1")
	// A test kernel command line for w1 where the appliance would render one: lab self-test mode.
	rendered := filepath.Join(nodesLabDir, "state/rendered/w1/kernel-cmdline")
	if err := os.MkdirAll(filepath.Dir(rendered), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rendered, []byte("lab.test=10.100.0.2:18080\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	out := e.must("bash", "nodes.sh", "up")
	t.Logf("nodes.sh up (3 containers to sshd-ready, 1 BMC) took %v:\n%s", time.Since(start), out)
	e.must("bash", "nodes.sh", "up") // idempotent
	status := e.must("bash", "nodes.sh", "status")
	for _, want := range []string{"cp1: running", "cp2: running", "cp3: running", "w1: BMC 10.100.0.121 up", "VM off"} {
		if !strings.Contains(status, want) {
			t.Errorf("status lacks %q:\n%s", want, status)
		}
	}
	knownHosts := filepath.Join(nodesLabDir, "ssh/known_hosts")

	t.Run("ssh with pinned host key", func(t *testing.T) {
		for _, tc := range []struct{ node, ip string }{{"cp1", "10.100.0.11"}, {"cp2", "10.100.0.12"}, {"cp3", "10.100.0.13"}} {
			out, err := e.ssh(knownHosts, tc.ip, "hostname; systemctl is-system-running; ip -4 -br addr show eth1")
			if err != nil {
				// is-system-running exits 1 for "degraded", which the appliance accepts.
				if !strings.Contains(out, "degraded") {
					t.Errorf("%s: ssh: %v\n%s", tc.node, err, out)
					continue
				}
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) < 3 || lines[0] != tc.node || (lines[1] != "running" && lines[1] != "degraded") ||
				!strings.Contains(lines[2], "10.200.0."+tc.ip[len("10.100.0."):]+"/24") {
				t.Errorf("%s: got %q; want hostname, running|degraded, and the namespace's workload address", tc.node, out)
			}
		}
	})

	t.Run("wrong host key refused", func(t *testing.T) {
		dir := t.TempDir()
		e.must("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(dir, "other"))
		pub, err := os.ReadFile(filepath.Join(dir, "other.pub"))
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(pub))
		wrong := filepath.Join(dir, "known_hosts")
		if err := os.WriteFile(wrong, []byte("10.100.0.11 "+f[0]+" "+f[1]+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := e.ssh(wrong, "10.100.0.11", "true")
		if err == nil || !strings.Contains(out, "Host key verification failed") {
			t.Errorf("ssh with a wrong pinned key: err=%v out=%q; want Host key verification failed", err, out)
		}
	})

	t.Run("reboot", func(t *testing.T) {
		bootID := func() string {
			out, err := e.ssh(knownHosts, "10.100.0.12", "cat", "/proc/sys/kernel/random/boot_id")
			if err != nil {
				t.Fatalf("ssh: %v\n%s", err, out)
			}
			return strings.TrimSpace(out)
		}
		first := bootID()
		e.must("bash", "nodes.sh", "reboot", "cp2")
		if second := bootID(); second == first || second == "" {
			t.Errorf("boot id after reboot %q, before %q: want a new boot", second, first)
		}
	})

	t.Run("BMC powers the VM", func(t *testing.T) {
		pass := filepath.Join(nodesLabDir, "bmc/w1.password")
		wrong := filepath.Join(t.TempDir(), "wrong")
		if err := os.WriteFile(wrong, []byte("not-the-password\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := e.ipmi(wrong, "chassis", "power", "status"); err == nil || strings.Contains(out, "Chassis Power is") {
			t.Errorf("wrong BMC password accepted: %v\n%s", err, out)
		}
		if out, _ := e.ipmi(pass, "chassis", "power", "status"); !strings.Contains(out, "Chassis Power is off") {
			t.Fatalf("power status before power on: %q, want off", out)
		}
		if out, err := e.ipmi(pass, "chassis", "bootdev", "pxe"); err != nil {
			t.Errorf("bootdev pxe: %v\n%s", err, out)
		}
		if out, _ := e.ipmi(pass, "chassis", "bootparam", "get", "5"); !strings.Contains(out, "Force PXE") {
			t.Errorf("boot device read back: %q, want Force PXE", out)
		}

		// The listener the VM's boot program sends its hello to, in the bootstrap namespace.
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		listener := exec.CommandContext(ctx, "ip", "netns", "exec", nodesPrefix+"-boot", "busybox", "nc", "-l", "-p", "18080")
		var got strings.Builder
		listener.Stdout = &got
		if err := listener.Start(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if out, err := e.ipmi(pass, "chassis", "power", "on"); err != nil {
			t.Fatalf("power on: %v\n%s", err, out)
		}
		if out, _ := e.ipmi(pass, "chassis", "power", "status"); !strings.Contains(out, "Chassis Power is on") {
			t.Errorf("power status after power on: %q", out)
		}
		if out, _ := e.cmd("ip", "netns", "pids", nodesPrefix+"-w1"); strings.TrimSpace(out) == "" {
			t.Errorf("no process (QEMU) in %s-w1 after power on", nodesPrefix)
		}
		err := listener.Wait() // busybox nc -l exits when the VM's connection closes (or the bound ends)
		t.Logf("VM power-on to hello on the lab network: %v", time.Since(start))
		if err != nil || !strings.Contains(got.String(), "hello from w1") {
			t.Errorf("listener in %s-boot: %v, got %q; want hello from w1", nodesPrefix, err, got.String())
		}
		console, _ := os.ReadFile(filepath.Join(nodesLabDir, "nodes/w1/console.log"))
		if !strings.Contains(string(console), "LAB-TEST: network up (w1 reached 10.100.0.2)") {
			t.Errorf("serial console lacks the network marker:\n%s", console)
		}
		if out, err := e.ipmi(pass, "chassis", "power", "off"); err != nil {
			t.Errorf("power off: %v\n%s", err, out)
		}
		if out, _ := e.ipmi(pass, "chassis", "power", "status"); !strings.Contains(out, "Chassis Power is off") {
			t.Errorf("power status after power off: %q", out)
		}
		if out, _ := e.cmd("ip", "netns", "pids", nodesPrefix+"-w1"); strings.TrimSpace(out) != "" {
			t.Errorf("processes left in %s-w1 after power off: %s", nodesPrefix, out)
		}
	})

	t.Run("down leaves nothing behind", func(t *testing.T) {
		e.must("bash", "nodes.sh", "down")
		if left := e.leftovers(); len(left) > 0 {
			t.Errorf("after nodes.sh down: %v", left)
		}
		if !strings.Contains(e.must("bash", "nodes.sh", "status"), "cp1: stopped") {
			t.Errorf("status after down does not say stopped")
		}
	})

	if after := rootNetState(t); after != before {
		t.Errorf("root namespace network changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func TestNodesRejectsBadInput(t *testing.T) {
	labns.RequireRoot(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown verb", []string{"destroy"}, "usage:"},
		{"ssh to a VM node", []string{"ssh", "w1", "true"}, "not a pre-installed node"},
		{"reboot without node", []string{"reboot"}, "usage: nodes.sh reboot NODE"},
		{"lab not up", []string{"up", "cp1"}, "lab labx not up"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := exec.Command("bash", append([]string{"nodes.sh"}, tc.args...)...)
			c.Env = append(os.Environ(), "LAB_PREFIX=labx", "LAB_DIR="+t.TempDir())
			out, err := c.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.want) {
				t.Errorf("nodes.sh %v: %v, %s; want failure with %q", tc.args, err, out, tc.want)
			}
		})
	}
}
