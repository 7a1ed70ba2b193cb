package lab

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

// k8sPrefix keeps this test's lab apart from the other tests' labs ("labt", "labn") and a person's ("lab").
const k8sPrefix = "nk"

// k8sLabDir holds this test's credentials and node state; fixed (not t.TempDir) so that a rerun can
// stop what an interrupted run left behind.
var k8sLabDir = filepath.Join(os.TempDir(), "appliance-lab-"+k8sPrefix)

// keyctlNR is the keyctl(2) system call number per architecture (asm/unistd_64.h): runc calls
// keyctl(KEYCTL_JOIN_SESSION_KEYRING) for every container it starts.
var keyctlNR = map[string]int{"amd64": 250, "arm64": 219}

// globalSysctls are host-wide kernel settings kubelet (and kube-proxy) write; a lab node must never
// change them on the host (node-init.sh shadows them with private files). ip_forward is per network
// namespace: the node turns it on in its own namespace only.
var globalSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/netfilter/nf_conntrack_max",
	"net/ipv4/ip_forward",
}

func hostSysctls(t *testing.T) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, s := range globalSysctls {
		b, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			t.Fatalf("host sysctl: %v", err)
		}
		m[s] = strings.TrimSpace(string(b))
	}
	return m
}

type k8sEnv struct{ t *testing.T }

// cmd runs argv with this lab's environment (nspawn workers) and a bound; it returns combined output.
func (e k8sEnv) cmd(argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	c := exec.CommandContext(ctx, argv[0], argv[1:]...)
	c.Env = append(os.Environ(), "LAB_PREFIX="+k8sPrefix, "LAB_DIR="+k8sLabDir, "LAB_WORKER_KIND=nspawn")
	out, err := c.CombinedOutput()
	return string(out), err
}

func (e k8sEnv) must(argv ...string) string {
	e.t.Helper()
	out, err := e.cmd(argv...)
	if err != nil {
		e.t.Fatalf("%v: %v\n%s", argv, err, out)
	}
	return out
}

// onNode runs a shell script on a node as root over SSH (nodes.sh ssh: from P-boot, lab key, pinned host key).
func (e k8sEnv) onNode(t *testing.T, node, script string) string {
	t.Helper()
	out, err := e.cmd("bash", "nodes.sh", "ssh", node, script)
	if err != nil {
		t.Fatalf("on %s: %q: %v\n%s", node, script, err, out)
	}
	return strings.TrimSpace(out)
}

// leftovers lists what must be gone after `nodes.sh down`: processes in the node namespaces, mounts
// under the lab directory, and the nodes' cgroups (lab-nk-NODE in any hierarchy).
func (e k8sEnv) leftovers() []string {
	var left []string
	for _, n := range []string{"cp1", "w1"} {
		if _, err := os.Stat("/run/netns/" + k8sPrefix + "-" + n); err != nil {
			continue // namespace gone (lab.sh down): nothing can run in it
		}
		if out, _ := e.cmd("ip", "netns", "pids", k8sPrefix+"-"+n); strings.TrimSpace(out) != "" {
			left = append(left, "processes in "+n+": "+strings.Join(strings.Fields(out), ","))
		}
	}
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], k8sLabDir) {
				left = append(left, "mount "+fields[4])
			}
		}
		f.Close()
	}
	for _, dir := range nodeCgroupDirs(e.t, "cp1", "w1") {
		if _, err := os.Stat(dir); err == nil {
			left = append(left, "cgroup "+dir)
		}
	}
	return left
}

