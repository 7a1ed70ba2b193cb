// Package labns gives tests their own network namespaces and a uniform way to demand privileges and
// real peers (binaries such as skopeo, nft, ignition).
//
// A privileged test calls RequireRoot; a test that needs a real peer calls RequireTool. Outside CI a
// missing privilege or tool skips the test with a loud reason; under CI (CI=true) it fails, because CI
// runs as root with every peer installed and must never skip.
package labns

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// InCI reports whether the test runs under CI (environment variable CI=true), where skips are failures.
func InCI() bool { return os.Getenv("CI") == "true" }

// RequireRoot fails the test under CI, and skips it loudly elsewhere, unless the process runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if InCI() {
		t.Fatalf("PRIVILEGED TEST CANNOT RUN: %s needs root (CI runs as root; this is a CI setup error)", t.Name())
	}
	t.Skipf("SKIPPED PRIVILEGED TEST %s: needs root; run `sudo make test` to cover it", t.Name())
}

// RequireTool returns the absolute path of a binary the test drives as a real peer. A missing binary
// fails the test under CI and skips it loudly elsewhere; `make deps` installs every peer.
func RequireTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/lib/dracut/modules.d/30ignition"} {
		if c := filepath.Join(dir, name); isExec(c) {
			return c
		}
	}
	if InCI() {
		t.Fatalf("REAL PEER MISSING: %s needs %q on PATH (`make deps` installs it)", t.Name(), name)
	}
	t.Skipf("SKIPPED %s: real peer %q not installed; run `make deps`", t.Name(), name)
	return ""
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// NS is a named network namespace created with iproute2 (`ip netns add`) for one test, deleted by
// t.Cleanup. Its loopback is up.
type NS struct {
	Name string
	t    testing.TB
}

// New creates a namespace called "<prefix>-<random hex>" (prefix at most 6 characters keeps veth names
// under IFNAMSIZ when callers derive them from Name). It requires root.
func New(t testing.TB, prefix string) *NS {
	t.Helper()
	RequireRoot(t)
	reapOrphans(t)
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	ns := &NS{Name: prefix + "-" + hex.EncodeToString(b), t: t}
	if out, err := exec.Command("ip", "netns", "add", ns.Name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns.Name, err, out)
	}
	owner := filepath.Join(ownerDir, ns.Name)
	if err := os.MkdirAll(ownerDir, 0o700); err == nil {
		_ = os.WriteFile(owner, []byte(strconv.Itoa(os.Getpid())), 0o600)
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", ns.Name).Run()
		_ = os.Remove(owner)
	})
	ns.MustRun("ip", "link", "set", "lo", "up")
	return ns
}

// ownerDir records, per namespace New made, the PID of the test process that owns it.
const ownerDir = "/run/appliance-test-netns"

// reapOrphans removes what test processes killed mid-run (a timeout, a CI limit) left behind: every
// namespace recorded in ownerDir whose owner process is gone, after killing the processes still
// inside it (peers a test started there: ipmi_sim, sshd, keepalived). Namespaces of live test
// processes, and any namespace not recorded there, are never touched.
func reapOrphans(t testing.TB) {
	ents, err := os.ReadDir(ownerDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(ownerDir, e.Name()))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue // its test process still runs
		}
		out, _ := exec.Command("ip", "netns", "pids", e.Name()).Output()
		for _, f := range strings.Fields(string(out)) {
			if p, err := strconv.Atoi(f); err == nil && p > 1 {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		_ = exec.Command("ip", "netns", "del", e.Name()).Run()
		_ = os.Remove(filepath.Join(ownerDir, e.Name()))
		t.Logf("removed namespace %s left by killed test process %d", e.Name(), pid)
	}
}

// Path is the namespace's bind-mount path, usable with netns.GetFromPath or nftables.WithNetNSFd.
func (n *NS) Path() string { return "/run/netns/" + n.Name }

// Command returns an exec.Cmd that runs argv inside the namespace (`ip netns exec NAME argv...`).
func (n *NS) Command(argv ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name}, argv...)...)
}

// Run runs argv inside the namespace and returns its combined output.
func (n *NS) Run(argv ...string) (string, error) {
	var buf bytes.Buffer
	c := n.Command(argv...)
	c.Stdout, c.Stderr = &buf, &buf
	err := c.Run()
	return buf.String(), err
}

// MustRun is Run that fails the test on a non-zero exit.
func (n *NS) MustRun(argv ...string) string {
	n.t.Helper()
	out, err := n.Run(argv...)
	if err != nil {
		n.t.Fatalf("in netns %s: %v: %v\n%s", n.Name, argv, err, out)
	}
	return out
}

// Link connects two namespaces with a veth pair and assigns each end an address (CIDR notation, e.g.
// "10.77.0.1/24"). Interface names are returned as (nameInA, nameInB).
func Link(t testing.TB, a *NS, addrA string, b *NS, addrB string) (string, string) {
	t.Helper()
	ia, ib := "v"+a.Name[len(a.Name)-6:]+"a", "v"+b.Name[len(b.Name)-6:]+"b"
	cmds := [][]string{
		{"ip", "link", "add", ia, "netns", a.Name, "type", "veth", "peer", "name", ib, "netns", b.Name},
		{"ip", "-n", a.Name, "addr", "add", addrA, "dev", ia},
		{"ip", "-n", b.Name, "addr", "add", addrB, "dev", ib},
		{"ip", "-n", a.Name, "link", "set", ia, "up"},
		{"ip", "-n", b.Name, "link", "set", ib, "up"},
	}
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	return ia, ib
}

