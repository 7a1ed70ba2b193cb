package install

import (
	"errors"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// disks as ListDisks returns them from a machine with two SATA SSDs and an NVMe disk (data, not a fake:
// Choose is a pure function of them).
var machineDisks = []Disk{
	{Name: "nvme0n1", Path: "/dev/nvme0n1", SizeBytes: 960 << 30, Model: "SAMSUNG MZQL2960HCJR-00A07", Serial: "S64FNE0R812345",
		WWN: "eui.36344630528123450025384500000001", Links: []string{"/dev/disk/by-id/nvme-SAMSUNG_MZQL2960HCJR-00A07_S64FNE0R812345", "/dev/disk/by-path/pci-0000:41:00.0-nvme-1"}},
	{Name: "sda", Path: "/dev/sda", SizeBytes: 240 << 30, Model: "INTEL SSDSC2KB24", Vendor: "ATA", Serial: "PHYF1234ABC", WWN: "0x55cd2e414e2a1b2c",
		HCTL: "0:0:0:0", Links: []string{"/dev/disk/by-path/pci-0000:00:17.0-ata-1"}},
	{Name: "sdb", Path: "/dev/sdb", SizeBytes: 240 << 30, Model: "INTEL SSDSC2KB24", Vendor: "ATA", Serial: "PHYF5678DEF", WWN: "0x55cd2e414e2a9f00",
		HCTL: "1:0:0:0", Links: []string{"/dev/disk/by-path/pci-0000:00:17.0-ata-2"}},
	{Name: "sdc", Path: "/dev/sdc", SizeBytes: 2 << 30, Model: "Flash Drive", Vendor: "SanDisk", Removable: true, Rotational: false},
	{Name: "sdd", Path: "/dev/sdd", SizeBytes: 4000 << 30, Model: "ST4000NM0035", Vendor: "ATA", Serial: "ZC1ABCDE", Rotational: true, HCTL: "2:0:0:0",
		WWN: "0x5000c500a0b1c2d30000000000000001"},
}

func TestChoose(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name  string
		hints config.RootDeviceHints
		want  string // chosen disk name; "" = ErrNoDisk
	}{
		{"no hints: smallest disk of at least 4 GiB", config.RootDeviceHints{}, "sda"},
		{"deviceName as kernel path", config.RootDeviceHints{DeviceName: "/dev/sdb"}, "sdb"},
		{"deviceName as by-path link", config.RootDeviceHints{DeviceName: "/dev/disk/by-path/pci-0000:00:17.0-ata-2"}, "sdb"},
		{"deviceName as by-id link", config.RootDeviceHints{DeviceName: "/dev/disk/by-id/nvme-SAMSUNG_MZQL2960HCJR-00A07_S64FNE0R812345"}, "nvme0n1"},
		{"serial exact", config.RootDeviceHints{SerialNumber: "PHYF5678DEF"}, "sdb"},
		{"serial is not a substring match", config.RootDeviceHints{SerialNumber: "PHYF5678"}, ""},
		{"model substring, first in order", config.RootDeviceHints{Model: "SSDSC2KB"}, "sda"},
		{"vendor and hctl", config.RootDeviceHints{Vendor: "ATA", HCTL: "1:0:0:0"}, "sdb"},
		{"wwn", config.RootDeviceHints{WWN: "0x55cd2e414e2a9f00"}, "sdb"},
		{"wwn of an extended name", config.RootDeviceHints{WWN: "0x5000c500a0b1c2d3"}, "sdd"},
		{"wwnWithExtension", config.RootDeviceHints{WWNWithExtension: "0x5000c500a0b1c2d30000000000000001"}, "sdd"},
		{"wwnVendorExtension", config.RootDeviceHints{WWNVendorExtension: "0x0000000000000001"}, "sdd"},
		{"minSizeGigabytes", config.RootDeviceHints{MinSizeGigabytes: 500}, "nvme0n1"},
		{"rotational true", config.RootDeviceHints{Rotational: &yes}, "sdd"},
		{"rotational false and big", config.RootDeviceHints{Rotational: &no, MinSizeGigabytes: 500}, "nvme0n1"},
		{"all must match", config.RootDeviceHints{SerialNumber: "PHYF1234ABC", HCTL: "1:0:0:0"}, ""},
		{"too big", config.RootDeviceHints{MinSizeGigabytes: 5000}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Choose(machineDisks, tt.hints)
			if tt.want == "" {
				if !errors.Is(err, ErrNoDisk) {
					t.Fatalf("Choose = %s, %v; want ErrNoDisk", d.Name, err)
				}
				// The reason names the hints and every disk seen.
				for _, want := range append([]string{"nodes[].rootDevice " + tt.hints.String()}, "nvme0n1 960.0 GiB", "sda 240.0 GiB serial=\"PHYF1234ABC\"", "sdd 4000.0 GiB") {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error lacks %q: %v", want, err)
					}
				}
				return
			}
			if err != nil || d.Name != tt.want {
				t.Fatalf("Choose = %q, %v; want %q", d.Name, err, tt.want)
			}
		})
	}
	t.Run("read-only disks are never chosen", func(t *testing.T) {
		ro := []Disk{{Name: "sda", Path: "/dev/sda", SizeBytes: 100 << 30, Serial: "A", ReadOnly: true}}
		if _, err := Choose(ro, config.RootDeviceHints{SerialNumber: "A"}); !errors.Is(err, ErrNoDisk) {
			t.Errorf("Choose(read-only, serial) = %v, want ErrNoDisk", err)
		}
		if _, err := Choose(ro, config.RootDeviceHints{}); !errors.Is(err, ErrNoDisk) || !strings.Contains(err.Error(), "no hints") {
			t.Errorf("Choose(read-only, no hints) = %v, want ErrNoDisk naming the missing hints", err)
		}
	})
	t.Run("removable disks only by hint", func(t *testing.T) {
		disks := []Disk{{Name: "sda", Path: "/dev/sda", SizeBytes: 64 << 30, Serial: "USB", Removable: true},
			{Name: "sdb", Path: "/dev/sdb", SizeBytes: 500 << 30, Serial: "SSD"}}
		if d, err := Choose(disks, config.RootDeviceHints{}); err != nil || d.Name != "sdb" {
			t.Errorf("Choose(no hints) = %s, %v; want sdb, not the smaller removable sda", d.Name, err)
		}
		if d, err := Choose(disks, config.RootDeviceHints{SerialNumber: "USB"}); err != nil || d.Name != "sda" {
			t.Errorf("Choose(serial USB) = %s, %v; want the removable sda the hint names", d.Name, err)
		}
	})
	t.Run("no disks at all", func(t *testing.T) {
		_, err := Choose(nil, config.RootDeviceHints{SerialNumber: "A"})
		if !errors.Is(err, ErrNoDisk) || !strings.Contains(err.Error(), "disks seen: none") {
			t.Errorf("Choose(nil) = %v, want ErrNoDisk with 'disks seen: none'", err)
		}
	})
}
