// Package install writes the node image to a machine's disk: it lists the disks the kernel sees,
// chooses one by root-device hints (agentapi.RootDeviceHints, the boot contract's BootArgs.Hints;
// Metal3's rootDeviceHints), partitions it (GPT: a BIOS boot partition for GRUB, an EFI system
// partition and one ext4 root), unpacks the node image's root filesystem onto it, applies the node's
// Ignition config to it with Debian's ignition binary, and makes it the persistent boot device (GRUB
// for BIOS and for UEFI on that disk). The node image's `hostagent install` runs it on a
// network-booted (or virtual-media-booted) machine; the installed system boots with root=UUID=…
// through the same initramfs (iso/node/init).
//
// It drives the standard tools (sfdisk, mkfs.ext4, unsquashfs, grub-install, ignition), as an
// installer in the field does (Ironic's agent, Debian's installer): their behaviour on real disks is
// the reference, and the tests run them on loop devices and in a QEMU VM.
package install

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Disk is one whole disk as the kernel shows it under /sys/block.
type Disk struct {
	// Name is the kernel name, e.g. "vda", "sda", "nvme0n1".
	Name string
	// Path is /dev/Name.
	Path string
	// Links are the stable /dev/disk/by-path/ and /dev/disk/by-id/ links that resolve to Path (udev's).
	Links []string
	// SizeBytes is the capacity in bytes (/sys/block/NAME/size × 512).
	SizeBytes int64
	// Model, Vendor, Serial, WWN and HCTL are what sysfs reports, trimmed; empty when the disk has none.
	Model, Vendor, Serial, WWN, HCTL string
	// Rotational is /sys/block/NAME/queue/rotational == 1.
	Rotational bool
	// Removable and ReadOnly are /sys/block/NAME/removable and ro.
	Removable, ReadOnly bool
}

// String describes d for people: "vda 20.0 GiB serial=NODE-DISK-1 model=… by-path=…".
func (d Disk) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %.1f GiB", d.Name, float64(d.SizeBytes)/(1<<30))
	for _, kv := range [][2]string{{"serial", d.Serial}, {"model", d.Model}, {"vendor", d.Vendor}, {"wwn", d.WWN}, {"hctl", d.HCTL}} {
		if kv[1] != "" {
			fmt.Fprintf(&b, " %s=%q", kv[0], kv[1])
		}
	}
	for _, l := range d.Links {
		if strings.HasPrefix(l, "/dev/disk/by-path/") {
			fmt.Fprintf(&b, " %s", l)
		}
	}
	if d.ReadOnly {
		b.WriteString(" read-only")
	}
	if d.Removable {
		b.WriteString(" removable")
	}
	return b.String()
}

// skipPrefixes are block devices that are never an install target: loop, RAM and compressed-RAM
// disks, CD/DVD drives, floppies, network block devices, device-mapper and MD (their members are
// the disks).
var skipPrefixes = []string{"loop", "ram", "zram", "sr", "fd", "nbd", "dm-", "md"}

// ListDisks returns the whole disks under sysBlock (normally /sys/block) in name order, with the
// symlinks under devDisk (normally /dev/disk: by-path, by-id) that point at each. Loop, RAM, CD and
// device-mapper devices are left out, and so are disks of size 0 (an empty card reader).
func ListDisks(sysBlock, devDisk string) ([]Disk, error) {
	ents, err := os.ReadDir(sysBlock)
	if err != nil {
		return nil, fmt.Errorf("list disks: %w", err)
	}
	links := map[string][]string{} // kernel name → links
	for _, sub := range []string{"by-path", "by-id"} {
		dir := filepath.Join(devDisk, sub)
		les, err := os.ReadDir(dir)
		if err != nil {
			continue // no udev, or no such links
		}
		for _, le := range les {
			target, err := os.Readlink(filepath.Join(dir, le.Name()))
			if err != nil {
				continue
			}
			name := filepath.Base(target)
			links[name] = append(links[name], filepath.Join("/dev/disk", sub, le.Name()))
		}
	}
	var disks []Disk
	for _, e := range ents {
		name := e.Name()
		if slices.ContainsFunc(skipPrefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		dir := filepath.Join(sysBlock, name)
		d := Disk{Name: name, Path: "/dev/" + name, Links: links[name]}
		sectors, err := strconv.ParseInt(read(dir, "size"), 10, 64)
		if err != nil || sectors == 0 {
			continue
		}
		d.SizeBytes = sectors * 512
		d.Model = read(dir, "device/model")
		d.Vendor = read(dir, "device/vendor")
		d.Serial = read(dir, "device/serial")
		if d.Serial == "" {
			d.Serial = read(dir, "serial") // virtio-blk
		}
		d.WWN = normalizeWWN(read(dir, "device/wwid"))
		if d.WWN == "" {
			d.WWN = normalizeWWN(read(dir, "wwid")) // NVMe namespaces
		}
		if hs, err := os.ReadDir(filepath.Join(dir, "device", "scsi_device")); err == nil && len(hs) == 1 {
			d.HCTL = hs[0].Name()
		}
		d.Rotational = read(dir, "queue/rotational") == "1"
		d.Removable = read(dir, "removable") == "1"
		d.ReadOnly = read(dir, "ro") == "1"
		slices.Sort(d.Links)
		disks = append(disks, d)
	}
	if len(disks) == 0 && len(ents) == 0 {
		return nil, fmt.Errorf("list disks: %s is empty: %w", sysBlock, fs.ErrNotExist)
	}
	return disks, nil
}

// read returns the trimmed content of dir/name, or "".
func read(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// normalizeWWN turns sysfs's wwid ("naa.5000c500a0b1c2d3", "t10.ATA …", "eui.…") into the form udev's
// ID_WWN and lsblk print for NAA names ("0x5000c500a0b1c2d3"); other forms are kept as they are.
func normalizeWWN(s string) string {
	if rest, ok := strings.CutPrefix(s, "naa."); ok {
		return "0x" + strings.ToLower(rest)
	}
	return s
}

// ErrNoDisk is matched (errors.Is) by Choose's error when no disk matches the hints.
var ErrNoDisk = errors.New("no disk matches the root-device hints")
