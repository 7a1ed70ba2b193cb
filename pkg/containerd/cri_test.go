package containerd

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// tomlTables reads TOML as containerd's `config dump` writes it into "table.key" → value, tracking
// [table] headers. Table keys are normalised (tableKey: containerd 2.x quotes them as literal strings,
// 'io.containerd.cri.v1.images'); values go through tomlValue. It understands only that output: one key
// per line, no inline tables or multi-line values in the keys the tests look at.
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
			table = tableKey(strings.Trim(line, "[]"))
		default:
			k, v, ok := strings.Cut(line, " = ")
			if ok && table == "" {
				out[k] = tomlValue(t, v)
			} else if ok {
				out[table+"."+k] = tomlValue(t, v)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// tomlValue decodes a TOML string (basic "…" or literal '…') to its text, and an array of strings to
// its decoded items joined by ", " in brackets; any other value is returned as written.
func tomlValue(t *testing.T, v string) string {
	t.Helper()
	str := func(s string) string {
		switch {
		case len(s) >= 2 && s[0] == '\'' && s[len(s)-1] == '\'':
			return s[1 : len(s)-1]
		case len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"':
			u, err := strconv.Unquote(s) // the escapes TOMLString writes are Go's too
			if err != nil {
				t.Fatalf("TOML basic string %s: %v", s, err)
			}
			return u
		}
		return s
	}
	if strings.HasPrefix(v, "[") && strings.HasSuffix(v, "]") {
		var items []string
		for _, it := range strings.Split(strings.Trim(v, "[]"), ",") {
			if it = strings.TrimSpace(it); it != "" {
				items = append(items, str(it))
			}
		}
		return "[" + strings.Join(items, ", ") + "]"
	}
	return str(v)
}

// TestCRIConfigContainerd has the real containerd 2.x of the runtime fixture (build-containerd.sh, the
// one the bundle's package ships) load CRIConfig's output and checks, in the dump of its effective
// configuration, that every setting landed in the plugin that reads it (a misspelt key or a wrong table
// would vanish from the dump or keep containerd's default), that no deprecated key is used, and that
// `containerd config migrate` (to the latest schema) keeps every setting.
func TestCRIConfigContainerd(t *testing.T) {
	bin := labns.ContainerdBin(t, "containerd")
	const images, runtime = `plugins."io.containerd.cri.v1.images"`, `plugins."io.containerd.cri.v1.runtime"`
	for _, tc := range []struct {
		name, image, wantImage string
	}{
		{"pause", testPause, "registry.k8s.io/pause:3.10.1"},
		// TOML escaping: a reference with a quote and backslash must survive (and not break the file).
		{"escaped", `10.0.0.1:8443/x"y\z:1`, `10.0.0.1:8443/x"y\z:1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.toml")
			if err := os.WriteFile(path, CRIConfig(tc.image), 0o644); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{
				images + ".pinned_images.sandbox":                           tc.wantImage,
				images + ".registry.config_path":                            "/etc/containerd/certs.d",
				runtime + ".restrict_oom_score_adj":                         "true",
				runtime + ".containerd.default_runtime_name":                "runc",
				runtime + ".containerd.runtimes.runc.runtime_type":          "io.containerd.runc.v2",
				runtime + ".containerd.runtimes.runc.options.SystemdCgroup": "true",
				runtime + ".cni.bin_dirs":                                   "[/usr/lib/cni]",
				runtime + ".cni.conf_dir":                                   "/etc/cni/net.d",
			}
			// The CRI gRPC server keeps its defaults, streaming on the loopback only (in the dump of the
			// effective config; migrate writes only what the file sets).
			defaults := map[string]string{
				`plugins."io.containerd.grpc.v1.cri".stream_server_address`: "127.0.0.1",
				`plugins."io.containerd.grpc.v1.cri".disable_tcp_service`:   "true",
			}
			for _, sub := range [][]string{{"config", "dump"}, {"config", "migrate"}} {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				var stderr bytes.Buffer
				cmd := exec.CommandContext(ctx, bin, append([]string{"--config", path}, sub...)...)
				cmd.Stderr = &stderr
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("containerd --config %s %s: %v\n%s", path, strings.Join(sub, " "), err, stderr.String())
				}
				got := tomlTables(t, out)
				check := maps.Clone(want)
				if sub[1] == "dump" {
					maps.Copy(check, defaults)
				}
				for k, v := range check {
					if got[k] != v {
						t.Errorf("containerd %s: %s = %q, want %q", strings.Join(sub, " "), k, got[k], v)
					}
				}
				if t.Failed() {
					t.Logf("containerd %s:\n%s", strings.Join(sub, " "), out)
				}
				// containerd logs unknown and deprecated keys rather than failing; none must be reported.
				if s := strings.ToLower(stderr.String()); strings.Contains(s, "unknown") || strings.Contains(s, "deprecat") {
					t.Errorf("containerd %s complains about the config:\n%s", strings.Join(sub, " "), stderr.String())
				}
			}
		})
	}
}
