package hostagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/install"
)

// InstallOptions is one run of the node image's installer (`hostagent install`).
type InstallOptions struct {
	// Boot is the node image's kernel command line (agentapi.ParseBootArgs of /proc/cmdline).
	Boot agentapi.BootArgs
	// Enroll runs the enrolment (`hostagent enroll`), writing ConfigPath, CAPath and IgnitionPath.
	Enroll func(ctx context.Context) error
	// ConfigPath, CAPath and IgnitionPath are where Enroll writes the hostagent configuration, the
	// pinned CA and the node's Ignition config.
	ConfigPath, CAPath, IgnitionPath string
	// InstallArgsPath is where Enroll writes the enrolment answer's install parameters
	// (agentapi.EnrollResponse.InstallArgs: kernel-argument words); "" or a missing file: none.
	// Words it holds replace the kernel command line's root-device hints and static addresses (the
	// answer comes over the pinned TLS; a virtual-media boot's command line has neither), and its
	// agentapi.ArgMAC names the NIC the installed system configures when the boot named none.
	InstallArgsPath string
	// Image is the node image's root filesystem; MediumInitrd the initramfs on an ISO boot (used
	// when Boot.InitrdURL is empty).
	Image, MediumInitrd string
	// BootMAC is the NIC the machine network-booted from (iso/node/init writes /run/node/bootif);
	// empty (an ISO boot): no install notice, and the installed system takes DHCP on every NIC.
	BootMAC string
	// SysBlock and DevDisk are /sys/block and /dev/disk.
	SysBlock, DevDisk string
	// WorkDir holds the downloaded initramfs and the mount point.
	WorkDir string
	Log     *slog.Logger
}

// InstallResult is what RunInstall did.
type InstallResult struct {
	Node    string
	Disk    install.Disk
	Install install.Result
	// Enrolled, Chosen, Installed and Notified are how long each stage took.
	Enrolled, Chosen, Installed, Notified time.Duration
}

// RunInstall enrols, chooses the disk by the node's root-device hints, installs the node image to it
// with the node's Ignition config applied, and, after a network boot, tells the appliance the machine
// is installed (so its next network boots boot the disk): POST agentapi.InstalledPathV1 over the
// appliance's HTTPS agent API, the CA pinned, with the node token the enrolment gave it. A disk that matches no hint is reported to the appliance as the
// node's failure (step config, with the hints and the disks seen) before the error is returned.
func RunInstall(ctx context.Context, o InstallOptions) (InstallResult, error) {
	var res InstallResult
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t0 := time.Now()
	if err := o.Enroll(ctx); err != nil {
		return res, fmt.Errorf("enrol: %w", err)
	}
	res.Enrolled = time.Since(t0)
	data, err := os.ReadFile(o.ConfigPath)
	if err != nil {
		return res, err
	}
	cfg, err := agentapi.Parse(data)
	if err != nil {
		return res, fmt.Errorf("%s: %w", o.ConfigPath, err)
	}
	res.Node = cfg.Node
	nodeMAC, err := applyInstallArgs(&o, log)
	if err != nil {
		return res, err
	}
	ca, err := os.ReadFile(o.CAPath)
	if err != nil {
		return res, err
	}

	t1 := time.Now()
	disks, err := install.ListDisks(o.SysBlock, o.DevDisk)
	if err == nil {
		res.Disk, err = install.Choose(disks, o.Boot.Hints)
	}
	if err != nil {
		reportFailure(ctx, cfg, ca, "install: "+err.Error(), log)
		return res, err
	}
	res.Chosen = time.Since(t1)
	log.Info("install: disk chosen", "node", cfg.Node, "disk", res.Disk.String(), "hints", o.Boot.Hints.String())

	initrd := o.MediumInitrd
	if o.Boot.InitrdURL != "" {
		initrd = filepath.Join(o.WorkDir, "initrd.img")
		if err := download(ctx, o.Boot.InitrdURL, initrd); err != nil {
			return res, fmt.Errorf("fetch the initramfs for the installed system: %w", err)
		}
	}
	// The installed system's network on the boot NIC, by MAC (names can change with the kernel): the
	// node's static addresses when the appliance gave them (nodes[].addresses), else DHCP; after a
	// virtual-media boot (no boot NIC known) DHCP on every Ethernet NIC.
	nw := installedNetwork(o.Boot)
	nic := o.BootMAC
	if nic == "" {
		nic = nodeMAC
	}
	if nic != "" && len(nw.Addresses) > 0 {
		log.Info("install: the installed system keeps the node's static addresses on its boot NIC", "node", cfg.Node, "mac", nic, "addresses", fmt.Sprint(nw.Addresses), "gateway", nw.Gateway.String())
	}
	files := []install.File{{Path: install.NetworkdPath, Mode: 0o644, Data: install.NetworkdFile(nic, nw)}}
	files = append(files, install.File{Path: CACertPath, Data: ca, Mode: 0o644})
	t2 := time.Now()
	ir, err := install.Install(ctx, install.Options{
		Disk: res.Disk.Path, Image: o.Image, Initrd: initrd, KernelArgs: o.Boot.ConsoleArgs(),
		Ignition: o.IgnitionPath, IgnitionCA: o.CAPath, Files: files,
		Enable:  []string{"systemd-networkd.service", "hostagent.service"},
		Marker:  install.Marker{Node: cfg.Node, DiskInfo: res.Disk.String()},
		WorkDir: filepath.Join(o.WorkDir, "target"), Log: log,
	})
	res.Install = ir
	if err != nil {
		reportFailure(ctx, cfg, ca, err.Error(), log)
		return res, err
	}
	res.Installed = time.Since(t2)

	t3 := time.Now()
	c, err := NewClient(cfg.ApplianceURL, ca, cfg.Token, "")
	if err == nil {
		notice := agentapi.InstallNotice{MAC: o.BootMAC, BootID: bootID()}
		if o.Boot.InitrdURL == "" {
			notice.MAC = "" // an ISO boot: no boot NIC
		}
		err = sendInstallNotice(ctx, c, notice)
	}
	switch {
	case errors.Is(err, errNoticeNotServed) && (o.Boot.InitrdURL == "" || o.BootMAC == ""):
		// An ISO boot the appliance has nothing to do for (no virtual media of its own): reboot.
		log.Info("install: the appliance takes no install notice for this boot", "node", cfg.Node, "answer", err.Error())
	case err != nil:
		// Without the notice the next network boot would install again, and a virtual CD would stay
		// in the boot: refuse to reboot.
		return res, fmt.Errorf("the disk is installed, but the appliance did not take the install notice (POST %s%s): %w", cfg.ApplianceURL, agentapi.InstalledPathV1, err)
	}
	res.Notified = time.Since(t3)
	return res, nil
}

