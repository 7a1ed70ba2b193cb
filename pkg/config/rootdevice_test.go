package config

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// TestValidateRootDevice: nodes[].rootDevice errors name the exact field path and say what to write;
// valid hints (Metal3's names) pass.
func TestValidateRootDevice(t *testing.T) {
	yes := true
	// w1 (nodes[3]) is an ipmi node; with a mac and bootDevice pxe it network-boots.
	netboot := func(c *BootstrapConfiguration) *Node {
		n := &c.Nodes[3]
		n.MAC = "52:54:00:00:00:21"
		n.Power.BootDevice = BootPXE
		return n
	}
	tests := []struct {
		name   string
		mutate func(c *BootstrapConfiguration)
		paths  []string
		msg    string
	}{
		{"every hint valid", func(c *BootstrapConfiguration) {
			netboot(c).RootDevice = &RootDeviceHints{DeviceName: "/dev/disk/by-path/pci-0000:00:05.0", HCTL: "0:0:0:0", Model: "QEMU",
				Vendor: "ATA", SerialNumber: "NODE-DISK-1", MinSizeGigabytes: 20, WWN: "0x5000c500a0b1c2d3",
				WWNWithExtension: "0x5000c500a0b1c2d30000000000000001", WWNVendorExtension: "0x1", Rotational: &yes}
		}, nil, ""},
		{"plain device name", func(c *BootstrapConfiguration) { netboot(c).RootDevice = &RootDeviceHints{DeviceName: "/dev/vda"} }, nil, ""},
		{"on a node that does not network-boot", func(c *BootstrapConfiguration) {
			c.Nodes[0].RootDevice = &RootDeviceHints{SerialNumber: "X"}
		}, []string{"nodes[0].rootDevice"}, "does not install from the network or virtual media"},
		{"on a virtual-media node (hints come in its enrolment answer)", func(c *BootstrapConfiguration) {
			n := &c.Nodes[3]
			n.MAC = "52:54:00:00:00:21"
			n.Power.Kind, n.Power.Address, n.Power.BootDevice, n.Power.VirtualMediaImage = PowerRedfish, "https://10.100.0.121", BootCDROM, "http://10.100.0.5/node.iso"
			n.Power.Username, n.Power.InsecureSkipVerify = "admin", true
			n.RootDevice = &RootDeviceHints{SerialNumber: "LAB-DISK-n2"}
		}, nil, ""},
		{"on a redfish node booting a CD it was not given", func(c *BootstrapConfiguration) {
			n := &c.Nodes[3]
			n.MAC = "52:54:00:00:00:21"
			n.Power.Kind, n.Power.Address, n.Power.BootDevice = PowerRedfish, "https://10.100.0.121", BootCDROM
			n.Power.Username, n.Power.InsecureSkipVerify = "admin", true
			n.RootDevice = &RootDeviceHints{SerialNumber: "LAB-DISK-n2"}
		}, []string{"nodes[3].rootDevice"}, "power.virtualMediaImage"},
		{"empty", func(c *BootstrapConfiguration) { netboot(c).RootDevice = &RootDeviceHints{} },
			[]string{"nodes[3].rootDevice"}, "is empty: give at least one hint"},
		{"device name not a path", func(c *BootstrapConfiguration) { netboot(c).RootDevice = &RootDeviceHints{DeviceName: "sda"} },
			[]string{"nodes[3].rootDevice.deviceName"}, "is not a device path"},
		{"device name unclean", func(c *BootstrapConfiguration) {
			netboot(c).RootDevice = &RootDeviceHints{DeviceName: "/dev/../etc/passwd"}
		},
			[]string{"nodes[3].rootDevice.deviceName"}, "is not a device path"},
		{"device name by label", func(c *BootstrapConfiguration) {
			netboot(c).RootDevice = &RootDeviceHints{DeviceName: "/dev/disk/by-label/root"}
		}, []string{"nodes[3].rootDevice.deviceName"}, "a blank disk does not have"},
		{"device name a partition", func(c *BootstrapConfiguration) { netboot(c).RootDevice = &RootDeviceHints{DeviceName: "/dev/sda1"} },
			[]string{"nodes[3].rootDevice.deviceName"}, "is a partition"},
		{"by-path partition", func(c *BootstrapConfiguration) {
			netboot(c).RootDevice = &RootDeviceHints{DeviceName: "/dev/disk/by-path/pci-0000:00:05.0-part1"}
		}, []string{"nodes[3].rootDevice.deviceName"}, "is a partition"},
		{"nvme partition", func(c *BootstrapConfiguration) {
			netboot(c).RootDevice = &RootDeviceHints{DeviceName: "/dev/nvme0n1p2"}
		},
			[]string{"nodes[3].rootDevice.deviceName"}, "is a partition"},
		{"bad hctl", func(c *BootstrapConfiguration) { netboot(c).RootDevice = &RootDeviceHints{HCTL: "0:0:0"} },
			[]string{"nodes[3].rootDevice.hctl"}, "Host:Channel:Target:Lun"},
		{"bad wwn", func(c *BootstrapConfiguration) {
			netboot(c).RootDevice = &RootDeviceHints{WWN: "naa.5000c500", WWNWithExtension: "xyz"}
		}, []string{"nodes[3].rootDevice.wwn", "nodes[3].rootDevice.wwnWithExtension"}, "is not a World Wide Name"},
		{"blank serial", func(c *BootstrapConfiguration) { netboot(c).RootDevice = &RootDeviceHints{SerialNumber: "  "} },
			[]string{"nodes[3].rootDevice.serialNumber"}, "is only white space"},
		{"model with newline", func(c *BootstrapConfiguration) { netboot(c).RootDevice = &RootDeviceHints{Model: "a\nb"} },
			[]string{"nodes[3].rootDevice.model"}, "contains a NUL or newline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := labConfig(t)
			tt.mutate(c)
			_, errs := Validate(c, ValidateOptions{})
			got := errPaths(errs)
			want := slices.Clone(tt.paths)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("error paths = %q, want %q; errors:\n%v", got, want, errs)
			}
			for _, p := range tt.paths {
				if e := findErr(errs, p); !strings.Contains(e.Msg, tt.msg) {
					t.Errorf("%s: message %q does not contain %q", e.Path, e.Msg, tt.msg)
				}
			}
		})
	}
}

