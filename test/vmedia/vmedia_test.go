// Package vmedia proves Redfish virtual media end to end: pkg/power drives the lab's Redfish BMC
// (test/redfishbmc, the project's own emulator, because no real BMC can run here) whose host is a
// real QEMU VM driven over QMP; the BMC fetches the ISO from an HTTPS server over TLS it verifies with
// the CA pkg/power hands it, attaches it as the VM's CD, and the VM boots that ISO.
package vmedia

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/pkg/power"
	"github.com/airgap-appliance/appliance/test/labns"
	"github.com/airgap-appliance/appliance/test/labredfish"
)

func TestMain(m *testing.M) {
	labns.ProbeMain(map[string]func([]string) int{"recv": recv})
	os.Exit(m.Run())
}

// recv ADDR: a TCP listener that prints "ready", then "got LINE" for every line a client sends,
// until stdin closes (the VM's callback, inside the test's namespace).
func recv(args []string) int {
	l, err := net.Listen("tcp", args[1])
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Println("got", sc.Text())
				}
			}()
		}
	}()
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// TestVirtualMediaBootsVM: pkg/power's BootVirtualMedia against the lab's Redfish BMC (the project's
// emulator, sessions on) boots a powered-off QEMU VM (TCG, no disk) from an ISO served over HTTPS by
// this test:
//   - the BMC gets the ISO server's CA in its VirtualMedia Certificates with
//     VerifyCertificate on, and fetches the ISO over verified TLS (the server counts the GET);
//   - the slot reads back Inserted with the image, the one-time boot override reads back Cd;
//   - the VM's serial console shows GRUB booting the ISO's entry, the kernel command line carrying
//     this run's nonce, the kit's /init starting, and the VM's network callback ("hello from
//     vmedia-NONCE") reaches a listener in the test's namespace;
//   - the media is ejected again (read back not inserted);
//   - the root network namespace has exactly the links it had before (QEMU ran in a namespace of
//     its own, with user-mode networking only).
//
// It prints the shares: insert (slot, CA, BMC download, read-back), boot override, power on, and
// power-on → GRUB → kernel → init → callback.
func TestVirtualMediaBootsVM(t *testing.T) {
	labns.NotInShort(t, "boots a TCG VM from the lab BMC's virtual media")
	labns.RequireRoot(t)
	labns.RequireTool(t, "grub-mkrescue")
	labns.RequireTool(t, "xorriso")
	before := labns.RootLinks(t)
	kernel, initrd := vmKit(t)
	m := labredfish.StartMachine(t, labredfish.MachineOptions{MemoryMiB: 256})

	nb := make([]byte, 4)
	_, _ = rand.Read(nb)
	nonce := hex.EncodeToString(nb)
	const port = 7011
	probe := labns.StartProbe(t, m.NS, "recv", fmt.Sprintf("127.0.0.1:%d", port))
	// QEMU user networking: the guest is 10.0.2.15, the host (the namespace's loopback) 10.0.2.2.
	cmdline := fmt.Sprintf("console=ttyS0 panic=-1 vmedia.nonce=%s ip=10.0.2.15::10.0.2.2:255.255.255.0:vmedia-%s:eth0:off lab.test=10.0.2.2:%d", nonce, nonce, port)
	iso := buildISO(t, kernel, initrd, cmdline)

	vb, rep, start := bootFromVirtualMedia(t, m, iso)
	milestones := kitMilestones(nonce)
	seen := waitConsole(t, m, start, milestones, "LAB-INIT: FAILED", 4*time.Minute)
	waitCallback(t, m, probe, nonce)
	logShares(t, rep, milestones, seen)

	// The override was "Once" (DSP2046): the BMC reads it back Disabled after the boot that used it.
	b, err := m.Get("/redfish/v1/Systems/" + m.SystemID)
	if err != nil || !strings.Contains(string(b), `"BootSourceOverrideEnabled":"Disabled"`) {
		t.Errorf("the one-time CD override after the boot: %v\n%s", err, b)
	}
	if err := vb.EjectVirtualMedia(t.Context()); err != nil {
		t.Errorf("EjectVirtualMedia: %v", err)
	}
	if b, err := m.Get("/redfish/v1/Systems/" + m.SystemID + "/VirtualMedia/CD1"); err != nil || !strings.Contains(string(b), `"Inserted":false`) {
		t.Errorf("the CD after the eject: %v\n%s", err, b)
	}

	if after := labns.RootLinks(t); !slices.Equal(before, after) {
		t.Errorf("the root namespace's links changed: before %v, after %v", before, after)
	}
}

