package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/overlay"
)

// TestOverlayFlags: `appliance overlay` reports every missing or wrong flag at once, each by its
// name, before it touches the network or an API server; Run's own refusals (VNI, port, MTU) too.
func TestOverlayFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	_, _, err := runCLI("overlay", "--network", "10.244.0.1/16", "--public-cidrs", "10.200.0.0/24,x")
	if err == nil {
		t.Fatal("overlay without a node name succeeded")
	}
	for _, want := range []string{
		`--node-name: required (or NODE_NAME)`,
		`--network: "10.244.0.1/16" is not an IPv4 network CIDR: give networks.pods`,
		`--public-cidrs: "x" is not a network CIDR: give networks.workloadPlane.cidrs`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	_, _, err = runCLI("overlay", "--node-name", "w1", "--network", "10.244.0.0/16", "--public-cidrs", "10.200.0.0/24",
		"--vni", "0", "--port", "70000", "--mtu", "600", "--state-dir", t.TempDir())
	for _, want := range []string{"VNI 0: give 1..16777215", "port 70000: give a UDP port", "MTU 600: give the link MTU (at least 626"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}

// TestOverlayReady: the readiness probe fails until the overlay's ready file exists.
func TestOverlayReady(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := runCLI("overlay", "ready", "--state-dir", dir); err == nil || !strings.Contains(err.Error(), "overlay: not ready") {
		t.Errorf("before registration: %v, want not ready", err)
	}
	if err := os.WriteFile(filepath.Join(dir, overlay.ReadyFile), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCLI("overlay", "ready", "--state-dir", dir); err != nil {
		t.Errorf("after registration: %v", err)
	}
}
