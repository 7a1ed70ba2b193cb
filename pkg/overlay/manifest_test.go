package overlay

import (
	"bytes"
	"errors"
	"flag"
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

func labManifestOptions() ManifestOptions {
	return ManifestOptions{Image: testImage, Network: netip.MustParsePrefix("10.244.0.0/16"),
		PublicCIDRs: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/24"), netip.MustParsePrefix("10.201.0.0/24")},
		VNI:         1, Port: 4789, MTU: 1500, APIServer: "10.100.0.100:6443",
		PodRanges:       map[string]netip.Prefix{"cp1": netip.MustParsePrefix("10.244.0.0/24"), "w1": netip.MustParsePrefix("10.244.1.0/24")},
		PublicAddresses: map[string]netip.Addr{"cp1": netip.MustParseAddr("10.200.0.11"), "w1": netip.MustParseAddr("10.201.0.21")}}
}

// TestManifestGolden renders the manifest of a two-subnet lab (MTU set) and of one that leaves the
// MTU to the interfaces, compares them with the golden files and renders each twice: identical bytes.
func TestManifestGolden(t *testing.T) {
	noMTU := labManifestOptions()
	noMTU.MTU, noMTU.APIServer, noMTU.PodRanges, noMTU.PublicAddresses = 0, "", nil, nil
	for _, c := range []struct {
		name  string
		o     ManifestOptions
		kinds string
	}{
		{"two-subnets", labManifestOptions(), "ServiceAccount,ClusterRole,ClusterRoleBinding,ConfigMap,DaemonSet"},
		{"interface-mtu", noMTU, "ServiceAccount,ClusterRole,ClusterRoleBinding,DaemonSet"},
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
			kinds := []string{}
			for i, doc := range bytes.Split(got, []byte("---\n")) {
				var m map[string]any
				if err := yaml.Unmarshal(doc, &m); err != nil || m["kind"] == nil {
					t.Errorf("document %d: %v %v", i, err, m)
				}
				kinds = append(kinds, m["kind"].(string))
			}
			if strings.Join(kinds, ",") != c.kinds {
				t.Errorf("kinds %v, want %s", kinds, c.kinds)
			}
		})
	}
}

// TestManifestErrors checks each refusal and that it says what to give instead.
func TestManifestErrors(t *testing.T) {
	for name, tt := range map[string]struct {
		edit func(*ManifestOptions)
		want string
	}{
		"image by tag":           {func(o *ManifestOptions) { o.Image = "10.100.0.2:8443/airgap-appliance/appliance:v1" }, "give the appliance image by digest"},
		"IPv6 pod network":       {func(o *ManifestOptions) { o.Network = netip.MustParsePrefix("fd00::/48") }, "give the IPv4 pod network (networks.pods)"},
		"no IPv4 CIDR":           {func(o *ManifestOptions) { o.PublicCIDRs = []netip.Prefix{netip.MustParsePrefix("fd00:1::/64")} }, "give the workload-plane CIDRs, at least one IPv4"},
		"VNI 0":                  {func(o *ManifestOptions) { o.VNI = 0 }, "VNI 0: give 1..16777215"},
		"port 0":                 {func(o *ManifestOptions) { o.Port = 0 }, "port 0: give a UDP port"},
		"MTU too small":          {func(o *ManifestOptions) { o.MTU = 600 }, "MTU 600: give the link MTU (at least 626"},
		"pod range outside":      {func(o *ManifestOptions) { o.PodRanges["w1"] = netip.MustParsePrefix("10.245.1.0/24") }, "pod range 10.245.1.0/24 of node w1: give a range inside 10.244.0.0/16"},
		"public address outside": {func(o *ManifestOptions) { o.PublicAddresses["w1"] = netip.MustParseAddr("10.100.0.21") }, "public address 10.100.0.21 of node w1: give an IPv4 address inside [10.200.0.0/24 10.201.0.0/24]"},
		"API server w/o port":    {func(o *ManifestOptions) { o.APIServer = "10.100.0.100" }, "give host:port"},
	} {
		t.Run(name, func(t *testing.T) {
			o := labManifestOptions()
			tt.edit(&o)
			_, err := Manifest(o)
			if !errors.Is(err, ErrManifest) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want ErrManifest saying %q", err, tt.want)
			}
		})
	}
}

// TestNetConf: flannel's net-conf.json as its subnet manager parses it (pkg/subnet.ParseConfig is
// exercised by TestOverlayAcrossRouter; here the exact bytes).
func TestNetConf(t *testing.T) {
	got, err := NetConf(Options{NodeName: "a", Network: netip.MustParsePrefix("10.244.0.0/16"),
		PublicCIDRs: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/24")}, VNI: 1, Port: 4789, MTU: 9000, StateDir: "/x"})
	if err != nil {
		t.Fatal(err)
	}
	want := `{
  "Network": "10.244.0.0/16",
  "EnableIPv4": true,
  "Backend": {
    "Type": "vxlan",
    "VNI": 1,
    "Port": 4789,
    "MTU": 9000
  }
}
`
	if string(got) != want {
		t.Errorf("NetConf:\n%s\nwant:\n%s", got, want)
	}
}
