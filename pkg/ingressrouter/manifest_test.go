package ingressrouter

import (
	"bytes"
	"errors"
	"flag"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml from the current output")

// testImage is an appliance image reference pinned by digest, as registry.ExecutableImage gives it.
const testImage = "10.100.0.2:8443/airgap-appliance/appliance@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// testLogger writes the controller's log into the test's output.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestManifestGolden renders the manifest of a lab with workers and one of a cluster without
// (routers on the control planes), compares them with the golden files and renders each twice:
// identical bytes.
func TestManifestGolden(t *testing.T) {
	for _, c := range []struct {
		name string
		o    ManifestOptions
	}{
		{"workers", ManifestOptions{Image: testImage, WorkersOnly: true,
			StatusAddress: netip.MustParseAddr("10.100.0.20"), APIServer: "10.100.0.10:6443"}},
		{"control-planes", ManifestOptions{Image: testImage, NodeSelector: map[string]string{"node-role.kubernetes.io/control-plane": ""},
			TolerateControlPlane: true, IngressClass: "apps", ListenPort: 8080, HealthPort: 10254}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Manifest(c.o)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := Manifest(c.o)
			if !bytes.Equal(got, again) {
				t.Error("two renderings differ")
			}
			golden := filepath.Join("testdata", c.name+".golden.yaml")
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
				t.Errorf("Manifest differs from %s: rerun with -update if intended\n%s", golden, got)
			}
			for i, doc := range bytes.Split(got, []byte("---\n")) {
				var m map[string]any
				if err := yaml.Unmarshal(doc, &m); err != nil || m["kind"] == nil {
					t.Errorf("document %d: %v %v", i, err, m)
				}
			}
		})
	}
}

// TestManifestErrors checks each refusal and that it says what to give instead.
func TestManifestErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		o    ManifestOptions
		want string
	}{
		{"no image", ManifestOptions{}, "give the appliance image by digest"},
		{"tag", ManifestOptions{Image: "registry/appliance:v1"}, "give the appliance image by digest"},
		{"short digest", ManifestOptions{Image: "registry/appliance@sha256:0123"}, "give the appliance image by digest"},
		{"upper-case digest", ManifestOptions{Image: strings.ToUpper(testImage)}, "give the appliance image by digest"},
		{"same ports", ManifestOptions{Image: testImage, ListenPort: 1936}, "give three ports"},
		{"same TLS port", ManifestOptions{Image: testImage, TLSPort: 80}, "give three ports"},
		{"api server without port", ManifestOptions{Image: testImage, APIServer: "10.0.0.1"}, "give host:port"},
		{"workers and control planes", ManifestOptions{Image: testImage, WorkersOnly: true, TolerateControlPlane: true}, "choose the workers or the control planes"},
		{"api server port 0", ManifestOptions{Image: testImage, APIServer: "10.0.0.1:0"}, "give host:port"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Manifest(c.o)
			if !errors.Is(err, ErrManifest) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Manifest = %v, want ErrManifest saying %q", err, c.want)
			}
		})
	}
}
