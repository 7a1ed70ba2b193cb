//go:build e2e

// Package nodeimage proves the node image (iso/build-node-image.sh) end to end on real VMs: a QEMU
// (TCG) machine with two blank virtio disks network-boots it from the appliance, enrols, installs
// itself to the disk its root-device hints name, reboots from that disk, and its hostagent reports to
// the appliance; a power cycle boots the disk again without reinstalling. A second machine does the
// same from the image's ISO form (virtual media).
package nodeimage

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/nodeiso"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/test/labns"
)

const (
	mac        = "52:54:00:4e:49:21"
	serverIP   = "10.83.0.1"
	pxeROM     = "/usr/lib/ipxe/qemu/pxe-virtio.rom"
	diskSerial = "NODE-DISK-1"
	isoMAC     = "52:54:00:4e:49:22"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func cacheDir() string {
	if c := os.Getenv("APPLIANCE_CACHE"); c != "" {
		return c
	}
	return "/var/cache/appliance"
}

// buildBinaries builds appliance and hostagent from the working tree into one directory (bootstrap
// serves the hostagent next to the appliance binary).
func buildBinaries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, c := range []string{"appliance", "hostagent"} {
		cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, c), "./cmd/"+c)
		cmd.Dir = repoRoot(t)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/%s: %v\n%s", c, err, out)
		}
	}
	return dir
}

// The network boot of a blank machine (DHCP, TFTP, iPXE, kernel, initramfs and root filesystem over
// HTTP; the install to the disk root-device hints name, a decoy disk left blank; the installed system
// at its static address; a power cycle that boots the disk and installs nothing again) is
// TestBareMetalWorkerJoinsCluster's (metal_test.go), with a real BMC and kubeadm join after it: it
// replaced TestNodeImagePXEInstall, which proved the same without a BMC and without Kubernetes.

// TestNodeImageISOInstallUEFI: the node image's ISO form (what pkg/power's Redfish virtual media
// inserts) installs a machine with UEFI firmware (OVMF). The ISO is built with the appliance URL and
// CA pin on its kernel command line (--iso-args, public data only); the VM (TCG, one blank disk, no
// hint: the smallest disk of at least 4 GiB) boots it from its CD through the ISO's UEFI GRUB (disk
// first in the boot order, so a blank disk falls through to the CD as a one-time virtual-media boot
// does), takes DHCP on its NIC, enrols as n2 (its MAC), installs, reboots from its disk through its
// EFI system partition (EFI/BOOT/BOOTX64.EFI), and its hostagent reports its config step done.
//
// The same with BIOS firmware is TestBareMetalWorkerJoinsCluster's n2 (metal_test.go), booted by a
// real Redfish BMC's virtual media and joined to Kubernetes: it replaced TestNodeImageISOInstall,
// which proved the BIOS install without a BMC and without Kubernetes.
func TestNodeImageISOInstallUEFI(t *testing.T) { testISOInstall(t, true) }

