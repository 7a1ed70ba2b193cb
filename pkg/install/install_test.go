package install

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/test/labns"
)

// TestListDisksMatchesLsblk: ListDisks on this machine's real /sys/block and /dev/disk sees every
// whole disk util-linux's lsblk sees (loop, RAM and zram devices aside), with the same size, and the
// same serial, model, WWN, HCTL and rotational flag wherever lsblk reports them.
func TestListDisksMatchesLsblk(t *testing.T) {
	lsblk := labns.RequireTool(t, "lsblk")
	out, err := exec.Command(lsblk, "-J", "-b", "-d", "-o", "NAME,SIZE,SERIAL,MODEL,WWN,HCTL,ROTA,TYPE").Output()
	if err != nil {
		t.Fatalf("lsblk: %v", err)
	}
	var lb struct {
		BlockDevices []struct {
			Name, Type               string
			Size                     int64
			Serial, Model, WWN, HCTL *string
			Rota                     bool
		} `json:"blockdevices"`
	}
	if err := json.Unmarshal(out, &lb); err != nil {
		t.Fatalf("lsblk -J: %v: %s", err, out)
	}
	disks, err := ListDisks("/sys/block", "/dev/disk")
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Disk{}
	for _, d := range disks {
		byName[d.Name] = d
	}
	compared := 0
	for _, b := range lb.BlockDevices {
		if b.Type != "disk" || b.Size == 0 || strings.HasPrefix(b.Name, "zram") || strings.HasPrefix(b.Name, "loop") || strings.HasPrefix(b.Name, "ram") {
			continue
		}
		d, ok := byName[b.Name]
		if !ok {
			t.Errorf("lsblk lists disk %s; ListDisks does not (it saw %v)", b.Name, disks)
			continue
		}
		compared++
		if d.SizeBytes != b.Size {
			t.Errorf("%s: size %d, lsblk %d", b.Name, d.SizeBytes, b.Size)
		}
		if d.Rotational != b.Rota {
			t.Errorf("%s: rotational %v, lsblk %v", b.Name, d.Rotational, b.Rota)
		}
		for _, f := range []struct {
			field string
			got   string
			want  *string
		}{{"serial", d.Serial, b.Serial}, {"model", d.Model, b.Model}, {"wwn", d.WWN, b.WWN}, {"hctl", d.HCTL, b.HCTL}} {
			if f.want != nil && strings.TrimSpace(*f.want) != f.got {
				t.Errorf("%s: %s %q, lsblk %q", b.Name, f.field, f.got, *f.want)
			}
		}
	}
	if compared == 0 {
		t.Fatalf("lsblk listed no whole disk to compare with (%s)", out)
	}
	t.Logf("compared %d disk(s) with lsblk: %v", compared, disks)
}

