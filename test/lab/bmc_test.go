package lab

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

// bmcPrefix keeps TestBMCUpDown's lab apart from TestNodes' ("labn") and every other lab.
const bmcPrefix = "labc"

// bmcLabDir is fixed (not t.TempDir) so that a rerun stops what an interrupted run left running.
var bmcLabDir = filepath.Join(os.TempDir(), "appliance-lab-"+bmcPrefix)

type bmcLab struct {
	t   *testing.T
	env []string
}

// run runs argv in the test lab's environment (plus env), bounded; it returns combined output.
func (b bmcLab) run(env []string, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, argv[0], argv[1:]...)
	c.Env = append(append(os.Environ(), b.env...), env...)
	out, err := c.CombinedOutput()
	return string(out), err
}

func (b bmcLab) must(argv ...string) string {
	b.t.Helper()
	out, err := b.run(nil, argv...)
	if err != nil {
		b.t.Fatalf("%v: %v\n%s", argv, err, out)
	}
	return out
}

// ssPID finds the owners in `ss -p` output: users:(("ipmi_sim",pid=123,fd=7)).
var ssPID = regexp.MustCompile(`pid=[0-9]+`)

// pids lists the numbers in out (one a line, or ss's pid=N).
func pids(out string) []int {
	var ps []int
	for _, f := range strings.FieldsFunc(out, func(r rune) bool { return r < '0' || r > '9' }) {
		if n, err := strconv.Atoi(f); err == nil && n > 0 {
			ps = append(ps, n)
		}
	}
	slices.Sort(ps)
	return slices.Compact(ps)
}

// serving checks the BMC as nodes.sh promises it after `up`: ipmi_sim.pid names an ipmi_sim, that
// process is the only one bound to 10.100.0.121:623, and the only process in the BMC's namespace.
// It returns the PID.
func (b bmcLab) serving(step string) int {
	b.t.Helper()
	raw, err := os.ReadFile(filepath.Join(bmcLabDir, "nodes/w1/ipmi_sim.pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 0 {
		b.t.Fatalf("%s: ipmi_sim.pid: %q, %v", step, raw, err)
	}
	comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	ss, _ := b.run(nil, "nsenter", "--net=/run/netns/"+bmcPrefix+"-bmc1", "--", "ss", "-Hlunp", "sport = :623")
	owners := pids(strings.Join(ssPID.FindAllString(ss, -1), " "))
	inNS, _ := b.run(nil, "ip", "netns", "pids", bmcPrefix+"-bmc1")
	if strings.TrimSpace(string(comm)) != "ipmi_sim" || !slices.Equal(owners, []int{pid}) || !slices.Equal(pids(inNS), []int{pid}) {
		b.t.Fatalf("%s: ipmi_sim.pid names %d (%q); bound to 10.100.0.121:623: %v; in %s-bmc1: %v; want that one ipmi_sim everywhere",
			step, pid, strings.TrimSpace(string(comm)), owners, bmcPrefix, pids(inNS))
	}
	return pid
}

// gone checks that pid no longer runs (nodes.sh waits for it before it returns). A zombie has
// exited (its sockets are closed); whoever reaps orphans here may not have reaped it yet.
func (b bmcLab) gone(step string, pid int) {
	b.t.Helper()
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return
	}
	if f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:])); len(f) > 0 && f[0] != "Z" {
		b.t.Errorf("%s: the earlier ipmi_sim %d still runs: %s", step, pid, st)
	}
}

// ourSims lists the ipmi_sim processes this lab started, found by their lan.conf (whatever their namespace).
func ourSims() []int {
	var found []int
	ents, _ := os.ReadDir("/proc")
	conf := filepath.Join(bmcLabDir, "nodes/w1/lan.conf")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if strings.Contains(string(cmd), conf) && strings.HasPrefix(filepath.Base(strings.SplitN(string(cmd), "\x00", 2)[0]), "ipmi_sim") {
			found = append(found, pid)
		}
	}
	return found
}

