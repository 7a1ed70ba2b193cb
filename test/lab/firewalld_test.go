package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/test/labns"
)

// The firewalld lab: a Debian 12 node container (systemd-nspawn, the lab's node rootfs from
// test/fixtures/build-rootfs.sh) booted with firewalld 1.3.3 unmasked under its systemd, in a network
// namespace linked to a peer namespace holding a node-network address and a stranger's. The test drives the
// firewall package's firewalld backend over the container's own system bus
// (/proc/<container init>/root/run/dbus/system_bus_socket), runs firewall-cmd and systemctl inside with
// nsenter, and sends real packets from the peer namespace.

// The firewalld lab sends real packets with labns's probe (test/labns/probe.go), plus one mode of its
// own, choose-apply ROLE: inside the container, what the bootstrap phase and hostagent do (Choose, Apply).
func TestMain(m *testing.M) {
	labns.ProbeMain(map[string]func([]string) int{"choose-apply": fwdChooseApply})
	os.Exit(m.Run())
}

func fwdChooseApply(args []string) int {
	fail := func(err error) int { fmt.Println("error:", err); return 1 }
	if len(args) != 2 {
		return fail(errors.New("choose-apply ROLE"))
	}
	spec := fwdSpec(firewall.Role(args[1]))
	ctx := context.Background()
	b, why, err := firewall.Choose(ctx, firewall.ChooseOptions{})
	if err != nil {
		return fail(err)
	}
	start := time.Now()
	changed, err := b.Apply(ctx, spec)
	if err != nil {
		return fail(err)
	}
	calls, writes := int64(-1), int64(-1)
	if f, ok := b.(*firewall.Firewalld); ok {
		calls, writes = f.Calls(), f.Writes()
	}
	fmt.Printf("backend=%s changed=%v calls=%d writes=%d took=%v why=%q detail=%q\n", b.Name(), changed, calls, writes,
		time.Since(start).Round(time.Millisecond), why, firewall.Describe(b, spec))
	return 0
}

// Topology (as firewall/packets_test.go): the node 10.77.0.1 (+ fresh addresses .3-.7 and .9 for VRRP cases
// needing fresh conntrack), the peer namespace holding 10.77.0.2 (node network 10.77.0.0/29, VRRP peer) and
// 10.77.0.100 (outside). IPv6: fd00:77::/64 is a node network, fd00:78::/64 on the same link is not.
const (
	fwdNodeIP      = "10.77.0.1"
	fwdPeerIP      = "10.77.0.2"
	fwdStrangerIP  = "10.77.0.100"
	fwdNodeIP6     = "fd00:77::1"
	fwdPeerIP6     = "fd00:77::2"
	fwdNodeIP6b    = "fd00:78::1"
	fwdStrangerIP6 = "fd00:78::2"
)

func fwdSpec(roles ...firewall.Role) firewall.Spec {
	return firewall.Spec{
		Roles:        roles,
		NodeNetworks: []netip.Prefix{netip.MustParsePrefix("10.77.0.0/29"), netip.MustParsePrefix("fd00:77::/64")},
		VRRPPeers:    []netip.Addr{netip.MustParseAddr(fwdPeerIP)},
	}
}

func fwdNodeSpec() firewall.Spec {
	return fwdSpec(firewall.RoleControlPlane, firewall.RoleEtcd, firewall.RoleWorker)
}

// fwdNet is the node and peer namespaces.
type fwdNet struct{ node, peer *labns.NS }

func newFwdNet(t *testing.T) fwdNet {
	t.Helper()
	node, peer := labns.New(t, "fwdn"), labns.New(t, "fwdp")
	ia, ib := labns.Link(t, node, fwdNodeIP+"/24", peer, fwdPeerIP+"/24")
	peer.MustRun("ip", "addr", "add", fwdStrangerIP+"/24", "dev", ib)
	for _, a := range []string{"10.77.0.3/24", "10.77.0.4/24", "10.77.0.5/24", "10.77.0.6/24", "10.77.0.7/24", "10.77.0.9/24"} {
		node.MustRun("ip", "addr", "add", a, "dev", ia)
	}
	for _, a := range []string{fwdNodeIP6, fwdNodeIP6b} {
		node.MustRun("ip", "addr", "add", a+"/64", "dev", ia, "nodad")
	}
	for _, a := range []string{fwdPeerIP6, fwdStrangerIP6} {
		peer.MustRun("ip", "addr", "add", a+"/64", "dev", ib, "nodad")
	}
	return fwdNet{node, peer}
}

// fwdProbe is one connection attempt of the open/closed table.
type fwdProbe struct {
	src, dst string
	port     uint16
	fromNode bool // src is inside the node networks
}

