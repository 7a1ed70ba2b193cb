//go:build e2e

// Package iso boots the appliance ISO (iso/build-iso.sh) in QEMU under TCG, the way an operator boots
// it on a server: the ISO as a CD, a configuration volume (FAT, label APPL-CONFIG) and a blank state
// disk as virtio disks, its NIC on a bridge in a network namespace of its own. Everything runs inside
// that namespace; nothing touches the root namespace's network.
package iso

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/test/labns"
)

const (
	vmMAC     = "52:54:00:10:00:02"
	vmAddr    = "10.100.0.2"
	bridgeCIP = "10.100.0.1/24"
	bootWait  = 6 * time.Minute
)

// repoRoot is the repository's root directory.
func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// buildISO builds (or reuses, by content) the ISO with binaries built from this tree.
func buildISO(t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	bin := t.TempDir()
	for _, c := range [][]string{
		{"go", "build", "-trimpath", "-o", filepath.Join(bin, "appliance"), "./cmd/appliance"},
		{"go", "build", "-trimpath", "-o", filepath.Join(bin, "hostagent"), "./cmd/hostagent"},
	} {
		cmd := exec.Command(c[0], c[1:]...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
	out := filepath.Join(labns.FixtureCache(), "iso", "appliance-test-amd64.iso")
	cmd := exec.Command("bash", filepath.Join(root, "iso", "build-iso.sh"), "--appliance", filepath.Join(bin, "appliance"),
		"--hostagent", filepath.Join(bin, "hostagent"), "--bundle", filepath.Join(labns.FixtureCache(), "bundle"), "--out", out)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if _, err := cmd.Output(); err != nil {
		t.Fatalf("iso/build-iso.sh: %v\n%s", err, stderr.String())
	}
	t.Logf("%s", strings.TrimSpace(stderr.String()))
	return out
}

// vm is one QEMU boot of the ISO.
type vm struct {
	cmd     *exec.Cmd
	console string
	start   time.Time
	exited  chan struct{}
	output  bytes.Buffer
}

// machine is the namespace with the bridge, the disks and the configuration volume.
type machine struct {
	ns              *labns.NS
	dir, iso, state string
	config          string // FAT image with bootstrap.yaml, or ""
}

func newMachine(t *testing.T, iso string) *machine {
	t.Helper()
	for _, tool := range []string{"qemu-system-x86_64", "mkfs.vfat", "mcopy", "curl"} {
		labns.RequireTool(t, tool)
	}
	m := &machine{ns: labns.New(t, "iso"), dir: t.TempDir(), iso: iso}
	m.ns.MustRun("ip", "link", "add", "br0", "type", "bridge")
	m.ns.MustRun("ip", "addr", "add", bridgeCIP, "dev", "br0")
	m.ns.MustRun("ip", "link", "set", "br0", "up")
	m.ns.MustRun("ip", "tuntap", "add", "tap0", "mode", "tap")
	m.ns.MustRun("ip", "link", "set", "tap0", "master", "br0", "up")
	m.state = filepath.Join(m.dir, "state.img")
	if err := os.WriteFile(m.state, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(m.state, 1<<30); err != nil { // blank: all zeros, no signature
		t.Fatal(err)
	}
	return m
}

// configVolume makes the APPL-CONFIG FAT image holding bootstrap.yaml and the files it names.
func (m *machine) configVolume(t *testing.T, files map[string]string) {
	t.Helper()
	img := filepath.Join(m.dir, "config.img")
	_ = os.Remove(img)
	if out, err := exec.Command("mkfs.vfat", "-C", "-n", "APPL-CONFIG", img, "16384").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.vfat: %v\n%s", err, out)
	}
	for name, content := range files {
		p := filepath.Join(m.dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mcopy", "-i", img, p, "::/"+name).CombinedOutput(); err != nil {
			t.Fatalf("mcopy %s: %v\n%s", name, err, out)
		}
	}
	m.config = img
}

func labConfig(t *testing.T) map[string]string {
	pub, err := os.ReadFile(filepath.Join(labns.FixtureCache(), "bundle-signing.pub"))
	if err != nil {
		t.Fatalf("the fixture bundle's public key (make fixtures): %v", err)
	}
	return map[string]string{
		"bundle-signing.pub": string(pub),
		"w1.password":        "lab-bmc-password\n",
		"bootstrap.yaml": `apiVersion: appliance.airgap.dev/v1alpha1
kind: BootstrapConfiguration
clusterName: isolab
networks:
  controlPlane: {cidrs: [10.100.0.0/24]}
  workloadPlane: {cidrs: [10.200.0.0/24]}
  services: 10.96.0.0/16
apiServer: {vip: 10.100.0.100}
bundle:
  path: /run/appliance/medium/bundle
  publicKeyFiles: [/run/appliance/config/bundle-signing.pub]
stateDir: /var/lib/appliance
host:
  interfaces:
  - macAddress: "` + vmMAC + `"
    addresses: [10.100.0.2/24, 10.200.0.2/24]
  stateDevice: /dev/disk/by-id/virtio-applstate
nodes:
- name: cp1
  roles: [control-plane, worker]
  addresses: [10.100.0.11, 10.200.0.11]
  power: {kind: ipmi, address: 10.100.0.111, username: admin, passwordFile: /run/appliance/config/w1.password}
`,
	}
}

// boot starts QEMU (BIOS, or UEFI with OVMF) in the namespace; the VM is killed (by PID) when the
// test ends or by halt.
func (m *machine) boot(t *testing.T, name string, uefi bool) *vm {
	t.Helper()
	if strings.Contains(m.dir, ",") {
		t.Fatalf("%s: QEMU's option syntax cannot take a path with a comma", m.dir)
	}
	v := &vm{console: filepath.Join(m.dir, name+".console.log"), start: time.Now()}
	args := []string{"qemu-system-x86_64", "-name", "appliance-iso-test", "-accel", "tcg", "-cpu", "qemu64,+rdrand",
		"-m", "2048", "-smp", "2", "-nodefaults", "-no-user-config", "-display", "none",
		"-chardev", "file,id=con,path=" + v.console, "-serial", "chardev:con",
		"-drive", "file=" + m.iso + ",media=cdrom,if=ide,readonly=on,format=raw", "-boot", "d",
		"-drive", "file=" + m.state + ",if=none,id=state,format=raw", "-device", "virtio-blk-pci,drive=state,serial=applstate",
		"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no", "-device", "virtio-net-pci,netdev=n0,mac=" + vmMAC}
	if m.config != "" {
		args = append(args, "-drive", "file="+m.config+",if=none,id=cfg,format=raw", "-device", "virtio-blk-pci,drive=cfg,serial=applconfig")
	}
	if uefi {
		vars := filepath.Join(m.dir, name+".OVMF_VARS.fd")
		data, err := os.ReadFile("/usr/share/OVMF/OVMF_VARS_4M.fd")
		if err != nil {
			t.Fatalf("OVMF (Debian package ovmf): %v", err)
		}
		if err := os.WriteFile(vars, data, 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-machine", "q35", "-drive", "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
			"-drive", "if=pflash,format=raw,unit=1,file="+vars)
		// q35 has AHCI instead of IDE for the CD.
		for i, a := range args {
			if strings.HasPrefix(a, "file="+m.iso) {
				args[i] = strings.Replace(a, "if=ide", "if=none,id=cd", 1)
			}
		}
		args = append(args, "-device", "ide-cd,drive=cd,bus=ide.0")
	}
	v.cmd = m.ns.Command(args...)
	v.cmd.Stdout, v.cmd.Stderr = &v.output, &v.output
	if err := v.cmd.Start(); err != nil {
		t.Fatalf("qemu: %v", err)
	}
	v.exited = make(chan struct{})
	go func() { _ = v.cmd.Wait(); close(v.exited) }()
	t.Cleanup(func() { v.halt() })
	t.Logf("%s: QEMU pid %d (%s), console %s", name, v.cmd.Process.Pid, map[bool]string{false: "BIOS", true: "UEFI/OVMF"}[uefi], v.console)
	return v
}

// halt kills the VM (its PID) and waits for it.
func (v *vm) halt() {
	select {
	case <-v.exited:
	default:
		_ = v.cmd.Process.Kill()
		<-v.exited
	}
}

// dead reports whether QEMU has exited (then with its output).
func (v *vm) dead() (string, bool) {
	select {
	case <-v.exited:
		return "QEMU exited: " + v.output.String(), true
	default:
		return "", false
	}
}

func (v *vm) log() string {
	b, _ := os.ReadFile(v.console)
	return string(b)
}

// waitConsole waits until the console shows re, or fails with the console's tail.
func (v *vm) waitConsole(t *testing.T, re *regexp.Regexp, limit time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if m := re.FindString(v.log()); m != "" {
			return m
		}
		if why, dead := v.dead(); dead || time.Now().After(deadline) {
			t.Fatalf("console never showed %q within %s %s; its tail:\n%s", re, limit, why, tail(v.log(), 40))
		}
		time.Sleep(time.Second)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitHealthz polls https://VM:8443/healthz from the namespace until it answers, and returns the CA
// certificate the appliance serves (fetched once healthz answers) and the time it took.
func (m *machine) waitHealthz(t *testing.T, v *vm) (*x509.Certificate, time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bootWait)
	for {
		out, err := m.ns.Run("curl", "-skf", "--max-time", "3", "https://"+vmAddr+":8443/healthz")
		if err == nil && strings.Contains(out, "generation") {
			took := time.Since(v.start)
			pemOut, err := m.ns.Run("curl", "-skf", "--max-time", "5", "https://"+vmAddr+":8443/ca.crt")
			if err != nil {
				t.Fatalf("GET /ca.crt: %v", err)
			}
			blk, _ := pem.Decode([]byte(pemOut))
			if blk == nil {
				t.Fatalf("/ca.crt is not PEM: %q", pemOut)
			}
			ca, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			// Now with the CA pinned: the serving certificate chains to it.
			caFile := filepath.Join(m.dir, "ca.pem")
			_ = os.WriteFile(caFile, []byte(pemOut), 0o644)
			if out, err := m.ns.Run("curl", "-sf", "--max-time", "5", "--cacert", caFile, "https://"+vmAddr+":8443/healthz"); err != nil {
				t.Fatalf("healthz with the CA pinned: %v %s", err, out)
			}
			return ca, took
		}
		if why, dead := v.dead(); dead || time.Now().After(deadline) {
			t.Fatalf("https://%s:8443/healthz did not answer within %s %s; console tail:\n%s", vmAddr, bootWait, why, tail(v.log(), 60))
		}
		time.Sleep(2 * time.Second)
	}
}

// shares reads the boot's phases from the console: kernel → initramfs, medium verified, systemd.
func shares(console string) string {
	var parts []string
	for _, p := range []struct{ name, re string }{
		{"initramfs start", `APPLIANCE-INIT: start \([^,]+, ([0-9.]+)s`},
		{"medium verified", `medium verified \(\d+ files\) at ([0-9.]+)s`},
		{"systemd", `switching to systemd at ([0-9.]+)s`},
	} {
		if m := regexp.MustCompile(p.re).FindStringSubmatch(console); m != nil {
			parts = append(parts, p.name+" at "+m[1]+" s")
		}
	}
	return strings.Join(parts, ", ")
}

func pinOf(c *x509.Certificate) string { return agentapi.PinOf(c) }

// TestISOBoot: power-on → /healthz over the network with BIOS, the state kept across a reboot (same
// CA, the state disk mounted and not formatted again), and a UEFI boot; then the refusals.
func TestISOBoot(t *testing.T) {
	labns.RequireRoot(t)
	iso := buildISO(t)
	m := newMachine(t, iso)
	m.configVolume(t, labConfig(t))

	v := m.boot(t, "bios", false)
	ca, took := m.waitHealthz(t, v)
	t.Logf("BIOS: power-on → /healthz in %.1f s (%s); CA pin %s", took.Seconds(), shares(v.log()), pinOf(ca))
	if !strings.Contains(v.log(), "is blank: formatting it ext4") {
		t.Errorf("first boot: the blank state disk was not formatted; console:\n%s", tail(v.log(), 40))
	}
	v.halt()

	v = m.boot(t, "bios-reboot", false)
	ca2, took := m.waitHealthz(t, v)
	t.Logf("BIOS reboot: /healthz in %.1f s", took.Seconds())
	if pinOf(ca2) != pinOf(ca) {
		t.Errorf("after a reboot the CA changed: %s, was %s (the state disk was not kept)", pinOf(ca2), pinOf(ca))
	}
	if strings.Contains(v.log(), "formatting it") {
		t.Errorf("the reboot formatted the state disk again")
	}
	v.halt()

	v = m.boot(t, "uefi", true)
	ca3, took := m.waitHealthz(t, v)
	t.Logf("UEFI (OVMF): power-on → /healthz in %.1f s (%s)", took.Seconds(), shares(v.log()))
	if pinOf(ca3) != pinOf(ca) {
		t.Errorf("UEFI boot: CA %s, want %s", pinOf(ca3), pinOf(ca))
	}
	v.halt()
}

// TestISORefusals: without a configuration the console says what to provide; a corrupted medium
// is refused before the system starts, naming the file.
func TestISORefusals(t *testing.T) {
	labns.RequireRoot(t)
	iso := buildISO(t)
	t.Run("without a configuration volume the console says what to provide", func(t *testing.T) {
		m2 := newMachine(t, iso)
		v := m2.boot(t, "noconfig", false)
		v.waitConsole(t, regexp.MustCompile(`attach a volume labelled APPL-CONFIG`), bootWait)
	})

	// (No commas in subtest names: they end up in paths that QEMU's option syntax would split.)
	t.Run("a corrupted medium is refused naming the file", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "corrupted.iso")
		data, err := os.ReadFile(iso)
		if err != nil {
			t.Fatal(err)
		}
		// README.txt's text is on the medium once; change one byte of it.
		i := bytes.Index(data, []byte("BOOTSTRAP APPLIANCE — this medium"))
		if i < 0 {
			t.Fatal("README.txt's text not found in the ISO")
		}
		data[i] = 'b'
		if err := os.WriteFile(bad, data, 0o600); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		t.Logf("corrupted ISO sha256 %s", hex.EncodeToString(sum[:8]))
		m2 := newMachine(t, bad)
		v := m2.boot(t, "corrupted", false)
		v.waitConsole(t, regexp.MustCompile(`corrupted medium: README.txt: FAILED`), bootWait)
		v.waitConsole(t, regexp.MustCompile(`failed verification`), time.Minute)
		if strings.Contains(v.log(), "switching to systemd") {
			t.Errorf("a corrupted medium was booted")
		}
	})
}
