package config

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml from the current output")

// TestExampleGolden: Marshal(Example()) is pinned in testdata/defaults.golden.yaml (what `appliance
// config defaults` prints); rendering twice gives identical bytes. Run with -update to regenerate.
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
	golden := filepath.Join("testdata", "defaults.golden.yaml")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestExampleGolden -update ./pkg/config to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("Marshal(Example()) differs from %s (-want +got), rerun with -update if intended:\n%s", golden, diff)
	}
}

// TestExampleValidatesClean: Example() validates without errors or warnings.
func TestExampleValidatesClean(t *testing.T) {
	warns, errs := Validate(Example(), ValidateOptions{})
	if len(errs) > 0 || len(warns) > 0 {
		t.Fatalf("Example() does not validate clean:\nerrors:\n%v\nwarnings:\n%v", errs, ErrorList(warns))
	}
	// Example is already defaulted: SetDefaults changes nothing.
	c := Example()
	SetDefaults(c)
	if diff := cmp.Diff(Example(), c, cmpConfig...); diff != "" {
		t.Errorf("Example() is not fully defaulted (-example +defaulted):\n%s", diff)
	}
}

// TestRoundTrip: Decode(Marshal(c)) == c for the example, the lab file and a configuration that uses
// every optional field.
func TestRoundTrip(t *testing.T) {
	hostKey, _ := testHostKey(t)
	full := Example()
	full.APIServer.Keepalived.AuthPasswordFile = "/etc/appliance/vrrp.password"
	full.Ignition = IgnitionSnippets{All: []string{"/a.ign"}, ControlPlane: []string{"/cp.ign"}, Worker: []string{"/w.ign", "/w2.ign"}}
	full.Nodes[0].Ignition = []string{"/cp1.ign"}
	full.Nodes[0].Power.HostKey = hostKey
	full.Nodes[4].Power.InsecureSkipVerify = true
	full.Nodes[4].Power.CAFile = ""
	full.Networks.Pods = pfx("fd00:233::/56")[0]
	full.Networks.Services = pfx("fd00:96::/112")[0]
	for name, c := range map[string]*BootstrapConfiguration{"example": Example(), "lab": labConfig(t), "full": full} {
		t.Run(name, func(t *testing.T) {
			data, err := Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			back, err := Decode(data)
			if err != nil {
				t.Fatalf("Decode(Marshal(c)): %v\n%s", err, data)
			}
			if diff := cmp.Diff(c, back, cmpConfig...); diff != "" {
				t.Errorf("round trip (-before +after):\n%s", diff)
			}
		})
	}
}

// TestLabFile: testdata/lab.yaml, the lab's configuration, loads without errors or warnings.
func TestLabFile(t *testing.T) {
	c, warns, err := Load(filepath.Join("testdata", "lab.yaml"), ValidateOptions{})
	if err != nil || len(warns) > 0 {
		t.Fatalf("Load(lab.yaml) = %v, warnings %v", err, ErrorList(warns))
	}
	checks := []struct{ name, got, want string }{
		{"clusterName", c.ClusterName, "lab"},
		{"vip", c.APIServer.VIP.String(), "10.100.0.100"},
		{"control planes", itoa(uint16(len(c.ControlPlaneNodes()))), "3"},
		{"workers", itoa(uint16(len(c.WorkerNodes()))), "1"},
		{"cp1 ssh address", c.Nodes[0].Power.Address, "10.100.0.11:22"},
		{"w1 ipmi address", c.Nodes[3].Power.Address, "10.100.0.121:623"},
		{"workloadPlane", c.Networks.WorkloadPlane.CIDRs[0].String(), "10.200.0.0/24"},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %q, want %q", ch.name, ch.got, ch.want)
		}
	}
}
