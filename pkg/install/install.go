package install

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// Layout of an installed disk (GPT), bootable by BIOS and UEFI firmware alike: partition 1 is GRUB's
// BIOS boot partition (1 MiB, GPT type 21686148-6449-6E6F-744E-656564454649, where grub-install
// embeds its BIOS core image), partition 2 the EFI system partition (64 MiB FAT32 labelled EFI, with
// GRUB at the removable-media path EFI/BOOT/BOOTX64.EFI, so no firmware boot entry is needed),
// partition 3 the ext4 root (the rest of the disk, labelled RootLabel). Both GRUBs read the root's
// /boot/grub/grub.cfg.
const (
	// RootLabel is the ext4 label of the installed root file system.
	RootLabel = "appliance-root"
	// MarkerPath is the file an installed system carries (Marker as JSON): its presence tells the
	// node image's first-boot unit and the operator that this root was installed from the network.
	MarkerPath = "/etc/appliance-node/installed.json"
	// biosBootType and linuxFSType are GPT partition type GUIDs (UEFI spec; GRUB's BIOS boot).
	biosBootType = "21686148-6449-6E6F-744E-656564454649"
	espType      = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
	linuxFSType  = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
	// rootPartition and espPartition are the partition numbers.
	espPartition, rootPartition = 2, 3
)

// Options is one install.
type Options struct {
	// Disk is the whole disk to write (a Disk.Path, e.g. /dev/vda). Everything on it is lost.
	Disk string
	// Image is the node image's root filesystem (rootfs.squashfs).
	Image string
	// Kernel and Initrd are written to the root's /boot/vmlinuz and /boot/initrd.img (the installed
	// system boots through the same initramfs, with root=UUID=…). Kernel empty: the image's own
	// /boot/vmlinuz stays.
	Kernel, Initrd string
	// KernelArgs are added to the installed system's command line (e.g. console=ttyS0,115200n8).
	KernelArgs []string
	// Ignition is an Ignition config file (spec ≤ 3.3, Debian's ignition 2.14) applied to the new
	// root with `ignition -platform file -stage fetch|files -root MNT`; empty: none. IgnitionCA is the
	// CA file its https sources are checked with (SSL_CERT_FILE).
	Ignition, IgnitionCA string
	// IgnitionBinary is Debian's ignition; empty: DefaultIgnition.
	IgnitionBinary string
	// Files are written into the new root (path in the root → content, mode), after Ignition.
	Files []File
	// Enable are systemd units enabled in the new root (systemctl --root) after Ignition, when their
	// unit file exists there.
	Enable []string
	// Marker is written to MarkerPath in the new root.
	Marker Marker
	// WorkDir is where the new root is mounted while it is written; empty: a temporary directory.
	WorkDir string
	// Log receives one line per step; nil discards.
	Log *slog.Logger
}

// File is one file written into the new root.
type File struct {
	Path string
	Data []byte
	Mode os.FileMode
}

// Marker is what an installed root records about its install (MarkerPath).
type Marker struct {
	Node      string    `json:"node"`
	Disk      string    `json:"disk"`
	DiskInfo  string    `json:"diskInfo,omitempty"`
	RootUUID  string    `json:"rootUUID"`
	Installed time.Time `json:"installed"`
	Image     string    `json:"image,omitempty"`
}

// DefaultIgnition is where Debian's ignition package installs the binary.
const DefaultIgnition = "/usr/lib/dracut/modules.d/30ignition/ignition"

// Result says what Install did, with the time of each step.
type Result struct {
	RootDevice string
	RootUUID   string
	Steps      []Step
}

// Step is one timed step of Install.
type Step struct {
	Name    string
	Seconds float64
}

