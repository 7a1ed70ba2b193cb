package containerd

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/test/labns"
)

func TestHostsTOML(t *testing.T) {
	for _, tc := range []struct {
		registry, endpoint, want string
	}{
		{"registry.k8s.io", "https://10.0.0.1:8443/v2/registry.k8s.io", `# Written by the air-gap appliance: pull registry.k8s.io images through the appliance mirror.
server = "https://registry.k8s.io"

[host."https://10.0.0.1:8443/v2/registry.k8s.io"]
  capabilities = ["pull", "resolve"]
  ca = "/etc/containerd/certs.d/appliance-ca.crt"
  override_path = true
`},
		{"docker.io", "https://[fd00::1]:8443/v2/docker.io", `# Written by the air-gap appliance: pull docker.io images through the appliance mirror.
server = "https://registry-1.docker.io"

[host."https://[fd00::1]:8443/v2/docker.io"]
  capabilities = ["pull", "resolve"]
  ca = "/etc/containerd/certs.d/appliance-ca.crt"
  override_path = true
`},
	} {
		got := HostsTOML(tc.registry, tc.endpoint, CAPath)
		if string(got) != tc.want {
			t.Errorf("HostsTOML(%q):\n%s\nwant:\n%s", tc.registry, got, tc.want)
		}
		if again := HostsTOML(tc.registry, tc.endpoint, CAPath); !bytes.Equal(got, again) {
			t.Errorf("HostsTOML(%q) is not deterministic", tc.registry)
		}
	}
}