// nodeCgroupDirs is where nodes.sh puts each node: lab-nk-NODE right below this process's cgroup in
// every hierarchy (nodes.sh's supervisor inherits this process's cgroups).
func nodeCgroupDirs(t *testing.T, nodes ...string) []string {
	t.Helper()
	mounts := map[string]string{} // controller list ("" for cgroup2) -> mount point
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 {
			continue
		}
		switch g[0] {
		case "cgroup2":
			mounts[""] = f[4]
		case "cgroup":
			var ctrls []string
			for _, o := range strings.Split(g[2], ",") {
				if o != "rw" && o != "ro" && !strings.HasPrefix(o, "xattr") && !strings.HasPrefix(o, "release_agent") &&
					o != "clone_children" && o != "noprefix" && o != "cpuset_v2_mode" {
					ctrls = append(ctrls, o)
				}
			}
			mounts[strings.Join(ctrls, ",")] = f[4]
		}
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, line := range strings.Split(strings.TrimSpace(string(self)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		mp, ok := mounts[parts[1]]
		if !ok {
			continue
		}
		for _, n := range nodes {
			dirs = append(dirs, filepath.Join(mp, parts[2], "lab-"+k8sPrefix+"-"+n))
		}
	}
	return dirs
}

// TestNspawnNodesForKubernetes boots a lab whose control plane (cp1) and worker (w1, LAB_WORKER_KIND=
// nspawn) are systemd-nspawn hosts and checks, inside each, what kubelet, containerd and runc need on
// this host (LAB.md, "Kubernetes nodes in systemd-nspawn"): writable cgroup hierarchies, /dev/kmsg,
// the keyring system calls, a shared root mount, per-netns forwarding and bridge netfilter, global
// sysctls shadowed so that the host kernel never changes, the lab resolver and hosts file, SSH with
// the pinned host key, and a reboot of the worker. Then it stops everything and looks for leftovers.
func TestNspawnNodesForKubernetes(t *testing.T) {
	labns.RequireRoot(t)
	for _, tool := range []string{"ip", "systemd-nspawn", "debootstrap", "ssh", "ssh-keygen", "nsenter", "setsid",
		"findmnt", "flock"} {
		labns.RequireTool(t, tool)
	}
	nr, ok := keyctlNR[runtime.GOARCH]
	if !ok {
		t.Fatalf("no keyctl system call number known for %s: add it to keyctlNR", runtime.GOARCH)
	}
	e := k8sEnv{t}
	// Leftovers of an interrupted run: stop its nodes, then its namespaces.
	e.must("bash", "nodes.sh", "down")
	e.must("bash", "lab.sh", "down")
	if err := os.RemoveAll(k8sLabDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range []string{"cp1", "w1"} {
				b, _ := os.ReadFile(filepath.Join(k8sLabDir, "nodes", n, "console.log"))
				t.Logf("console of %s:\n%s", n, b)
			}
		}
		if out, err := e.cmd("bash", "nodes.sh", "down"); err != nil {
			t.Errorf("cleanup: nodes.sh down: %v\n%s", err, out)
		}
		if out, err := e.cmd("bash", "lab.sh", "down"); err != nil {
			t.Errorf("cleanup: lab.sh down: %v\n%s", err, out)
		}
		if left := e.leftovers(); len(left) == 0 {
			_ = os.RemoveAll(k8sLabDir)
		} else {
			t.Errorf("cleanup left behind: %v", left)
		}
	})
	beforeNet := rootNetState(t)
	beforeSysctl := hostSysctls(t)

	e.must("bash", "lab.sh", "up", "1", "1")
	start := time.Now()
	out := e.must("bash", "nodes.sh", "up")
	t.Logf("nodes.sh up (cp1 + nspawn w1 to sshd-ready) took %v:\n%s", time.Since(start), out)
	status := e.must("bash", "nodes.sh", "status")
	for _, want := range []string{"cp1: running", "ssh root@10.100.0.11", "w1: running", "ssh root@10.100.0.21"} {
		if !strings.Contains(status, want) {
			t.Errorf("status lacks %q:\n%s", want, status)
		}
	}
	if _, err := os.Stat("/run/netns/" + k8sPrefix + "-bmc1"); err == nil {
		t.Errorf("an nspawn worker got a BMC namespace %s-bmc1", k8sPrefix)
	}

	for _, tc := range []struct{ node, ip string }{{"cp1", "10.100.0.11"}, {"w1", "10.100.0.21"}} {
		t.Run(tc.node, func(t *testing.T) {
			t.Run("nspawn flags and own cgroup", func(t *testing.T) {
				pidB, err := os.ReadFile(filepath.Join(k8sLabDir, "nodes", tc.node, "nspawn.pid"))
				if err != nil {
					t.Fatal(err)
				}
				pid := strings.TrimSpace(string(pidB))
				cmdline, _ := os.ReadFile("/proc/" + pid + "/cmdline")
				args := strings.Split(string(cmdline), "\x00")
				for _, want := range []string{"--capability=all", "--system-call-filter=@keyring", "--bind=/dev/kmsg",
					"/usr/local/sbin/lab-node-init"} {
					if !slices.Contains(args, want) {
						t.Errorf("systemd-nspawn %s runs without %s: %q", pid, want, args)
					}
				}
				environ, _ := os.ReadFile("/proc/" + pid + "/environ")
				if !slices.Contains(strings.Split(string(environ), "\x00"), "SYSTEMD_NSPAWN_API_VFS_WRITABLE=network") {
					t.Errorf("systemd-nspawn %s runs without SYSTEMD_NSPAWN_API_VFS_WRITABLE=network", pid)
				}
				// nspawn may add sub-cgroups of its own (supervisor, payload) below the node's cgroup.
				own := "/lab-" + k8sPrefix + "-" + tc.node
				cg, _ := os.ReadFile("/proc/" + pid + "/cgroup")
				for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
					if !strings.HasSuffix(line, own) && !strings.Contains(line, own+"/") {
						t.Errorf("systemd-nspawn %s is not in the node's own cgroup %s: %q", pid, own, line)
					}
				}
			})
			t.Run("identity, resolver, hosts", func(t *testing.T) {
				got := e.onNode(t, tc.node, "hostname; cat /etc/resolv.conf; grep -c . /etc/resolv.conf; "+
					"grep -xF \"$(printf '%s\\t%s' "+tc.ip+" "+tc.node+")\" /etc/hosts; ip -4 -br addr show eth0")
				lines := strings.Split(got, "\n")
				if len(lines) != 5 || lines[0] != tc.node || lines[1] != "nameserver 10.100.0.2" || lines[2] != "1" ||
					lines[3] != tc.ip+"\t"+tc.node || !strings.Contains(lines[4], tc.ip+"/24") {
					t.Errorf("got %q; want hostname, only `nameserver 10.100.0.2`, /etc/hosts mapping %s to %s, eth0 %s",
						got, tc.node, tc.ip, tc.ip)
				}
			})
			t.Run("cgroup hierarchies writable", func(t *testing.T) {
				// Every hierarchy the node sees; kubelet's systemd driver and runc create cgroups in each.
				got := e.onNode(t, tc.node, `n=0; for m in $(findmnt -rn -t cgroup,cgroup2 -o TARGET); do
					n=$((n+1)); mkdir "$m/lab-check" && rmdir "$m/lab-check" || echo "FAIL $m"; done; echo "checked $n"`)
				if strings.Contains(got, "FAIL") || !strings.Contains(got, "checked ") || strings.Contains(got, "checked 0") {
					t.Errorf("mkdir in the cgroup hierarchies: %s", got)
				}
				if !strings.Contains(e.onNode(t, tc.node, "findmnt -rn -o TARGET /sys/fs/cgroup/memory"), "memory") {
					t.Errorf("no memory cgroup hierarchy in the node")
				}
			})
			t.Run("kmsg readable", func(t *testing.T) {
				if got := e.onNode(t, tc.node, "dd if=/dev/kmsg bs=8192 count=1 iflag=nonblock status=none | wc -c"); got == "0" {
					t.Errorf("read 0 bytes from /dev/kmsg")
				}
			})
			t.Run("keyring syscalls allowed", func(t *testing.T) {
				// perl-base is Essential in Debian: syscall() without any extra package in the node.
				got := e.onNode(t, tc.node, fmt.Sprintf(`perl -e '$r = syscall(%d, 1, 0); print $r < 0 ? "errno ".($!+0)." $!" : "serial $r"'; echo; grep '^Seccomp:' /proc/self/status`, nr))
				if !strings.HasPrefix(got, "serial ") {
					t.Errorf("keyctl(KEYCTL_JOIN_SESSION_KEYRING) in the node: %q; want a keyring serial (runc needs it)", got)
				}
				if !strings.Contains(got, "Seccomp:\t2") {
					t.Errorf("node processes run without a seccomp filter (%q): nspawn's filter with @keyring added is expected", got)
				}
			})
			t.Run("root mount shared", func(t *testing.T) {
				if got := e.onNode(t, tc.node, "findmnt -no PROPAGATION /"); got != "shared" {
					t.Errorf("propagation of / is %q, want shared", got)
				}
			})
			t.Run("per-netns sysctls", func(t *testing.T) {
				got := e.onNode(t, tc.node, "cat /proc/sys/net/ipv4/ip_forward /proc/sys/net/bridge/bridge-nf-call-iptables /proc/sys/net/bridge/bridge-nf-call-ip6tables")
				if got != "1\n1\n1" {
					t.Errorf("ip_forward, bridge-nf-call-iptables, -ip6tables in the node: %q, want 1 1 1", got)
				}
				if host := hostSysctls(t)["net/ipv4/ip_forward"]; host != beforeSysctl["net/ipv4/ip_forward"] {
					t.Errorf("root namespace ip_forward changed: %s -> %s", beforeSysctl["net/ipv4/ip_forward"], host)
				}
			})
			t.Run("global sysctl writes stay private", func(t *testing.T) {
				want := "1"
				if beforeSysctl["vm/overcommit_memory"] == "1" {
					want = "0"
				}
				script := "echo " + want + " >/proc/sys/vm/overcommit_memory && echo 10 >/proc/sys/kernel/panic && " +
					"echo 1000001 >/proc/sys/kernel/keys/root_maxkeys && cat /proc/sys/vm/overcommit_memory /proc/sys/kernel/panic"
				if got := e.onNode(t, tc.node, script); got != want+"\n10" {
					t.Errorf("node reads back %q after its writes, want %q", got, want+"\n10")
				}
				for k, v := range hostSysctls(t) {
					if v != beforeSysctl[k] {
						t.Errorf("host %s changed by a node write: %s -> %s", k, beforeSysctl[k], v)
					}
				}
			})
		})
	}

	t.Run("reboot nspawn worker", func(t *testing.T) {
		bootID := func() string { return e.onNode(t, "w1", "cat /proc/sys/kernel/random/boot_id") }
		first := bootID()
		e.must("bash", "nodes.sh", "reboot", "w1")
		if second := bootID(); second == first || second == "" {
			t.Errorf("boot id after reboot %q, before %q: want a new boot", second, first)
		}
		if got := e.onNode(t, "w1", "cat /proc/sys/net/ipv4/ip_forward; findmnt -no PROPAGATION /"); got != "1\nshared" {
			t.Errorf("after reboot: ip_forward and / propagation %q, want 1 and shared", got)
		}
	})

	t.Run("down leaves nothing behind", func(t *testing.T) {
		e.must("bash", "nodes.sh", "down")
		if left := e.leftovers(); len(left) > 0 {
			t.Errorf("after nodes.sh down: %v", left)
		}
		if st := e.must("bash", "nodes.sh", "status"); !strings.Contains(st, "cp1: stopped") || !strings.Contains(st, "w1: stopped") {
			t.Errorf("status after down: %q, want cp1 and w1 stopped", st)
		}
	})

	if after := hostSysctls(t); fmt.Sprint(after) != fmt.Sprint(beforeSysctl) {
		t.Errorf("host sysctls changed:\nbefore %v\nafter  %v", beforeSysctl, after)
	}
	if after := rootNetState(t); after != beforeNet {
		t.Errorf("root namespace network changed:\nbefore:\n%s\nafter:\n%s", beforeNet, after)
	}
}

