package agentapi

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// bootArgsCases are command lines as the writers make them, with the BootArgs they hold: Format
// writes exactly the line, ParseBootArgs reads exactly the set.
var bootArgsCases = []struct {
	name string
	b    BootArgs
	line string
}{
	{"empty", BootArgs{}, ""},
	{"a BMC-booted node's kernel-cmdline file (pkg/plan), the node ISO's embed area",
		BootArgs{ApplianceURL: "https://10.83.0.2:8443", CAPin: "sha256:" + strings.Repeat("ab", 32)},
		"appliance.url=https://10.83.0.2:8443 appliance.ca_pin=sha256:" + strings.Repeat("ab", 32)},
	{"a network-booted machine's install words (pkg/applianced)",
		BootArgs{Hints: RootDeviceHints{SerialNumber: "NODE-DISK-1", Model: "QEMU HARDDISK"},
			Network: Network{Addresses: []netip.Prefix{netip.MustParsePrefix("10.83.0.21/24")}, Gateway: netip.MustParseAddr("10.83.0.1")}},
		"appliance.rootdevice.model=QEMU+HARDDISK appliance.rootdevice.serialNumber=NODE-DISK-1 appliance.address=10.83.0.21/24 appliance.gateway=10.83.0.1"},
	{"the enrolment answer's install parameters",
		BootArgs{Hints: RootDeviceHints{SerialNumber: "LAB-DISK-n2"}, Network: Network{Addresses: []netip.Prefix{netip.MustParsePrefix("10.100.0.22/24")}}, MAC: "52:54:00:01:64:02"},
		"appliance.rootdevice.serialNumber=LAB-DISK-n2 appliance.address=10.100.0.22/24 appliance.mac=52:54:00:01:64:02"},
	{"the iPXE script's node and network-boot words (pkg/netboot), as the kernel sees them",
		BootArgs{Node: "w1", RootFSURL: "http://10.0.0.2:8080/boot/rootfs.squashfs", RootFSSHA256: strings.Repeat("0f", 32),
			InitrdURL: "http://10.0.0.2:8080/boot/initrd", BootIF: "01-52-54-00-00-00-21", IP: "10.0.0.50::10.0.0.1:255.255.255.0"},
		"appliance.node=w1 appliance.rootfs=http://10.0.0.2:8080/boot/rootfs.squashfs appliance.rootfs_sha256=" + strings.Repeat("0f", 32) +
			" appliance.initrd=http://10.0.0.2:8080/boot/initrd BOOTIF=01-52-54-00-00-00-21 appliance.ip=10.0.0.50::10.0.0.1:255.255.255.0"},
	{"the node ISO's GRUB menu (iso/node/grub.cfg) with its embed area",
		BootArgs{ApplianceURL: "https://10.83.0.2:8443", CAPin: "sha256:00", Medium: "APPLNODE", Console: []string{"tty0", "ttyS0,115200n8"}},
		"appliance.url=https://10.83.0.2:8443 appliance.ca_pin=sha256:00 appliance.medium=APPLNODE console=tty0 console=ttyS0,115200n8"},
	{"every hint, percent-encoded",
		BootArgs{Hints: RootDeviceHints{DeviceName: "/dev/disk/by-path/pci-0000:00:05.0", HCTL: "0:0:0:0", Model: "QEMU HARDDISK", Vendor: "ATA",
			SerialNumber: "NODE DISK/1%", MinSizeGigabytes: 8, WWN: "0x5000c500a0b1c2d3", WWNWithExtension: "0x5000c500a0b1c2d30000000000000001",
			WWNVendorExtension: "0x1", Rotational: new(false)}},
		"appliance.rootdevice.deviceName=%2Fdev%2Fdisk%2Fby-path%2Fpci-0000%3A00%3A05.0 appliance.rootdevice.hctl=0%3A0%3A0%3A0 " +
			"appliance.rootdevice.model=QEMU+HARDDISK appliance.rootdevice.vendor=ATA appliance.rootdevice.serialNumber=NODE+DISK%2F1%25 " +
			"appliance.rootdevice.minSizeGigabytes=8 appliance.rootdevice.wwn=0x5000c500a0b1c2d3 " +
			"appliance.rootdevice.wwnWithExtension=0x5000c500a0b1c2d30000000000000001 appliance.rootdevice.wwnVendorExtension=0x1 " +
			"appliance.rootdevice.rotational=false"},
}

