package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/netboot"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/test/labns"
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
	evs, _ := nodestate.Open(statedir.Nodes(cfg.StateDir)).Events("w1")
	for _, ev := range evs {
		if ev.State == agentapi.StatePowering {
			t.Errorf("--no-power recorded a power-on in the node store: %+v", ev)
		}
	}
	// Each reinstall replaced the token (0600) and recorded it in w1's history.
	hist, err := nodestate.Open(statedir.Nodes(cfg.StateDir)).History("w1")
	rotated := 0
	for _, e := range hist {
		if e.Kind == nodestate.TokenRotated {
			rotated++
		}
	}
	if err != nil || rotated != 2 || !strings.Contains(stderr, "replaced its token") {
		t.Errorf("w1's history holds %d token-rotated entries (%v), want 2; stderr %q", rotated, err, stderr)
	}
	tokPath := pki.NodeTokenPath(statedir.PKI(cfg.StateDir), "w1")
	if st, err := os.Stat(tokPath); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("%s after reinstall: %v, want mode 0600", tokPath, err)
	}
}

// chassisLog is ipmi_sim's chassis_control PROGRAM for TestNodeReinstallThroughBMC: power and boot
// device live in files beside it, and every set is appended to "log".
const chassisLog = `#!/bin/sh
dir=$(dirname "$0")
shift
op=$1; shift
case $op in
get)
  for p in "$@"; do
    case $p in
      power) echo "power:$(cat "$dir/power")";;
      boot) echo "boot:$(cat "$dir/boot")";;
      *) echo "Invalid parameter: $p"; exit 1;;
    esac
  done;;
set)
  echo "$*" >> "$dir/log"
  while [ $# -gt 1 ]; do
    case $1 in
      power) echo "$2" > "$dir/power";;
      boot) echo "$2" > "$dir/boot";;
      reset) ;;
      *) echo "Invalid parameter: $1"; exit 1;;
    esac
    shift 2
  done;;
*) exit 1;;
esac
`

// TestNodeReinstallThroughBMC: against a real IPMI BMC (OpenIPMI's ipmi_sim on 127.0.0.1, its
// chassis in files), reinstall forgets the install, records the power-on (the enrolment window) and
// has the BMC set a PXE boot and power-cycle the node.
func TestNodeReinstallThroughBMC(t *testing.T) {
	sim := labns.RequireTool(t, "ipmi_sim")
	labns.RequireTool(t, "ipmitool")
	dir := t.TempDir()
	l, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.LocalAddr().(*net.UDPAddr).Port
	l.Close()
	for name, data := range map[string]string{"power": "1\n", "boot": "none\n", "chassis": chassisLog} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	lan := fmt.Sprintf("name \"w1\"\nset_working_mc 0x20\n  startlan 1\n    addr 127.0.0.1 %d\n    priv_limit admin\n"+
		"    allowed_auths_callback none md2 md5 straight\n    allowed_auths_user none md2 md5 straight\n"+
		"    allowed_auths_operator none md2 md5 straight\n    allowed_auths_admin none md2 md5 straight\n"+
		"    guid a123456789abcdefa123456789abcdef\n  endlan\n  chassis_control \"%s 0x20\"\n"+
		"  user 2 true \"admin\" \"s3cret\" admin 10 none md2 md5 straight\n", port, filepath.Join(dir, "chassis"))
	emu := "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nmc_enable 0x20\n"
	for name, data := range map[string]string{"lan.conf": lan, "bmc.emu": emu, "password": "s3cret\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o700); err != nil {
		t.Fatal(err)
	}
	var simOut bytes.Buffer
	cmd := exec.Command(sim, "-n", "-c", filepath.Join(dir, "lan.conf"), "-f", filepath.Join(dir, "bmc.emu"), "-s", filepath.Join(dir, "state"))
	cmd.Stdout, cmd.Stderr = &simOut, &simOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	cfg := config.Example()
	cfg.StateDir = t.TempDir()
	for i := range cfg.Nodes {
		if cfg.Nodes[i].Name == "w1" {
			cfg.Nodes[i].MAC = "52:54:00:00:00:21"
			cfg.Nodes[i].Power = config.Power{Kind: config.PowerIPMI, Address: fmt.Sprintf("127.0.0.1:%d", port),
				Username: "admin", PasswordFile: filepath.Join(dir, "password"), BootDevice: config.BootPXE}
		}
	}
	path := writeConfig(t, cfg)
	nb := filepath.Join(cfg.StateDir, "netboot")
	if err := netboot.MarkInstalled(nb, netboot.Installed{Node: "w1", MAC: "52:54:00:00:00:21", Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var stderr string
	for i := 0; ; i++ { // ipmi_sim takes a moment to listen
		_, stderr, err = runCLI("node", "reinstall", "w1", "-c", path, "--yes")
		if err == nil || i == 20 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("reinstall through ipmi_sim: %v\nstderr: %s\nipmi_sim: %s", err, stderr, simOut.String())
	}
	if _, ok, _ := netboot.InstalledMark(nb, "w1"); ok {
		t.Error("w1 still marked installed")
	}
	log, _ := os.ReadFile(filepath.Join(dir, "log"))
	if !strings.Contains(string(log), "boot pxe") || !strings.Contains(string(log), "power") {
		t.Errorf("the BMC's chassis saw %q, want a PXE boot set and a power action", log)
	}
	st, err := nodestate.Open(statedir.Nodes(cfg.StateDir)).Get("w1")
	if err != nil || st.State != agentapi.StatePowering {
		t.Errorf("w1's record = %+v, %v; want %s (the enrolment window)", st, err, agentapi.StatePowering)
	}
	t.Logf("reinstall: %s; chassis log: %q", strings.TrimSpace(stderr), log)
}
