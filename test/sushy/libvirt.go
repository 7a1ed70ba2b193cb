package sushy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// domainName is the libvirt domain StartLibvirt defines.
const domainName = "vmedia-node"

// LibvirtOptions shape the machine StartLibvirt defines. The zero value (with MemoryMiB) is a
// diskless machine whose one NIC is QEMU user-mode networking inside the test's namespace, and a BMC
// on 127.0.0.1.
type LibvirtOptions struct {
	// MemoryMiB is the machine's memory. Required.
	MemoryMiB int
	// UUID is the domain's UUID: the SMBIOS system UUID the machine reads
	// (/sys/class/dmi/id/product_uuid) and the Redfish System Id. Empty: libvirt makes one.
	UUID string
	// MAC is the NIC's MAC address. Empty: libvirt makes one.
	MAC string
	// Disks are blank virtio disks (sparse files in the test's directory, created here and owned by
	// nobody), in this order, each with its serial (what root-device hints match).
	Disks []Disk
	// Lab, when set, puts the machine and its BMC on a lab segment instead (see LabNIC).
	Lab *LabNIC
	// ColdReboot makes a reboot of the machine (a guest reset: libvirt's reboot event) restart the
	// domain from its definition (destroy, then create), as a real machine's firmware reads its BMC's
	// boot override and media again at every reset. sushy-tools' libvirt driver writes boot overrides
	// and media changes into the domain's persistent definition only, which a running QEMU never
	// reads: without this, a machine that reboots itself keeps the boot order it was started with.
	// Redfish power actions (On, ForceOff, ForceRestart: destroy and create) are unaffected.
	ColdReboot bool
}

// Disk is a blank virtio disk of LibvirtOptions.
type Disk struct {
	SizeGiB int
	Serial  string
}

// LabNIC bridges the machine onto a segment of a lab (test/lab): inside the test's namespace, bridge
// br0 holds a veth whose peer joins Bridge in the namespace Fabric, and the tap vm0 (made by root,
// owned by nobody, so that QEMU opens it unprivileged: <interface type='ethernet'> with
// managed='no'). The BMC (sushy-emulator) listens on BMC's address, which br0 holds: a BMC sharing
// the machine's NIC, as NC-SI does. The root namespace gets nothing.
type LabNIC struct {
	Fabric, Bridge string
	BMC            netip.Prefix
}

// Machine is a QEMU virtual machine (TCG, SeaBIOS) defined in a libvirt daemon of the test's own, and
// sushy-tools' libvirt driver serving it as a Redfish BMC.
type Machine struct {
	// Emulator is sushy-emulator with TLS and basic auth: on 127.0.0.1 in the root namespace, or, with
	// LibvirtOptions.Lab, on the BMC address inside NS.
	Emulator
	// Addr is where clients reach the BMC: 127.0.0.1:Port, or the lab BMC address and Port.
	Addr string
	// SystemID is the Redfish System Id: the libvirt domain's UUID.
	SystemID string
	// NS is the network namespace libvirtd, and so QEMU, run in. Without a lab NIC the VM reaches the
	// namespace's 127.0.0.1 as 10.0.2.2 (QEMU user networking's host address).
	NS *labns.NS
	// Console is the path of the VM's serial console (ttyS0) log, appended to across restarts.
	Console string
	// Disks are the paths of LibvirtOptions.Disks' files.
	Disks []string
	// Events is the path of the domain's lifecycle log: one line per libvirt event, "UNIXNANOS
	// EVENT" (started, stopped, reset, restarted, …).
	Events string
}

