package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/hostagent"
)

// Paths of the node image's live system (iso/node/init).
const (
	liveRootFS       = "/run/node/rootfs.squashfs"
	liveMediumRootFS = "/run/node/medium/live/rootfs.squashfs"
	liveMediumInitrd = "/run/node/medium/live/initrd.img"
	liveBootIF       = "/run/node/bootif"
)

func newInstallCommand(logger func(io.Writer) *slog.Logger) *cobra.Command {
	var (
		cmdline, image, workDir string
		reboot                  bool
	)
	cmd := &cobra.Command{
		Use:   "install",
		Short: "Enrol this network-booted machine, install the node image to its disk and boot it from there",
		Long: "install is what the node image's first-boot unit runs (iso/node/rootfs, node-firstboot.service) on a\n" +
			"machine booted from the network or the node image ISO. From the kernel command line (public data only:\n" +
			"appliance.url, appliance.ca_pin, appliance.initrd, appliance.rootdevice.*) it enrols with the appliance\n" +
			"(`hostagent enroll`, writing /etc/hostagent/config.yaml and the node's Ignition config), chooses the disk\n" +
			"by the node's root-device hints (nodes[].rootDevice; none: the smallest disk of at least 4 GiB), writes\n" +
			"the node image to it (GPT, ext4, GRUB for BIOS and UEFI) with the Ignition config applied, tells the appliance\n" +
			"over its HTTPS agent API, with the node token, that the machine is installed (its next network boots boot\n" +
			"the disk; a virtual-media node's BMC boots the disk next and ejects the CD) and reboots into the disk, where\n" +
			"hostagent.service takes over. No disk matching the hints fails the node, reported to the appliance with\n" +
			"the hints and the disks seen.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			start := time.Now()
			ctx := cmd.Context()
			log := logger(cmd.ErrOrStderr())
			raw, err := os.ReadFile(cmdline)
			if err != nil {
				return err
			}
			boot, err := agentapi.ParseBootArgs(string(raw))
			if err == nil {
				err = boot.RequireAppliance()
			}
			if err != nil {
				return err
			}
			if image == "" {
				image = liveRootFS
				if _, err := os.Stat(image); err != nil {
					image = liveMediumRootFS
				}
			}
			mac := ""
			if b, err := os.ReadFile(liveBootIF); err == nil {
				mac = strings.TrimSpace(string(b))
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			const cfgPath, caPath, ignPath = "/etc/hostagent/config.yaml", hostagent.CACertPath, "/run/ignition/config.ign"
			const argsPath = "/run/hostagent/install-args"
			res, err := hostagent.RunInstall(ctx, hostagent.InstallOptions{
				Boot: boot,
				Enroll: func(ctx context.Context) error {
					// The same enrolment the lab kit's init runs.
					c := exec.CommandContext(ctx, self, "enroll", "--url", boot.ApplianceURL, "--pin", boot.CAPin,
						"--ca-out", caPath, "--key", enrollKeyPath, "--config", cfgPath, "--install-args-out", argsPath,
						"--ignition-out", ignPath, "--ignition-version", "3.3.0")
					c.Stdout, c.Stderr = cmd.ErrOrStderr(), cmd.ErrOrStderr()
					return c.Run()
				},
				ConfigPath: cfgPath, CAPath: caPath, IgnitionPath: ignPath, InstallArgsPath: argsPath,
				Image: image, MediumInitrd: liveMediumInitrd, BootMAC: mac,
				SysBlock: "/sys/block", DevDisk: "/dev/disk", WorkDir: workDir, Log: log,
			})
			if err != nil {
				return err
			}
			var steps []string
			for _, s := range res.Install.Steps {
				steps = append(steps, fmt.Sprintf("%s %.1fs", s.Name, s.Seconds))
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "NODE-INSTALL: node %s installed to %s (root %s) in %.1fs: enrol %.1fs, disk choice %.1fs, install %.1fs (%s), notice %.1fs\n",
				res.Node, res.Disk, res.Install.RootUUID, time.Since(start).Seconds(), res.Enrolled.Seconds(), res.Chosen.Seconds(),
				res.Installed.Seconds(), strings.Join(steps, ", "), res.Notified.Seconds())
			if reboot {
				fmt.Fprintln(cmd.ErrOrStderr(), "NODE-INSTALL: rebooting into the installed disk")
				return exec.CommandContext(ctx, "systemctl", "--no-block", "reboot").Run()
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cmdline, "cmdline", "/proc/cmdline", "the kernel command line to read")
	f.StringVar(&image, "image", "", "the node image's root filesystem (default: the live boot's, /run/node/…)")
	f.StringVar(&workDir, "work-dir", "/run/node/install", "scratch space (the initramfs download, the mount point)")
	f.BoolVar(&reboot, "reboot", true, "reboot into the installed disk when done")
	// The unit's ExecStart spells it out; it is what install does anyway.
	f.Bool("from-kernel-cmdline", true, "read the appliance URL, CA pin and root-device hints from --cmdline")
	return cmd
}