// applyInstallArgs reads o.InstallArgsPath (a missing file or "" is no words) with
// agentapi.ParseBootArgs and puts its root-device hints and static addresses in o.Boot, in place of
// the kernel command line's, when it holds any, and returns its appliance.mac (nodes[].mac; "" when
// none). Words that do not parse are an error naming them.
func applyInstallArgs(o *InstallOptions, log *slog.Logger) (mac string, err error) {
	if o.InstallArgsPath == "" {
		return "", nil
	}
	b, err := os.ReadFile(o.InstallArgsPath)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	args, err := agentapi.ParseBootArgs(string(b))
	if err != nil {
		return "", fmt.Errorf("the enrolment answer's install parameters (%s): %w", o.InstallArgsPath, err)
	}
	if !args.Hints.IsZero() {
		o.Boot.Hints = args.Hints
	}
	if !args.Network.IsZero() {
		o.Boot.Network = args.Network
	}
	log.Info("install: parameters from the enrolment answer", "hints", o.Boot.Hints.String(), "addresses", fmt.Sprint(o.Boot.Network.Addresses), "mac", args.MAC)
	return args.MAC, nil
}

// errNoticeNotServed is wrapped by sendInstallNotice for a 404: the appliance has nothing to do for
// this node's install (agentapi.ErrInstallNoticeNotServed).
var errNoticeNotServed = errors.New("the appliance takes no install notice for this node")

// bootID is /proc/sys/kernel/random/boot_id, or "" when unreadable.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// installedNetwork is b.Network, with b.DHCPGateway() as the gateway when the configuration names
// none and one of the addresses' networks holds it (the provisioning network's router, as its DHCP
// server announced it at this boot).
func installedNetwork(b agentapi.BootArgs) agentapi.Network {
	nw := b.Network
	gw := b.DHCPGateway()
	if nw.Gateway.IsValid() || !gw.IsValid() {
		return nw
	}
	for _, a := range nw.Addresses {
		if a.Masked().Contains(gw) {
			nw.Gateway = gw
			break
		}
	}
	return nw
}

// reportFailure tells the appliance this node failed (best effort: the console has it too).
func reportFailure(ctx context.Context, cfg agentapi.Configuration, ca []byte, detail string, log *slog.Logger) {
	bootID := "unknown"
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		bootID = strings.TrimSpace(string(b))
	}
	c, err := NewClient(cfg.ApplianceURL, ca, cfg.Token, bootID)
	if err == nil {
		err = c.Report(ctx, agentapi.Report{BootID: bootID, Step: agentapi.StepConfig, Status: "failed", Detail: detail, Time: time.Now().UTC()})
	}
	if err != nil {
		log.Warn("install: the failure was not reported to the appliance", "err", err)
	}
}

func download(ctx context.Context, u, dst string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
	if err != nil {
		return err
	}
	_, err = atomicfile.Write(dst, b, 0o644)
	return err
}

// sendInstallNotice POSTs the install notice (agentapi.InstalledPathV1) with c's token, retrying
// network errors, 5xx answers and 429 (the appliance is still handling this node's previous notice,
// or limits its rate) for up to a minute; another 4xx answer (refused: another node's MAC, the
// token, an appliance that does not network-boot the node) is returned at once with the appliance's
// words.
func sendInstallNotice(ctx context.Context, c *Client, n agentapi.InstallNotice) error {
	body, err := json.Marshal(n)
	if err != nil {
		return err
	}
	var last error
	for i := 0; i < 30; i++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+agentapi.InstalledPathV1, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+c.token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.hc.Do(req)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
			if resp.StatusCode == http.StatusNotFound {
				return fmt.Errorf("%w: %w", errNoticeNotServed, last)
			}
			if resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests {
				return last
			}
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	return last
}