// TestBootArgsRoundTrip: each writer's line formats and parses to the same set and line, and words
// outside the contract (the boot loader's, the operator's boot.kernelArgs) are ignored.
func TestBootArgsRoundTrip(t *testing.T) {
	for _, tt := range bootArgsCases {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.b.Format(); got != tt.line {
				t.Errorf("Format =\n%s\nwant\n%s", got, tt.line)
			}
			got, err := ParseBootArgs(tt.line)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.b) {
				t.Errorf("ParseBootArgs = %+v, want %+v", got, tt.b)
			}
			noisy := "BOOT_IMAGE=/live/vmlinuz initrd=initrd quiet netboot.test=1 appliance.config=x " + tt.line + " \tro\n"
			if got, err := ParseBootArgs(noisy); err != nil || !reflect.DeepEqual(got, tt.b) {
				t.Errorf("ParseBootArgs(with other words) = %+v, %v; want %+v", got, err, tt.b)
			}
		})
	}
}

// TestParseBootArgs: the node image's command line as pkg/netboot's script makes it, and the
// refusals that name what to fix.
func TestParseBootArgs(t *testing.T) {
	line := "initrd=initrd console=tty0 console=ttyS0,115200n8 appliance.url=https://10.0.0.2:8443 " +
		"appliance.ca_pin=sha256:ab appliance.rootdevice.serialNumber=NODE-DISK-1 appliance.rootdevice.model=QEMU+HARDDISK appliance.node=w1 " +
		"appliance.rootfs=http://10.0.0.2:8080/boot/rootfs.squashfs appliance.initrd=http://10.0.0.2:8080/boot/initrd " +
		"BOOTIF=01-52-54-00-00-00-21 appliance.ip=10.0.0.50::10.0.0.1:255.255.255.0"
	b, err := ParseBootArgs(line)
	if err == nil {
		err = b.RequireAppliance()
	}
	if err != nil {
		t.Fatal(err)
	}
	if b.ApplianceURL != "https://10.0.0.2:8443" || b.CAPin != "sha256:ab" || b.Node != "w1" || b.InitrdURL != "http://10.0.0.2:8080/boot/initrd" {
		t.Errorf("ParseBootArgs = %+v", b)
	}
	if b.Hints.SerialNumber != "NODE-DISK-1" || b.Hints.Model != "QEMU HARDDISK" {
		t.Errorf("hints = %+v, want serialNumber NODE-DISK-1 and model \"QEMU HARDDISK\"", b.Hints)
	}
	if strings.Join(b.ConsoleArgs(), " ") != "console=tty0 console=ttyS0,115200n8" {
		t.Errorf("console = %q", b.ConsoleArgs())
	}
	if b.DHCPGateway().String() != "10.0.0.1" || !b.Network.IsZero() {
		t.Errorf("DHCP gateway %s, network %+v; want 10.0.0.1 and no static network", b.DHCPGateway(), b.Network)
	}
	for _, ip := range []string{"", "10.0.0.50::0.0.0.0:255.255.255.0", "10.0.0.50:::255.255.255.0", "10.0.0.50", "${netX/ip}::${netX/gateway}:${netX/netmask}"} {
		if gw := (BootArgs{IP: ip}).DHCPGateway(); gw.IsValid() {
			t.Errorf("DHCPGateway of appliance.ip=%s = %s, want none", ip, gw)
		}
	}
	for _, bad := range []struct{ line, want string }{
		{"appliance.ca_pin=sha256:ab", "appliance.url= is missing"},
		{"appliance.url=https://x:8443", "appliance.ca_pin= is missing"},
		{"appliance.url=https://x:8443 appliance.ca_pin=sha256:ab appliance.initrd=ftp://x/i", "appliance.initrd="},
		{"appliance.url=https://x:8443 appliance.ca_pin=sha256:ab appliance.rootdevice.size=8", "unknown root-device hint"},
		{"appliance.url=https://x:8443 appliance.ca_pin=sha256:ab appliance.address=10.0.0.21", "appliance.address="},
		{ArgRootDevicePrefix + "serial=X", "unknown root-device hint"},
		{ArgRootDevicePrefix + "minSizeGigabytes=-1", "minSizeGigabytes"},
		{ArgRootDevicePrefix + "rotational=maybe", "rotational"},
		{ArgRootDevicePrefix + "model=%zz", "model"},
		{"appliance.address=10.83.0.21", "appliance.address=\"10.83.0.21\" is not an address with its prefix length"},
		{"appliance.gateway=router", "appliance.gateway=\"router\" is not an IP address"},
	} {
		b, err := ParseBootArgs(bad.line)
		if err == nil {
			err = b.RequireAppliance()
		}
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseBootArgs(%q) = %v, want an error containing %q", bad.line, err, bad.want)
		}
	}
}

