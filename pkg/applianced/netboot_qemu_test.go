package applianced

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/test/labns"
)

// vmKit returns the lab VM kit (test/fixtures/build-vmkit.sh: Debian cloud kernel + busybox
// initramfs) as the lab's chassis finds it (--check); a missing kit fails with the build command.
func vmKit(t *testing.T) (kernel, initrd string) {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "..", "test", "fixtures", "build-vmkit.sh"))
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("bash", script, "--check")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the VM kit is not built (%s --check: %v: %s): run `make fixtures` (or bash %s)", script, err, strings.TrimSpace(stderr.String()), script)
	}
	dir := strings.TrimSpace(string(out))
	return filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "base.cpio.gz")
}

// TestLabServeNetbootQEMU: a QEMU VM (TCG) with nothing to boot but its NIC boots from `appliance
// serve` with boot.dhcp: server, through the appliance's own firewall: QEMU's iPXE ROM (Debian's
// ipxe-qemu) gets an address and its script's URL by DHCP, loads the kernel and initrd named by
// boot.kernel and boot.initrd over the boot HTTP port and boots; the console shows the kernel
// command line of the script: the node's name, the appliance URL and CA pin, boot.kernelArgs (with
// a nonce of this run), and no token.
func TestLabServeNetbootQEMU(t *testing.T) { testServeQEMU(t, false) }

// TestLabServeNetbootQEMUProxy: the same boot with boot.dhcp: proxy, the default, beside a
// "datacenter" DHCP server in a namespace of its own on the same segment (busybox udhcpd, which
// knows nothing of PXE): the VM's iPXE takes its address from udhcpd and its boot file from the
// appliance's proxyDHCP offer.
func TestLabServeNetbootQEMUProxy(t *testing.T) { testServeQEMU(t, true) }

func testServeQEMU(t *testing.T, proxy bool) {
	labns.NotInShort(t, "network-boots a TCG VM")
	labns.RequireRoot(t)
	qemu := labns.RequireTool(t, "qemu-system-x86_64")
	const rom = "/usr/lib/ipxe/qemu/pxe-virtio.rom"
	if _, err := os.Stat(rom); err != nil {
		t.Fatalf("%s missing (Debian package ipxe-qemu, a dependency of qemu-system-x86): make deps", rom)
	}
	kernel, initrd := vmKit(t)
	ns := labns.New(t, "nbq")
	for _, c := range [][]string{
		{"ip", "link", "add", "nbbr0", "type", "bridge"},
		{"ip", "addr", "add", "10.81.0.1/24", "dev", "nbbr0"},
		{"ip", "link", "set", "nbbr0", "up"},
		{"ip", "tuntap", "add", "dev", "nbtap0", "mode", "tap"},
		{"ip", "link", "set", "nbtap0", "master", "nbbr0"},
		{"ip", "link", "set", "nbtap0", "up"},
	} {
		ns.MustRun(c...)
	}
	nonceB := make([]byte, 6)
	_, _ = rand.Read(nonceB)
	nonce := hex.EncodeToString(nonceB)
	const mac = "52:54:00:4e:51:01"

	boot := "  dhcp: server\n  range: {start: 10.81.0.150, end: 10.81.0.170}\n"
	if proxy {
		boot = "  dhcp: proxy\n"
		startUDHCPD(t, ns, "nbbr0")
	}
	sl := newServeLab(t, []byte("unused: boot.kernel names the VM kit"))
	cfgPath := sl.config(t, "10.81", `- name: cp1
  roles: [control-plane]
  addresses: [10.81.0.11, 10.80.0.11]
  power: {kind: ipmi, address: 10.81.0.211, username: admin, passwordFile: `+sl.password+`, bootDevice: disk}
- name: pxe1
  roles: [worker]
  addresses: [10.81.0.21, 10.80.0.21]
  mac: "`+mac+`"
  power: {kind: ipmi, address: 10.81.0.221, username: admin, passwordFile: `+sl.password+`}
boot:
`+boot+`  kernel: `+kernel+`
  initrd: `+initrd+`
  kernelArgs: [console=ttyS0, netboot.test=`+nonce+`]
`)
	applyApplianceFirewall(t, ns, cfgPath)
	serve := startServe(t, ns, cfgPath)

	line, took := pxeBootVM(t, ns, qemu, rom, mac, nonce)
	blk, _ := pem.Decode(sl.caPEM)
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"appliance.node=pxe1", "appliance.url=https://10.81.0.1:8443", "appliance.ca_pin=" + agentapi.PinOf(ca), "console=ttyS0"} {
		if !strings.Contains(line, want) {
			t.Errorf("kernel command line lacks %q: %s", want, line)
		}
	}
	if strings.Contains(strings.ToLower(line), "token") {
		t.Errorf("kernel command line carries a token: %s", line)
	}
	mode := "server"
	if proxy {
		mode = "proxy, beside busybox udhcpd"
		if !strings.Contains(serve.Log(), "reply=\"OFFER to pxe1") {
			t.Errorf("serve sent pxe1 no proxyDHCP offer:\n%s", serve.Log())
		}
	}
	t.Logf("FIGURES: QEMU (TCG) network boot from appliance serve (boot.dhcp %s; QEMU's iPXE ROM -> DHCP -> HTTP script, kernel, initrd), kernel command line on the console %s after QEMU started",
		mode, took.Round(100*time.Millisecond))
}

