package main

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/vipcheck"
)

// TestConfigValidateCollisions (issue 14): `config validate` takes several files and warns, without
// failing, when two clusters would collide on one network: the same VIP, or the same VRID with
// overlapping control-plane CIDRs. Each warning names the other file and the field; the JSON output
// keeps the one-file shape per file (an array for several files).
func TestConfigValidateCollisions(t *testing.T) {
	mk := func(name, vip string, vrid uint8) string {
		c := config.Example()
		c.ClusterName = name
		c.APIServer.VIP = netip.MustParseAddr(vip)
		c.APIServer.Keepalived.VirtualRouterID = vrid
		return writeConfig(t, c)
	}
	a := mk("a", "10.100.0.100", 51)
	sameVRID := mk("b", "10.100.0.101", 51)
	sameVIP := mk("c", "10.100.0.100", 52)
	clear := mk("d", "10.100.0.102", 53)

	for _, tc := range []struct {
		name  string
		files []string
		field string // "" = no collision warning
	}{
		{"same VRID, same segment", []string{a, sameVRID}, vipcheck.FieldVRID},
		{"same VIP", []string{a, sameVIP}, vipcheck.FieldVIP},
		{"no collision", []string{a, clear}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, err := runCLI(append([]string{"config", "validate", "--offline"}, tc.files...)...)
			if err != nil {
				t.Fatalf("a collision is a warning, not a failure: %v\n%s", err, errOut)
			}
			for _, f := range tc.files {
				if !strings.Contains(out, f+" is valid") {
					t.Errorf("stdout %q does not report %s valid", out, f)
				}
			}
			warnings := strings.Count(errOut, "warning: ")
			if tc.field == "" {
				if warnings != 0 {
					t.Errorf("unexpected warnings: %s", errOut)
				}
				return
			}
			if warnings != 2 {
				t.Errorf("want one warning per file, got %d: %s", warnings, errOut)
			}
			for i, f := range tc.files {
				other := tc.files[1-i]
				want := "warning: " + f + ": " + tc.field + ": " + other + " (cluster "
				if !strings.Contains(errOut, want) {
					t.Errorf("stderr lacks %q:\n%s", want, errOut)
				}
			}

			out, _, err = runCLI(append([]string{"config", "validate", "--offline", "-o", "json"}, tc.files...)...)
			var vs []validateJSON
			if err != nil || json.Unmarshal([]byte(out), &vs) != nil || len(vs) != 2 {
				t.Fatalf("json: %v, output %q", err, out)
			}
			for i, v := range vs {
				if v.File != tc.files[i] || !v.Valid || len(v.Warnings) != 1 {
					t.Errorf("json[%d]: %+v", i, v)
					continue
				}
				w := v.Warnings[0]
				if w.Path != tc.field || w.Line == 0 || !strings.Contains(w.Msg, tc.files[1-i]) {
					t.Errorf("json[%d] warning %+v: want path %s, a line, and the other file named", i, w, tc.field)
				}
			}
		})
	}

	// An unreadable file fails the run; the others are still reported.
	out, _, err := runCLI("config", "validate", "--offline", a, "/nonexistent/bootstrap.yaml")
	if err == nil || !strings.Contains(err.Error(), "1 of 2 files are not valid") || !strings.Contains(out, a+" is valid") {
		t.Errorf("with a missing file: %v, stdout %q", err, out)
	}
}

// TestNetworkBootSaid: `config validate` and `status` say what network boot serve runs (the example
// has two network-bootable workers, so boot.dhcp defaults to proxy); status keeps it off stdout.
func TestNetworkBootSaid(t *testing.T) {
	cfg := config.Example()
	cfg.StateDir = t.TempDir()
	path := writeConfig(t, cfg)
	const want = "proxyDHCP (udp 67, 4011), TFTP (udp 69) and boot HTTP (tcp 8080) on the control-plane interface; the node image /var/cache/appliance/bundle/netboot/node-amd64.iso; answers 2 machines: w1 52:54:00:00:00:21, w2 52:54:00:00:00:22"
	out, errOut, err := runCLI("config", "validate", "--offline", path)
	if err != nil || !strings.Contains(out, "  network boot: "+want+"\n") {
		t.Errorf("config validate: %v\nstdout %q\nstderr %q\nwant the line %q", err, out, errOut, want)
	}
	out, _, err = runCLI("config", "validate", "--offline", "-o", "json", path)
	var r validateResult
	if err != nil || json.Unmarshal([]byte(out), &r) != nil || r.NetworkBoot != want {
		t.Errorf("config validate -o json: %v, networkBoot %q, want %q", err, r.NetworkBoot, want)
	}
	out, errOut, err = runCLI("status", "-c", path)
	if err != nil || !strings.Contains(errOut, "network boot (served by appliance serve): "+want) || strings.Contains(out, "network boot") {
		t.Errorf("status: %v\nstdout %q\nstderr %q", err, out, errOut)
	}
}
