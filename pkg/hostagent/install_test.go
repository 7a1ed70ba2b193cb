package hostagent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/install"
	"github.com/airgap-appliance/appliance/pkg/netboot"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/server"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestInstalledNetwork: the node's static addresses (agentapi.BootArgs.Network) are what the
// installed system keeps; without appliance.gateway the DHCP gateway of this boot is taken when it is
// on their network.
func TestInstalledNetwork(t *testing.T) {
	line := "initrd=initrd console=tty0 console=ttyS0,115200n8 appliance.url=https://10.0.0.2:8443 " +
		"appliance.ca_pin=sha256:ab appliance.node=w1 appliance.initrd=http://10.0.0.2:8080/boot/initrd " +
		"BOOTIF=01-52-54-00-00-00-21 appliance.ip=10.0.0.50::10.0.0.1:255.255.255.0"
	b, err := agentapi.ParseBootArgs(line + " appliance.address=10.0.0.21/24")
	if err != nil {
		t.Fatal(err)
	}
	if nw := installedNetwork(b); len(nw.Addresses) != 1 || nw.Addresses[0].String() != "10.0.0.21/24" || nw.Gateway.String() != "10.0.0.1" {
		t.Errorf("installed network = %+v, want 10.0.0.21/24 via 10.0.0.1", nw)
	}
	b, _ = agentapi.ParseBootArgs(line + " appliance.address=10.9.0.21/24")
	if nw := installedNetwork(b); nw.Gateway.IsValid() {
		t.Errorf("installed network = %+v: the DHCP gateway 10.0.0.1 is not on 10.9.0.0/24", nw)
	}
}

