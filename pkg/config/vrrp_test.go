package config

import (
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// labWithKeepalived is testdata/lab.yaml with apiServer.vip set to vip and apiServer.keepalived to
// keepalivedYAML (a flow mapping; "" leaves it out).
func labWithKeepalived(t *testing.T, vip, keepalivedYAML string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "lab.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const from = "apiServer:\n  vip: 10.100.0.100\n"
	if !strings.Contains(string(data), from) {
		t.Fatalf("lab.yaml lacks %q", from)
	}
	to := "apiServer:\n  vip: " + vip + "\n"
	if keepalivedYAML != "" {
		to += "  keepalived: " + keepalivedYAML + "\n"
	}
	return []byte(strings.Replace(string(data), from, to, 1))
}

// TestAdvertInterval: VRRPv3 at 250 ms by default; VRRPv2 (authPasswordFile) at 1 s by default and
// whole seconds only; every refusal names apiServer.keepalived.advertInterval and says what to do.
func TestAdvertInterval(t *testing.T) {
	tests := []struct {
		name, keepalived string
		want             time.Duration
		decodeErr, msg   string // decodeErr: the message of a decode error; msg: of a validation error
	}{
		{"default VRRPv3", "", 250 * time.Millisecond, "", ""},
		{"default VRRPv2", "{authPasswordFile: /etc/appliance/vrrp.pass}", time.Second, "", ""},
		{"VRRPv3 written", "{advertInterval: 100ms}", 100 * time.Millisecond, "", ""},
		{"VRRPv3 longest", "{advertInterval: 40.95s}", 40950 * time.Millisecond, "", ""},
		{"VRRPv2 written", "{authPasswordFile: /p, advertInterval: 3s}", 3 * time.Second, "", ""},
		{"VRRPv2 sub-second", "{authPasswordFile: /p, advertInterval: 250ms}", 0, "",
			"250ms is below 1s, but apiServer.keepalived.authPasswordFile selects VRRPv2 with PASS authentication"},
		{"VRRPv2 sub-second says why", "{authPasswordFile: /p, advertInterval: 500ms}", 0, "",
			"remove authPasswordFile to use VRRPv3 with sub-second intervals (the PASS password is sent in clear text"},
		{"VRRPv2 fraction", "{authPasswordFile: /p, advertInterval: 1500ms}", 0, "", "1.5s is not a whole number of seconds from 1s to 255s"},
		{"VRRPv2 too long", "{authPasswordFile: /p, advertInterval: 256s}", 0, "", "4m16s is not a whole number of seconds from 1s to 255s"},
		{"VRRPv3 not centiseconds", "{advertInterval: 255ms}", 0, "", "255ms is not a multiple of 10ms from 10ms to 40.95s"},
		{"VRRPv3 too short", "{advertInterval: 5ms}", 0, "", "5ms is not a multiple of 10ms"},
		{"VRRPv3 too long", "{advertInterval: 41s}", 0, "", "41s is not a multiple of 10ms from 10ms to 40.95s"},
		{"zero", "{advertInterval: 0s}", 0, `"0s" is not a positive duration`, ""},
		{"no unit", "{advertInterval: 250}", 0, "250 is not a duration: write a number with its unit", ""},
		{"negative", "{advertInterval: -1s}", 0, `"-1s" is not a positive duration`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, _, errs := load(labWithKeepalived(t, "10.100.0.100", tc.keepalived), ValidateOptions{})
			const path = "apiServer.keepalived.advertInterval"
			if tc.decodeErr != "" || tc.msg != "" {
				msg := tc.msg + tc.decodeErr
				requireErr(t, errs, path, msg, 15)
				if len(errs) != 1 {
					t.Errorf("want exactly one error, got:\n%v", errs)
				}
				return
			}
			if len(errs) > 0 {
				t.Fatalf("errors: %v", errs)
			}
			if got := c.APIServer.Keepalived.AdvertInterval; got != tc.want {
				t.Errorf("advertInterval = %s, want %s", got, tc.want)
			}
			// The defaulted document prints and reads back the same interval.
			out, err := Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(out), "advertInterval: "+tc.want.String()+"\n") {
				t.Errorf("Marshal lacks advertInterval: %s:\n%s", tc.want, out)
			}
			back, _, errs := load(out, ValidateOptions{})
			if len(errs) > 0 || back.APIServer.Keepalived.AdvertInterval != tc.want {
				t.Errorf("Marshal → load: %v, %v", back.APIServer.Keepalived.AdvertInterval, errs)
			}
		})
	}
}

