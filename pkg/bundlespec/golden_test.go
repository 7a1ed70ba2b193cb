package bundlespec

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite testdata/example.yaml from the current output")

// TestExampleGolden: Marshal(Example()) is pinned in testdata/example.yaml; rendering twice gives
// identical bytes. Run with -update to regenerate.
func TestExampleGolden(t *testing.T) {
	got, err := Marshal(Example())
	if err != nil {
		t.Fatal(err)
	}
	again, err := Marshal(Example())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, again) {
		t.Fatal("Marshal(Example()) is not deterministic")
	}
	golden := filepath.Join("testdata", "example.yaml")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./pkg/bundlespec -run TestExampleGolden -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("Marshal(Example()) differs from %s (-want +got), rerun with -update if intended:\n%s", golden, diff)
	}
}

// TestExampleValidatesClean: Example passes Validate without CheckFiles and is fully defaulted.
func TestExampleValidatesClean(t *testing.T) {
	if errs := Validate(Example(), ValidateOptions{}); len(errs) > 0 {
		t.Fatalf("Example() does not validate clean:\n%v", errs)
	}
	s := Example()
	SetDefaults(s)
	if diff := cmp.Diff(Example(), s, cmpSpec...); diff != "" {
		t.Errorf("Example() is not fully defaulted (-example +defaulted):\n%s", diff)
	}
	// Every optional part is used, so that the golden file shows every field.
	e := Example()
	if len(e.Images.Extra) == 0 || e.Registries.Auth.DockerConfigFile == "" || len(e.Registries.Hosts) == 0 ||
		len(e.ExtraPackages) == 0 || e.Signing.RepoKeyFile == "" || e.Signing.BundleKeyFile == "" || e.Output.PartSize == 0 {
		t.Errorf("Example() leaves an optional field unset: %+v", e)
	}
}

// TestRoundTrip: Decode(Marshal(s)) == s for the example, a minimal specification and one that uses
// odd but valid values.
func TestRoundTrip(t *testing.T) {
	minimal := &BundleSpecification{Kubernetes: Kubernetes{Version: "v1.36.3"},
		Apt: Apt{Sources: []AptSource{{URI: "http://deb.corp/debian", Suite: "bookworm", Components: []string{"main"}, SignedBy: "k.gpg"}}}}
	SetDefaults(minimal)
	odd := Example()
	odd.Images.Install = []string{"registry.k8s.io/pause:3.10.1@" + digest}
	odd.Platforms = []string{PlatformAll}
	odd.Registries.Hosts["[fd00::5]:5000"] = Registry{Mirrors: []string{"https://[fd00::6]:5000/v2/x"}}
	odd.Registries.Hosts["empty.example"] = Registry{}
	odd.Output.PartSize = 4_700_000_000
	odd.Signing = Signing{}
	for name, s := range map[string]*BundleSpecification{"example": Example(), "minimal": minimal, "odd": odd} {
		t.Run(name, func(t *testing.T) {
			if errs := Validate(s, ValidateOptions{}); len(errs) > 0 {
				t.Fatalf("not valid: %v", errs)
			}
			data, err := Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			back, err := Decode(data)
			if err != nil {
				t.Fatalf("Decode(Marshal(s)): %v\n%s", err, data)
			}
			if diff := cmp.Diff(s, back, cmpSpec...); diff != "" {
				t.Errorf("round trip (-before +after):\n%s\nYAML:\n%s", diff, data)
			}
		})
	}
}

func TestMarshalNil(t *testing.T) {
	if _, err := Marshal(nil); err == nil {
		t.Error("Marshal(nil) succeeded")
	}
}
