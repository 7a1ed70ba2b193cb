package sushy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

// nobody runs libvirtd, QEMU and sushy-emulator in StartLibvirt: an unprivileged libvirt daemon is a
// session daemon, whose sockets, configuration and state live under the directories its environment
// names (XDG_RUNTIME_DIR, XDG_CONFIG_HOME, XDG_CACHE_HOME) and which never sets up host networking. A
// root libvirtd would be the system daemon (/run/libvirt, /etc/libvirt, the libvirt-qemu user that
// only libvirt-daemon-system creates, its default network on virbr0).
var nobody = &syscall.Credential{Uid: 65534, Gid: 65534}

// Machine is a QEMU virtual machine (TCG, SeaBIOS, no disk, one user-mode NIC) defined in a libvirt
// daemon of the test's own, and sushy-tools' libvirt driver serving it as a Redfish BMC.
type Machine struct {
	// Emulator is sushy-emulator on 127.0.0.1 (root namespace) with TLS and basic auth.
	Emulator
	// SystemID is the Redfish System Id: the libvirt domain's UUID.
	SystemID string
	// NS is the network namespace libvirtd, and so QEMU and its user-mode network, run in. The
	// VM reaches the namespace's 127.0.0.1 as 10.0.2.2 (QEMU user networking's host address).
	NS *labns.NS
	// Console is the path of the VM's serial console (ttyS0) log.
	Console string
}

// StartLibvirt starts, for one test:
//   - a network namespace (labns), and in it libvirtd as the unprivileged user nobody, a session
//     daemon with private runtime, config and cache directories (nothing under /run/libvirt or
//     /etc/libvirt; no bridge, no tap, no firewall rule anywhere: its only network is QEMU's user
//     mode, inside the namespace);
//   - a storage pool "default" (where sushy's libvirt driver uploads inserted images) and a domain
//     "vmedia-node": memoryMiB of memory, TCG ("-enable-kvm hangs here", LAB.md), i440FX with SeaBIOS, no
//     disk, the serial console to a file, a virtio NIC in user mode, powered off;
//   - sushy-emulator with its libvirt driver on that daemon, as nobody, on 127.0.0.1 with TLS and
//     basic auth.
//
// Everything is stopped by PID at the end (the domain destroyed first: libvirt daemonizes QEMU).
// Needs root (to create the namespace and switch to nobody), libvirtd (libvirt-daemon,
// libvirt-daemon-driver-qemu), qemu-system-x86 and python3-libvirt: missing ones fail the test in CI
// and skip it loudly elsewhere.
func StartLibvirt(t testing.TB, memoryMiB int) Machine {
	t.Helper()
	labns.RequireRoot(t)
	libvirtd := labns.RequireTool(t, "libvirtd")
	labns.RequireTool(t, "qemu-system-x86_64")
	labns.RequireTool(t, "setpriv")
	if out, err := exec.Command("/usr/bin/python3", "-c", "import libvirt").CombinedOutput(); err != nil {
		if labns.InCI() {
			t.Fatalf("REAL PEER MISSING: sushy-tools' libvirt driver needs Debian's python3-libvirt (`make deps`): %s", out)
		}
		t.Skipf("SKIPPED: python3-libvirt missing (`make deps`): %s", out)
	}
	// Not t.TempDir (nor $TMPDIR, which may be one): its parents are 0700 root, which nobody cannot
	// traverse. /tmp is world-traversable.
	dir, err := os.MkdirTemp("/tmp", "vmedia-libvirt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	sub := map[string]string{}
	for _, d := range []string{"home", "run", "config", "cache", "pool", "sushy", "console"} {
		p := filepath.Join(dir, d)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, int(nobody.Uid), int(nobody.Gid)); err != nil {
			t.Fatal(err)
		}
		sub[d] = p
	}
	ns := labns.New(t, "vmedia")

	logf, err := os.Create(filepath.Join(dir, "libvirtd.log"))
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + sub["home"], "XDG_RUNTIME_DIR=" + sub["run"],
		"XDG_CONFIG_HOME=" + sub["config"], "XDG_CACHE_HOME=" + sub["cache"]}
	// ip netns exec execs setpriv, which execs env, which execs libvirtd: cmd's PID is libvirtd's.
	cmd := ns.Command(append([]string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", "-i"}, append(env, libvirtd)...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	sock := filepath.Join(sub["run"], "libvirt", "libvirt-sock")
	uri := "qemu:///session?socket=" + sock
	t.Cleanup(func() {
		// libvirt daemonizes QEMU: destroy the domain (or kill QEMU by its pid file) before libvirtd.
		_, _ = asNobody("/usr/bin/python3", "-c", fmt.Sprintf(
			"import libvirt\nc=libvirt.open(%q)\nfor d in c.listAllDomains():\n  d.isActive() and d.destroy()\n", uri)).CombinedOutput()
		if b, err := os.ReadFile(filepath.Join(sub["run"], "libvirt", "qemu", "run", "vmedia-node.pid")); err == nil {
			var pid int
			if _, err := fmt.Sscan(string(b), &pid); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = cmd.Process.Kill()
		<-exited
		_ = logf.Close()
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("libvirtd exited:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("libvirtd made no socket at %s in 30 s:\n%s", sock, b)
		}
	}

	console := filepath.Join(sub["console"], "ttyS0.log")
	define := fmt.Sprintf(`import libvirt
c = libvirt.open(%q)
p = c.storagePoolDefineXML("<pool type='dir'><name>default</name><target><path>%s</path></target></pool>")
p.create()
d = c.defineXML("""<domain type='qemu'><name>vmedia-node</name><memory unit='MiB'>%d</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
<devices><serial type='file'><source path='%s'/><target port='0'/></serial>
<interface type='user'><model type='virtio'/></interface></devices></domain>""")
print(d.UUIDString())
`, uri, sub["pool"], memoryMiB, console)
	out, err := asNobody("/usr/bin/python3", "-c", define).CombinedOutput()
	if err != nil {
		t.Fatalf("define the libvirt pool and domain: %v\n%s", err, out)
	}
	id := strings.TrimSpace(string(out))

	em := start(t, sub["sushy"], fmt.Sprintf("SUSHY_EMULATOR_LIBVIRT_URI = %q\n", uri), nobody)
	return Machine{Emulator: em, SystemID: id, NS: ns, Console: console}
}

// asNobody is a command run as the user nobody (the owner of the test's libvirt daemon).
func asNobody(argv ...string) *exec.Cmd {
	c := exec.Command(argv[0], argv[1:]...)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: nobody}
	return c
}
