package firstboot

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/test/labns"
)

// host is a fake root for Run: the real blkid(8) and mkfs.ext4(8) run on regular files standing in
// for /dev/… (they probe and format files as they do devices); mount, networkctl, systemctl and
// ssh-keygen would change this machine, so they are recorded instead (a fake, said here).
type host struct {
	root  string
	mu    sync.Mutex
	calls []string
	mount map[string]string // dir → device "mounted" by the recorded mount
}

func newHost(t *testing.T) *host {
	t.Helper()
	labns.RequireTool(t, "blkid")
	labns.RequireTool(t, "mkfs.ext4")
	h := &host{root: t.TempDir(), mount: map[string]string{}}
	for _, d := range []string{"proc/self", "dev", "run/appliance"} {
		if err := os.MkdirAll(filepath.Join(h.root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h.writeMounts(t)
	return h
}

func (h *host) writeMounts(t *testing.T) {
	var b strings.Builder
	for dir, dev := range h.mount {
		fmt.Fprintf(&b, "%s %s ext4 rw 0 0\n", dev, dir)
	}
	if err := os.WriteFile(filepath.Join(h.root, "proc/self/mounts"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (h *host) exec(t *testing.T) func(ctx context.Context, name string, args ...string) (string, error) {
	return func(ctx context.Context, name string, args ...string) (string, error) {
		h.mu.Lock()
		h.calls = append(h.calls, name+" "+strings.Join(args, " "))
		h.mu.Unlock()
		switch name {
		case "blkid", "mkfs.ext4":
			real := make([]string, len(args))
			for i, a := range args {
				real[i] = a
				if strings.HasPrefix(a, "/dev/") {
					real[i] = filepath.Join(h.root, a)
				}
			}
			if name == "blkid" && args[0] == "-L" {
				return "", &exec.ExitError{} // no configuration volume on this fake host
			}
			out, err := exec.CommandContext(ctx, name, real...).CombinedOutput()
			if err != nil {
				return string(out), fmt.Errorf("%s: %w", name, err)
			}
			return string(out), nil
		case "mount":
			h.mount[args[len(args)-1]] = args[len(args)-2]
			h.writeMounts(t)
		}
		return "", nil
	}
}

func (h *host) called(prefix string) bool {
	for _, c := range h.calls {
		if strings.HasPrefix(c, prefix) {
			return true
		}
	}
	return false
}

// writeConfig puts a valid configuration with the given host section at ConfigDir (as if the
// configuration volume were mounted there) with the files it names.
func (h *host) writeConfig(t *testing.T, hostYAML string) {
	t.Helper()
	dir := filepath.Join(h.root, ConfigDir)
	if err := os.MkdirAll(filepath.Join(dir, "bundle"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "w1.password"), []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`apiVersion: appliance.airgap.dev/v1alpha1
kind: BootstrapConfiguration
clusterName: lab
networks:
  controlPlane: {cidrs: [10.100.0.0/24]}
  workloadPlane: {cidrs: [10.200.0.0/24]}
  services: 10.96.0.0/16
apiServer: {vip: 10.100.0.100}
bundle:
  path: %s/bundle
  publicKeys: ["ed25519:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="]
stateDir: /var/lib/appliance
nodes:
- name: cp1
  roles: [control-plane, worker]
  addresses: [10.100.0.11, 10.200.0.11]
  power: {kind: ipmi, address: 10.100.0.111, username: admin, passwordFile: %s/w1.password}
%s`, dir, dir, hostYAML)
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	h.mount[ConfigDir] = "/dev/config"
	h.writeMounts(t)
}

func (h *host) disk(t *testing.T, name string, mkfs ...string) {
	t.Helper()
	p := filepath.Join(h.root, "dev", name)
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 64<<20); err != nil {
		t.Fatal(err)
	}
	if len(mkfs) > 0 {
		if out, err := exec.Command(mkfs[0], append(mkfs[1:], p)...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", mkfs, err, out)
		}
	}
}

func (h *host) options(t *testing.T) Options {
	hasAddress = func([]netip.Addr) (bool, error) { return true, nil } // the recorded networkctl configures nothing
	return Options{Root: h.root, Cmdline: "console=ttyS0", Exec: h.exec(t)}
}

func (h *host) read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.root, p))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestRunBlankStateDiskIsFormattedThenReused(t *testing.T) {
	h := newHost(t)
	h.disk(t, "vdb")
	h.writeConfig(t, `host:
  interfaces:
  - {name: ens3, addresses: [10.100.0.2/24]}
  - {macAddress: "52:54:00:AA:BB:CC", addresses: [10.200.0.2/24], gateway: 10.200.0.1}
  stateDevice: /dev/vdb
  autoBootstrap: true
`)
	if err := Run(context.Background(), h.options(t)); err != nil {
		t.Fatal(err)
	}
	if !h.called("mkfs.ext4 -q -L " + config.StateLabel + " /dev/vdb") {
		t.Errorf("the blank disk was not formatted: %v", h.calls)
	}
	if !h.called("mount -t ext4 /dev/vdb /var/lib/appliance") || !h.called("networkctl reload") || !h.called("systemctl start --no-block "+BootstrapUnit) {
		t.Errorf("calls: %v", h.calls)
	}
	if got := h.read(t, NetworkDir+"/10-appliance-0.network"); !strings.Contains(got, "Name=ens3\n") || !strings.Contains(got, "Address=10.100.0.2/24\n") {
		t.Errorf("ens3's network file:\n%s", got)
	}
	if got := h.read(t, NetworkDir+"/10-appliance-1.network"); !strings.Contains(got, "MACAddress=52:54:00:aa:bb:cc\n") || !strings.Contains(got, "Gateway=10.200.0.1\n") {
		t.Errorf("the second interface's network file:\n%s", got)
	}
	if env := h.read(t, BootstrapEnv); strings.Contains(env, "--skip-phases") || !strings.Contains(env, "--config "+filepath.Join(h.root, ConfigDir, ConfigFile)) {
		t.Errorf("autoBootstrap: bootstrap.env %q", env)
	}
	banner := h.read(t, BannerPath)
	for _, want := range []string{"https://10.100.0.2:8443", "CA pin         (not created yet)", "cp1             pending"} {
		if !strings.Contains(banner, want) {
			t.Errorf("banner lacks %q:\n%s", want, banner)
		}
	}

	// A reboot: the disk now carries the appliance's label and is mounted as it is, never formatted.
	h.calls = nil
	delete(h.mount, "/var/lib/appliance")
	h.writeMounts(t)
	if err := Run(context.Background(), h.options(t)); err != nil {
		t.Fatal(err)
	}
	if h.called("mkfs") || !h.called("mount -t ext4 /dev/vdb /var/lib/appliance") {
		t.Errorf("second boot: %v", h.calls)
	}
}

func TestRunRefusesADiskThatHoldsSomethingElse(t *testing.T) {
	h := newHost(t)
	h.disk(t, "sdb", "mkfs.ext4", "-q", "-L", "DATA")
	h.writeConfig(t, "host:\n  interfaces: [{name: ens3, addresses: [10.100.0.2/24]}]\n  stateDevice: /dev/sdb\n")
	err := Run(context.Background(), h.options(t))
	if err == nil || !strings.Contains(err.Error(), "host.stateDevice: /dev/sdb is not blank") || !strings.Contains(err.Error(), "label DATA") {
		t.Fatalf("got %v, want a refusal naming the disk and what it holds", err)
	}
	if h.called("mkfs") || h.called("mount -t ext4") || h.called("systemctl") {
		t.Errorf("a refused disk must not be formatted, mounted or served from: %v", h.calls)
	}
	if b := h.read(t, BannerPath); !strings.Contains(b, "NOT RUNNING: host.stateDevice: /dev/sdb is not blank") {
		t.Errorf("banner:\n%s", b)
	}
	// The timer's refresh keeps the problem on the console.
	if err := Banner(h.options(t)); err != nil {
		t.Fatal(err)
	}
	if b := h.read(t, BannerPath); !strings.Contains(b, "NOT RUNNING") {
		t.Errorf("Banner painted over the problem:\n%s", b)
	}
}

func TestRunWithoutConfiguration(t *testing.T) {
	h := newHost(t)
	err := Run(context.Background(), h.options(t))
	if err == nil || !strings.Contains(err.Error(), "attach a volume labelled "+ConfigLabel) {
		t.Fatalf("got %v", err)
	}
	if b := h.read(t, BannerPath); !strings.Contains(b, "appliance.config=URL") {
		t.Errorf("banner does not say what to provide:\n%s", b)
	}
}

func TestRunRefusesInvalidConfigurationAndMissingHost(t *testing.T) {
	h := newHost(t)
	h.writeConfig(t, "host:\n  interfaces: [{name: ens3, addresses: [10.200.0.2/24]}]\n")
	err := Run(context.Background(), h.options(t))
	if err == nil || !strings.Contains(err.Error(), "host.interfaces: no address lies in networks.controlPlane.cidrs") {
		t.Fatalf("got %v", err)
	}
	h.writeConfig(t, "")
	err = Run(context.Background(), h.options(t))
	if err == nil || !strings.Contains(err.Error(), "host.interfaces is required when the appliance boots from its ISO") {
		t.Fatalf("got %v", err)
	}
	if h.called("systemctl") || h.called("networkctl") {
		t.Errorf("nothing may start from an unusable configuration: %v", h.calls)
	}
}

// TestRunConfigFromURL: appliance.config=URL on the kernel command line is fetched (a real HTTP
// server on 127.0.0.1) and used; no volume is looked for.
func TestRunConfigFromURL(t *testing.T) {
	h := newHost(t)
	h.writeConfig(t, "host:\n  interfaces: [{name: ens3, addresses: [10.100.0.2/24]}]\n")
	cfg, err := os.ReadFile(filepath.Join(h.root, ConfigDir, ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(h.root, ConfigDir, ConfigFile)); err != nil {
		t.Fatal(err)
	}
	delete(h.mount, ConfigDir)
	h.writeMounts(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/lab/bootstrap.yaml" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(cfg)
	}))
	defer srv.Close()
	o := h.options(t)
	o.Cmdline = "console=ttyS0 appliance.config=" + srv.URL + "/lab/bootstrap.yaml quiet"
	if err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if h.called("blkid -L") {
		t.Errorf("a configuration volume was looked for although the URL gave one: %v", h.calls)
	}
	if got := h.read(t, ConfigDir+"/"+ConfigFile); got != string(cfg) {
		t.Errorf("the fetched configuration differs from the served one")
	}
	o.Cmdline = "appliance.config=" + srv.URL + "/missing.yaml"
	if err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("a missing URL: %v, want the HTTP status", err)
	}
}

// TestSSHHostKeysKept: the first boot's host key (made by the real ssh-keygen in the fake root)
// are kept in STATE/ssh and restored on the next boot instead of new ones.
func TestSSHHostKeysKept(t *testing.T) {
	h := newHost(t)
	keygen := labns.RequireTool(t, "ssh-keygen")
	h.writeConfig(t, "host:\n  interfaces: [{name: ens3, addresses: [10.100.0.2/24]}]\n  sshAuthorizedKeys: [\"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test\"]\n")
	o := h.options(t)
	o.Exec = func(ctx context.Context, name string, args ...string) (string, error) {
		if name == "ssh-keygen" { // the real one, into the fake root's /etc/ssh
			if err := os.MkdirAll(filepath.Join(h.root, "etc/ssh"), 0o755); err != nil {
				return "", err
			}
			out, err := exec.CommandContext(ctx, keygen, args...).CombinedOutput() // -f is under the fake root (o.path)
			return string(out), err
		}
		return h.exec(t)(ctx, name, args...)
	}
	if err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	first := h.read(t, "/etc/ssh/ssh_host_ed25519_key.pub")
	if kept := h.read(t, "/var/lib/appliance/ssh/ssh_host_ed25519_key.pub"); kept != first {
		t.Fatalf("host key not kept in the state directory")
	}
	if st, err := os.Stat(filepath.Join(h.root, "/var/lib/appliance/ssh/ssh_host_ed25519_key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("kept private host key: %v %v", err, st)
	}
	// Only an ed25519 key: RSA 3072 cost most of 4.9 s of a TCG-emulated first boot.
	if made, _ := filepath.Glob(filepath.Join(h.root, "etc/ssh/ssh_host_*")); len(made) != 2 {
		t.Errorf("host key files %v, want the ed25519 pair only", made)
	}
	// A reboot: /etc/ssh is fresh (tmpfs overlay), the state disk is not.
	if err := os.RemoveAll(filepath.Join(h.root, "etc/ssh")); err != nil {
		t.Fatal(err)
	}
	if err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if again := h.read(t, "/etc/ssh/ssh_host_ed25519_key.pub"); again != first {
		t.Errorf("the reboot made a new host key")
	}
	if !h.called("systemctl start ssh.service") {
		t.Errorf("sshd not started: %v", h.calls)
	}
	// The bootstrap starts before SSH: nothing of it needs sshd, and under TCG the host key and
	// sshd's start delayed it by 0.6 s.
	bootstrapAt, sshAt := -1, -1
	for i, c := range h.calls {
		switch {
		case strings.HasPrefix(c, "systemctl start --no-block "+BootstrapUnit) && bootstrapAt < 0:
			bootstrapAt = i
		case strings.HasPrefix(c, "systemctl start ssh.service") && sshAt < 0:
			sshAt = i
		}
	}
	if bootstrapAt < 0 || sshAt < bootstrapAt {
		t.Errorf("%s started at call %d, sshd at %d: want the bootstrap first (%v)", BootstrapUnit, bootstrapAt, sshAt, h.calls)
	}
}