// TestBMCUpDown starts and stops w1's BMC (ipmi_sim) again and again, back to back, and in the ways
// that made `nodes.sh up` fail with "ipmi_sim exited" or leave a second BMC on the port (issue 29):
// an up right after the previous ipmi_sim got SIGTERM, an up after its PID file was lost, an up from
// a shell with job control (setsid(1) forks there, so $! is not ipmi_sim), and an ipmi_sim that
// really exits (its status and log's tail must be in up's output, which the lab's purge leaves as
// the only trace). After every up, ipmi_sim.pid must name the one process bound to the BMC's port and
// the only one in its namespace; after every down, the earlier ipmi_sim must be gone.
func TestBMCUpDown(t *testing.T) {
	labns.RequireRoot(t)
	for _, tool := range []string{"ip", "ss", "ipmi_sim", "ipmitool", "nsenter", "setsid", "ssh-keygen"} {
		labns.RequireTool(t, tool)
	}
	b := bmcLab{t: t, env: []string{"LAB_PREFIX=" + bmcPrefix, "LAB_DIR=" + bmcLabDir, "LAB_WORKER_KIND=vm"}}
	// `down w1`, not `down`: stopping VM nodes only never touches the host's nspawn tmpfs, which
	// other labs' containers may be using.
	b.must("bash", "nodes.sh", "down", "w1")
	b.must("bash", "lab.sh", "down")
	if err := os.RemoveAll(bmcLabDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if out, err := b.run(nil, "bash", "nodes.sh", "down", "w1"); err != nil {
			t.Errorf("cleanup: nodes.sh down w1: %v\n%s", err, out)
		}
		_, _ = b.run(nil, "bash", "lab.sh", "down")
		if left := ourSims(); len(left) > 0 {
			t.Errorf("cleanup: ipmi_sim of this lab still running: %v", left)
			for _, p := range left {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		_ = os.RemoveAll(bmcLabDir)
	})
	before := rootNetState(t)
	b.must("bash", "lab.sh", "up", "1", "1")

	start := time.Now()
	const cycles = 6
	for i := range cycles {
		b.must("bash", "nodes.sh", "up", "w1")
		pid := b.serving("cycle " + strconv.Itoa(i))
		b.must("bash", "nodes.sh", "down", "w1")
		b.gone("cycle "+strconv.Itoa(i), pid)
		if _, err := os.Stat("/run/netns/" + bmcPrefix + "-bmc1"); err == nil {
			t.Fatalf("cycle %d: %s-bmc1 still there after down", i, bmcPrefix)
		}
	}
	t.Logf("%d BMC up/down cycles in %v", cycles, time.Since(start).Round(time.Millisecond))

	t.Run("up while the previous ipmi_sim is being killed", func(t *testing.T) {
		b := bmcLab{t: t, env: b.env}
		b.must("bash", "nodes.sh", "up", "w1")
		old := b.serving("first up")
		if err := syscall.Kill(old, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		b.must("bash", "nodes.sh", "up", "w1")
		if b.serving("up after SIGTERM") == old {
			t.Errorf("up after SIGTERM kept the dying ipmi_sim %d", old)
		}
		b.gone("up after SIGTERM", old)
	})

	t.Run("up after the PID file was lost", func(t *testing.T) {
		b := bmcLab{t: t, env: b.env}
		b.must("bash", "nodes.sh", "up", "w1")
		old := b.serving("first up")
		if err := os.Remove(filepath.Join(bmcLabDir, "nodes/w1/ipmi_sim.pid")); err != nil {
			t.Fatal(err)
		}
		// Debian's ipmi_sim binds with SO_REUSEADDR: a second one would bind beside the untracked one.
		b.must("bash", "nodes.sh", "up", "w1")
		b.serving("up without a PID file")
		b.gone("up without a PID file", old)
	})

	t.Run("up from a shell with job control", func(t *testing.T) {
		b := bmcLab{t: t, env: b.env}
		b.must("bash", "nodes.sh", "down", "w1")
		// With job control the background job leads its own process group, so setsid(1) forks and
		// $! is a setsid that exits at once while ipmi_sim runs on.
		b.must("bash", "-c", `set -m; set -- up w1; . "$0"`, "nodes.sh")
		pid := b.serving("up under job control")
		b.must("bash", "nodes.sh", "down", "w1")
		b.gone("down after up under job control", pid)
	})

	t.Run("an ipmi_sim that exits is reported with its status and log", func(t *testing.T) {
		b := bmcLab{t: t, env: b.env}
		b.must("bash", "nodes.sh", "down", "w1")
		stub := t.TempDir()
		if err := os.WriteFile(filepath.Join(stub, "ipmi_sim"),
			[]byte("#!/bin/sh\necho 'Unable to bind to LAN port: stub for the test' >&2\nexit 3\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := b.run([]string{"PATH=" + stub + ":" + os.Getenv("PATH")}, "bash", "nodes.sh", "up", "w1")
		for _, want := range []string{"w1: ipmi_sim exited (status 3)", "Unable to bind to LAN port: stub for the test"} {
			if err == nil || !strings.Contains(out, want) {
				t.Errorf("up with an ipmi_sim that exits: %v; output lacks %q:\n%s", err, want, out)
			}
		}
	})

	t.Run("the recorded ipmi_sim answers IPMI", func(t *testing.T) {
		b := bmcLab{t: t, env: b.env}
		b.must("bash", "nodes.sh", "up", "w1")
		b.serving("up")
		out, err := b.run(nil, "ip", "netns", "exec", bmcPrefix+"-boot", "ipmitool", "-I", "lanplus", "-C", "3",
			"-H", "10.100.0.121", "-U", "admin", "-f", filepath.Join(bmcLabDir, "bmc/w1.password"), "chassis", "power", "status")
		if err != nil || !strings.Contains(out, "Chassis Power is off") {
			t.Errorf("ipmitool chassis power status: %v\n%s", err, out)
		}
		old := b.serving("after ipmitool")
		b.must("bash", "nodes.sh", "down", "w1")
		b.gone("down", old)
	})

	if after := rootNetState(t); after != before {
		t.Errorf("root namespace network changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