// TestRunInstallNoMatchingDiskFailsNode: on this machine's real disks (/sys/block, /dev/disk), hints
// no disk matches end the install before anything is written, and the node is failed at the real
// appliance front (pkg/server's enrolment and agent API, in-process over TLS with a pkg/pki CA) with
// a reason that names the hints and the disks seen. The hints are the enrolment answer's
// (server.EnrollNode.InstallArgs, as `hostagent enroll --install-args-out` writes them), which
// replace the kernel command line's: the reason names the answer's serial, not the command line's.
func TestRunInstallNoMatchingDiskFailsNode(t *testing.T) {
	ca, cert := testPKI(t)
	pin := agentapi.PinOf(ca.Cert)
	dir := t.TempDir()
	rendered := filepath.Join(dir, "rendered")
	store := nodestate.Open(filepath.Join(dir, "nodes"))
	tokens := map[string]string{"w1": "tok-w1"}
	s, err := server.New(server.Options{Listen: "127.0.0.1:0", Certificate: cert, CAPEM: ca.CertPEM,
		Enroll: server.NewEnrollment(rendered, filepath.Join(dir, "enrolment"), []server.EnrollNode{{Name: "w1", BMC: true, MAC: enrollMAC,
			InstallArgs: []string{"appliance.rootdevice.serialNumber=FROM-THE-ENROLMENT", "appliance.address=10.9.0.21/24", "appliance.mac=" + enrollMAC}}}, store, nil),
		Ignition: server.NewIgnitionStore(rendered, tokens),
		Agent:    server.NewAgentAPI(rendered, tokens, store, nil)})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(s.Handler())
	ts.TLS = s.TLSConfig()
	ts.StartTLS()
	t.Cleanup(ts.Close)
	cfg, err := agentapi.Configuration{Node: "w1", Roles: []string{"worker"}, ApplianceURL: ts.URL, CAPin: pin, Token: "tok-w1"}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for p, data := range map[string][]byte{
		filepath.Join(rendered, "w1", statedir.AgentConfigFile):           cfg,
		filepath.Join(rendered, "w1", statedir.IgnitionDir, "3.3.0.json"): []byte(`{"ignition":{"version":"3.3.0"}}`),
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []string{agentapi.StatePowering, agentapi.StateBooting} {
		if _, err := store.Set("w1", st, ""); err != nil {
			t.Fatal(err)
		}
	}
	work := t.TempDir()
	cfgPath, caPath, argsPath := filepath.Join(work, "config.yaml"), filepath.Join(work, "ca.crt"), filepath.Join(work, "install-args")
	hints := config.RootDeviceHints{SerialNumber: "NO-SUCH-DISK"}
	_, err = RunInstall(t.Context(), InstallOptions{
		Boot: agentapi.BootArgs{ApplianceURL: ts.URL, CAPin: pin, Hints: hints},
		Enroll: func(ctx context.Context) error {
			caPEM, err := FetchCA(ctx, ts.URL, pin)
			if err != nil {
				return err
			}
			if err := os.WriteFile(caPath, caPEM, 0o644); err != nil {
				return err
			}
			_, key, _ := ed25519.GenerateKey(nil)
			res, err := Enroll(ctx, EnrollOptions{ApplianceURL: ts.URL, CAPin: pin, CAPEM: caPEM, Key: key, MACs: []string{enrollMAC}, RetryFor: 10 * time.Second})
			if err != nil {
				return err
			}
			if err := os.WriteFile(argsPath, []byte(strings.Join(res.Response.InstallArgs, " ")+"\n"), 0o644); err != nil {
				return err
			}
			return os.WriteFile(cfgPath, []byte(res.Response.HostagentConfig), 0o600)
		},
		ConfigPath: cfgPath, CAPath: caPath, InstallArgsPath: argsPath, Image: filepath.Join(work, "never-read.squashfs"),
		SysBlock: "/sys/block", DevDisk: "/dev/disk", WorkDir: work,
	})
	if !errors.Is(err, install.ErrNoDisk) {
		t.Fatalf("RunInstall = %v, want ErrNoDisk", err)
	}
	st, err := store.Get("w1")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != agentapi.StateFailed {
		t.Fatalf("w1 is %q (%s), want failed", st.State, st.Reason)
	}
	for _, want := range []string{`nodes[].rootDevice {serialNumber: "FROM-THE-ENROLMENT"}`, "disks seen: "} {
		if !strings.Contains(st.Reason, want) {
			t.Errorf("w1's reason %q lacks %q", st.Reason, want)
		}
	}
	t.Logf("w1: %s: %s", st.State, st.Reason)
}

// TestInstallNoticeOverAgentAPI: the install notice goes over the real appliance front (pkg/server's
// agent API over TLS with a pkg/pki CA, the client pinning it) to a real pkg/netboot server's
// NoteInstalled, as `appliance serve` wires them. A notice with a token the appliance does not know,
// or with w1's token and w2's MAC, is refused with a 4xx that says what to fix, logged once however
// often it is retried, and marks nothing; w1's own notice marks w1, whose iPXE script then boots the
// disk. The boot port's plain HTTP takes no notice (the old unauthenticated POST /installed/MAC).
func TestInstallNoticeOverAgentAPI(t *testing.T) {
	ca, cert := testPKI(t)
	dir := t.TempDir()
	kernel, initrd := filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd")
	for _, p := range []string{kernel, initrd} {
		if err := os.WriteFile(p, []byte("boot file"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	macW1, macW2 := "52:54:00:00:00:21", "52:54:00:00:00:22"
	hw1, _ := net.ParseMAC(macW1)
	hw2, _ := net.ParseMAC(macW2)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	nb, err := netboot.New(netboot.Config{Mode: netboot.ModeOff, ServerIP: netip.MustParseAddr("10.77.0.1"), HTTPPort: 8080,
		Machines: []netboot.Machine{{Name: "w1", MAC: hw1}, {Name: "w2", MAC: hw2}}, Kernel: kernel, Initrd: initrd,
		KernelArgs: []string{"appliance.url=https://10.77.0.1:8443"}, StateDir: filepath.Join(dir, "netboot"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	rendered := filepath.Join(dir, "rendered")
	tokens := map[string]string{"w1": "tok-w1", "w2": "tok-w2", "s1": "tok-s1"}
	agent := server.NewAgentAPI(rendered, tokens, nodestate.Open(filepath.Join(dir, "nodes")), log)
	agent.Installed = func(_ context.Context, node string, n agentapi.InstallNotice, remote string) error {
		return nb.NoteInstalled(node, n, remote)
	}
	s, err := server.New(server.Options{Listen: "127.0.0.1:0", Certificate: cert, CAPEM: ca.CertPEM,
		Ignition: server.NewIgnitionStore(rendered, tokens), Agent: agent})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(s.Handler())
	ts.TLS = s.TLSConfig()
	ts.StartTLS()
	t.Cleanup(ts.Close)
	client := func(token string) *Client {
		c, err := NewClient(ts.URL, ca.CertPEM, token, "")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	noMarks := func(when string) {
		t.Helper()
		for _, n := range []string{"w1", "w2"} {
			if m, ok, _ := netboot.InstalledMark(filepath.Join(dir, "netboot"), n); ok {
				t.Fatalf("%s: %s is marked installed (%+v)", when, n, m)
			}
		}
	}

	// The old plain-HTTP notice on the boot port is gone.
	boot := httptest.NewServer(nb.Handler())
	t.Cleanup(boot.Close)
	resp, err := http.Post(boot.URL+"/installed/"+macW1, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("POST /installed/MAC on the boot port: %s, want 404", resp.Status)
	}
	noMarks("after a plain-HTTP notice")

	for _, tc := range []struct {
		name, token, mac string
		says             []string
		logged           string
	}{
		{"unknown token", "tok-nobody", macW1, []string{"401", "Authorization: Bearer"}, "install notice refused: no valid node token"},
		{"no token", "", macW1, []string{"401"}, "install notice refused: no valid node token"},
		{"w1's token, w2's MAC", "tok-w1", macW2, []string{"403", "52:54:00:00:00:22 is node w2's nodes[].mac, and this token is node w1's"}, "install notice refused (403)"},
	} {
		for i := 0; i < 2; i++ {
			err := sendInstallNotice(t.Context(), client(tc.token), agentapi.InstallNotice{MAC: tc.mac})
			if err == nil {
				t.Fatalf("%s: notice taken", tc.name)
			}
			for _, w := range tc.says {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: %v lacks %q", tc.name, err, w)
				}
			}
		}
		noMarks(tc.name)
	}
	for _, msg := range []string{"install notice refused: no valid node token", "install notice refused (403)"} {
		if n := strings.Count(logs.String(), msg); n != 1 {
			t.Errorf("%q logged %d times for two refused retries each, want once:\n%s", msg, n, logs.String())
		}
	}
	if strings.Contains(logs.String(), "tok-") {
		t.Errorf("a token reached the log:\n%s", logs.String())
	}

	// A node the appliance does not network-boot: 404, which an ISO-booted installer may pass over.
	if err := sendInstallNotice(t.Context(), client("tok-s1"), agentapi.InstallNotice{MAC: "52:54:00:00:00:41"}); !errors.Is(err, errNoticeNotServed) || !strings.Contains(err.Error(), "not network-booted") {
		t.Errorf("s1's notice: %v, want errNoticeNotServed saying it is not network-booted", err)
	}
	noMarks("s1's notice")

	if err := sendInstallNotice(t.Context(), client("tok-w1"), agentapi.InstallNotice{MAC: macW1}); err != nil {
		t.Fatalf("w1's own notice: %v", err)
	}
	m, ok, err := netboot.InstalledMark(filepath.Join(dir, "netboot"), "w1")
	if err != nil || !ok || m.MAC != macW1 || !strings.HasPrefix(m.From, "127.0.0.1:") {
		t.Fatalf("w1's mark after its notice: %+v, %v, %v", m, ok, err)
	}
	if script, _ := nb.Script(hw1); !strings.Contains(script, "sanboot") {
		t.Errorf("w1's script after the notice does not boot the disk:\n%s", script)
	}
	if _, ok, _ := netboot.InstalledMark(filepath.Join(dir, "netboot"), "w2"); ok {
		t.Error("w2 marked by w1's notice")
	}
}

// TestInstallNoticeRetriesBusy: while the appliance is still acting on the node's previous notice
// it answers 429 (agentapi.ErrInstallNoticeBusy, through the real agent API); the machine sends its
// notice again and it is taken, instead of giving up before its reboot.
func TestInstallNoticeRetriesBusy(t *testing.T) {
	ca, cert := testPKI(t)
	dir := t.TempDir()
	agent := server.NewAgentAPI(filepath.Join(dir, "rendered"), map[string]string{"v1": "tok-v1"}, nodestate.Open(filepath.Join(dir, "nodes")), nil)
	calls := 0
	agent.Installed = func(_ context.Context, node string, _ agentapi.InstallNotice, _ string) error {
		if calls++; calls < 3 {
			return fmt.Errorf("%w: node %s's previous install notice is still being acted on", agentapi.ErrInstallNoticeBusy, node)
		}
		return nil
	}
	s, err := server.New(server.Options{Listen: "127.0.0.1:0", Certificate: cert, CAPEM: ca.CertPEM, Agent: agent})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(s.Handler())
	ts.TLS = s.TLSConfig()
	ts.StartTLS()
	t.Cleanup(ts.Close)
	c, err := NewClient(ts.URL, ca.CertPEM, "tok-v1", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := sendInstallNotice(t.Context(), c, agentapi.InstallNotice{BootID: "live"}); err != nil || calls != 3 {
		t.Fatalf("notice after two 429s: %v after %d calls, want taken at the third", err, calls)
	}
}

// TestApplyInstallArgs: the enrolment answer's words replace the command line's hints and addresses,
// give the node's MAC, leave the command line's alone when they hold none of them, and a word that
// does not parse is an error naming it.
func TestApplyInstallArgs(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "install-args")
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cmdline := agentapi.BootArgs{Hints: agentapi.RootDeviceHints{SerialNumber: "CMDLINE"}, Network: agentapi.Network{Addresses: []netip.Prefix{netip.MustParsePrefix("10.1.0.5/24")}}}
	o := InstallOptions{Boot: cmdline, InstallArgsPath: write("appliance.rootdevice.serialNumber=LAB-DISK-n2 appliance.address=10.100.0.22/24 appliance.mac=52:54:00:01:64:02\n")}
	mac, err := applyInstallArgs(&o, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if o.Boot.Hints.SerialNumber != "LAB-DISK-n2" || fmt.Sprint(o.Boot.Network.Addresses) != "[10.100.0.22/24]" || mac != "52:54:00:01:64:02" {
		t.Errorf("after the answer's words: hints %+v, network %+v, mac %q", o.Boot.Hints, o.Boot.Network, mac)
	}
	o = InstallOptions{Boot: cmdline, InstallArgsPath: write("\n")}
	if mac, err := applyInstallArgs(&o, slog.New(slog.DiscardHandler)); err != nil || o.Boot.Hints.SerialNumber != "CMDLINE" || len(o.Boot.Network.Addresses) != 1 || mac != "" {
		t.Errorf("no words: %v, boot %+v, mac %q; want the command line's kept", err, o.Boot, mac)
	}
	o = InstallOptions{Boot: cmdline, InstallArgsPath: filepath.Join(dir, "missing")}
	if _, err := applyInstallArgs(&o, slog.New(slog.DiscardHandler)); err != nil || o.Boot.Hints.SerialNumber != "CMDLINE" {
		t.Errorf("no file: %v, hints %+v; want the command line's kept", err, o.Boot.Hints)
	}
	o = InstallOptions{Boot: cmdline, InstallArgsPath: write("appliance.rootdevice.size=8\n")}
	if _, err := applyInstallArgs(&o, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "unknown root-device hint") {
		t.Errorf("a bad word: %v, want an error naming it", err)
	}
}
