package power

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

// Tests against real peers (ipmi_sim, sshd) run the peers inside a network namespace made for the
// test, and re-run the test's client half inside the same namespace: the test binary re-executes
// itself with `ip netns exec NS` and -test.run/-test.bench naming the test, passing the peers'
// details in childEnv. Client traffic then never leaves the namespace, and child processes of the
// code under test (ipmitool) inherit it.

const childEnv = "POWER_TEST_CHILD"

// childParams returns the parent's parameters when running as the in-namespace half.
func childParams(tb testing.TB) (map[string]string, bool) {
	raw := os.Getenv(childEnv)
	if raw == "" {
		return nil, false
	}
	var p map[string]string
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		tb.Fatalf("bad %s: %v", childEnv, err)
	}
	return p, true
}

// runInNS re-runs the current test (or benchmark, with bench=true) inside ns with params and fails
// tb if the child fails. The child's output is logged.
func runInNS(tb testing.TB, ns *labns.NS, params map[string]string, bench bool) string {
	tb.Helper()
	raw, err := json.Marshal(params)
	if err != nil {
		tb.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	top := strings.SplitN(tb.Name(), "/", 2)[0]
	args := []string{self, "-test.v", "-test.count=1"}
	if bench {
		args = append(args, "-test.run=^$", "-test.bench=^"+regexp.QuoteMeta(top)+"$", "-test.benchtime=1x")
	} else {
		args = append(args, "-test.run=^"+regexp.QuoteMeta(top)+"$")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns.Name}, args...)...)
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	tb.Logf("in-namespace half (%s):\n%s", ns.Name, out.String())
	if err != nil {
		tb.Fatalf("in-namespace half of %s failed: %v", top, err)
	}
	if !bench && !strings.Contains(out.String(), "--- PASS: "+top) {
		tb.Fatalf("in-namespace half of %s ran no test", top)
	}
	return out.String()
}

// startProcess starts argv inside ns, stopped by PID (SIGKILL, then wait) at cleanup.
func startProcess(tb testing.TB, ns *labns.NS, logPath string, argv ...string) *exec.Cmd {
	tb.Helper()
	cmd := ns.Command(argv...) // `ip netns exec` execs argv: the PID is the peer's
	f, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Stdin = nil
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %v: %v", argv, err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = f.Close()
		if tb.Failed() {
			b, _ := os.ReadFile(logPath)
			tb.Logf("%s log:\n%s", filepath.Base(argv[0]), b)
		}
	})
	return cmd
}

// simBMC is one OpenIPMI ipmi_sim instance whose chassis power and boot device live in files.
type simBMC struct {
	Addr     string // host
	Port     int
	Dir      string // holds power ("0"/"1") and boot ("none", "pxe", "default", "cdrom")
	User     string
	Password string
}

// chassisScript is ipmi_sim's chassis_control PROGRAM: `PROGRAM DEV get power boot` prints
// "power:N" / "boot:X"; `PROGRAM DEV set power 1 boot pxe` stores them. A file "boot-stuck" makes
// it ignore boot changes, a file "power-fail" makes power changes fail (a chassis fault); every set is appended to "log" (a BMC that accepts but does not apply an override).
const chassisScript = `#!/bin/sh
dir=$(dirname "$0")
shift
op=$1; shift
case $op in
get)
  for p in "$@"; do
    case $p in
      power) echo "power:$(cat "$dir/power")";;
      boot) echo "boot:$(cat "$dir/boot")";;
      *) echo "Invalid parameter: $p"; exit 1;;
    esac
  done;;
set)
  echo "$*" >> "$dir/log"
  while [ $# -gt 1 ]; do
    case $1 in
      power) [ -e "$dir/power-fail" ] && exit 1; echo "$2" > "$dir/power";;
      boot) [ -e "$dir/boot-stuck" ] || echo "$2" > "$dir/boot";;
      reset) ;;
      *) echo "Invalid parameter: $1"; exit 1;;
    esac
    shift 2
  done;;
*) exit 1;;
esac
`

// startIPMISim writes lan.conf, an .emu with `mc_enable 0x20`, and the chassis script, then runs
// ipmi_sim -n inside ns listening on addr:port.
func startIPMISim(tb testing.TB, ns *labns.NS, name, addr string, port int) simBMC {
	tb.Helper()
	bin := labns.RequireTool(tb, "ipmi_sim")
	dir := filepath.Join(tb.TempDir(), name)
	must(tb, os.MkdirAll(filepath.Join(dir, "state"), 0o700))
	s := simBMC{Addr: addr, Port: port, Dir: dir, User: "admin", Password: "s3cret-" + name}
	must(tb, os.WriteFile(filepath.Join(dir, "power"), []byte("0\n"), 0o600))
	must(tb, os.WriteFile(filepath.Join(dir, "boot"), []byte("none\n"), 0o600))
	must(tb, os.WriteFile(filepath.Join(dir, "chassis"), []byte(chassisScript), 0o700))
	lan := fmt.Sprintf(`name "%s"
set_working_mc 0x20
  startlan 1
    addr %s %d
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid a123456789abcdefa123456789abcdef
  endlan
  chassis_control "%s 0x20"
  user 2 true "%s" "%s" admin 10 none md2 md5 straight
`, name, addr, port, filepath.Join(dir, "chassis"), s.User, s.Password)
	must(tb, os.WriteFile(filepath.Join(dir, "lan.conf"), []byte(lan), 0o600))
	emu := "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nmc_enable 0x20\n"
	must(tb, os.WriteFile(filepath.Join(dir, "bmc.emu"), []byte(emu), 0o600))
	startProcess(tb, ns, filepath.Join(dir, "ipmi_sim.log"), bin, "-n", "-c", filepath.Join(dir, "lan.conf"),
		"-f", filepath.Join(dir, "bmc.emu"), "-s", filepath.Join(dir, "state"))
	return s
}

func (s simBMC) params(prefix string) map[string]string {
	return map[string]string{
		prefix + "addr": s.Addr, prefix + "port": fmt.Sprint(s.Port), prefix + "dir": s.Dir,
		prefix + "user": s.User, prefix + "password": s.Password,
	}
}

func simFromParams(p map[string]string, prefix string) simBMC {
	var port int
	fmt.Sscan(p[prefix+"port"], &port)
	return simBMC{Addr: p[prefix+"addr"], Port: port, Dir: p[prefix+"dir"], User: p[prefix+"user"], Password: p[prefix+"password"]}
}

// waitRMCP waits (bounded) until the BMC answers RMCP presence pings: ipmi_sim is up.
func waitRMCP(tb testing.TB, host string, port int) {
	tb.Helper()
	addr := fmt.Sprintf("%s:%d", host, port)
	for i := 0; i < 100; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := rmcpPing(ctx, addr)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatalf("ipmi_sim at %s never answered RMCP pings", addr)
}

func readTrim(tb testing.TB, path string) string {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

// waitFor polls cond (bounded: 100 × 100 ms) for a state a peer reaches on its own schedule.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	for range 100 {
		if cond() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	tb.Fatalf("timed out waiting for %s", what)
}