// TestNodesLabDirPerPrefix: without LAB_DIR, each lab prefix gets its own directory (the default
// prefix keeps /var/lib/appliance-lab); a LAB_DIR that holds another lab's nodes is left alone.
func TestNodesLabDirPerPrefix(t *testing.T) {
	labns.RequireRoot(t)
	run := func(env []string, args ...string) (string, error) {
		c := exec.Command("bash", append([]string{"nodes.sh"}, args...)...)
		c.Env = append(os.Environ(), env...)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	env := func(kv ...string) []string {
		var out []string
		for _, e := range os.Environ() { // an inherited LAB_DIR would hide the default
			if !strings.HasPrefix(e, "LAB_DIR=") && !strings.HasPrefix(e, "LAB_PREFIX=") {
				out = append(out, e)
			}
		}
		return append(out, kv...)
	}
	for prefix, want := range map[string]string{"lab": "LAB_DIR=/var/lib/appliance-lab ", "nz": "LAB_DIR=/var/lib/appliance-lab-nz "} {
		c := exec.Command("bash", "nodes.sh", "usage")
		c.Env = env("LAB_PREFIX=" + prefix)
		out, _ := c.CombinedOutput()
		if !strings.Contains(string(out), want) {
			t.Errorf("prefix %s: usage says %q, want %q", prefix, out, want)
		}
	}

	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "nodes", "cp1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nodes", ".prefix"), []byte("other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run([]string{"LAB_PREFIX=nz", "LAB_DIR=" + dir}, "status"); err != nil || !strings.Contains(out, "holds lab 'other'") {
		t.Errorf("status on another lab's LAB_DIR: %v %q", err, out)
	}
	if out, err := run([]string{"LAB_PREFIX=nz", "LAB_DIR=" + dir}, "down"); err != nil || !strings.Contains(out, "nothing of lab nz") {
		t.Errorf("down on another lab's LAB_DIR: %v %q", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "nodes", "cp1")); err != nil {
		t.Errorf("down removed another lab's node directory: %v", err)
	}
	if out, err := run([]string{"LAB_PREFIX=nz", "LAB_WORKER_KIND=bare"}, "status"); err == nil || !strings.Contains(out, "must be vm or nspawn") {
		t.Errorf("LAB_WORKER_KIND=bare accepted: %v %q", err, out)
	}
}