func (p fwdProbe) String() string {
	return fmt.Sprintf("%s -> %s", p.src, net.JoinHostPort(p.dst, strconv.Itoa(int(p.port))))
}

// fwdPorts are listened on in the node namespace: every TCP port of the table's roles plus one outside it.
var fwdPorts = []uint16{22, 2379, 2380, 6443, 8443, 10250, 10256, 10257, 10259, 30080, 9999}

func fwdProbes() []fwdProbe {
	var out []fwdProbe
	for _, port := range fwdPorts {
		out = append(out, fwdProbe{fwdPeerIP, fwdNodeIP, port, true}, fwdProbe{fwdStrangerIP, fwdNodeIP, port, false})
	}
	for _, port := range []uint16{22, 8443, 10250, 9999} {
		out = append(out, fwdProbe{fwdPeerIP6, fwdNodeIP6, port, true}, fwdProbe{fwdStrangerIP6, fwdNodeIP6b, port, false})
	}
	return out
}

// fwdExpect is the port table's answer: open when a TCP entry of one of the spec's roles covers the port and
// admits the source (anywhere, or the node networks for a source inside them).
func fwdExpect(s firewall.Spec, p fwdProbe) bool {
	for _, e := range firewall.Ports(s.HTTPSPort, s.APIPort) {
		if e.Protocol != firewall.ProtoTCP || !slices.Contains(s.Roles, e.Role) || p.port < e.From || p.port > e.To {
			continue
		}
		if e.Source == firewall.SourceAnywhere || (e.Source == firewall.SourceNodeNetworks && p.fromNode) {
			return true
		}
	}
	return false
}

// fwdCheckTable dials every probe from the peer namespace (concurrently) and compares with the port table.
// It returns the number of open probes.
func fwdCheckTable(t *testing.T, n fwdNet, s firewall.Spec, label string) int {
	t.Helper()
	probes := fwdProbes()
	got := make([]string, len(probes))
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, p := range probes {
		cmd := labns.ProbeCommand(t, n.peer, "dial", p.src, net.JoinHostPort(p.dst, strconv.Itoa(int(p.port))))
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{} // at most 8 at once: a small machine
			defer func() { <-sem }()
			out, err := cmd.CombinedOutput()
			got[i] = strings.TrimSpace(string(out))
			if err != nil {
				got[i] = "helper failed: " + err.Error() + ": " + got[i]
			}
		}()
	}
	wg.Wait()
	open := 0
	for i, p := range probes {
		if got[i] == "open" {
			open++
		}
		if want := fwdExpect(s, p); (got[i] == "open") != want {
			t.Errorf("%s: %s = %q, want open=%v (roles %v)", label, p, got[i], want, s.Roles)
		}
	}
	return open
}

// ---------------------------------------------------------------------------------------------------------
// The node container.

type fwdContainer struct {
	t       *testing.T
	root    string // the overlay mount: the container's /
	init    int    // PID of the container's systemd
	bus     string // D-Bus address of the container's system bus, reachable from here
	nspawn  *exec.Cmd
	stopped chan struct{}
}

// fwdRootfs returns the lab's node rootfs, building it when missing (as test/fixtures tests do).
func fwdRootfs(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("bash", "../fixtures/build-rootfs.sh").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("test/fixtures/build-rootfs.sh (make fixtures builds it): %v\n%s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	root := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(root, "usr/sbin/firewalld")); err != nil {
		t.Fatalf("the node rootfs %s has no firewalld (an older rootfs version?): %v", root, err)
	}
	return root
}

const nspawnRun = "/run/systemd/nspawn"