// startUDHCPD runs busybox udhcpd, leasing 10.81.0.150-170 and knowing nothing of PXE, in a
// namespace of its own (the datacenter's DHCP server) linked to bridge in ns; stopped by PID.
func startUDHCPD(t *testing.T, ns *labns.NS, bridge string) {
	t.Helper()
	busybox := labns.RequireTool(t, "busybox")
	dc := labns.New(t, "nbd")
	port := "p" + dc.Name[len(dc.Name)-6:]
	for _, c := range [][]string{
		{"ip", "link", "add", "eth0", "netns", dc.Name, "type", "veth", "peer", "name", port, "netns", ns.Name},
		{"ip", "-n", ns.Name, "link", "set", port, "master", bridge},
		{"ip", "-n", ns.Name, "link", "set", port, "up"},
		{"ip", "-n", dc.Name, "addr", "add", "10.81.0.2/24", "dev", "eth0"},
		{"ip", "-n", dc.Name, "link", "set", "eth0", "up"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "udhcpd.conf")
	if err := os.WriteFile(conf, []byte("start 10.81.0.150\nend 10.81.0.170\ninterface eth0\noption subnet 255.255.255.0\n"+
		"lease_file "+filepath.Join(dir, "leases")+"\npidfile "+filepath.Join(dir, "udhcpd.pid")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := dc.Command(busybox, "udhcpd", "-f", conf)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // by PID: `ip netns exec` execs busybox
		<-exited
		t.Logf("udhcpd (pid %d):\n%s", cmd.Process.Pid, out.String())
	})
}

// pxeBootVM boots a QEMU VM (TCG) in ns from its NIC (tap nbtap0, QEMU's iPXE ROM rom, MAC mac) and
// returns the kernel command line its console shows (the one with netboot.test=nonce) and how long
// after QEMU's start it showed. The wait is bounded (150 s) only so a broken boot ends.
func pxeBootVM(t *testing.T, ns *labns.NS, qemu, rom, mac, nonce string) (string, time.Duration) {
	t.Helper()
	dir := t.TempDir()
	console := filepath.Join(dir, "console.log")
	cmd := ns.Command(qemu, "-name", "serve-netboot", "-accel", "tcg", "-cpu", "qemu64,+rdrand", "-m", "512",
		"-nodefaults", "-no-user-config", "-display", "none",
		"-chardev", "file,id=con,path="+console, "-serial", "chardev:con",
		"-netdev", "tap,id=n0,ifname=nbtap0,script=no,downscript=no",
		// Debian's pxe-virtio.rom names PCI device 1af4:1041 (modern virtio-net): the NIC must be
		// modern-only or SeaBIOS skips the ROM; bootindex puts the NIC first.
		"-device", "virtio-net-pci,disable-legacy=on,netdev=n0,mac="+mac+",romfile="+rom+",bootindex=1",
		"-debugcon", "file:"+filepath.Join(dir, "seabios.log"), "-global", "isa-debugcon.iobase=0x402")
	labns.MachineSession(cmd)
	var qout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &qout, &qout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill() // by PID: `ip netns exec` execs QEMU
			<-exited
		}
	})
	t.Logf("QEMU pid %d, console %s", cmd.Process.Pid, console)

	re := regexp.MustCompile(`Command line: [^\n]*netboot\.test=` + nonce + `[^\n]*`)
	var line string
	for deadline := start.Add(150 * time.Second); line == ""; time.Sleep(200 * time.Millisecond) {
		b, _ := os.ReadFile(console)
		line = re.FindString(string(b))
		if line != "" {
			break
		}
		select {
		case <-exited:
			t.Fatalf("QEMU exited before the console showed the kernel command line: %s\nconsole:\n%s", qout.String(), lastLines(string(b), 40))
		default:
		}
		if time.Now().After(deadline) {
			bios, _ := os.ReadFile(filepath.Join(dir, "seabios.log"))
			t.Fatalf("no kernel command line on the console within 150 s; its tail:\n%s\nSeaBIOS log tail:\n%s", lastLines(string(b), 40), lastLines(string(bios), 15))
		}
	}
	return line, time.Since(start)
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