// Install writes the node image to o.Disk: GPT (BIOS boot + root), mkfs.ext4, unsquashfs, kernel and
// initramfs, fstab, Ignition, o.Files, units, GRUB for BIOS (grub-install --target=i386-pc) with a
// grub.cfg that boots root=UUID=…. Errors name the step and the tool's output.
func Install(ctx context.Context, o Options) (Result, error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var res Result
	step := func(name string, fn func() error) error {
		t0 := time.Now()
		if err := fn(); err != nil {
			return fmt.Errorf("install to %s: %s: %w", o.Disk, name, err)
		}
		s := time.Since(t0).Seconds()
		res.Steps = append(res.Steps, Step{Name: name, Seconds: s})
		log.Info("install step", "step", name, "seconds", fmt.Sprintf("%.1f", s))
		return nil
	}
	if st, err := os.Stat(o.Disk); err != nil || st.Mode()&os.ModeDevice == 0 {
		return res, fmt.Errorf("install: %s is not a block device", o.Disk)
	}
	if _, err := os.Stat(o.Image); err != nil {
		return res, fmt.Errorf("install: the node image %s: %w", o.Image, err)
	}
	mnt := o.WorkDir
	if mnt != "" {
		if err := os.MkdirAll(mnt, 0o700); err != nil {
			return res, err
		}
	} else {
		d, err := os.MkdirTemp("", "install-root-")
		if err != nil {
			return res, err
		}
		defer os.Remove(d)
		mnt = d
	}
	part, esp := partitionPath(o.Disk, rootPartition), partitionPath(o.Disk, espPartition)
	res.RootDevice = part
	var detach []string

	if err := step("partition", func() error {
		_ = run(ctx, "wipefs", "--all", "--force", o.Disk)
		table := "label: gpt\n" +
			"start=2048, size=2048, type=" + biosBootType + ", name=\"bios-boot\"\n" +
			"start=4096, size=131072, type=" + espType + ", name=\"EFI\"\n" +
			"start=135168, type=" + linuxFSType + ", name=\"" + RootLabel + "\"\n"
		if err := runIn(ctx, table, "sfdisk", "--quiet", "--wipe", "always", "--wipe-partitions", "always", o.Disk); err != nil {
			return err
		}
		_ = run(ctx, "udevadm", "settle", "--timeout=10")
		if err := waitBlock(ctx, part, 50); err == nil {
			return nil
		}
		// A kernel without partition-table support (CONFIG_EFI_PARTITION off, as in some microVM
		// kernels) never makes the partitions' nodes: reach them through loop devices over their
		// sectors instead, as sfdisk reads them back.
		for _, pp := range []struct {
			n   int
			dev *string
		}{{espPartition, &esp}, {rootPartition, &part}} {
			start, size, err := partitionRange(ctx, o.Disk, pp.n)
			if err != nil {
				return fmt.Errorf("%s did not appear and the table cannot be read back: %w", *pp.dev, err)
			}
			dev, err := output(ctx, "losetup", "--find", "--show", "--offset", strconv.FormatInt(start*512, 10),
				"--sizelimit", strconv.FormatInt(size*512, 10), o.Disk)
			if err != nil || dev == "" {
				return fmt.Errorf("%s did not appear (no partition support in this kernel?) and losetup over its sectors failed: %v", *pp.dev, err)
			}
			log.Info("install: the kernel made no partition device; using a loop device over the partition", "partition", *pp.dev, "loop", dev)
			*pp.dev = dev
			detach = append(detach, dev)
		}
		res.RootDevice = part
		return nil
	}); err != nil {
		return res, err
	}
	defer func() {
		for _, d := range detach {
			_ = run(context.WithoutCancel(ctx), "losetup", "-d", d)
		}
	}()
	if err := step("mkfs", func() error {
		if err := run(ctx, "mkfs.vfat", "-F", "32", "-n", "EFI", esp); err != nil {
			return err
		}
		return run(ctx, "mkfs.ext4", "-F", "-q", "-L", RootLabel, part)
	}); err != nil {
		return res, err
	}
	uuid, err := output(ctx, "blkid", "-p", "-s", "UUID", "-o", "value", part)
	if err != nil || uuid == "" {
		return res, fmt.Errorf("install to %s: blkid %s: no UUID (%v)", o.Disk, part, err)
	}
	res.RootUUID = uuid
	if err := run(ctx, "mount", "-t", "ext4", part, mnt); err != nil {
		return res, fmt.Errorf("install to %s: mount %s: %w", o.Disk, part, err)
	}
	mounted := true
	defer func() {
		if mounted {
			_ = run(context.WithoutCancel(ctx), "umount", mnt)
		}
	}()
	if err := step("unpack", func() error {
		return run(ctx, "unsquashfs", "-f", "-n", "-d", mnt, o.Image)
	}); err != nil {
		return res, err
	}
	if err := step("boot files", func() error {
		for _, f := range []struct{ src, dst string }{{o.Kernel, "boot/vmlinuz"}, {o.Initrd, "boot/initrd.img"}} {
			if f.src == "" {
				continue
			}
			b, err := os.ReadFile(f.src)
			if err != nil {
				return err
			}
			if _, err := atomicfile.Write(filepath.Join(mnt, f.dst), b, 0o644); err != nil {
				return err
			}
		}
		if _, err := os.Stat(filepath.Join(mnt, "boot/initrd.img")); err != nil {
			return errors.New("no initramfs for the installed system: give Initrd (the node image's initrd.img)")
		}
		fstab := "# written by the appliance's node install\nUUID=" + uuid + " / ext4 defaults,errors=remount-ro 0 1\n"
		if _, err := atomicfile.Write(filepath.Join(mnt, "etc/fstab"), []byte(fstab), 0o644); err != nil {
			return err
		}
		return nil
	}); err != nil {
		return res, err
	}
	if o.Ignition != "" {
		if err := step("ignition", func() error { return applyIgnition(ctx, o, mnt) }); err != nil {
			return res, err
		}
	}
	if err := step("files", func() error {
		for _, f := range o.Files {
			p := filepath.Join(mnt, filepath.Clean("/"+f.Path))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			if _, err := atomicfile.Write(p, f.Data, f.Mode); err != nil {
				return err
			}
		}
		for _, u := range o.Enable {
			if !unitExists(mnt, u) {
				continue
			}
			if err := run(ctx, "systemctl", "--root="+mnt, "enable", u); err != nil {
				return err
			}
		}
		m := o.Marker
		m.Disk, m.RootUUID = o.Disk, uuid
		if m.Installed.IsZero() {
			m.Installed = time.Now().UTC()
		}
		b, _ := json.MarshalIndent(m, "", "  ")
		p := filepath.Join(mnt, MarkerPath)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		_, err := atomicfile.Write(p, append(b, '\n'), 0o644)
		return err
	}); err != nil {
		return res, err
	}
	if err := step("bootloader", func() error {
		if err := run(ctx, "grub-install", "--target=i386-pc", "--boot-directory="+filepath.Join(mnt, "boot"), "--modules=part_gpt ext2", o.Disk); err != nil {
			return err
		}
		if err := installEFI(ctx, mnt, esp, uuid); err != nil {
			return fmt.Errorf("UEFI: %w", err)
		}
		var err error
		_, err = atomicfile.Write(filepath.Join(mnt, "boot/grub/grub.cfg"), []byte(GrubConfig(uuid, o.KernelArgs)), 0o644)
		return err
	}); err != nil {
		return res, err
	}
	if err := step("sync", func() error {
		mounted = false
		return run(ctx, "umount", mnt)
	}); err != nil {
		return res, err
	}
	return res, nil
}