// fwdNspawnRun makes /run/systemd/nspawn a tmpfs as nodes.sh does (systemd-nspawn refuses otherwise), with
// nodes.sh's mark, and releases it at the end when it mounted it and no container uses it.
func fwdNspawnRun(t *testing.T) {
	t.Helper()
	if err := os.MkdirAll(nspawnRun, 0o755); err != nil {
		t.Fatal(err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(nspawnRun, &st); err != nil {
		t.Fatal(err)
	}
	const tmpfsMagic = 0x01021994
	if st.Type == tmpfsMagic {
		return
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "mode=0755,size=16m", "appliance-lab-nspawn", nspawnRun).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs on %s: %v\n%s", nspawnRun, err, out)
	}
	if err := os.WriteFile(filepath.Join(nspawnRun, ".mounted-by-appliance-lab"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("mounted a tmpfs on %s (systemd-nspawn requires one)", nspawnRun)
	t.Cleanup(func() {
		for _, d := range []string{"propagate", "unix-export"} {
			if es, _ := os.ReadDir(filepath.Join(nspawnRun, d)); len(es) > 0 {
				return
			}
		}
		_ = exec.Command("umount", nspawnRun).Run()
	})
}

// fwdCgroups returns, per cgroup hierarchy this process is in, a directory below its cgroup for the container
// (as nodes.sh ct_cgroups does).
func fwdCgroups(t *testing.T, name string) []string {
	t.Helper()
	mounts := map[string]string{} // controllers ("" for cgroup2) -> mount point
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(mi), "\n") {
		left, right, ok := strings.Cut(l, " - ")
		if !ok {
			continue
		}
		lf, rf := strings.Fields(left), strings.Fields(right)
		if len(lf) < 5 || len(rf) < 3 {
			continue
		}
		switch rf[0] {
		case "cgroup2":
			mounts[""] = lf[4]
		case "cgroup":
			for _, o := range strings.Split(rf[2], ",") {
				if o != "rw" && o != "ro" && !strings.HasPrefix(o, "relatime") {
					mounts[o] = lf[4]
				}
			}
		}
	}
	cg, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		ctrl := strings.Split(parts[1], ",")[0]
		if m, ok := mounts[ctrl]; ok {
			out = append(out, filepath.Join(m, parts[2], name))
		}
	}
	return out
}

// bootFirewalldNode boots the node rootfs with firewalld unmasked and waits until firewalld answers on the
// container's bus. Everything is undone by t.Cleanup.
func bootFirewalldNode(t *testing.T, n fwdNet) *fwdContainer {
	t.Helper()
	rootfs := fwdRootfs(t)
	fwdNspawnRun(t)
	dir := t.TempDir()
	c := &fwdContainer{t: t, root: filepath.Join(dir, "root"), stopped: make(chan struct{})}
	for _, d := range []string{"upper", "work", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("mount", "-t", "overlay", "overlay-fwd", "-o",
		fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", rootfs, dir, dir), c.root).CombinedOutput(); err != nil {
		t.Fatalf("mount overlay: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", c.root).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", c.root, err, out)
		}
	})
	// firewalld on (the rootfs masks it), sshd off (not needed here).
	units := filepath.Join(c.root, "etc/systemd/system")
	must := func(err error) {
		t.Helper()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	must(os.Remove(filepath.Join(units, "firewalld.service")))
	must(os.MkdirAll(filepath.Join(units, "multi-user.target.wants"), 0o755))
	must(os.Remove(filepath.Join(units, "multi-user.target.wants/firewalld.service")))
	must(os.Symlink("/lib/systemd/system/firewalld.service", filepath.Join(units, "multi-user.target.wants/firewalld.service")))
	must(os.Remove(filepath.Join(units, "multi-user.target.wants/ssh.service")))
	must(os.Symlink("/dev/null", filepath.Join(units, "ssh.service")))
	// The test binary, for the choose-apply helper run inside.
	exe, err := os.Executable()
	must(err)
	b, err := os.ReadFile(exe)
	must(err)
	must(os.WriteFile(filepath.Join(c.root, "usr/local/bin/fwdtest"), b, 0o755))

	machine := "fwd-" + strings.TrimPrefix(n.node.Name, "fwdn-")
	cgroups := fwdCgroups(t, "appliance-"+machine)
	script := `set -e
for d in "$@"; do
	mkdir -p "$d"
	for f in cpuset.cpus cpuset.mems; do
		if [ -e "$d/$f" ] && [ -z "$(cat "$d/$f")" ]; then cat "$(dirname "$d")/$f" >"$d/$f"; fi
	done
	echo $$ >"$d/cgroup.procs"
done
exec systemd-nspawn --quiet --directory="$ROOT" --machine="$MACHINE" --register=no --keep-unit --console=pipe \
	--link-journal=no --resolv-conf=off --timezone=off --capability=all --kill-signal=SIGRTMIN+3 \
	--network-namespace-path="$NETNS" --boot`
	cmd := exec.Command("bash", append([]string{"-c", script, "nspawn"}, cgroups...)...)
	cmd.Env = append(os.Environ(), "ROOT="+c.root, "MACHINE="+machine, "NETNS="+n.node.Path(), "SYSTEMD_NSPAWN_API_VFS_WRITABLE=network")
	console, err := os.Create(filepath.Join(dir, "console.log"))
	must(err)
	cmd.Stdout, cmd.Stderr = console, console
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.nspawn = cmd
	go func() { _ = cmd.Wait(); close(c.stopped) }()
	t.Cleanup(func() {
		// SIGTERM to systemd-nspawn powers the container off; SIGKILL only past a bound.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.stopped:
		case <-time.After(30 * time.Second):
			t.Errorf("container %s still running 30 s after SIGTERM: SIGKILL", machine)
			if c.init > 0 {
				_ = syscall.Kill(c.init, syscall.SIGKILL)
			}
			_ = cmd.Process.Kill()
			<-c.stopped
		}
		// The container's systemd made sub-cgroups: remove depth first (cgroup directories go with rmdir).
		for _, cg := range cgroups {
			var dirs []string
			_ = filepath.WalkDir(cg, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				if err := os.Remove(dirs[i]); err != nil {
					t.Errorf("remove cgroup %s: %v", dirs[i], err)
				}
			}
		}
		_ = os.RemoveAll(filepath.Join(nspawnRun, "propagate", machine))
		_ = os.RemoveAll(filepath.Join(nspawnRun, "unix-export", machine))
	})
	// The container's init: systemd-nspawn's child whose root is the overlay.
	deadline := time.Now().Add(bound)
	for c.init == 0 {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(console.Name())
			t.Fatalf("container did not start:\n%s", log)
		}
		select {
		case <-c.stopped:
			log, _ := os.ReadFile(console.Name())
			t.Fatalf("systemd-nspawn exited:\n%s", log)
		case <-time.After(100 * time.Millisecond):
		}
		// nspawn's first child is at first its own outer child, which sets the container up and exits once
		// the inner child runs; only the child that has exec'd the container's systemd is its init. Taking
		// the first child at any moment caught the outer one under load (CI: "stat of /proc/PID/ns/user
		// failed" for 90 s).
		kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
		for _, f := range strings.Fields(string(kids)) {
			comm, _ := os.ReadFile("/proc/" + f + "/comm")
			if strings.TrimSpace(string(comm)) == "systemd" {
				c.init, _ = strconv.Atoi(f)
				break
			}
		}
	}
	c.bus = fmt.Sprintf("unix:path=/proc/%d/root/run/dbus/system_bus_socket", c.init)
	c.waitFirewalld(true)
	return c
}