// TestDecodeRootDevice: the YAML keys are Metal3's; an unknown hint key is refused by the strict
// decoder with its path.
func TestDecodeRootDevice(t *testing.T) {
	base, err := os.ReadFile("testdata/lab.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(base) + "  mac: \"52:54:00:00:00:21\"\n  rootDevice:\n    serialNumber: NODE-DISK-1\n    minSizeGigabytes: 8\n    rotational: false\n"
	if !strings.HasSuffix(strings.TrimRight(string(base), "\n"), "passwordFile: /var/lib/appliance-lab/bmc/w1.password") {
		t.Fatal("testdata/lab.yaml no longer ends with w1's power section; this test appends to w1: update it")
	}
	c, err := Decode([]byte(doc))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	h := c.Nodes[3].RootDevice
	if h == nil || h.SerialNumber != "NODE-DISK-1" || h.MinSizeGigabytes != 8 || h.Rotational == nil || *h.Rotational {
		t.Fatalf("nodes[3].rootDevice = %+v, want serialNumber NODE-DISK-1, minSizeGigabytes 8, rotational false", h)
	}
	_, err = Decode([]byte(doc + "    serial: X\n"))
	if err == nil || !strings.Contains(err.Error(), "nodes[3].rootDevice.serial") {
		t.Fatalf("Decode with rootDevice.serial: %v, want an unknown-key error naming nodes[3].rootDevice.serial", err)
	}
	_, err = Decode([]byte(strings.Replace(doc, "minSizeGigabytes: 8", "minSizeGigabytes: -8", 1)))
	if err == nil || !strings.Contains(err.Error(), "nodes[3].rootDevice.minSizeGigabytes") {
		t.Fatalf("Decode with minSizeGigabytes: -8: %v, want an error naming nodes[3].rootDevice.minSizeGigabytes", err)
	}
}