// TestRootDeviceHintsString: the flow form messages print, in the kernel arguments' order.
func TestRootDeviceHintsString(t *testing.T) {
	h := RootDeviceHints{SerialNumber: "X", MinSizeGigabytes: 20, Rotational: new(true), Model: "QEMU HARDDISK"}
	if got, want := h.String(), `{model: "QEMU HARDDISK", serialNumber: "X", minSizeGigabytes: 20, rotational: true}`; got != want {
		t.Errorf("String = %s, want %s", got, want)
	}
	if got := (RootDeviceHints{}).String(); got != "{}" {
		t.Errorf("String of no hints = %s, want {}", got)
	}
}

// FuzzBootArgs: ParseBootArgs never panics, and whatever it accepts formats to a line it reads back
// to the same set (Parse(Format(x)) == x), which formats to the same line again.
func FuzzBootArgs(f *testing.F) {
	for _, tt := range bootArgsCases {
		f.Add(tt.line)
	}
	for _, s := range []string{
		"BOOT_IMAGE=/vmlinuz root=UUID=1 ro quiet console=tty0 console",
		"appliance.url appliance.url= appliance.ca_pin=x appliance.ca_pin=y appliance.node=",
		"appliance.rootdevice.minSizeGigabytes=007 appliance.rootdevice.rotational=1 appliance.rootdevice.model=%41+b",
		"appliance.address=::ffff:10.0.0.1/120 appliance.gateway=fe80::1%eth0 appliance.address=10.0.0.1/32",
		"appliance.ip=${netX/ip}::${netX/gateway}:${netX/netmask} BOOTIF=01-${netX/mac:hexhyp} appliance.initrd=HTTP://x/",
		"appliance.rootdevice.=x appliance.rootdevice.model=%zz appliance.initrd=http:///x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		b, err := ParseBootArgs(line)
		if err != nil {
			return
		}
		formatted := b.Format()
		back, err := ParseBootArgs(formatted)
		if err != nil {
			t.Fatalf("ParseBootArgs(%q) = %+v; its Format %q does not parse: %v", line, b, formatted, err)
		}
		if !reflect.DeepEqual(back, b) {
			t.Fatalf("ParseBootArgs(%q) = %+v; ParseBootArgs(Format) = %+v (Format %q)", line, b, back, formatted)
		}
		if again := back.Format(); again != formatted {
			t.Fatalf("Format is not stable: %q, then %q", formatted, again)
		}
	})
}