func TestTOMLString(t *testing.T) {
	for in, want := range map[string]string{
		"https://a/v2/b": `"https://a/v2/b"`,
		`a"b\c`:          `"a\"b\\c"`,
		"a\nb\x01\t":     `"a\nb\u0001\t"`,
		"\x7f":           `"\u007F"`,
	} {
		if got := TOMLString(in); got != want {
			t.Errorf("TOMLString(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestSetConfigPath(t *testing.T) {
	const dir = "/etc/containerd/certs.d"
	for _, tc := range []struct {
		name, in, want string
		changed        bool
		err            error
	}{
		{
			name:    "replace empty value, keep comments",
			in:      "# mine\nversion = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n    config_path = \"\" # set me\n  [plugins.\"io.containerd.grpc.v1.cri\".registry.auths]\n",
			want:    "# mine\nversion = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n    config_path = \"/etc/containerd/certs.d\" # set me\n  [plugins.\"io.containerd.grpc.v1.cri\".registry.auths]\n",
			changed: true,
		},
		{
			name: "already set",
			in:   "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n",
			want: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n",
		},
		{
			name:    "table without key",
			in:      "version = 2\n[plugins . \"io.containerd.grpc.v1.cri\" . registry]\n  x = 1\n",
			want:    "version = 2\n[plugins . \"io.containerd.grpc.v1.cri\" . registry]\n  config_path = \"/etc/containerd/certs.d\"\n  x = 1\n",
			changed: true,
		},
		{
			name:    "no table (v3)",
			in:      "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\n  x = 1",
			want:    "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\n  x = 1\n\n[plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n",
			changed: true,
		},
		{
			// containerd 2.3's `config migrate` output: the registry table is version 3's.
			name:    "schema 4",
			in:      "version = 4\n\n[plugins]\n  [plugins.'io.containerd.cri.v1.images'.registry]\n    config_path = ''\n",
			want:    "version = 4\n\n[plugins]\n  [plugins.'io.containerd.cri.v1.images'.registry]\n    config_path = \"/etc/containerd/certs.d\"\n",
			changed: true,
		},
		{name: "schema 1", in: "root = \"/var/lib/containerd\"\n", err: ErrUnsupportedConfig},
		{name: "schema 5", in: "version = 5\n", err: ErrUnsupportedConfig},
		{name: "dotted key", in: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  registry.config_path = \"\"\n", err: ErrUnsupportedConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changed, err := SetConfigPath([]byte(tc.in), dir)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if string(got) != tc.want || changed != tc.changed {
				t.Errorf("got changed=%v\n%s\nwant changed=%v\n%s", changed, got, tc.changed, tc.want)
			}
			again, changed2, err := SetConfigPath(got, dir)
			if err != nil || changed2 || !bytes.Equal(again, got) {
				t.Errorf("second pass not idempotent: changed=%v err=%v\n%s", changed2, err, again)
			}
		})
	}
}

// TestSetConfigPathContainerd checks with real containerds that their edited default config parses
// and carries the config_path: the host's Debian containerd 1.6 (a version 2 file) and the runtime
// fixture's containerd 2.x (build-containerd.sh; its default config quotes the plugin ids as TOML
// literal strings, 'io.containerd.cri.v1.images', which SetConfigPath must recognise rather than append a
// second registry table).
func TestSetConfigPathContainerd(t *testing.T) {
	for _, tc := range []struct {
		name string
		bin  func(t *testing.T) string
	}{
		{"host", func(t *testing.T) string { return labns.RequireTool(t, "containerd") }},
		{"fixture", func(t *testing.T) string { return labns.ContainerdBin(t, "containerd") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := tc.bin(t)
			def, err := exec.Command(bin, "config", "default").Output()
			if err != nil {
				t.Fatalf("containerd config default: %v", err)
			}
			edited, changed, err := SetConfigPath(def, CertsDir)
			if err != nil || !changed {
				t.Fatalf("SetConfigPath(default) = changed %v, %v", changed, err)
			}
			if n := bytes.Count(edited, []byte("config_path")); n != bytes.Count(def, []byte("config_path")) {
				t.Errorf("SetConfigPath added a config_path instead of setting the one there (%d, was %d):\n%s", n, bytes.Count(def, []byte("config_path")), edited)
			}
			path := filepath.Join(t.TempDir(), "config.toml")
			if err := os.WriteFile(path, edited, 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, "--config", path, "config", "dump").CombinedOutput()
			if err != nil {
				t.Fatalf("containerd config dump: %v\n%s", err, out)
			}
			if !strings.Contains(string(out), `config_path = "/etc/containerd/certs.d"`) && !strings.Contains(string(out), `config_path = '/etc/containerd/certs.d'`) {
				t.Errorf("containerd does not see config_path:\n%s", out)
			}
		})
	}
}

// TestHostsTOMLEndpoints: several mirrors become one [host] table each, in the order given (containerd
// tries them in that order); one endpoint renders exactly what HostsTOML does.
func TestHostsTOMLEndpoints(t *testing.T) {
	got := string(HostsTOMLEndpoints("registry.k8s.io", []string{"https://10.0.0.11:5443/v2/registry.k8s.io", "https://10.0.0.12:5443/v2/registry.k8s.io"}, CAPath))
	want := `# Written by the air-gap appliance: pull registry.k8s.io images through the appliance mirror.
server = "https://registry.k8s.io"

[host."https://10.0.0.11:5443/v2/registry.k8s.io"]
  capabilities = ["pull", "resolve"]
  ca = "/etc/containerd/certs.d/appliance-ca.crt"
  override_path = true

[host."https://10.0.0.12:5443/v2/registry.k8s.io"]
  capabilities = ["pull", "resolve"]
  ca = "/etc/containerd/certs.d/appliance-ca.crt"
  override_path = true
`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	one := "https://10.0.0.1:8443/v2/registry.k8s.io"
	if a, b := HostsTOMLEndpoints("registry.k8s.io", []string{one}, CAPath), HostsTOML("registry.k8s.io", one, CAPath); !bytes.Equal(a, b) {
		t.Errorf("one endpoint:\n%s\nHostsTOML:\n%s", a, b)
	}
}

// TestCheckVersion: what `containerd --version` prints for the packages a node may have, and the
// refusal of a containerd too old for the version 3 config (it would silently ignore it).
func TestCheckVersion(t *testing.T) {
	for _, tc := range []struct {
		out, want string
		err       error
		bad       bool
	}{
		{out: "containerd github.com/containerd/containerd/v2 v2.3.7 \n", want: "v2.3.7"},
		{out: "containerd github.com/containerd/containerd/v2 v2.1.0 a1b2c3\n", want: "v2.1.0"},
		{out: "containerd containerd.io 2.2.1 dea7da5\n", want: "2.2.1"}, // Docker's containerd.io package
		{out: "containerd github.com/containerd/containerd/v2 v2.0.6 x\n", want: "v2.0.6", err: ErrTooOld},
		{out: "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n", want: "1.6.20~ds1", err: ErrTooOld},
		{out: "containerd github.com/containerd/containerd v1.7.28 b98a3aace656320842a23f4a392a33f46af97866\n", want: "v1.7.28", err: ErrTooOld},
		{out: "bash: containerd: command not found\n", bad: true},
		{out: "containerd github.com/containerd/containerd/v2 unknown\n", bad: true},
		{out: "", bad: true},
	} {
		got, err := CheckVersion(tc.out)
		switch {
		case tc.bad:
			if err == nil || errors.Is(err, ErrTooOld) {
				t.Errorf("CheckVersion(%q) = %q, %v; want an unreadable-version error", tc.out, got, err)
			}
		case !errors.Is(err, tc.err) || got != tc.want:
			t.Errorf("CheckVersion(%q) = %q, %v; want %q, %v", tc.out, got, err, tc.want, tc.err)
		case err != nil && !strings.Contains(err.Error(), "needs "+MinVersion):
			t.Errorf("CheckVersion(%q): %v does not say which version is needed", tc.out, err)
		}
	}
}
