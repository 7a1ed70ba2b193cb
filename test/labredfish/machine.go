package labredfish

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/airgap-appliance/appliance/test/labns"
	"github.com/airgap-appliance/appliance/test/redfishbmc"
)

// MachineOptions shape the machine StartMachine gives a BMC. The zero value (with MemoryMiB) is a
// diskless machine with legacy BIOS whose one NIC is QEMU user-mode networking inside the test's
// namespace, and a BMC on 127.0.0.1.
type MachineOptions struct {
	Options
	// MemoryMiB is the machine's memory. Required.
	MemoryMiB int
	// UUID is the SMBIOS system UUID the machine reads (/sys/class/dmi/id/product_uuid), also the
	// Redfish System Id. Empty: a random one.
	UUID string
	// MAC is the NIC's MAC address. Empty: QEMU's default.
	MAC string
	// Disks are blank virtio disks (sparse files in the test's directory), in this order, each with
	// its serial (what root-device hints match).
	Disks []Disk
	// Lab, when set, puts the machine and its BMC on a lab segment instead (see LabNIC).
	Lab *LabNIC
	// UEFI gives the machine OVMF (Debian's ovmf) and BootSourceOverrideMode UEFI at start; without
	// it, it has SeaBIOS (a PATCH of the mode to UEFI still boots OVMF).
	UEFI bool
}

// Disk is a blank virtio disk of MachineOptions.
type Disk struct {
	SizeGiB int
	Serial  string
}

// LabNIC bridges the machine onto a segment of a lab (test/lab): inside the test's namespace, bridge
// br0 holds a veth whose peer joins Bridge in the namespace Fabric, and the tap vm0 QEMU uses. The BMC
// listens on BMC's address (port 443), which br0 holds: a BMC sharing the machine's NIC, as NC-SI
// does. The root namespace gets nothing.
type LabNIC struct {
	Fabric, Bridge string
	BMC            netip.Prefix
}

// Machine is a QEMU virtual machine (TCG) behind the lab's Redfish BMC: a power-on through the BMC
// starts QEMU with the boot override in force, an inserted virtual CD is the machine's CD, and a
// reboot of the machine restarts it from the BMC's settings, as real firmware reads the BMC's boot
// override and media at every reset.
type Machine struct {
	BMC
	// NS is the network namespace QEMU runs in. Without a lab NIC the VM reaches the namespace's
	// 127.0.0.1 as 10.0.2.2 (QEMU user networking's host address).
	NS *labns.NS
	// Console is the path of the VM's serial console (ttyS0) log, appended to across restarts.
	Console string
	// Disks are the paths of MachineOptions.Disks' files.
	Disks []string
	// Events is the path of the machine's lifecycle log (redfishbmc.QEMUConfig.Events): one line per
	// event, "UNIXNANOS EVENT" (started, stopped, reset, restarted from its definition).
	Events string
}

// StartMachine starts, for one test, a network namespace (labns), a powered-off QEMU machine
// described by o, and its BMC: the emulator driving that machine over QMP, in the namespace with a
// lab NIC, else on 127.0.0.1 in the root namespace (QEMU still in the namespace, user-mode
// networking). Everything is stopped by PID at the end (the BMC kills QEMU on its way out). Needs
// root and qemu-system-x86_64 (and ovmf for UEFI): missing ones fail the test in CI and skip it
// loudly elsewhere.
func StartMachine(t testing.TB, o MachineOptions) Machine {
	t.Helper()
	labns.RequireRoot(t)
	qemu := labns.RequireTool(t, "qemu-system-x86_64")
	if o.MemoryMiB <= 0 {
		t.Fatal("labredfish.StartMachine: MemoryMiB is required")
	}
	// Not t.TempDir when its path holds a comma, which QEMU's option syntax cannot take.
	dir, err := os.MkdirTemp("", "labredfish-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	for _, d := range []string{"run", "disks", "bmc"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if o.UUID == "" {
		o.UUID = uuid.NewString()
	}
	o.SystemID = o.UUID
	ns := labns.New(t, "vmedia")
	q := &redfishbmc.QEMUConfig{Binary: qemu, MemoryMiB: o.MemoryMiB, UUID: o.UUID, MAC: o.MAC,
		Console: filepath.Join(dir, "run", "ttyS0.log"), Events: filepath.Join(dir, "run", "events.log"), RunDir: filepath.Join(dir, "run"),
		OVMFCode: "/usr/share/OVMF/OVMF_CODE_4M.fd", OVMFVars: "/usr/share/OVMF/OVMF_VARS_4M.fd"}
	if _, err := os.Stat(q.OVMFCode); err != nil {
		if o.UEFI {
			t.Fatalf("UEFI machine: OVMF (Debian package ovmf, `make deps`): %v", err)
		}
		q.OVMFCode, q.OVMFVars = "", ""
	}
	var disks []string
	for i, d := range o.Disks {
		p := filepath.Join(dir, "disks", fmt.Sprintf("disk%d.img", i))
		f, err := os.Create(p)
		if err == nil {
			err = f.Truncate(int64(d.SizeGiB) << 30)
			_ = f.Close()
		}
		if err != nil {
			t.Fatalf("disk %s: %v", p, err)
		}
		if strings.ContainsAny(d.Serial, ", ") {
			t.Fatalf("disk serial %q: QEMU's option syntax cannot take a comma or space", d.Serial)
		}
		disks = append(disks, p)
		q.Disks = append(q.Disks, redfishbmc.DiskConfig{Path: p, Serial: d.Serial})
	}
	var bmc BMC
	if o.Lab != nil {
		labNIC(t, ns, *o.Lab)
		q.TAP = "vm0"
		bmc = start(t, filepath.Join(dir, "bmc"), o.Options, o.Lab.BMC.Addr(), ns, q, o.UEFI)
	} else {
		q.NetNS = ns.Name
		bmc = start(t, filepath.Join(dir, "bmc"), o.Options, netip.MustParseAddr("127.0.0.1"), nil, q, o.UEFI)
	}
	return Machine{BMC: bmc, NS: ns, Console: q.Console, Disks: disks, Events: q.Events}
}

// labNIC builds LabNIC's plumbing in ns (see LabNIC).
func labNIC(t testing.TB, ns *labns.NS, l LabNIC) {
	t.Helper()
	port := "v" + ns.Name[len(ns.Name)-6:] + "c"
	for _, c := range [][]string{
		{"ip", "link", "add", "eth0", "netns", ns.Name, "type", "veth", "peer", "name", port, "netns", l.Fabric},
		{"ip", "-n", l.Fabric, "link", "set", port, "master", l.Bridge, "up"},
		{"ip", "-n", ns.Name, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"ip", "-n", ns.Name, "link", "set", "eth0", "master", "br0", "up"},
		{"ip", "-n", ns.Name, "tuntap", "add", "dev", "vm0", "mode", "tap"},
		{"ip", "-n", ns.Name, "link", "set", "vm0", "master", "br0", "up"},
		{"ip", "-n", ns.Name, "addr", "add", l.BMC.String(), "dev", "br0"},
		{"ip", "-n", ns.Name, "link", "set", "br0", "up"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
}