type milestone struct{ name, text string }

// kitMilestones are what the lab kit ISO's boot shows on the console, in order (buildISO's entry).
func kitMilestones(nonce string) []milestone {
	return []milestone{
		{"GRUB boots the ISO's entry", "Booting `vmedia'"},
		{"kernel command line with the nonce", "vmedia.nonce=" + nonce},
		{"init started", "LAB-INIT: start"},
		{"callback sent", "LAB-TEST: sent hello"},
	}
}

// waitCallback waits (30 s at most, after the console showed it sent) for the VM's network callback
// "hello from vmedia-NONCE" at the listener in the machine's namespace.
func waitCallback(t *testing.T, m labredfish.Machine, probe *labns.Probe, nonce string) {
	t.Helper()
	want := "got hello from vmedia-" + nonce
	for wait := time.After(30 * time.Second); ; {
		select {
		case l, ok := <-probe.Lines:
			if !ok {
				t.Fatal("the listener in the namespace ended")
			}
			if l == want {
				return
			}
		case <-wait:
			t.Fatalf("the listener in %s never got %q", m.NS.Name, want)
		}
	}
}

// bootFromVirtualMedia serves iso over HTTPS (a certificate of a CA of its own, which pkg/power hands
// the BMC) and has pkg/power boot m from it through the lab's BMC: the BMC must fetch it over verified
// TLS, and the report must show a standard slot, verified, powered on. start is when the call began.
func bootFromVirtualMedia(t *testing.T, m labredfish.Machine, iso string) (vb power.VirtualMediaBooter, rep power.VirtualMediaReport, start time.Time) {
	t.Helper()
	isoCA, leaf := pkitest.Issue(t)
	var gets atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/node.iso" {
			http.NotFound(w, r)
			return
		}
		gets.Add(1)
		http.ServeFile(w, r, iso)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	ctx := t.Context()
	c, err := power.NewBMC(ctx, power.BMCOptions{Kind: power.KindRedfish, Host: "127.0.0.1", Port: m.Port,
		Username: m.User, Password: m.Password, CAPEM: m.CAPEM, Timeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if st, err := c.PowerState(ctx); err != nil || st != power.StateOff {
		t.Fatalf("the VM before: %v, %v (want off)", st, err)
	}
	vb, ok := c.(power.VirtualMediaBooter)
	if !ok {
		t.Fatalf("the Redfish controller %T does not implement power.VirtualMediaBooter", c)
	}
	start = time.Now()
	rep, err = vb.BootVirtualMedia(ctx, power.VirtualMediaOptions{Image: srv.URL + "/node.iso", CAPEM: isoCA})
	if err != nil {
		log, _ := os.ReadFile(m.Log)
		t.Fatalf("BootVirtualMedia: %v\nBMC log:\n%s", err, log)
	}
	if !rep.Verified || rep.Powered != "on" || rep.Legacy || !strings.Contains(rep.Slot, "/VirtualMedia/") {
		t.Errorf("report %+v: want a standard slot, TLS verified, powered on", rep)
	}
	if gets.Load() == 0 {
		t.Errorf("the BMC never fetched %s/node.iso", srv.URL)
	}
	t.Logf("BMC: %s", rep)
	return vb, rep, start
}

// waitConsole waits until the VM's serial console shows each milestone in order and returns when
// each was first seen (since start). A console line holding failed, or bound passing, fails the test
// with the console's end (bound is a limit for a hung boot under TCG, not a speed check).
func waitConsole(t *testing.T, m labredfish.Machine, start time.Time, milestones []milestone, failed string, bound time.Duration) []time.Duration {
	t.Helper()
	seen := make([]time.Duration, len(milestones))
	deadline := time.Now().Add(bound)
	for next := 0; next < len(milestones); time.Sleep(100 * time.Millisecond) {
		b, _ := os.ReadFile(m.Console)
		for next < len(milestones) && bytes.Contains(b, []byte(milestones[next].text)) {
			seen[next] = time.Since(start)
			next++
		}
		if bytes.Contains(b, []byte(failed)) || (next < len(milestones) && time.Now().After(deadline)) {
			t.Fatalf("the VM's console lacks %q:\n%s", milestones[next].text, tail(b, 3000))
		}
	}
	return seen
}

// logShares prints the BMC's shares (insert, boot override, power) and each milestone's.
func logShares(t *testing.T, rep power.VirtualMediaReport, milestones []milestone, seen []time.Duration) {
	shares := []string{fmt.Sprintf("insert %.1fs", rep.Insert.Seconds()), fmt.Sprintf("boot override %.1fs", rep.Boot.Seconds()), fmt.Sprintf("power on %.1fs", rep.Power.Seconds())}
	prev := rep.Insert + rep.Boot + rep.Power
	for i, ms := range milestones {
		shares = append(shares, fmt.Sprintf("→ %s +%.1fs", ms.name, (seen[i]-prev).Seconds()))
		prev = seen[i]
	}
	t.Logf("virtual media boot, %.1fs in all: %s", prev.Seconds(), strings.Join(shares, ", "))
}

// The node image ISO itself, booted by the same driver, is TestBareMetalWorkerJoinsCluster's
// (test/nodeimage): its n2 boots it from virtual media inserted by `appliance bootstrap` all the way
// to an installed, Ready Kubernetes node (it replaced TestVirtualMediaBootsNodeImage, which booted the
// ISO to multi-user.target only).

// vmKit returns the lab VM kit (test/fixtures/build-vmkit.sh: Debian cloud kernel + busybox
// initramfs) as the lab's chassis finds it (--check); a missing kit fails with the build command.
func vmKit(t *testing.T) (kernel, initrd string) {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "fixtures", "build-vmkit.sh"))
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

