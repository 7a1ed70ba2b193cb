package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/bundle"

	"github.com/airgap-appliance/appliance/test/labns"
)

// aptFetch points a private apt configuration (nothing of the host's apt state is used or changed)
// at the appliance's /repo/, runs `apt-get update` and `apt-get download` from a node namespace —
// apt itself checks Release → Packages → .deb hashes — then unpacks the package and runs it.
func aptFetch(t *testing.T, l *lab, caFile string) {
	labns.RequireTool(t, "apt-get")
	root := t.TempDir()
	for _, d := range []string{"etc/apt/sources.list.d", "etc/apt/apt.conf.d", "etc/apt/preferences.d",
		"var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "var/lib/dpkg", "dl"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(t, filepath.Join(root, "var/lib/dpkg/status"), "")
	// As a provisioned node does (pkg/provision): the appliance CA for HTTPS, and signed-by the
	// bundle's repository keyring, so apt accepts only an InRelease signed by the bundle's repo key
	// and then checks its hash chain down to each .deb.
	keyring, err := os.ReadFile(filepath.Join(bundlePath, filepath.FromSlash(bundle.RepoKeyringPath)))
	if err != nil {
		t.Fatalf("the fixture bundle's repository keyring: %v", err)
	}
	mustWrite(t, filepath.Join(root, "appliance-repo.gpg"), string(keyring))
	mustWrite(t, filepath.Join(root, "etc/apt/sources.list"), "deb [signed-by="+filepath.Join(root, "appliance-repo.gpg")+"] "+applURL+"/repo/debian stable main\n")
	opts := []string{"-o", "Dir=" + root, "-o", "Dir::State::status=" + root + "/var/lib/dpkg/status",
		"-o", "Dir::Bin::Methods=/usr/lib/apt/methods", "-o", "Acquire::https::CaInfo=" + caFile,
		"-o", "APT::Sandbox::User=root", "-o", "Debug::NoLocking=1", "-o", "APT::Architecture=amd64",
		"-o", "Acquire::Languages=none"}
	l.mustRun(t, "cp1", append([]string{"apt-get", "-q"}, append(opts, "update")...)...)
	cmd := l.exec("cp1", append([]string{"apt-get", "-q"}, append(opts, "download", "hello")...)...)
	cmd.Dir = filepath.Join(root, "dl")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("apt-get download hello: %v\n%s", err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(root, "dl", "hello_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("downloaded: %v", debs)
	}
	x := filepath.Join(root, "x")
	if out, err := exec.Command("dpkg-deb", "-x", debs[0], x).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x: %v %s", err, out)
	}
	out, err := exec.Command(filepath.Join(x, "usr/bin/hello")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Hello, world!") {
		t.Fatalf("the package's program: %v %s", err, out)
	}
}

// containerdPull runs a private containerd (own root, state, socket) inside a node namespace and
// pulls registry.k8s.io/pause:3.10 with ctr, in a private mount namespace where the /etc/containerd
// that Debian's ignition wrote from the node's Ignition config (ignRoot) is bind-mounted over the
// host's, so hosts.toml and its CA path are used exactly as a node would. No route leads anywhere
// but the lab, so the image can only come through the appliance mirror.
func containerdPull(t *testing.T, l *lab, ignRoot string) {
	labns.RequireTool(t, "containerd")
	ctr := labns.RequireTool(t, "ctr")
	dir, err := os.MkdirTemp("", "ctrd") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "c.sock")
	mustWrite(t, filepath.Join(dir, "config.toml"), fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock))
	logf, _ := os.Create(filepath.Join(dir, "containerd.log"))
	defer logf.Close()
	d := l.exec("cp1", "containerd", "--config", filepath.Join(dir, "config.toml"))
	d.Stdout, d.Stderr = logf, logf
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.Process.Kill()
		_ = d.Wait()
		// The native snapshotter leaves no mounts; remove what containerd created.
		_ = os.RemoveAll(dir)
	})
	if err := waitFor(20*time.Second, func() error { _, err := os.Stat(sock); return err }); err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "containerd.log"))
		t.Fatalf("containerd did not start: %v\n%s", err, b)
	}
	asNode := func(argv ...string) (string, error) {
		script := `mount --bind "$0" /etc/containerd && exec "$@"`
		return l.run("cp1", append([]string{"unshare", "-m", "--propagation", "private", "sh", "-c", script,
			filepath.Join(ignRoot, "etc/containerd")}, argv...)...)
	}
	out, err := asNode(ctr, "--address", sock, "images", "pull", "--snapshotter", "native",
		"--hosts-dir", "/etc/containerd/certs.d", "registry.k8s.io/pause:3.10")
	if err != nil {
		t.Fatalf("ctr images pull through the mirror: %v\n%s", err, out)
	}
	list := l.mustRun(t, "cp1", ctr, "--address", sock, "images", "ls", "-q")
	if !strings.Contains(list, "registry.k8s.io/pause:3.10") {
		t.Fatalf("image not in containerd after pull: %s", list)
	}
	// Without the mirror configuration the same pull must fail: there is no route to the internet.
	if out, err := l.run("cp1", "timeout", "30", ctr, "--address", sock, "images", "pull", "--snapshotter", "native",
		"--hosts-dir", t.TempDir(), "registry.k8s.io/pause:3.10"); err == nil {
		t.Fatalf("a pull without the mirror succeeded: the lab is not air-gapped\n%s", out)
	}
}