// TestInstallLoopDisk writes a small node image to a real block device (a loop device over a sparse
// file, partition scanning on) with the real tools, then reads the disk back at the partitions' offsets
// (nothing mounted, no second loop device): a GPT with GRUB's BIOS boot partition and the clean ext4
// root labelled appliance-root; the image's files, the kernel and
// initramfs, fstab and the marker on the root; GRUB's boot code in the MBR and its core in the BIOS
// boot partition; a grub.cfg that boots root=UUID=<the root's UUID>. A second install onto the same
// disk (a reinstall) gives a new root.
func TestInstallLoopDisk(t *testing.T) {
	labns.RequireRoot(t)
	for _, tool := range []string{"losetup", "sfdisk", "wipefs", "mkfs.ext4", "mkfs.vfat", "mcopy", "mdir", "blkid", "debugfs", "dumpe2fs", "unsquashfs", "mksquashfs", "grub-install", "grub-mkimage"} {
		labns.RequireTool(t, tool)
	}
	if _, err := os.Stat("/usr/lib/grub/i386-pc/boot.img"); err != nil {
		t.Fatalf("GRUB for BIOS missing (Debian package grub-pc-bin): make deps")
	}
	dir := t.TempDir()
	// The image: a tiny root filesystem made with the real mksquashfs.
	src := filepath.Join(dir, "src")
	for p, data := range map[string]string{"etc/os-release": "ID=debian\n", "boot/vmlinuz": "image kernel", "usr/bin/hello": "#!/bin/sh\n"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, p), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	image := filepath.Join(dir, "rootfs.squashfs")
	if out, err := exec.Command("mksquashfs", src, image, "-noappend", "-quiet", "-no-progress").CombinedOutput(); err != nil {
		t.Fatalf("mksquashfs: %v: %s", err, out)
	}
	kernel, initrd := filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.img")
	if err := os.WriteFile(kernel, []byte("served kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(initrd, []byte("served initramfs"), 0o644); err != nil {
		t.Fatal(err)
	}
	backing := filepath.Join(dir, "disk.img")
	f, err := os.Create(backing)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(256 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out, err := exec.Command("losetup", "--find", "--show", "--partscan", backing).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", loop).Run() })

	install := func() Result {
		t.Helper()
		res, err := Install(t.Context(), Options{Disk: loop, Image: image, Kernel: kernel, Initrd: initrd,
			KernelArgs: []string{"console=ttyS0,115200n8"}, WorkDir: t.TempDir(),
			Files:  []File{{Path: "/etc/hostagent/config.yaml", Data: []byte("node: n1\n"), Mode: 0o600}},
			Marker: Marker{Node: "n1", DiskInfo: "loop test"}})
		if err != nil {
			t.Fatalf("Install: %v", err)
		}
		return res
	}
	res := install()
	// This machine's kernel may lack partition-table support (Install then reaches the root through a
	// loop device over its sectors); either way blkid must see the root file system there.
	if res.RootUUID == "" {
		t.Fatalf("Result = %+v, want a root UUID", res)
	}
	if res.RootDevice != loop+"p3" {
		t.Logf("the kernel made no %sp3; Install used %s over the root partition's sectors", loop, res.RootDevice)
	}
	t.Logf("install steps: %+v", res.Steps)

	// The partition table, as sfdisk reads it back.
	js, err := exec.Command("sfdisk", "--json", loop).Output()
	if err != nil {
		t.Fatalf("sfdisk --json: %v", err)
	}
	var pt struct {
		PartitionTable struct {
			Label      string
			Partitions []struct {
				Node        string
				Start, Size int64
				Type, Name  string
			}
		} `json:"partitiontable"`
	}
	if err := json.Unmarshal(js, &pt); err != nil {
		t.Fatal(err)
	}
	if pt.PartitionTable.Label != "gpt" || len(pt.PartitionTable.Partitions) != 3 {
		t.Fatalf("partition table %s, want gpt with 3 partitions", js)
	}
	p1, pe, p2 := pt.PartitionTable.Partitions[0], pt.PartitionTable.Partitions[1], pt.PartitionTable.Partitions[2]
	if !strings.EqualFold(pe.Type, espType) || pe.Size != 131072 {
		t.Errorf("partition 2 = %+v, want the EFI system partition, 64 MiB", pe)
	}
	if !strings.EqualFold(p1.Type, biosBootType) || p1.Start != 2048 || p1.Size != 2048 {
		t.Errorf("partition 1 = %+v, want the BIOS boot partition at sector 2048, 2048 sectors", p1)
	}
	if !strings.EqualFold(p2.Type, linuxFSType) || p2.Name != RootLabel {
		t.Errorf("partition 3 = %+v, want a Linux file system named %s", p2, RootLabel)
	}
	// The partitions are read back at their offsets on the disk itself (debugfs, dumpe2fs, blkid and
	// mtools take an offset), never through a second loop device: nothing is mounted, and the check
	// sees exactly the bytes a booting machine's firmware and kernel would.
	rootOff, espOff := partitionOffset(t, loop, 3), partitionOffset(t, loop, 2)
	rootFS := fmt.Sprintf("%s?offset=%d", loop, rootOff)
	if got, _ := exec.Command("blkid", "-p", "-O", fmt.Sprint(rootOff), "-s", "LABEL", "-o", "value", loop).Output(); strings.TrimSpace(string(got)) != RootLabel {
		t.Errorf("root label %q, want %s", got, RootLabel)
	}
	// GRUB: boot.img in the MBR (its "GRUB " string), core.img in the BIOS boot partition.
	raw, err := os.ReadFile(backing)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw[:512], []byte("GRUB")) || raw[510] != 0x55 || raw[511] != 0xaa {
		t.Errorf("the MBR holds no GRUB boot code: % x", raw[:512])
	}
	if core := raw[2048*512 : 4096*512]; bytes.Count(core, []byte{0}) == len(core) {
		t.Errorf("the BIOS boot partition is empty: grub-install embedded no core image")
	}

	// Install unmounted the root: its file system must be clean (no journal left to replay).
	if hdr, err := exec.Command("dumpe2fs", "-h", rootFS).Output(); err != nil {
		t.Fatalf("dumpe2fs -h %s: %v", rootFS, err)
	} else if !regexp.MustCompile(`(?m)^Filesystem state:\s+clean$`).Match(hdr) || bytes.Contains(hdr, []byte("needs_recovery")) {
		t.Errorf("the installed root is not clean after Install returned:\n%s", hdr)
	}
	for p, want := range map[string]string{
		"/etc/os-release":            "ID=debian\n",
		"/usr/bin/hello":             "#!/bin/sh\n",
		"/boot/vmlinuz":              "served kernel",
		"/boot/initrd.img":           "served initramfs",
		"/etc/hostagent/config.yaml": "node: n1\n",
		"/etc/fstab":                 "UUID=" + res.RootUUID + " / ext4",
		"/boot/grub/grub.cfg":        "linux /boot/vmlinuz root=UUID=" + res.RootUUID + " rw console=ttyS0,115200n8",
		MarkerPath:                   `"rootUUID": "` + res.RootUUID + `"`,
	} {
		if got := debugfs(t, rootFS, "cat "+p); !strings.Contains(got, want) {
			t.Errorf("%s on the installed root: %q; want it to contain %q", p, got, want)
		}
	}
	if st := debugfs(t, rootFS, "stat /etc/hostagent/config.yaml"); !strings.Contains(st, "Mode:  0600") {
		t.Errorf("/etc/hostagent/config.yaml is not 0600 (it holds the node token):\n%s", st)
	}
	for _, m := range []string{"/boot/grub/i386-pc/normal.mod", "/boot/grub/x86_64-efi/normal.mod"} {
		if st := debugfs(t, rootFS, "stat "+m); !strings.Contains(st, "Type: regular") {
			t.Errorf("GRUB's module %s is not on the root: %s", m, st)
		}
	}

	// The EFI system partition: FAT labelled EFI with GRUB at the removable-media path (read with
	// mtools: the file system is never mounted).
	if got, _ := exec.Command("blkid", "-p", "-O", fmt.Sprint(espOff), "-s", "TYPE", "-o", "value", loop).Output(); strings.TrimSpace(string(got)) != "vfat" {
		t.Errorf("EFI system partition type %q, want vfat", got)
	}
	if out, err := exec.Command("mdir", "-i", fmt.Sprintf("%s@@%d", loop, espOff), "-b", "::/EFI/BOOT").CombinedOutput(); err != nil || !strings.Contains(string(out), "BOOTX64.EFI") {
		t.Errorf("::/EFI/BOOT on the EFI system partition: %v: %s; want BOOTX64.EFI", err, out)
	}

	// A reinstall writes a new file system (a new UUID) over the old one.
	res2 := install()
	if res2.RootUUID == res.RootUUID {
		t.Errorf("the reinstall kept the root UUID %s: the disk was not rewritten", res.RootUUID)
	}
}

// partitionOffset is the byte offset of loop's partition n, as sfdisk reads the table back.
func partitionOffset(t *testing.T, loop string, n int) int64 {
	t.Helper()
	start, _, err := partitionRange(t.Context(), loop, n)
	if err != nil {
		t.Fatal(err)
	}
	return start * 512
}

// debugfs runs one read-only debugfs request against fs (a device, with ?offset=N) and returns
// its output; a debugfs failure fails the test.
func debugfs(t *testing.T, fs, request string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", request, fs).Output()
	if err != nil {
		t.Fatalf("debugfs -R %q %s: %v", request, fs, err)
	}
	return string(out)
}

// TestInstallRefusesNonBlockDevice: a path that is not a block device is refused before anything is
// written, naming it.
func TestInstallRefusesNonBlockDevice(t *testing.T) {
	file := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Install(t.Context(), Options{Disk: file, Image: file})
	if err == nil || !strings.Contains(err.Error(), file+" is not a block device") {
		t.Fatalf("Install onto a regular file: %v, want a refusal naming it", err)
	}
	_ = config.RootDeviceHints{}
}
