//go:build e2e

// Package iso boots the appliance ISO (iso/build-iso.sh) in QEMU under TCG (test/isovm): a
// configuration volume and a blank state disk, its NIC on a bridge in a network namespace of its own.
// The whole journey from the ISO, with the lab's nodes, is test/integration's TestISOJourney.
package iso

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/test/isovm"
	"github.com/airgap-appliance/appliance/test/labns"
)

const (
	vmMAC    = "52:54:00:10:00:02"
	vmAddr   = "10.100.0.2"
	bootWait = 6 * time.Minute
)

// machine is the namespace with a bridge and a tap, and the VM's disks.
type machine struct {
	ns                      *labns.NS
	dir, iso, state, config string
}

func newMachine(t *testing.T, iso string) *machine {
	t.Helper()
	labns.RequireTool(t, "curl")
	m := &machine{ns: labns.New(t, "iso"), dir: t.TempDir(), iso: iso}
	m.ns.MustRun("ip", "link", "add", "br0", "type", "bridge")
	m.ns.MustRun("ip", "addr", "add", "10.100.0.1/24", "dev", "br0")
	m.ns.MustRun("ip", "link", "set", "br0", "up")
	m.ns.MustRun("ip", "tuntap", "add", "tap0", "mode", "tap")
	m.ns.MustRun("ip", "link", "set", "tap0", "master", "br0", "up")
	m.state = isovm.BlankDisk(t, filepath.Join(m.dir, "state.img"), 1<<30)
	return m
}

func (m *machine) boot(t *testing.T, name string, uefi bool) *isovm.VM {
	return isovm.Boot(t, isovm.Options{NS: m.ns, ISO: m.iso, Config: m.config, State: m.state, UEFI: uefi,
		NICs: []isovm.NIC{{Tap: "tap0", MAC: vmMAC}}, Dir: m.dir, Name: name})
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
  stateDevice: ` + isovm.StateDevice + `
nodes:
- name: cp1
  roles: [control-plane, worker]
  addresses: [10.100.0.11, 10.200.0.11]
  power: {kind: ipmi, address: 10.100.0.111, username: admin, passwordFile: /run/appliance/config/w1.password}
`,
	}
}

// waitHealthz polls https://VM:8443/healthz from the namespace until it answers, then fetches the CA
// the appliance serves and checks /healthz again with it pinned. It returns the CA and the time since
// power-on.
func (m *machine) waitHealthz(t *testing.T, v *isovm.VM) (*x509.Certificate, time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bootWait)
	for {
		out, err := m.ns.Run("curl", "-skf", "--max-time", "3", "https://"+vmAddr+":8443/healthz")
		if err == nil && strings.Contains(out, "generation") {
			took := time.Since(v.Start)
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
			caFile := filepath.Join(m.dir, "ca.pem")
			if err := os.WriteFile(caFile, []byte(pemOut), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := m.ns.Run("curl", "-sf", "--max-time", "5", "--cacert", caFile, "https://"+vmAddr+":8443/healthz"); err != nil {
				t.Fatalf("healthz with the CA pinned: %v %s", err, out)
			}
			return ca, took
		}
		if why, dead := v.Dead(); dead || time.Now().After(deadline) {
			t.Fatalf("https://%s:8443/healthz did not answer within %s %s; console tail:\n%s", vmAddr, bootWait, why, isovm.Tail(v.Log(), 60))
		}
		time.Sleep(2 * time.Second)
	}
}

// TestISOBoot: power-on → /healthz over the network with BIOS, the state kept across a reboot (same
// CA, the state disk mounted and not formatted again), and a UEFI boot. A second proof, in make
// check-full (the Makefile's FULL_ONLY): make check's TestISOJourney boots the same ISO with BIOS,
// bootstraps from it and reboots it with UEFI, keeping the CA and the state disk.
func TestISOBoot(t *testing.T) {
	labns.RequireRoot(t)
	iso := isovm.BuildISO(t)
	m := newMachine(t, iso)
	m.config = isovm.ConfigVolume(t, m.dir, labConfig(t))

	v := m.boot(t, "bios", false)
	ca, took := m.waitHealthz(t, v)
	t.Logf("BIOS: power-on → /healthz in %.1f s (%s); CA pin %s", took.Seconds(), v.Shares("serve"), agentapi.PinOf(ca))
	if !strings.Contains(v.Log(), "is blank: formatting it ext4") {
		t.Errorf("first boot: the blank state disk was not formatted; console:\n%s", isovm.Tail(v.Log(), 40))
	}
	v.Halt()

	v = m.boot(t, "bios-reboot", false)
	ca2, took := m.waitHealthz(t, v)
	t.Logf("BIOS reboot: /healthz in %.1f s", took.Seconds())
	if agentapi.PinOf(ca2) != agentapi.PinOf(ca) {
		t.Errorf("after a reboot the CA changed: %s, was %s (the state disk was not kept)", agentapi.PinOf(ca2), agentapi.PinOf(ca))
	}
	if strings.Contains(v.Log(), "formatting it") {
		t.Errorf("the reboot formatted the state disk again")
	}
	v.Halt()

	v = m.boot(t, "uefi", true)
	ca3, took := m.waitHealthz(t, v)
	t.Logf("UEFI (OVMF): power-on → /healthz in %.1f s (%s)", took.Seconds(), v.Shares("serve"))
	if agentapi.PinOf(ca3) != agentapi.PinOf(ca) {
		t.Errorf("UEFI boot: CA %s, want %s", agentapi.PinOf(ca3), agentapi.PinOf(ca))
	}
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestISORefusals: without a configuration the console says what to provide; a state disk that
// holds something else is refused and left alone; a corrupted medium is refused before the system
// starts, naming the file. (No commas in subtest names: they end up in paths QEMU would split.)
func TestISORefusals(t *testing.T) {
	labns.RequireRoot(t)
	iso := isovm.BuildISO(t)
	t.Run("without a configuration volume the console says what to provide", func(t *testing.T) {
		m := newMachine(t, iso)
		v := m.boot(t, "noconfig", false)
		v.WaitConsole(t, regexp.MustCompile(`attach a volume labelled APPL-CONFIG`), bootWait)
	})

	t.Run("a state disk that holds something else is refused", func(t *testing.T) {
		labns.RequireTool(t, "mkfs.ext4")
		m := newMachine(t, iso)
		m.config = isovm.ConfigVolume(t, m.dir, labConfig(t))
		if out, err := exec.Command("mkfs.ext4", "-q", "-L", "DATA", m.state).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.ext4: %v\n%s", err, out)
		}
		before := fileSum(t, m.state)
		v := m.boot(t, "otherdisk", false)
		v.WaitConsole(t, regexp.MustCompile(`is not blank and is not the appliance's state disk \(found [^)]*label DATA`), bootWait)
		v.Halt()
		if after := fileSum(t, m.state); after != before {
			t.Errorf("the refused disk was written to")
		}
	})

	t.Run("a corrupted medium is refused naming the file", func(t *testing.T) {
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
		bad := filepath.Join(t.TempDir(), "corrupted.iso")
		if err := os.WriteFile(bad, data, 0o600); err != nil {
			t.Fatal(err)
		}
		m := newMachine(t, bad)
		v := m.boot(t, "corrupted", false)
		v.WaitConsole(t, regexp.MustCompile(`corrupted medium: README.txt: FAILED`), bootWait)
		v.WaitConsole(t, regexp.MustCompile(`failed verification`), time.Minute)
		if strings.Contains(v.Log(), "switching to systemd") {
			t.Errorf("a corrupted medium was booted")
		}
	})
}
