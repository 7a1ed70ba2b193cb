package containerd

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

const testPause = "registry.k8s.io/pause:3.10.1"

var update = flag.Bool("update", false, "rewrite testdata/cri-config.toml from the current output")

// TestCRIConfigGolden: the whole file a Kubernetes node gets, as reviewed in testdata/cri-config.toml
// (`go test ./pkg/containerd -run Golden -update` rewrites it; the diff is the review).
func TestCRIConfigGolden(t *testing.T) {
	got := CRIConfig(testPause)
	golden := filepath.Join("testdata", "cri-config.toml")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("CRIConfig differs from %s (rerun with -update and review the diff):\n%s", golden, got)
	}
}

func TestCRIConfigDeterministic(t *testing.T) {
	a, b := CRIConfig(testPause), CRIConfig(testPause)
	if !bytes.Equal(a, b) {
		t.Fatalf("two renders differ:\n%s\n---\n%s", a, b)
	}
	if !bytes.HasSuffix(a, []byte("\n")) {
		t.Error("config does not end with a newline")
	}
	for _, want := range []string{
		"version = 3\n",
		`sandbox = "registry.k8s.io/pause:3.10.1"`,
		`config_path = "/etc/containerd/certs.d"`,
		`bin_dirs = ["/usr/lib/cni"]`,
	} {
		if !bytes.Contains(a, []byte(want)) {
			t.Errorf("config lacks %q:\n%s", want, a)
		}
	}
	if c := CRIConfig("registry.k8s.io/pause:3.9"); bytes.Equal(a, c) {
		t.Error("the sandbox image does not reach the config")
	}
}

// tomlTables reads TOML as containerd's `config dump` writes it into "table.key" → raw value
// (the text after " = "), tracking [table] headers. It understands only that output: one key per
// line, no inline tables or multi-line values in the keys the tests look at.
func tomlTables(t *testing.T, data []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	table := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") && !strings.Contains(line, "="):
			table = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, " = ")
			if ok && table == "" {
				out[k] = v
			} else if ok {
				out[table+"."+k] = v
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCRIConfigContainerd has the real containerd load CRIConfig's output and checks, in the dump of
// its effective configuration, that every setting landed in the table containerd reads it from (a
// misspelt key or a wrong table would vanish from the dump or keep containerd's default).
func TestCRIConfigContainerd(t *testing.T) {
	bin := labns.RequireTool(t, "containerd")
	const cri = `plugins."io.containerd.grpc.v1.cri"`
	for _, tc := range []struct {
		name, image, wantImage string
	}{
		{"pause", testPause, `"registry.k8s.io/pause:3.10.1"`},
		// TOML escaping: a reference with a quote and backslash must survive (and not break the file).
		{"escaped", `10.0.0.1:8443/x"y\z:1`, `"10.0.0.1:8443/x\"y\\z:1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.toml")
			if err := os.WriteFile(path, CRIConfig(tc.image), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var stderr bytes.Buffer
			cmd := exec.CommandContext(ctx, bin, "--config", path, "config", "dump")
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("containerd --config %s config dump: %v\n%s", path, err, stderr.String())
			}
			got := tomlTables(t, out)
			want := map[string]string{
				"version":                                               "2",
				cri + ".sandbox_image":                                  tc.wantImage,
				cri + ".restrict_oom_score_adj":                         "true",
				cri + ".containerd.default_runtime_name":                `"runc"`,
				cri + ".containerd.runtimes.runc.runtime_type":          `"io.containerd.runc.v2"`,
				cri + ".containerd.runtimes.runc.options.SystemdCgroup": "true",
				cri + ".cni.bin_dir":                                    `"/usr/lib/cni"`,
				cri + ".cni.conf_dir":                                   `"/etc/cni/net.d"`,
				cri + ".registry.config_path":                           `"/etc/containerd/certs.d"`,
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("containerd's effective %s = %q, want %q", k, got[k], v)
				}
			}
			if t.Failed() {
				t.Logf("config dump:\n%s", out)
			}
			// containerd 1.6 logs unknown keys rather than failing; none must be reported.
			if s := stderr.String(); strings.Contains(strings.ToLower(s), "unknown") || strings.Contains(strings.ToLower(s), "deprecated") {
				t.Errorf("containerd complains about the config:\n%s", s)
			}
		})
	}
}
