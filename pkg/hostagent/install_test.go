package hostagent

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/install"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/server"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// TestParseBootArgs: the node image's kernel command line as pkg/netboot's script makes it, and the
// refusals that name what to fix.
func TestParseBootArgs(t *testing.T) {
	words := strings.Fields("initrd=initrd console=tty0 console=ttyS0,115200n8 appliance.url=https://10.0.0.2:8443 " +
		"appliance.ca_pin=sha256:ab appliance.rootdevice.serialNumber=NODE-DISK-1 appliance.rootdevice.model=QEMU+HARDDISK appliance.node=w1 " +
		"appliance.rootfs=http://10.0.0.2:8080/boot/rootfs.squashfs appliance.initrd=http://10.0.0.2:8080/boot/initrd " +
		"BOOTIF=01-52-54-00-00-00-21 appliance.ip=10.0.0.50::10.0.0.1:255.255.255.0")
	b, err := ParseBootArgs(words)
	if err != nil {
		t.Fatal(err)
	}
	if b.ApplianceURL != "https://10.0.0.2:8443" || b.CAPin != "sha256:ab" || b.Node != "w1" || b.InitrdURL != "http://10.0.0.2:8080/boot/initrd" {
		t.Errorf("ParseBootArgs = %+v", b)
	}
	if b.Hints.SerialNumber != "NODE-DISK-1" || b.Hints.Model != "QEMU HARDDISK" {
		t.Errorf("hints = %+v, want serialNumber NODE-DISK-1 and model \"QEMU HARDDISK\"", b.Hints)
	}
	if strings.Join(b.Console, " ") != "console=tty0 console=ttyS0,115200n8" {
		t.Errorf("console = %q", b.Console)
	}
	for _, bad := range []struct{ line, want string }{
		{"appliance.ca_pin=sha256:ab", "appliance.url= is missing"},
		{"appliance.url=https://x:8443", "appliance.ca_pin= is missing"},
		{"appliance.url=https://x:8443 appliance.ca_pin=sha256:ab appliance.initrd=ftp://x/i", "appliance.initrd="},
		{"appliance.url=https://x:8443 appliance.ca_pin=sha256:ab appliance.rootdevice.size=8", "unknown root-device hint"},
	} {
		if _, err := ParseBootArgs(strings.Fields(bad.line)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseBootArgs(%q) = %v, want an error containing %q", bad.line, err, bad.want)
		}
	}
}

// TestRunInstallNoMatchingDiskFailsNode: on this machine's real disks (/sys/block, /dev/disk), hints
// no disk matches end the install before anything is written, and the node is failed at the real
// appliance front (pkg/server's enrolment and agent API, in-process over TLS with a pkg/pki CA) with
// a reason that names the hints and the disks seen.
func TestRunInstallNoMatchingDiskFailsNode(t *testing.T) {
	ca, cert := testPKI(t)
	pin := agentapi.PinOf(ca.Cert)
	dir := t.TempDir()
	rendered := filepath.Join(dir, "rendered")
	store := nodestate.Open(filepath.Join(dir, "nodes"))
	tokens := map[string]string{"w1": "tok-w1"}
	s, err := server.New(server.Options{Listen: "127.0.0.1:0", Certificate: cert, CAPEM: ca.CertPEM,
		Enroll:   server.NewEnrollment(rendered, filepath.Join(dir, "enrolment"), []server.EnrollNode{{Name: "w1", BMC: true, MAC: enrollMAC}}, store, nil),
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
	cfgPath, caPath := filepath.Join(work, "config.yaml"), filepath.Join(work, "ca.crt")
	hints := config.RootDeviceHints{SerialNumber: "NO-SUCH-DISK"}
	_, err = RunInstall(t.Context(), InstallOptions{
		Boot: BootArgs{ApplianceURL: ts.URL, CAPin: pin, Hints: hints},
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
			return os.WriteFile(cfgPath, []byte(res.Response.HostagentConfig), 0o600)
		},
		ConfigPath: cfgPath, CAPath: caPath, Image: filepath.Join(work, "never-read.squashfs"),
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
	for _, want := range []string{`nodes[].rootDevice {serialNumber: "NO-SUCH-DISK"}`, "disks seen: "} {
		if !strings.Contains(st.Reason, want) {
			t.Errorf("w1's reason %q lacks %q", st.Reason, want)
		}
	}
	t.Logf("w1: %s: %s", st.State, st.Reason)
}