// ignitionFetch runs Debian's ignition binary (fetch, then files stage) in a node namespace against
// the appliance: the pointer config carries the node token (as an Authorization header), the CA is trusted for the first fetch
// through SSL_CERT_FILE (as the kernel command line's CA pin would), and every later download
// (the hostagent binary) trusts only the CA inside the served config. It returns the scratch root
// the files were written into (under dir).
func ignitionFetch(t *testing.T, l *lab, node, caFile, dir string) string {
	ign := labns.RequireTool(t, "ignition")
	root := filepath.Join(dir, "root")
	bin := filepath.Join(dir, "bin")
	// LAB.md: the files stage relabels with setfiles when it finds an SELinux config.
	mustWriteMode(t, filepath.Join(root, "etc/selinux/config"), "SELINUX=disabled\nSELINUXTYPE=targeted\n", 0o644)
	mustWriteMode(t, filepath.Join(bin, "setfiles"), "#!/bin/sh\nexit 0\n", 0o755)
	pointer := filepath.Join(dir, "pointer.ign")
	// The token travels in the Authorization header (the config source's httpHeaders, spec ≥ 3.1):
	// /ignition/ takes it nowhere else.
	mustWrite(t, pointer, `{"ignition":{"version":"3.3.0","config":{"replace":{"source":"`+
		applURL+`/ignition/`+node+`","httpHeaders":[{"name":"Authorization","value":"Bearer `+readToken(t, l, node)+`"}]}}}}`)
	cache := filepath.Join(dir, "ignition.json")
	for _, stage := range []string{"fetch", "files"} {
		args := []string{"env", "-i", "PATH=" + bin + ":/usr/sbin:/usr/bin:/sbin:/bin", "IGNITION_CONFIG_FILE=" + pointer}
		if stage == "fetch" {
			args = append(args, "SSL_CERT_FILE="+caFile)
		}
		args = append(args, "timeout", "60", ign, "-platform", "file", "-stage", stage, "-root", root,
			"-config-cache", cache, "-state-file", filepath.Join(dir, "state"), "-neednet", filepath.Join(dir, "neednet"),
			"-fetch-timeout", "5s", "-log-to-stdout")
		if out, err := l.run(node, args...); err != nil {
			t.Fatalf("ignition -stage %s: %v\n%s", stage, err, out)
		}
	}
	for path, mode := range map[string]os.FileMode{
		"etc/hostagent/config.yaml":                         0o600,
		"usr/local/bin/hostagent":                           0o755,
		"etc/containerd/certs.d/registry.k8s.io/hosts.toml": 0o644,
		"etc/containerd/certs.d/docker.io/hosts.toml":       0o644,
		"etc/containerd/certs.d/appliance-ca.crt":           0o644,
		"usr/local/share/ca-certificates/appliance-ca.crt":  0o644,
	} {
		st, err := os.Stat(filepath.Join(root, path))
		if err != nil {
			t.Fatalf("ignition did not write %s: %v", path, err)
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", path, st.Mode().Perm(), mode)
		}
	}
	cfg, _ := os.ReadFile(filepath.Join(root, "etc/hostagent/config.yaml"))
	if !strings.Contains(string(cfg), "node: "+node) || !strings.Contains(string(cfg), "caPin: sha256:") {
		t.Errorf("hostagent config:\n%s", cfg)
	}
	// The hostagent binary arrived intact (Ignition checked its sha256 against the config).
	out, err := exec.Command(filepath.Join(root, "usr/local/bin/hostagent"), "version").CombinedOutput()
	if err != nil {
		t.Errorf("delivered hostagent does not run: %v %s", err, out)
	}
	return root
}

func mustWriteMode(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
}