func testISOInstall(t *testing.T, uefi bool) {
	l := newNodeLab(t)
	caPEM, err := os.ReadFile(filepath.Join(statedir.PKI(l.state), "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(caPEM)
	if blk == nil {
		t.Fatal("no PEM block in the appliance CA")
	}
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	// The ISO as a BMC fetches it: from the appliance's /boot/node.iso over HTTPS, verified with the
	// appliance CA, inside the lab namespace; the bundle's ISO was built with no arguments, so the
	// appliance's URL and pin are on its kernel command line only if the appliance wrote them.
	args := "appliance.url=https://" + serverIP + ":8443 appliance.ca_pin=" + agentapi.PinOf(ca)
	iso := filepath.Join(l.dir, "node-amd64.iso")
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := labns.InNamespace(l.ns.Path(), func() (err error) {
				c, err = (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}}}
	resp, err := hc.Get("https://" + serverIP + ":8443" + nodeiso.Path)
	if err != nil {
		t.Fatalf("GET %s from the appliance: %v", nodeiso.Path, err)
	}
	isoFile, err := os.Create(iso)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(isoFile, resp.Body)
	resp.Body.Close()
	if cerr := isoFile.Close(); err == nil {
		err = cerr
	}
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s from the appliance: %s, %d bytes, %v", nodeiso.Path, resp.Status, n, err)
	}
	disk := filepath.Join(l.dir, "iso-disk.img")
	f, err := os.Create(disk)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(8 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := l.store.Set("n2", agentapi.StatePowering, "test: QEMU started in place of a BMC virtual-media boot"); err != nil {
		t.Fatal(err)
	}
	console := filepath.Join(l.dir, "iso-console.log")
	var firmware []string
	if uefi {
		code, vars := "/usr/share/OVMF/OVMF_CODE.fd", "/usr/share/OVMF/OVMF_VARS.fd"
		b, err := os.ReadFile(vars)
		if err != nil {
			t.Fatalf("OVMF missing (%v): Debian package ovmf, make deps", err)
		}
		myVars := filepath.Join(l.dir, "OVMF_VARS.fd")
		if err := os.WriteFile(myVars, b, 0o600); err != nil {
			t.Fatal(err)
		}
		firmware = []string{"-drive", "if=pflash,format=raw,readonly=on,file=" + code, "-drive", "if=pflash,format=raw,file=" + myVars}
	}
	vm := startVM(t, l.ns, l.qemu, console, append(firmware, []string{
		"-netdev", "tap,id=n0,ifname=nitap0,script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac=" + isoMAC + ",romfile=",
		"-drive", "file=" + disk + ",format=raw,if=none,id=d0,cache=unsafe",
		"-device", "virtio-blk-pci,drive=d0,serial=ISO-NODE-DISK,bootindex=1",
		"-drive", "file=" + iso + ",format=raw,if=none,id=cd,media=cdrom,readonly=on",
		"-device", "ide-cd,drive=cd,bootindex=2",
	}...))
	c := &consoleWatch{t: t, path: console, start: vm.start, vm: vm}
	// The ISO's GRUB gave the kernel the arguments the appliance wrote into the image it served.
	c.wait(regexp.MustCompile(`Command line: [^\n]*appliance\.medium=APPLNODE `+regexp.QuoteMeta(args)), 0, 5*time.Minute)
	tMedium := c.wait(regexp.MustCompile(`NODE-INIT: medium `), 0, 5*time.Minute)
	line := c.waitLine(regexp.MustCompile(`NODE-INSTALL: node n2 installed to [^\n]*`), 12*time.Minute)
	tInstalled := c.since()
	if !strings.Contains(line, "vda") {
		t.Errorf("installed to %s, want vda (the only disk)", line)
	}
	tDisk := c.wait(regexp.MustCompile(`Command line: [^\n]*root=UUID=`), 0, 5*time.Minute)
	st := waitReport(t, l.store, "n2", "", 8*time.Minute, c)
	fw := "BIOS"
	if uefi {
		fw = "UEFI"
	}
	t.Logf("FIGURES: node image ISO (virtual media, %s) under TCG: medium mounted %s, installed %s (%s), kernel from disk %s, hostagent report %s (state %s: %s)",
		fw, tMedium, tInstalled, strings.TrimPrefix(line, "NODE-INSTALL: "), tDisk, c.since(), st.State, steps(st))
}

// nodeLab is the appliance side of the ISO test: the binaries of this tree, the bundle's node image,
// a lab namespace with the boot network (bridge nibr0, the appliance at 10.83.0.1, tap nitap0 for the
// VM), and `appliance bootstrap` run up to serve there (boot.dhcp: server) for cp1 (never booted),
// n1 (network boot, hinted disk) and n2 (the ISO).
type nodeLab struct {
	qemu, bin, dir, state, cfgPath string
	ns                             *labns.NS
	store                          *nodestate.Store
}

func newNodeLab(t *testing.T) *nodeLab {
	t.Helper()
	labns.RequireRoot(t)
	qemu := labns.RequireTool(t, "qemu-system-x86_64")
	for _, tool := range []string{"go", "nft"} {
		labns.RequireTool(t, tool)
	}
	if _, err := os.Stat(pxeROM); err != nil {
		t.Fatalf("%s missing (Debian package ipxe-qemu, a dependency of qemu-system-x86): make deps", pxeROM)
	}
	bundleDir := filepath.Join(cacheDir(), "bundle")
	if _, err := os.Stat(filepath.Join(bundleDir, "SHA256SUMS.sig")); err != nil {
		t.Fatalf("the fixture bundle is not built (%v): make fixtures", err)
	}
	for _, f := range bundle.NodeImageFiles {
		if _, err := os.Stat(filepath.Join(bundleDir, f)); err != nil {
			t.Fatalf("the fixture bundle has no node image (%v): make fixtures", err)
		}
	}
	bin := buildBinaries(t)

	ns := labns.New(t, "ni")
	for _, c := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", "nibr0", "type", "bridge"},
		{"ip", "addr", "add", serverIP + "/24", "dev", "nibr0"},
		{"ip", "link", "set", "nibr0", "up"},
		{"ip", "tuntap", "add", "dev", "nitap0", "mode", "tap"},
		{"ip", "link", "set", "nitap0", "master", "nibr0"},
		{"ip", "link", "set", "nitap0", "up"},
	} {
		ns.MustRun(c...)
	}
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	pw := filepath.Join(dir, "bmc.password")
	if err := os.WriteFile(pw, []byte("unused: no BMC in this test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "bootstrap.yaml")
	cfg := `apiVersion: appliance.airgap.dev/v1alpha1
kind: BootstrapConfiguration
clusterName: nodeimage
kubernetes: {enabled: false}
networks:
  controlPlane: {cidrs: [10.83.0.0/24]}
  workloadPlane: {cidrs: [10.83.0.0/24]}
  services: 10.96.0.0/16
apiServer: {vip: 10.83.0.100}
bundle:
  path: ` + bundleDir + `
  publicKeyFiles: [` + filepath.Join(cacheDir(), "bundle-signing.pub") + `]
stateDir: ` + state + `
boot:
  dhcp: server
  range: {start: 10.83.0.150, end: 10.83.0.170}
  # nodeISO: the bundle's netboot/node-amd64.iso (the default): kernel, initramfs, root filesystem
  kernelArgs: ["console=ttyS0,115200n8"]
nodes:
- name: cp1
  roles: [control-plane]
  addresses: [10.83.0.11]
  power: {kind: ipmi, address: 10.83.0.211, username: admin, passwordFile: ` + pw + `, bootDevice: disk}
- name: n1
  roles: [worker]
  addresses: [10.83.0.21]
  mac: "` + mac + `"
  power: {kind: ipmi, address: 10.83.0.221, username: admin, passwordFile: ` + pw + `}
  rootDevice: {serialNumber: ` + diskSerial + `}
- name: n2
  roles: [worker]
  addresses: [10.83.0.22]
  mac: "` + isoMAC + `"
  power: {kind: ipmi, address: 10.83.0.222, username: admin, passwordFile: ` + pw + `}
`
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	appliance := filepath.Join(bin, "appliance")
	t0 := time.Now()
	boot := ns.Command(appliance, "bootstrap", "--config", cfgPath, "--skip-phases", "power,converge,upgrade,handoff")
	out, err := boot.CombinedOutput()
	t.Cleanup(func() {
		if out, err := ns.Command(appliance, "stop", "--config", cfgPath).CombinedOutput(); err != nil {
			t.Logf("appliance stop: %v\n%s", err, out)
		}
		if b, err := os.ReadFile(filepath.Join(state, "serve", "serve.log")); err == nil {
			t.Logf("appliance serve log (tail):\n%s", lastLines(string(b), 60))
		}
	})
	if err != nil {
		t.Fatalf("appliance bootstrap: %v\n%s", err, out)
	}
	t.Logf("appliance bootstrap (to serve) in %.1fs:\n%s", time.Since(t0).Seconds(), lastLines(string(out), 15))

	// Power-ons are recorded by the tests, as the power phase records them before it asks the BMC.
	return &nodeLab{qemu: qemu, bin: bin, ns: ns, dir: dir, state: state, cfgPath: cfgPath,
		store: nodestate.Open(statedir.Nodes(state))}
}

// vmProc is one QEMU process.
type vmProc struct {
	cmd    *exec.Cmd
	start  time.Time
	exited chan struct{}
	out    *bytes.Buffer
}

func (v *vmProc) stop() {
	select {
	case <-v.exited:
	default:
		_ = v.cmd.Process.Kill() // by PID: `ip netns exec` execs QEMU
		<-v.exited
	}
}

// startVM starts the machine with devices; serial console appended to console.
func startVM(t *testing.T, ns *labns.NS, qemu, console string, devices []string) *vmProc {
	t.Helper()
	args := append([]string{"-name", "nodeimage", "-accel", "tcg", "-cpu", "qemu64,+rdrand", "-m", "1536", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none",
		"-chardev", "file,id=con,path=" + console + ",append=on", "-serial", "chardev:con"}, devices...)
	cmd := ns.Command(append([]string{qemu}, args...)...)
	labns.MachineSession(cmd) // its CPU share is a session's, not the caller's niced one
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	v := &vmProc{cmd: cmd, start: time.Now(), exited: make(chan struct{}), out: &out}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(v.exited) }()
	t.Cleanup(v.stop)
	t.Logf("QEMU pid %d, console %s", cmd.Process.Pid, console)
	return v
}

// consoleWatch waits for lines on the VM's serial console. The waits are bounded only so that a
// broken boot ends; nothing is asserted about how long they take.
type consoleWatch struct {
	t     *testing.T
	path  string
	start time.Time
	from  int
	vm    *vmProc
}

func (c *consoleWatch) since() time.Duration {
	return time.Since(c.start).Round(100 * time.Millisecond)
}

func (c *consoleWatch) size() int {
	b, _ := os.ReadFile(c.path)
	return len(b)
}

func (c *consoleWatch) waitLine(re *regexp.Regexp, limit time.Duration) string {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		b, _ := os.ReadFile(c.path)
		if c.from < len(b) {
			if m := re.FindString(string(b[c.from:])); m != "" {
				return m
			}
		}
		select {
		case <-c.vm.exited:
			c.t.Fatalf("QEMU exited before the console showed %q: %s\nconsole tail:\n%s", re, c.vm.out.String(), lastLines(string(b), 60))
		default:
		}
		if f := regexp.MustCompile(`(NODE-INIT: FAILED|Failed to start \S*node-first|hostagent\[[0-9]+\]: Error: )[^\n]*`).FindString(string(b[min(c.from, len(b)):])); f != "" {
			c.t.Fatalf("the node failed (%s) before the console showed %q; console tail:\n%s", f, re, lastLines(string(b), 80))
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the console never showed %q within %s; its tail:\n%s", re, limit, lastLines(string(b), 80))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// wait returns when re shows after offset from (0: c.from) and how long after the VM's start.
func (c *consoleWatch) wait(re *regexp.Regexp, from int, limit time.Duration) time.Duration {
	c.t.Helper()
	if from > 0 {
		c.from = from
	}
	c.waitLine(re, limit)
	return c.since()
}

// waitReport waits until node's hostagent, from a boot other than notBoot, has reported its config
// step done (it reached the appliance with its token and its configuration applies), and returns
// the status; a failed node ends the test with its reason.
func waitReport(t *testing.T, store *nodestate.Store, node, notBoot string, limit time.Duration, c *consoleWatch) agentapi.NodeStatus {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		st, err := store.Get(node)
		if err == nil && st.BootID != "" && st.BootID != notBoot {
			if st.State == agentapi.StateFailed {
				t.Fatalf("%s failed: %s", node, st.Reason)
			}
			if st.Steps[agentapi.StepConfig].Status == agentapi.StatusDone {
				return st
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(c.path)
			t.Fatalf("%s's hostagent never reported its config step done from a new boot within %s (status %+v, %v); console tail:\n%s", node, limit, st, err, lastLines(string(b), 80))
		}
		select {
		case <-c.vm.exited:
			t.Fatalf("QEMU exited before %s reported: %s", node, c.vm.out.String())
		default:
		}
		time.Sleep(time.Second)
	}
}

func steps(st agentapi.NodeStatus) string {
	var out []string
	for _, s := range agentapi.Steps {
		if r, ok := st.Steps[s]; ok {
			out = append(out, s+" "+r.Status)
		}
	}
	return strings.Join(out, ", ")
}

func readHead(t *testing.T, p string, n int) []byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