// efiModules are the GRUB modules built into the UEFI image (the rest load from /boot/grub/x86_64-efi).
var efiModules = []string{"part_gpt", "ext2", "search", "search_fs_uuid", "normal", "configfile", "linux", "echo", "all_video", "serial", "terminal"}

// installEFI makes the EFI system partition bootable without mounting it (mtools; some kernels have
// no vfat): a GRUB UEFI image (grub-mkimage) whose early config finds the root by rootUUID and reads
// its /boot/grub/grub.cfg, at the removable-media path EFI/BOOT/BOOTX64.EFI (UEFI spec §3.5.1.1: the
// firmware boots it with no boot entry in NVRAM), and GRUB's UEFI modules in the root's
// /boot/grub/x86_64-efi, as grub-install --removable would place them.
func installEFI(ctx context.Context, mnt, esp, rootUUID string) error {
	const lib = "/usr/lib/grub/x86_64-efi"
	if _, err := os.Stat(filepath.Join(lib, "kernel.img")); err != nil {
		return fmt.Errorf("GRUB for UEFI missing (Debian package grub-efi-amd64-bin): %w", err)
	}
	tmp, err := os.MkdirTemp("", "install-efi-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	early := filepath.Join(tmp, "early.cfg")
	if err := os.WriteFile(early, []byte("search --no-floppy --fs-uuid --set=root "+rootUUID+"\nset prefix=($root)/boot/grub\n"), 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(tmp, "EFI", "BOOT"), 0o755); err != nil {
		return err
	}
	args := append([]string{"-O", "x86_64-efi", "-c", early, "-p", "/boot/grub", "-o", filepath.Join(tmp, "EFI", "BOOT", "BOOTX64.EFI")}, efiModules...)
	if err := run(ctx, "grub-mkimage", args...); err != nil {
		return err
	}
	mods := filepath.Join(mnt, "boot", "grub", "x86_64-efi")
	if err := os.MkdirAll(mods, 0o755); err != nil {
		return err
	}
	ents, err := os.ReadDir(lib)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if ext := filepath.Ext(e.Name()); ext != ".mod" && ext != ".lst" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(lib, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(mods, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return run(ctx, "mcopy", "-s", "-i", esp, filepath.Join(tmp, "EFI"), "::/")
}

// GrubConfig is the installed disk's grub.cfg: no menu wait, serial and VGA consoles, the root by
// file-system UUID, the kernel and initramfs from the root's /boot.
func GrubConfig(rootUUID string, kernelArgs []string) string {
	args := strings.TrimSpace("root=UUID=" + rootUUID + " rw " + strings.Join(kernelArgs, " "))
	return "# written by the appliance's node install (pkg/install)\n" +
		"set timeout=0\nset default=0\n" +
		"serial --unit=0 --speed=115200\nterminal_input console serial\nterminal_output console serial\n" +
		"insmod part_gpt\ninsmod ext2\n" +
		"search --no-floppy --fs-uuid --set=root " + rootUUID + "\n" +
		"menuentry \"Node (installed)\" {\n" +
		"\tlinux /boot/vmlinuz " + args + "\n" +
		"\tinitrd /boot/initrd.img\n}\n"
}

// applyIgnition runs Debian's ignition on the new root: the fetch stage (remote resources, with the
// CA) then the files stage, as the lab kit does. Ignition relabels with setfiles when the root has an
// SELinux config: Debian has no SELinux, so the root gets SELINUX=disabled and setfiles is a stub on
// PATH (LAB.md).
func applyIgnition(ctx context.Context, o Options, mnt string) error {
	bin := o.IgnitionBinary
	if bin == "" {
		bin = DefaultIgnition
	}
	sel := filepath.Join(mnt, "etc/selinux/config")
	if _, err := os.Stat(sel); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(sel), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(sel, []byte("SELINUX=disabled\nSELINUXTYPE=targeted\n"), 0o644); err != nil {
			return err
		}
	}
	stub, err := os.MkdirTemp("", "ignition-path-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stub)
	if err := os.WriteFile(filepath.Join(stub, "setfiles"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		return err
	}
	for _, stage := range []string{"fetch", "files"} {
		cmd := exec.CommandContext(ctx, bin, "-platform", "file", "-stage", stage, "-root", mnt, "-log-to-stdout")
		cmd.Env = append(os.Environ(), "IGNITION_CONFIG_FILE="+o.Ignition, "PATH="+stub+":"+os.Getenv("PATH"))
		if o.IgnitionCA != "" {
			cmd.Env = append(cmd.Env, "SSL_CERT_FILE="+o.IgnitionCA)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("ignition -stage %s: %w: %s", stage, err, tail(string(out), 2000))
		}
	}
	return nil
}

func unitExists(root, unit string) bool {
	for _, d := range []string{"etc/systemd/system", "lib/systemd/system", "usr/lib/systemd/system"} {
		if _, err := os.Stat(filepath.Join(root, d, unit)); err == nil {
			return true
		}
	}
	return false
}

// partitionPath is partition n of disk: /dev/vda → /dev/vda2, /dev/nvme0n1 and /dev/loop0 → …p2.
func partitionPath(disk string, n int) string {
	if last := disk[len(disk)-1]; last >= '0' && last <= '9' {
		return fmt.Sprintf("%sp%d", disk, n)
	}
	return fmt.Sprintf("%s%d", disk, n)
}

// partitionRange returns partition n's start and size in 512-byte sectors, as `sfdisk --json` reads
// the table back.
func partitionRange(ctx context.Context, disk string, n int) (start, size int64, err error) {
	out, err := exec.CommandContext(ctx, "sfdisk", "--json", disk).Output()
	if err != nil {
		return 0, 0, fmt.Errorf("sfdisk --json %s: %w", disk, err)
	}
	var pt struct {
		PartitionTable struct {
			SectorSize int64 `json:"sectorsize"`
			Partitions []struct {
				Start, Size int64
			}
		} `json:"partitiontable"`
	}
	if err := json.Unmarshal(out, &pt); err != nil {
		return 0, 0, fmt.Errorf("sfdisk --json %s: %w", disk, err)
	}
	if len(pt.PartitionTable.Partitions) < n {
		return 0, 0, fmt.Errorf("%s has %d partitions, not %d", disk, len(pt.PartitionTable.Partitions), n)
	}
	if ss := pt.PartitionTable.SectorSize; ss != 0 && ss != 512 {
		return 0, 0, fmt.Errorf("%s has %d-byte sectors: only 512 are handled without the kernel's partition support", disk, ss)
	}
	p := pt.PartitionTable.Partitions[n-1]
	return p.Start, p.Size, nil
}

// waitBlock waits (up to tries × 100 ms) for the kernel and udev to create the partition's device node.
func waitBlock(ctx context.Context, p string, tries int) error {
	for i := 0; ; i++ {
		if st, err := os.Stat(p); err == nil && st.Mode()&os.ModeDevice != 0 {
			return nil
		}
		if i >= tries {
			return fmt.Errorf("%s did not appear after the partition table was written", p)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func run(ctx context.Context, name string, args ...string) error {
	return runIn(ctx, "", name, args...)
}

func runIn(ctx context.Context, stdin, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, tail(string(out), 2000))
	}
	return nil
}

func output(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).Output()
	return strings.TrimSpace(string(out)), err
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
