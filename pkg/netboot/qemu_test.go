package netboot

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

// vmKit returns the lab VM kit (test/fixtures/build-vmkit.sh: Debian cloud kernel + busybox
// initramfs) the way the lab's chassis finds it (--check); a missing kit fails with the build command.
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

// TestLabQEMUPXEBoot boots a QEMU VM (TCG) from the network served by this package in server mode:
// QEMU's own iPXE ROM (Debian's ipxe-qemu, pxe-virtio.rom) DHCPs, gets its script URL, loads the
// lab VM kit's kernel and initrd over HTTP and boots it; the console must show the kernel command
// line the script carries (with a nonce of this run) and the kit's /init starting.
func TestLabQEMUPXEBoot(t *testing.T) {
	labns.NotInShort(t, "network-boots a TCG VM")
	labns.RequireRoot(t)
	qemu := labns.RequireTool(t, "qemu-system-x86_64")
	const rom = "/usr/lib/ipxe/qemu/pxe-virtio.rom"
	if _, err := os.Stat(rom); err != nil {
		t.Fatalf("%s missing (Debian package ipxe-qemu, a dependency of qemu-system-x86): make deps", rom)
	}
	kernel, initrd := vmKit(t)
	ns := labns.New(t, "nb")
	for _, c := range [][]string{
		{"ip", "link", "add", "nbbr0", "type", "bridge"},
		{"ip", "addr", "add", "10.78.0.1/24", "dev", "nbbr0"},
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
	const mac = "52:54:00:4e:42:01"
	startHelper(t, ns, helperConfig{Mode: ModeServer, Interface: "nbbr0", ServerIP: "10.78.0.1", HTTPPort: 8080,
		Subnet: "10.78.0.0/24", RangeStart: "10.78.0.100", RangeEnd: "10.78.0.120", Kernel: kernel, Initrd: initrd,
		KernelArgs: []string{"console=ttyS0", "appliance.url=https://10.78.0.1:8443", "appliance.ca_pin=sha256:" + strings.Repeat("ab", 32), "netboot.test=" + nonce},
		Machines:   map[string]string{mac: "pxe1"}})

	dir := t.TempDir()
	console := filepath.Join(dir, "console.log")
	cmd := ns.Command(qemu, "-name", "netboot-pxe", "-accel", "tcg", "-cpu", "qemu64,+rdrand", "-m", "512",
		"-nodefaults", "-no-user-config", "-display", "none",
		"-chardev", "file,id=con,path="+console, "-serial", "chardev:con",
		"-netdev", "tap,id=n0,ifname=nbtap0,script=no,downscript=no",
		// Debian's pxe-virtio.rom names PCI device 1af4:1041 (modern virtio-net), so the NIC must be
		// modern-only (disable-legacy=on) or SeaBIOS skips the ROM as not its device's; bootindex
		// puts the NIC first.
		"-device", "virtio-net-pci,disable-legacy=on,netdev=n0,mac="+mac+",romfile="+rom+",bootindex=1",
		// SeaBIOS's own log (iPXE prints to the absent VGA), shown when the boot fails.
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

	wait := func(re *regexp.Regexp, limit time.Duration) (string, time.Duration) {
		t.Helper()
		deadline := start.Add(limit)
		for {
			b, _ := os.ReadFile(console)
			if m := re.FindString(string(b)); m != "" {
				return m, time.Since(start)
			}
			select {
			case <-exited:
				t.Fatalf("QEMU exited before the console showed %q: %s\nconsole:\n%s", re, qout.String(), tail(string(b), 40))
			default:
			}
			if time.Now().After(deadline) {
				bios, _ := os.ReadFile(filepath.Join(dir, "seabios.log"))
				t.Fatalf("console never showed %q within %s; its tail:\n%s\nSeaBIOS log tail:\n%s", re, limit, tail(string(b), 40), tail(string(bios), 15))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	line, tCmd := wait(regexp.MustCompile(`Command line: [^\n]*netboot\.test=`+nonce+`[^\n]*`), 100*time.Second)
	for _, want := range []string{"appliance.node=pxe1", "appliance.url=https://10.78.0.1:8443", "initrd=initrd"} {
		if !strings.Contains(line, want) {
			t.Errorf("kernel command line lacks %q: %s", want, line)
		}
	}
	if strings.Contains(strings.ToLower(line), "token") {
		t.Errorf("kernel command line carries a token: %s", line)
	}
	_, tInit := wait(regexp.MustCompile(`LAB-INIT: start`), 110*time.Second)
	t.Logf("FIGURES: QEMU (TCG) PXE boot via iPXE ROM -> DHCP (server mode) -> HTTP script, kernel, initrd: kernel command line on the console at %s, initramfs /init at %s after QEMU started",
		tCmd.Round(100*time.Millisecond), tInit.Round(100*time.Millisecond))
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