// String implements fmt.Stringer.
func (n *NS) String() string { return fmt.Sprintf("netns(%s)", n.Name) }

// KubernetesVersion is the version of the Kubernetes fixture: pkg/config's DefaultKubernetesVersion,
// which labns cannot import (pkg/config's own tests import labns), like the Makefile's
// KUBERNETES_VERSION and test/fixtures/build-bundle.sh's; test/fixtures/kubernetes'
// TestDefaultVersionEverywhere keeps them all equal.
const KubernetesVersion = "v1.37.2"

// FixtureCache is the directory `make fixtures` builds into: $APPLIANCE_CACHE, else
// /var/cache/appliance (.ci/run points it at a cache of its own that starts empty).
func FixtureCache() string {
	if c := os.Getenv("APPLIANCE_CACHE"); c != "" {
		return c
	}
	return "/var/cache/appliance"
}

// KubernetesBin returns the path of a binary of the Kubernetes fixture
// (FixtureCache()/kubernetes-KubernetesVersion/bin/NAME, test/fixtures/build-kubernetes.sh). Missing, it
// fails the test under CI and skips it loudly elsewhere.
func KubernetesBin(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(FixtureCache(), "kubernetes-"+KubernetesVersion, "bin", name)
	if isExec(p) {
		return p
	}
	msg := fmt.Sprintf("real %s missing at %s: `make fixtures` builds it (test/fixtures/build-kubernetes.sh %s)", name, p, KubernetesVersion)
	if InCI() {
		t.Fatalf("REAL PEER MISSING: %s: %s", t.Name(), msg)
	}
	t.Skipf("SKIPPED %s: %s", t.Name(), msg)
	return ""
}

// ContainerdVersion is the version of the container runtime fixture (Makefile CONTAINERD_VERSION,
// test/fixtures/build-bundle.sh), whose containerd and runc the bundle's repository carries.
const ContainerdVersion = "v2.3.7"

// ContainerdBin returns the path of a binary of the container runtime fixture
// (FixtureCache()/containerd-ContainerdVersion/bin/NAME: containerd, containerd-shim-runc-v2, ctr, runc;
// test/fixtures/build-containerd.sh). Missing, it fails the test under CI and skips it loudly elsewhere.
func ContainerdBin(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(FixtureCache(), "containerd-"+ContainerdVersion, "bin", name)
	if isExec(p) {
		return p
	}
	msg := fmt.Sprintf("real %s missing at %s: `make fixtures` builds it (test/fixtures/build-containerd.sh %s)", name, p, ContainerdVersion)
	if InCI() {
		t.Fatalf("REAL PEER MISSING: %s: %s", t.Name(), msg)
	}
	t.Skipf("SKIPPED %s: %s", t.Name(), msg)
	return ""
}

// MachineSession makes cmd, a TCG virtual machine (QEMU), the leader of a session of its own
// (setsid(2) at exec; any SysProcAttr already set, such as Pdeathsig, is kept).
//
// Why: this kernel groups tasks for CFS by session (CONFIG_SCHED_AUTOGROUP,
// /proc/sys/kernel/sched_autogroup_enabled = 1), and nice only weighs tasks within one group.
// make check runs its VM lane at nice 10 in the same session as its test lane, while
// systemd-nspawn's containers and ipmi_sim (set up by setsid) each get a session, so a group, of
// their own. Measured on the 2 cores here: a nice-10 spinner in the check's session beside two
// nice-0 spinners there and two spinners in sessions of their own got 3 % of a core, the others
// 31 % and 66 % each. A QEMU left in the check's session was starved that way: n2 (Redfish
// virtual media) took 15m29 to Ready beside suite-test where n1 (whose QEMU ipmi_sim starts in its
// own session) took 9m29, and the appliance ISO beside the Kubernetes e2e missed its 6-minute
// /healthz wait while still verifying the bundle. In a session of its own a VM gets a group's fair
// share, as n1's always had.
func MachineSession(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
}

// NotInShort marks t as one of make check's heavier proofs, which make test's quick loop (go test
// -short) leaves out: a test that boots a TCG VM or runs Kubernetes components, or holds a timer for
// a minute. what says which (e.g. "boots a TCG VM"). Under -short the test is skipped loudly; under CI
// (CI=true), which runs make check without -short, -short is a setup error and fails the test, as
// CI must never skip.
func NotInShort(t testing.TB, what string) {
	t.Helper()
	if !testing.Short() {
		return
	}
	if InCI() {
		t.Fatalf("%s %s and is not skipped under CI: run CI without -short (make check)", t.Name(), what)
	}
	t.Skipf("SKIPPED UNDER -short (make test): %s %s; make check runs it", t.Name(), what)
}