// StartLibvirt starts, for one test:
//   - a network namespace (labns), and in it libvirtd as the unprivileged user nobody, a session
//     daemon with private runtime, config and cache directories (nothing under /run/libvirt or
//     /etc/libvirt; no bridge, no tap, no firewall rule in the root namespace);
//   - a storage pool "default" (where sushy's libvirt driver uploads inserted images) and a domain
//     "vmedia-node": o.MemoryMiB of memory, TCG ("-enable-kvm hangs here", LAB.md), i440FX with
//     SeaBIOS, o.Disks, the serial console to a file, a virtio NIC (QEMU user mode, or with o.Lab the
//     tap described at LabNIC), powered off;
//   - a watcher of the domain's events (Machine.Events; with o.ColdReboot it restarts the domain at a
//     guest reset);
//   - sushy-emulator with its libvirt driver on that daemon, as nobody, with TLS and basic auth.
//
// Everything is stopped by PID at the end (the domain destroyed first: libvirt daemonizes QEMU).
// Needs root (to create the namespace and switch to nobody), libvirtd (libvirt-daemon,
// libvirt-daemon-driver-qemu), qemu-system-x86 and python3-libvirt: missing ones fail the test in CI
// and skip it loudly elsewhere.
func StartLibvirt(t testing.TB, o LibvirtOptions) Machine {
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
	for _, d := range []string{"home", "run", "config", "cache", "pool", "sushy", "console", "disks"} {
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

	var disks []string
	var diskXML strings.Builder
	for i, d := range o.Disks {
		p := filepath.Join(sub["disks"], fmt.Sprintf("disk%d.img", i))
		f, err := os.Create(p)
		if err == nil {
			err = f.Truncate(int64(d.SizeGiB) << 30)
			_ = f.Close()
		}
		if err == nil {
			err = os.Chown(p, int(nobody.Uid), int(nobody.Gid))
		}
		if err != nil {
			t.Fatalf("disk %s: %v", p, err)
		}
		disks = append(disks, p)
		fmt.Fprintf(&diskXML, "<disk type='file' device='disk'><driver name='qemu' type='raw' cache='unsafe'/><source file='%s'/>"+
			"<target dev='vd%c' bus='virtio'/><serial>%s</serial></disk>\n", p, 'a'+i, html.EscapeString(d.Serial))
	}
	nic := "<interface type='user'><model type='virtio'/></interface>"
	// launch is how libvirtd is started inside ns (`ip netns exec` gives it a mount namespace of its own).
	launch := "exec \"$@\""
	if o.Lab != nil {
		labNIC(t, ns, *o.Lab)
		nic = "<interface type='ethernet'><target dev='vm0' managed='no'/><model type='virtio'/></interface>"
		// QEMU (as nobody) opens the tap through /dev/net/tun, which is root's (0600) on this host:
		// libvirtd gets a device node of its own for it, nobody's, bound over /dev/net/tun in the
		// mount namespace `ip netns exec` made for it. The host's /dev is not changed.
		tun := filepath.Join(dir, "tun")
		if err := syscall.Mknod(tun, syscall.S_IFCHR|0o600, 10<<8|200); err != nil {
			t.Fatalf("mknod %s (the tun device for nobody): %v", tun, err)
		}
		if err := os.Chown(tun, int(nobody.Uid), int(nobody.Gid)); err != nil {
			t.Fatal(err)
		}
		launch = "mount --bind " + tun + " /dev/net/tun && exec \"$@\""
	}
	if o.MAC != "" {
		nic = strings.Replace(nic, "<model", "<mac address='"+o.MAC+"'/><model", 1)
	}
	uuid := ""
	if o.UUID != "" {
		uuid = "<uuid>" + o.UUID + "</uuid>"
	}

	logf, err := os.Create(filepath.Join(dir, "libvirtd.log"))
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + sub["home"], "XDG_RUNTIME_DIR=" + sub["run"],
		"XDG_CONFIG_HOME=" + sub["config"], "XDG_CACHE_HOME=" + sub["cache"]}
	// ip netns exec execs sh, which execs setpriv, which execs env, which execs libvirtd: cmd's PID is
	// libvirtd's.
	cmd := ns.Command(append([]string{"sh", "-c", launch, "sh", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", "-i"},
		append(env, libvirtd)...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	sock := filepath.Join(sub["run"], "libvirt", "libvirt-sock")
	uri := "qemu:///session?socket=" + sock
	t.Cleanup(func() {
		// libvirt daemonizes QEMU: destroy the domain (or kill QEMU by its pid file) before libvirtd;
		// virtlogd, which libvirtd started, would otherwise linger for its idle timeout.
		_, _ = asNobody("/usr/bin/python3", "-c", fmt.Sprintf(
			"import libvirt\nc=libvirt.open(%q)\nfor d in c.listAllDomains():\n  d.isActive() and d.destroy()\n", uri)).CombinedOutput()
		killPidFile(filepath.Join(sub["run"], "libvirt", "qemu", "run", domainName+".pid"))
		_ = cmd.Process.Kill()
		<-exited
		killPidFile(filepath.Join(sub["run"], "libvirt", "virtlogd.pid"))
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
d = c.defineXML("""<domain type='qemu'><name>%s</name>%s<memory unit='MiB'>%d</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
<devices><serial type='file'><source path='%s' append='on'/><target port='0'/></serial>
%s
%s</devices></domain>""")
print(d.UUIDString())
`, uri, sub["pool"], domainName, uuid, o.MemoryMiB, console, nic, diskXML.String())
	out, err := asNobody("/usr/bin/python3", "-c", define).CombinedOutput()
	if err != nil {
		t.Fatalf("define the libvirt pool and domain: %v\n%s", err, out)
	}
	id := strings.TrimSpace(string(out))
	events := watchDomain(t, ns, uri, filepath.Join(sub["console"], "events.log"), o.ColdReboot)

	var em Emulator
	addr := ""
	if o.Lab != nil {
		em = start(t, sub["sushy"], fmt.Sprintf("SUSHY_EMULATOR_LIBVIRT_URI = %q\n", uri), nobody, &listenIn{ns: ns, ip: o.Lab.BMC.Addr()})
		addr = net.JoinHostPort(o.Lab.BMC.Addr().String(), strconv.Itoa(em.Port))
	} else {
		em = start(t, sub["sushy"], fmt.Sprintf("SUSHY_EMULATOR_LIBVIRT_URI = %q\n", uri), nobody, nil)
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(em.Port))
	}
	return Machine{Emulator: em, Addr: addr, SystemID: id, NS: ns, Console: console, Disks: disks, Events: events}
}

// labNIC builds LabNIC's plumbing in ns (see LabNIC).
func labNIC(t testing.TB, ns *labns.NS, l LabNIC) {
	t.Helper()
	port := "v" + ns.Name[len(ns.Name)-6:] + "c"
	for _, c := range [][]string{
		{"ip", "link", "add", "eth0", "netns", ns.Name, "type", "veth", "peer", "name", port, "netns", l.Fabric},
		{"ip", "-n", l.Fabric, "link", "set", port, "master", l.Bridge, "up"},
		{"ip", "-n", ns.Name, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"ip", "-n", ns.Name, "link", "set", "eth0", "master", "br0", "up"},
		{"ip", "-n", ns.Name, "tuntap", "add", "dev", "vm0", "mode", "tap", "user", "65534", "group", "65534"},
		{"ip", "-n", ns.Name, "link", "set", "vm0", "master", "br0", "up"},
		{"ip", "-n", ns.Name, "addr", "add", l.BMC.String(), "dev", "br0"},
		{"ip", "-n", ns.Name, "link", "set", "br0", "up"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
}

// watchScript logs the domain's libvirt events (lifecycle and reset) to a file, and with "cold"
// restarts the domain from its definition at a guest reset (LibvirtOptions.ColdReboot).
const watchScript = `import libvirt, sys, time
uri, path, cold = sys.argv[1], sys.argv[2], sys.argv[3] == "cold"
names = {0: "defined", 1: "undefined", 2: "started", 3: "suspended", 4: "resumed", 5: "stopped", 6: "shutdown", 7: "pmsuspended", 8: "crashed"}
libvirt.virEventRegisterDefaultImpl()
c = libvirt.open(uri)
log = open(path, "a", buffering=1)
pending = []
def note(what):
    log.write("%d %s\n" % (time.time_ns(), what))
def lifecycle(conn, dom, event, detail, opaque):
    note("%s %d" % (names.get(event, str(event)), detail))
def reset(conn, dom, opaque):
    note("reset")
    if cold:
        pending.append(dom.UUIDString())
c.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, lifecycle, None)
c.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_REBOOT, reset, None)
note("watching")
while True:
    libvirt.virEventRunDefaultImpl()
    while pending:
        d = c.lookupByUUIDString(pending.pop(0))
        if d.isActive():
            d.destroy()
        # Under load the destroyed QEMU can still hold its tap and files for a moment, and the new one
        # exits at once (libvirt: "qemu unexpectedly closed the monitor"): retry, logging each failure.
        for attempt in range(1, 11):
            try:
                d.create()
                note("restarted from its definition")
                break
            except libvirt.libvirtError as e:
                note("restart %d failed: %s" % (attempt, str(e).replace("\n", " ")))
                time.sleep(min(attempt, 5))
`

// watchDomain runs watchScript as nobody in ns until the test ends and returns its log's path once it
// watches.
func watchDomain(t testing.TB, ns *labns.NS, uri, path string, cold bool) string {
	t.Helper()
	mode := "log"
	if cold {
		mode = "cold"
	}
	var out bytes.Buffer
	cmd := ns.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", watchScript, uri, path, mode)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // by PID: ip netns exec and setpriv exec python
		<-exited
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if b, _ := os.ReadFile(path); bytes.Contains(b, []byte(" watching\n")) {
			return path
		}
		select {
		case <-exited:
			t.Fatalf("the domain watcher exited:\n%s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the domain watcher did not start in 30 s:\n%s", out.String())
		}
	}
}

// killPidFile sends SIGKILL to the PID a pid file holds, if any.
func killPidFile(p string) {
	b, err := os.ReadFile(p)
	if err != nil {
		return
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// asNobody is a command run as the user nobody (the owner of the test's libvirt daemon).
func asNobody(argv ...string) *exec.Cmd {
	c := exec.Command(argv[0], argv[1:]...)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: nobody}
	return c
}

// Get fetches path (e.g. /redfish/v1/Systems/ID) from the BMC as a lab client would: from inside NS
// when the BMC is on a lab segment, with its CA and credentials. Non-2xx answers are errors.
func (m Machine) Get(path string) ([]byte, error) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(m.CAPEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	if !strings.HasPrefix(m.Addr, "127.0.0.1:") {
		tr.DialContext = dialIn(m.NS.Path())
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, "https://"+m.Addr+path, nil)
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(m.User, m.Password)
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode/100 != 2 {
		err = fmt.Errorf("GET %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	return b, err
}

// dialIn returns a dialer whose connections are made inside the network namespace at nsPath: each
// dial runs on a thread that enters it and is never handed back to the runtime (it ends locked).
func dialIn(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = labns.InNamespace(nsPath, func() (err error) {
			var d net.Dialer
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}
