package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/netboot"
)

// TestNodeReinstall: `appliance node reinstall` refuses, with what to fix, a node that does not
// network-boot, an unknown node, a run without --yes and a missing state directory; with --no-power
// it makes the appliance forget the install (the node's iPXE script network-boots the image again)
// and says whether there was one.
func TestNodeReinstall(t *testing.T) {
	cfg := config.Example()
	cfg.StateDir = t.TempDir()
	w := -1
	for i, n := range cfg.Nodes {
		if n.Name == "w1" {
			w = i
		}
	}
	if w < 0 {
		t.Fatal("config.Example() has no w1")
	}
	cfg.Nodes[w].MAC = "52:54:00:00:00:21"
	cfg.Nodes[w].Power.BootDevice = config.BootPXE
	if !cfg.Nodes[w].NetworkBootable() {
		t.Fatalf("w1 of the example is not network-bootable: %+v", cfg.Nodes[w].Power)
	}
	path := writeConfig(t, cfg)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no --yes", []string{"node", "reinstall", "w1", "-c", path}, "reinstalling w1 writes its disk anew (everything on it is lost): pass --yes to do it"},
		{"unknown node", []string{"node", "reinstall", "nope", "-c", path, "--yes"}, "nope is not in nodes[] of " + path},
		{"not network-booted", []string{"node", "reinstall", "cp1", "-c", path, "--yes"}, "nodes[0] (cp1) does not install from the network (it needs mac, power.kind ipmi or redfish and power.bootDevice pxe)"},
		{"no state directory", []string{"node", "reinstall", "w1", "-c", path, "--yes", "-s", filepath.Join(cfg.StateDir, "absent")}, "is not there: run appliance bootstrap first"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := runCLI(tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q\nstderr: %s", err, tc.want, stderr)
			}
		})
	}

	nb := filepath.Join(cfg.StateDir, "netboot")
	if err := netboot.MarkInstalled(nb, netboot.Installed{Node: "w1", MAC: "52:54:00:00:00:21", Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	_, stderr, err := runCLI("node", "reinstall", "w1", "-c", path, "--yes", "--no-power")
	if err != nil {
		t.Fatalf("reinstall --no-power: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "the appliance forgot its install") || !strings.Contains(stderr, "not powered (--no-power)") {
		t.Errorf("stderr %q does not say the install was forgotten and the node not powered", stderr)
	}
	if _, ok, err := netboot.InstalledMark(nb, "w1"); ok || err != nil {
		t.Errorf("w1 still marked installed after reinstall (%v)", err)
	}
	_, stderr, err = runCLI("node", "reinstall", "w1", "-c", path, "--yes", "--no-power")
	if err != nil || !strings.Contains(stderr, "it was not marked installed") {
		t.Errorf("second reinstall: %v, stderr %q; want it to say w1 was not marked installed", err, stderr)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "nodes")); err == nil {
		t.Errorf("--no-power recorded a power-on in the node store")
	}
}