// waitFirewalld waits until the chooser, looking at the container's bus, sees firewalld running (up) or not.
func (c *fwdContainer) waitFirewalld(up bool) {
	c.t.Helper()
	const limit = 90 * time.Second // a bound on a hang, not a speed expectation
	deadline := time.Now().Add(limit)
	var why string
	for time.Now().Before(deadline) {
		b, w, err := firewall.Choose(context.Background(), firewall.ChooseOptions{BusAddress: c.bus, Timeout: 2 * time.Second})
		why = w
		if err != nil {
			why = err.Error()
		}
		if err == nil && (b.Name() == firewall.BackendFirewalld) == up {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.t.Fatalf("firewalld running=%v not reached within %v: %s\n%s", up, limit, why, c.exec("systemctl", "status", "--no-pager", "firewalld"))
}

// exec runs argv inside the container (all its namespaces) and returns its combined output.
func (c *fwdContainer) exec(argv ...string) string {
	out, _ := c.run(argv...)
	return out
}

func (c *fwdContainer) run(argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", append([]string{"-t", strconv.Itoa(c.init), "-a"}, argv...)...).CombinedOutput()
	return string(out), err
}

func (c *fwdContainer) must(argv ...string) string {
	c.t.Helper()
	out, err := c.run(argv...)
	if err != nil {
		c.t.Fatalf("in the container: %v: %v\n%s", argv, err, out)
	}
	return out
}

// TestFirewalldBackend proves the firewalld backend on a real firewalld (Debian 12, 1.3.3) under systemd in a
// node container: our nftables table cannot open a port firewalld rejects; the firewalld backend opens exactly
// the port table (the same expectation TestNFTablesOpenSet checks for the nftables backend), VRRP only from the
// peer, resets a source's connections past the per-source cap from its table beside firewalld's (table inet
// appliance-conncap), survives firewall-cmd --reload and a firewalld restart (the cap table too: InPlace), a
// second Apply writes nothing, Remove leaves nothing; a zone of the same name made by someone else, a node
// network bound to another zone, a stopped or hung firewalld and a missing bus are clear errors with nothing
// half applied. The bootstrap-host variant runs the chooser itself inside the container (the system bus path
// production takes).
func TestFirewalldBackend(t *testing.T) {
	labns.RequireRoot(t)
	for _, tool := range []string{"ip", "systemd-nspawn", "debootstrap", "nsenter", "mount"} {
		labns.RequireTool(t, tool)
	}
	n := newFwdNet(t)
	labns.StartProbe(t, n.node, fwdListenArgs()...)
	c := bootFirewalldNode(t, n)
	t.Logf("container up: init pid %d, firewalld %s", c.init, strings.TrimSpace(c.exec("firewall-cmd", "--version")))
	ctx := context.Background()
	spec := fwdNodeSpec()
	kubelet := fwdProbe{fwdPeerIP, fwdNodeIP, 10250, true}
	dial := func(p fwdProbe) string {
		return labns.ProbeOnce(t, n.peer, "dial", p.src, net.JoinHostPort(p.dst, strconv.Itoa(int(p.port))))
	}

	t.Run("firewalld rejects what our nftables table accepts", func(t *testing.T) {
		nft := &firewall.NFTables{NetNSPath: n.node.Path()}
		if _, err := nft.Apply(ctx, spec); err != nil {
			t.Fatal(err)
		}
		if got := dial(kubelet); got == "open" {
			t.Errorf("%s open with only the nftables backend under firewalld: the premise of the firewalld backend is wrong", kubelet)
		}
		if err := nft.Remove(ctx); err != nil {
			t.Fatal(err)
		}
	})

	// NetNSPath: the connection cap table goes where firewalld runs, the node's namespace (never this
	// process's, the root namespace).
	fw := &firewall.Firewalld{BusAddress: c.bus, NetNSPath: n.node.Path()}
	t.Run("apply, then a second apply writes nothing", func(t *testing.T) {
		start := time.Now()
		changed, err := fw.Apply(ctx, spec)
		first := time.Since(start)
		if err != nil || !changed {
			t.Fatalf("first Apply = %v, %v", changed, err)
		}
		calls1, writes1 := fw.Calls(), fw.Writes()
		start = time.Now()
		changed, err = fw.Apply(ctx, spec)
		second := time.Since(start)
		if err != nil || changed {
			t.Fatalf("second Apply = %v, %v; want unchanged", changed, err)
		}
		if w := fw.Writes() - writes1; w != 0 {
			t.Errorf("second Apply made %d writes, want 0", w)
		}
		t.Logf("firewalld Apply, node roles %v (2 node networks, 1 VRRP peer): first %v, %d D-Bus calls (%d writes); second %v, %d calls, %d writes",
			spec.Roles, first.Round(time.Millisecond), calls1, writes1, second.Round(time.Millisecond),
			fw.Calls()-calls1, fw.Writes()-writes1)
		if ok, err := fw.InPlace(spec); err != nil || !ok {
			t.Errorf("InPlace = %v, %v; want true", ok, err)
		}
		if out := c.exec("firewall-cmd", "--info-zone=appliance"); !strings.Contains(out, "10.77.0.0/29") {
			t.Errorf("firewall-cmd --info-zone=appliance lacks the node network:\n%s", out)
		}
	})

	t.Run("open set equals the port table", func(t *testing.T) {
		if fwdCheckTable(t, n, spec, "firewalld") == 0 {
			t.Error("nothing open: the closed checks prove nothing")
		}
	})

	t.Run("per-source connection cap beside firewalld", func(t *testing.T) {
		// The node roles serve cluster-mirror (5443), capped: firewalld opens it from the node networks, the
		// backend's own table inet appliance-conncap resets a source's connections past the cap.
		if out := n.node.MustRun("nft", "list", "table", "inet", firewall.DefaultConnCapTable); !strings.Contains(out, fmt.Sprintf("ct count over %d", firewall.ConnsPerSource)) {
			t.Fatalf("table inet %s lacks the cap:\n%s", firewall.DefaultConnCapTable, out)
		}
		srv := labns.StartHolder(t, n.node, fmt.Sprintf(":%d", firewall.ClusterMirrorPort))
		dst := net.JoinHostPort(fwdNodeIP, strconv.Itoa(int(firewall.ClusterMirrorPort)))
		for i, d := range labns.DialN(t, n.peer, fwdPeerIP, dst, firewall.ConnsPerSource+2) {
			if under := i < firewall.ConnsPerSource; under && d.Err != nil || !under && !d.Refused() {
				t.Errorf("%s -> %s: connection %d (cap %d): %v", fwdPeerIP, dst, i+1, firewall.ConnsPerSource, d.Err)
			}
		}
		srv.WaitAccepted(t, firewall.ConnsPerSource)
	})

	t.Run("VRRP only from the peer", func(t *testing.T) {
		fwdVRRP(t, n, c, fw, spec, []string{"10.77.0.3", "10.77.0.4", "10.77.0.5"})
	})

	t.Run("survives firewall-cmd --reload and a firewalld restart", func(t *testing.T) {
		c.must("firewall-cmd", "--reload")
		fwdStillThere(t, n, fw, spec, "after firewall-cmd --reload")
		c.must("systemctl", "restart", "firewalld")
		c.waitFirewalld(true)
		fwdStillThere(t, n, fw, spec, "after systemctl restart firewalld")
	})

	t.Run("another spec updates runtime and permanent in place", func(t *testing.T) {
		w0 := fw.Writes()
		worker := fwdSpec(firewall.RoleWorker)
		if changed, err := fw.Apply(ctx, worker); err != nil || !changed {
			t.Fatalf("Apply(worker) = %v, %v", changed, err)
		}
		t.Logf("role change control-plane+etcd+worker -> worker: %d writes", fw.Writes()-w0)
		fwdCheckTable(t, n, worker, "firewalld, worker")
		c.must("firewall-cmd", "--reload") // the permanent configuration holds the same
		if ok, err := fw.InPlace(worker); err != nil || !ok {
			t.Errorf("after reload InPlace(worker) = %v, %v", ok, err)
		}
		if _, err := fw.Apply(ctx, spec); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("remove leaves nothing", func(t *testing.T) {
		if err := fw.Remove(ctx); err != nil {
			t.Fatal(err)
		}
		fwdGone(t, c)
		if got := dial(kubelet); got == "open" {
			t.Errorf("%s still open after Remove", kubelet)
		}
		w0 := fw.Writes()
		if err := fw.Remove(ctx); err != nil || fw.Writes() != w0 {
			t.Errorf("second Remove = %v with %d writes, want nil and 0", err, fw.Writes()-w0)
		}
	})

	t.Run("zone name taken by someone else", func(t *testing.T) {
		c.must("firewall-cmd", "--permanent", "--new-zone=appliance")
		c.must("firewall-cmd", "--reload")
		_, err := fw.Apply(ctx, spec)
		if !errors.Is(err, firewall.ErrNotOurs) || !strings.Contains(err.Error(), `zone "appliance"`) ||
			!strings.Contains(err.Error(), "--delete-zone=appliance") {
			t.Errorf("Apply over a foreign zone = %v; want ErrNotOurs naming the zone and how to free it", err)
		}
		if err := fw.Remove(ctx); !errors.Is(err, firewall.ErrNotOurs) {
			t.Errorf("Remove of a foreign zone = %v, want ErrNotOurs", err)
		}
		if out := c.must("firewall-cmd", "--permanent", "--info-zone=appliance"); strings.Contains(out, "10.77.0.0") {
			t.Errorf("the foreign zone was changed:\n%s", out)
		}
		c.must("firewall-cmd", "--permanent", "--delete-zone=appliance")
		c.must("firewall-cmd", "--reload")
	})

	t.Run("node network bound to another zone: refused before any write", func(t *testing.T) {
		c.must("firewall-cmd", "--permanent", "--zone=trusted", "--add-source=10.77.0.0/29")
		c.must("firewall-cmd", "--reload")
		w0 := fw.Writes()
		_, err := fw.Apply(ctx, spec)
		if !errors.Is(err, firewall.ErrSourceConflict) || !strings.Contains(err.Error(), `zone "trusted"`) ||
			!strings.Contains(err.Error(), "--remove-source=10.77.0.0/29") {
			t.Errorf("Apply with 10.77.0.0/29 in zone trusted = %v; want ErrSourceConflict naming the zone and the fix", err)
		}
		if w := fw.Writes() - w0; w != 0 {
			t.Errorf("refused after %d writes, want 0", w)
		}
		c.must("firewall-cmd", "--permanent", "--zone=trusted", "--remove-source=10.77.0.0/29")
		c.must("firewall-cmd", "--reload")
		fwdGone(t, c)
	})

	t.Run("runtime refusal after a permanent write: rolled back", func(t *testing.T) {
		if _, err := fw.Apply(ctx, spec); err != nil {
			t.Fatal(err)
		}
		// 10.77.0.8/29 belongs to zone trusted in the runtime only: firewalld accepts it for our permanent zone
		// (update2 checks the permanent configuration), then refuses it for the runtime one (setZoneSettings2):
		// the permanent update must be undone.
		c.must("firewall-cmd", "--zone=trusted", "--add-source=10.77.0.8/29")
		more := spec
		more.NodeNetworks = append(slices.Clone(spec.NodeNetworks), netip.MustParsePrefix("10.77.0.8/29"))
		w0 := fw.Writes()
		_, err := fw.Apply(ctx, more)
		if err == nil || !strings.Contains(err.Error(), "already bound to zone 'trusted'") || !strings.Contains(err.Error(), "were undone") {
			t.Errorf("Apply = %v; want firewalld's refusal (source already bound to zone trusted), changes undone", err)
		}
		t.Logf("refused and rolled back with %d writes: %v", fw.Writes()-w0, err)
		if ok, err := fw.InPlace(spec); err != nil || !ok {
			t.Errorf("after the rollback InPlace(previous spec) = %v, %v; want true (permanent and runtime as before)", ok, err)
		}
		if out := c.must("firewall-cmd", "--permanent", "--info-zone=appliance"); strings.Contains(out, "10.77.0.8") {
			t.Errorf("the permanent zone kept the refused source:\n%s", out)
		}
		c.must("firewall-cmd", "--zone=trusted", "--remove-source=10.77.0.8/29")
		if err := fw.Remove(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("firewalld not answering", func(t *testing.T) {
		// Hung: the process is stopped, the bus still routes to it.
		c.must("systemctl", "kill", "--signal=SIGSTOP", "firewalld")
		hung := &firewall.Firewalld{BusAddress: c.bus, NetNSPath: n.node.Path(), CallTimeout: 2 * time.Second}
		_, err := hung.Apply(ctx, spec)
		c.must("systemctl", "kill", "--signal=SIGCONT", "firewalld")
		if !errors.Is(err, firewall.ErrFirewalldUnavailable) || !strings.Contains(err.Error(), "no answer") {
			t.Errorf("Apply to a stopped (SIGSTOP) firewalld = %v; want ErrFirewalldUnavailable, no answer", err)
		}
		// Stopped: the chooser picks nftables; forced to firewalld, Apply says firewalld does not run.
		c.must("systemctl", "stop", "firewalld")
		c.waitFirewalld(false)
		forced, _, err := firewall.Choose(ctx, firewall.ChooseOptions{BusAddress: c.bus, NetNSPath: n.node.Path(), Backend: firewall.BackendFirewalld})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := forced.Apply(ctx, spec); !errors.Is(err, firewall.ErrFirewalldUnavailable) || !strings.Contains(err.Error(), "systemctl status firewalld") {
			t.Errorf("Apply with firewalld stopped = %v; want ErrFirewalldUnavailable naming systemctl status firewalld", err)
		}
		if out := c.exec("systemctl", "is-active", "firewalld"); strings.TrimSpace(out) == "active" {
			t.Error("the backend started firewalld through bus activation")
		}
		// No bus at all.
		nobus := "unix:path=" + filepath.Join(t.TempDir(), "no_bus_socket")
		if _, err := (&firewall.Firewalld{BusAddress: nobus, NetNSPath: n.node.Path()}).Apply(ctx, spec); !errors.Is(err, firewall.ErrFirewalldUnavailable) {
			t.Errorf("Apply without a bus = %v; want ErrFirewalldUnavailable", err)
		}
		if b, why, err := firewall.Choose(ctx, firewall.ChooseOptions{BusAddress: nobus}); err != nil || b.Name() != firewall.BackendNFTables {
			t.Errorf("Choose without a bus = %v (%s), %v; want nftables", b, why, err)
		}
		c.must("systemctl", "start", "firewalld")
		c.waitFirewalld(true)
	})

	t.Run("bootstrap host: the chooser inside picks firewalld", func(t *testing.T) {
		first := c.must("env", labns.ProbeEnv+"=1", "/usr/local/bin/fwdtest", "choose-apply", string(firewall.RoleBootstrap))
		second := c.must("env", labns.ProbeEnv+"=1", "/usr/local/bin/fwdtest", "choose-apply", string(firewall.RoleBootstrap))
		t.Logf("bootstrap role, first: %s", strings.TrimSpace(first))
		t.Logf("bootstrap role, second: %s", strings.TrimSpace(second))
		if !strings.Contains(first, "backend=firewalld changed=true") || !strings.Contains(first, `detail="firewalld (zone appliance`) {
			t.Errorf("first run inside the container: %s", first)
		}
		if !strings.Contains(second, "backend=firewalld changed=false") || !strings.Contains(second, "writes=0") {
			t.Errorf("second run inside the container: %s", second)
		}
		boot := fwdSpec(firewall.RoleBootstrap)
		if fwdCheckTable(t, n, boot, "firewalld, bootstrap") == 0 {
			t.Error("nothing open")
		}
		fwdVRRP(t, n, c, fw, boot, []string{"10.77.0.6", "10.77.0.7", "10.77.0.9"})
		if err := fw.Remove(ctx); err != nil {
			t.Fatal(err)
		}
		fwdGone(t, c)
	})
}

func fwdListenArgs() []string {
	args := []string{"listen"}
	for _, p := range fwdPorts {
		args = append(args, fmt.Sprintf(":%d", p)) // dual-stack
	}
	return args
}

// fwdVRRP sends real advertisements to node addresses never used before (fresh conntrack, LAB.md): from the
// peer (received), from a non-peer inside the link (dropped), and from the peer again after its rich rule was
// removed from the runtime (dropped: the acceptance is the rule's doing), then Apply restores the rule.
func fwdVRRP(t *testing.T, n fwdNet, c *fwdContainer, fw *firewall.Firewalld, spec firewall.Spec, fresh []string) {
	t.Helper()
	if _, err := fw.Apply(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	rx := labns.StartProbe(t, n.node, "vrrp-recv")
	send := func(src, dst string) bool {
		if got := labns.ProbeOnce(t, n.peer, "vrrp-send", src, dst); got != "sent" {
			t.Fatalf("vrrp-send: %s", got)
		}
		return rx.Received(src)
	}
	// Each (source, destination) pair once: a new conntrack entry every time.
	if !send(fwdPeerIP, fresh[0]) {
		t.Error("advertisement from the VRRP peer dropped")
	}
	if send(fwdStrangerIP, fresh[1]) {
		t.Error("advertisement from a non-peer accepted")
	}
	rule := fmt.Sprintf(`rule family="ipv4" source address="%s" protocol value="%d" accept`, fwdPeerIP, firewall.IPProtoVRRP)
	c.must("firewall-cmd", "--policy=appliance-host", "--remove-rich-rule="+rule)
	if send(fwdPeerIP, fresh[2]) {
		t.Error("advertisement from the peer accepted with its rich rule removed: something else accepts VRRP")
	}
	if ok, _ := fw.InPlace(spec); ok {
		t.Error("InPlace = true with the VRRP rule removed from the runtime")
	}
	w0 := fw.Writes()
	if changed, err := fw.Apply(context.Background(), spec); err != nil || !changed {
		t.Fatalf("Apply after the rule was removed = %v, %v", changed, err)
	}
	t.Logf("restoring one runtime rich rule took %d writes", fw.Writes()-w0)
	if !send(fwdPeerIP, fwdNodeIP) {
		t.Error("advertisement from the peer dropped after Apply restored the rule")
	}
	// Positive control: the receiver works.
	labns.ProbeOnce(t, n.node, "vrrp-send", "127.0.0.1", "127.0.0.1")
	if !rx.Received("127.0.0.1") {
		t.Fatal("receiver did not see a local advertisement: the test proves nothing")
	}
}

// fwdStillThere: the configuration is live and complete again, Apply writes nothing, ports still answer.
func fwdStillThere(t *testing.T, n fwdNet, fw *firewall.Firewalld, spec firewall.Spec, when string) {
	t.Helper()
	if ok, err := fw.InPlace(spec); err != nil || !ok {
		t.Errorf("%s: InPlace = %v, %v; want true", when, ok, err)
	}
	w0 := fw.Writes()
	if changed, err := fw.Apply(context.Background(), spec); err != nil || changed || fw.Writes() != w0 {
		t.Errorf("%s: Apply = %v, %v with %d writes; want unchanged, 0 writes", when, changed, err, fw.Writes()-w0)
	}
	fwdCheckTable(t, n, spec, "firewalld "+when)
}

// fwdGone: neither the zone nor the policy exists, permanent or runtime, and no nft table has a trace (the
// connection cap table is gone too).
func fwdGone(t *testing.T, c *fwdContainer) {
	t.Helper()
	for _, argv := range [][]string{
		{"firewall-cmd", "--get-zones"}, {"firewall-cmd", "--permanent", "--get-zones"},
		{"firewall-cmd", "--get-policies"}, {"firewall-cmd", "--permanent", "--get-policies"},
	} {
		if out := c.must(argv...); slices.ContainsFunc(strings.Fields(out), func(s string) bool { return strings.HasPrefix(s, "appliance") }) {
			t.Errorf("%v still lists ours: %s", argv, out)
		}
	}
	if out := c.must("nft", "list", "ruleset"); strings.Contains(out, "appliance") || strings.Contains(out, "10.77.0.0/29") {
		t.Errorf("nft list ruleset still mentions the appliance:\n%s", out)
	}
}

// TestNFTablesOpenSet is the nftables half of the comparison: the same probes and the same expectation
// (fwdExpect, from the port table) against the nftables backend in a namespace without firewalld.
func TestNFTablesOpenSet(t *testing.T) {
	labns.RequireRoot(t)
	labns.RequireTool(t, "nft")
	n := newFwdNet(t)
	labns.StartProbe(t, n.node, fwdListenArgs()...)
	for _, spec := range []firewall.Spec{fwdNodeSpec(), fwdSpec(firewall.RoleBootstrap)} {
		nft := &firewall.NFTables{NetNSPath: n.node.Path()}
		if _, err := nft.Apply(context.Background(), spec); err != nil {
			t.Fatal(err)
		}
		if fwdCheckTable(t, n, spec, "nftables") == 0 {
			t.Error("nothing open")
		}
	}
}