// TestDefaultVirtualRouterIDUsesVIP: two clusters with the same name and different VIPs get
// different VRIDs (through SetDefaults, as `config validate` and bootstrap see them), the same inputs
// always the same one, pinned so that a change of the derivation shows.
func TestDefaultVirtualRouterIDUsesVIP(t *testing.T) {
	vrid := func(vip string) uint8 {
		c, _, errs := load(labWithKeepalived(t, vip, ""), ValidateOptions{})
		if len(errs) > 0 {
			t.Fatalf("vip %s: %v", vip, errs)
		}
		if !c.VirtualRouterIDDerived() {
			t.Errorf("vip %s: VirtualRouterIDDerived() = false for a document without virtualRouterID", vip)
		}
		return c.APIServer.Keepalived.VirtualRouterID
	}
	a, b := vrid("10.100.0.100"), vrid("10.100.0.101")
	if a == b {
		t.Errorf("clusters \"lab\" with VIPs 10.100.0.100 and 10.100.0.101 both get VRID %d", a)
	}
	if again := vrid("10.100.0.100"); again != a {
		t.Errorf("same inputs, VRIDs %d and %d", a, again)
	}
	pinned := []struct {
		name, vip string
		want      uint8
	}{
		{"lab", "10.100.0.100", a},
		{"lab", "10.100.0.101", b},
		{"lab", "", DefaultVirtualRouterID("lab", netip.Addr{})},
	}
	for _, p := range pinned {
		var vip netip.Addr
		if p.vip != "" {
			vip = netip.MustParseAddr(p.vip)
		}
		if got := DefaultVirtualRouterID(p.name, vip); got != p.want {
			t.Errorf("DefaultVirtualRouterID(%q, %q) = %d, want %d", p.name, p.vip, got, p.want)
		}
	}
	// Pinned literally: the VRID of running clusters must not move with a code change (the state
	// keeps it too, see pkg/plan.VRRPFor, but a new derivation should be a decision).
	if a != 179 || b != 1 {
		t.Errorf("lab VRIDs %d, %d; pinned 179, 1", a, b)
	}
	// A written VRID is not derived.
	c, _, errs := load(labWithKeepalived(t, "10.100.0.100", "{virtualRouterID: 9}"), ValidateOptions{})
	if len(errs) > 0 || c.APIServer.Keepalived.VirtualRouterID != 9 || c.VirtualRouterIDDerived() {
		t.Errorf("written VRID 9: got %d, derived %v, errors %v", c.APIServer.Keepalived.VirtualRouterID, c.VirtualRouterIDDerived(), errs)
	}
}

// TestDefaultVirtualRouterIDCollisions: over many clusters (names and VIPs), the VRIDs are spread
// like a uniform choice among 255: a group of k clusters on one segment collides about as often as
// the birthday bound 1 − ∏(1 − i/255) says, and every VRID is used about equally (chi-square).
// Deterministic: the inputs are fixed, so the figures are the same on every run.
func TestDefaultVirtualRouterIDCollisions(t *testing.T) {
	names := []string{"lab", "prod", "staging", "dev", "test", "edge", "k8s", "cluster"}
	counts := make([]int, 256)
	n := 0
	var ids []uint8
	for i := range 40 {
		for _, base := range names {
			name := base
			if i > 0 {
				name = fmt.Sprintf("%s-%d", base, i)
			}
			for host := 1; host < 255; host += 3 {
				for _, net := range []byte{0, 100, 201} {
					v := DefaultVirtualRouterID(name, netip.AddrFrom4([4]byte{10, net, 0, byte(host)}))
					if v == 0 {
						t.Fatalf("VRID 0 for %s", name)
					}
					counts[v]++
					ids = append(ids, v)
					n++
				}
			}
		}
	}
	// Uniformity: chi-square over 255 buckets (254 degrees of freedom; the 99.9th percentile is
	// about 330).
	exp := float64(n) / 255
	chi := 0.0
	for v := 1; v <= 255; v++ {
		d := float64(counts[v]) - exp
		chi += d * d / exp
	}
	t.Logf("%d (name, VIP) pairs: chi-square %.1f over 255 VRIDs (99.9th percentile ≈ 330)", n, chi)
	if chi > 330 {
		t.Errorf("VRIDs are not spread evenly: chi-square %.1f > 330", chi)
	}
	// Collisions in consecutive groups of k clusters versus the birthday bound.
	for _, k := range []int{2, 4, 10} {
		groups, hit := 0, 0
		for g := 0; g+k <= len(ids); g += k {
			seen := map[uint8]bool{}
			for _, v := range ids[g : g+k] {
				if seen[v] {
					hit++
					break
				}
				seen[v] = true
			}
			groups++
		}
		bound := 1.0
		for i := range k {
			bound *= 1 - float64(i)/255
		}
		bound = 1 - bound
		rate := float64(hit) / float64(groups)
		sigma := math.Sqrt(bound * (1 - bound) / float64(groups))
		t.Logf("groups of %2d clusters: %5d of %5d collide (%.2f%%), birthday bound %.2f%% (±%.2f%% one sigma)",
			k, hit, groups, 100*rate, 100*bound, 100*sigma)
		if rate > bound+4*sigma {
			t.Errorf("groups of %d: collision rate %.2f%% is well above the birthday bound %.2f%%", k, 100*rate, 100*bound)
		}
	}
}