// buildISO makes a BIOS+UEFI hybrid ISO with grub-mkrescue (as iso/build-iso.sh does) that boots
// kernel and initrd with cmdline at once, GRUB on the serial console.
func buildISO(t *testing.T, kernel, initrd, cmdline string) string {
	t.Helper()
	dir := t.TempDir()
	stage := filepath.Join(dir, "stage")
	if err := os.MkdirAll(filepath.Join(stage, "boot", "grub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for src, dst := range map[string]string{kernel: "vmlinuz", initrd: "initrd.img"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(stage, "boot", dst), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := fmt.Sprintf("set timeout=0\nserial --unit=0 --speed=115200\nterminal_input serial console\nterminal_output serial console\nmenuentry vmedia {\n  linux /boot/vmlinuz %s\n  initrd /boot/initrd.img\n}\n", cmdline)
	if err := os.WriteFile(filepath.Join(stage, "boot", "grub", "grub.cfg"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	iso := filepath.Join(dir, "node.iso")
	if out, err := exec.Command("grub-mkrescue", "-o", iso, stage, "--", "-volid", "VMEDIA").CombinedOutput(); err != nil {
		t.Fatalf("grub-mkrescue: %v\n%s", err, out)
	}
	return iso
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// TestVirtualMediaStreamBootsVM: the same VM boots with UEFI (OVMF) from an ISO the BMC streams
// (InsertMedia TransferMethod "Stream", DSP2046 VirtualMedia: the host reads the image through the
// BMC on demand, nothing is copied first), driven as a Redfish client would, by plain requests: the
// ISO server's CA into the slot's Certificates, VerifyCertificate on, InsertMedia with Stream over
// HTTPS, a one-time Cd override in UEFI mode, power on. The image server sees only range requests
// (the BMC never fetches the image whole) and the VM's console shows the ISO booting to its network
// callback; the eject then leaves the slot empty.
func TestVirtualMediaStreamBootsVM(t *testing.T) {
	labns.NotInShort(t, "boots a TCG VM from the lab BMC's streamed virtual media")
	labns.RequireRoot(t)
	labns.RequireTool(t, "grub-mkrescue")
	labns.RequireTool(t, "nbdkit")
	kernel, initrd := vmKit(t)
	m := labredfish.StartMachine(t, labredfish.MachineOptions{MemoryMiB: 256, UEFI: true})
	nb := make([]byte, 4)
	_, _ = rand.Read(nb)
	nonce := hex.EncodeToString(nb)
	const port = 7012
	probe := labns.StartProbe(t, m.NS, "recv", fmt.Sprintf("127.0.0.1:%d", port))
	cmdline := fmt.Sprintf("console=ttyS0 panic=-1 vmedia.nonce=%s ip=10.0.2.15::10.0.2.2:255.255.255.0:vmedia-%s:eth0:off lab.test=10.0.2.2:%d", nonce, nonce, port)
	iso := buildISO(t, kernel, initrd, cmdline)

	isoCA, leaf := pkitest.Issue(t)
	var ranged, whole atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Range") != "" {
			ranged.Add(1)
		} else if r.Method == http.MethodGet {
			whole.Add(1)
		}
		http.ServeFile(w, r, iso)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	sys := "/redfish/v1/Systems/" + m.SystemID
	slot := sys + "/VirtualMedia/CD1"
	start := time.Now()
	for _, req := range []struct {
		method, path string
		body         any
	}{
		{"POST", slot + "/Certificates", map[string]string{"CertificateString": string(isoCA), "CertificateType": "PEM"}},
		{"PATCH", slot, map[string]bool{"VerifyCertificate": true}},
		{"POST", slot + "/Actions/VirtualMedia.InsertMedia", map[string]any{"Image": srv.URL + "/vmedia.iso", "TransferMethod": "Stream", "TransferProtocolType": "HTTPS"}},
		{"PATCH", sys, map[string]any{"Boot": map[string]string{"BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Once", "BootSourceOverrideMode": "UEFI"}}},
		{"POST", sys + "/Actions/ComputerSystem.Reset", map[string]string{"ResetType": "On"}},
	} {
		if _, err := m.Do(req.method, req.path, req.body); err != nil {
			log, _ := os.ReadFile(m.Log)
			t.Fatalf("%v\nBMC log:\n%s", err, tail(log, 3000))
		}
	}
	b, err := m.Get(slot)
	if err != nil || !strings.Contains(string(b), `"TransferMethod":"Stream"`) || !strings.Contains(string(b), `"Inserted":true`) {
		t.Fatalf("the slot after a streamed insert: %v\n%s", err, b)
	}
	seen := waitConsole(t, m, start, kitMilestones(nonce), "LAB-INIT: FAILED", 5*time.Minute)
	waitCallback(t, m, probe, nonce)
	if ranged.Load() < 2 || whole.Load() != 0 {
		t.Errorf("the image server saw %d range requests and %d whole-file GETs: a streamed image is read in ranges only", ranged.Load(), whole.Load())
	}
	if _, err := m.Do("POST", slot+"/Actions/VirtualMedia.EjectMedia", map[string]any{}); err != nil {
		t.Fatalf("eject: %v", err)
	}
	if b, err := m.Get(slot); err != nil || !strings.Contains(string(b), `"Inserted":false`) {
		t.Errorf("the slot after the eject: %v\n%s", err, b)
	}
	t.Logf("streamed UEFI boot: %d range requests; callback after %.1fs (GRUB %.1fs, kernel %.1fs, init %.1fs)",
		ranged.Load(), seen[3].Seconds(), seen[0].Seconds(), seen[1].Seconds(), seen[2].Seconds())
}
