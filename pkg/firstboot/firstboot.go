// Package firstboot sets up a bootstrap host that booted from the appliance ISO (`appliance
// firstboot`, run by appliance-firstboot.service at every boot; iso/): it finds the configuration,
// gives the host its static addresses, prepares and mounts the state disk, enables SSH when asked,
// starts appliance-bootstrap.service, and keeps a console banner (agetty's /etc/issue.d) that says
// where the appliance is and what it is doing, or exactly what to provide when something is missing.
//
// Every step is idempotent (a reboot runs them again on the same disk), and the one destructive step,
// formatting the state disk, happens only on a device that blkid(8) finds blank (no filesystem, RAID
// or partition-table signature): a device with the label config.StateLabel is mounted as it is, any
// other content is refused and left alone.
package firstboot

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// Where things are on the booted appliance.
const (
	// ConfigLabel is the filesystem label of the configuration volume (FAT allows 11 characters).
	ConfigLabel = "APPL-CONFIG"
	// ConfigDir is where the configuration volume is mounted (read-only), or where a configuration
	// fetched from appliance.config=URL is written.
	ConfigDir = "/run/appliance/config"
	// ConfigFile is the configuration's name in ConfigDir.
	ConfigFile = "bootstrap.yaml"
	// MediumDir is where the initramfs mounted the ISO (iso/init).
	MediumDir = "/run/appliance/medium"
	// BannerPath is the console banner, which agetty prints after /etc/issue (util-linux reads
	// /etc/issue.d only while /etc/issue exists, and /run/issue.d only when it does not). On the ISO,
	// /etc is the RAM overlay: the banner never reaches the medium.
	BannerPath = "/etc/issue.d/50-appliance.issue"
	// BootstrapEnv holds APPLIANCE_BOOTSTRAP_ARGS for appliance-bootstrap.service.
	BootstrapEnv = "/run/appliance/bootstrap.env"
	// NetworkDir receives the systemd-networkd .network files (runtime, not persistent).
	NetworkDir = "/run/systemd/network"
	// BootstrapUnit is the unit that runs `appliance bootstrap`.
	BootstrapUnit = "appliance-bootstrap.service"
	// ProblemPath keeps the last failure of Run (the banner's text), so that Banner does not paint
	// over it; removed when Run succeeds.
	ProblemPath = "/run/appliance/firstboot.problem"
)

// Options are Run's inputs; the zero value is the real host.
type Options struct {
	// Root prefixes every path Run reads or writes (tests); "" is /.
	Root string
	// Cmdline is the kernel command line; "" reads /proc/cmdline.
	Cmdline string
	// Exec runs a command and returns its combined output; nil runs it for real (blkid, mount,
	// mkfs.ext4, networkctl, systemctl, ssh-keygen).
	Exec func(ctx context.Context, name string, args ...string) (string, error)
	// Log receives one line per step (journal and console); nil discards.
	Log io.Writer
	// AddressWait bounds the wait for the control-plane address to be up; 0 means 30 s.
	AddressWait time.Duration
	// HTTPClient fetches appliance.config=URL; nil is a client with a 30 s timeout.
	HTTPClient *http.Client
}

func (o *Options) path(p string) string { return filepath.Join(o.Root, p) }

func (o *Options) logf(format string, args ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, "firstboot: "+format+"\n", args...)
	}
}

func (o *Options) run(ctx context.Context, name string, args ...string) (string, error) {
	if o.Exec != nil {
		return o.Exec(ctx, name, args...)
	}
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// ErrNoConfig: neither a configuration volume nor appliance.config=URL was found.
var ErrNoConfig = errors.New("no configuration")

// Run sets the host up: the configuration, the network, the state disk, then it starts
// appliance-bootstrap.service and, last, SSH. On any error before the start the banner says what
// failed and what to provide, and the error is returned (the unit fails and the journal keeps it);
// nothing is formatted or started after it. An SSH failure after the start is returned and logged
// the same way, but the appliance keeps running.
func Run(ctx context.Context, o Options) error {
	cfgPath, err := findConfig(ctx, &o)
	if err != nil {
		return o.fail(err)
	}
	cfg, warnings, err := config.Load(cfgPath, config.ValidateOptions{CheckFiles: true})
	for _, w := range warnings {
		o.logf("warning: %s", w)
	}
	if err != nil {
		return o.fail(fmt.Errorf("%s is not valid:\n%w", cfgPath, err))
	}
	if len(cfg.Host.Interfaces) == 0 {
		return o.fail(fmt.Errorf("%s: host.interfaces is required when the appliance boots from its ISO: give the host's static address in networks.controlPlane.cidrs (e.g. name: ens3, addresses: [10.100.0.2/24])", cfgPath))
	}
	if err := network(ctx, &o, cfg); err != nil {
		return o.fail(err)
	}
	if err := stateDisk(ctx, &o, cfg); err != nil {
		return o.fail(err)
	}
	args := "--config " + cfgPath
	what := "serving (run `appliance bootstrap --config " + cfgPath + "` to power the nodes on)"
	if !cfg.Host.AutoBootstrap {
		args += " --skip-phases power,converge"
	} else {
		what = "bootstrapping the cluster unattended"
	}
	if _, err := atomicfile.Write(o.path(BootstrapEnv), []byte("APPLIANCE_BOOTSTRAP_ARGS="+args+"\n"), 0o644); err != nil {
		return o.fail(err)
	}
	if _, err := o.run(ctx, "systemctl", "start", "--no-block", BootstrapUnit); err != nil {
		return o.fail(err)
	}
	o.logf("started %s: %s", BootstrapUnit, what)
	if err := os.Remove(o.path(ProblemPath)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// SSH after the bootstrap has started: nothing of it needs sshd, and a first boot's host key
	// (ssh-keygen) and sshd's start took 0.6 s of a TCG-emulated boot on the way to it. A failure
	// here fails the unit (journal) but leaves the appliance running: the banner says so.
	sshErr := sshServer(ctx, &o, cfg)
	if sshErr != nil {
		o.logf("FAILED: %v", sshErr)
	}
	if err := WriteBanner(&o, cfg, cfgPath, ""); err != nil {
		return err
	}
	return sshErr
}

// fail writes the banner with the problem and returns err.
func (o *Options) fail(err error) error {
	o.logf("FAILED: %v", err)
	_, _ = atomicfile.Write(o.path(ProblemPath), []byte(err.Error()+"\n"), 0o644)
	_ = WriteBanner(o, nil, "", err.Error())
	return err
}

// findConfig returns the configuration file: fetched from appliance.config=URL (http or https; the
// URL carries the configuration's secrets' locations, not the secrets, which stay on the host), else
// read from the volume labelled ConfigLabel, mounted read-only at ConfigDir.
func findConfig(ctx context.Context, o *Options) (string, error) {
	cmdline := o.Cmdline
	if cmdline == "" {
		b, _ := os.ReadFile(o.path("/proc/cmdline"))
		cmdline = string(b)
	}
	dir := o.path(ConfigDir)
	for _, f := range strings.Fields(cmdline) {
		u, ok := strings.CutPrefix(f, "appliance.config=")
		if !ok {
			continue
		}
		client := o.HTTPClient
		if client == nil {
			client = &http.Client{Timeout: 30 * time.Second}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return "", fmt.Errorf("appliance.config=%s on the kernel command line: %w", u, err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return "", fmt.Errorf("appliance.config=%s: %w (is the host's network up to it?)", u, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("appliance.config=%s: HTTP %s", u, resp.Status)
		}
		data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return "", fmt.Errorf("appliance.config=%s: %w", u, err)
		}
		p := filepath.Join(dir, ConfigFile)
		if _, err := atomicfile.Write(p, data, 0o600); err != nil {
			return "", err
		}
		o.logf("configuration fetched from %s", u)
		return p, nil
	}
	p := filepath.Join(dir, ConfigFile)
	if mounted(o, ConfigDir) {
		return p, existing(p)
	}
	out, err := o.run(ctx, "blkid", "-L", ConfigLabel)
	dev := strings.TrimSpace(out)
	if err != nil || dev == "" {
		return "", fmt.Errorf("%w: attach a volume labelled %s (FAT or ext4, e.g. a USB stick: mkfs.vfat -n %s) holding %s, or boot with appliance.config=URL on the kernel command line; see README.txt on the medium",
			ErrNoConfig, ConfigLabel, ConfigLabel, ConfigFile)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	opts := "ro,nodev,nosuid,noexec"
	if typ, _ := o.run(ctx, "blkid", "-o", "value", "-s", "TYPE", dev); strings.TrimSpace(typ) == "vfat" {
		opts += ",fmask=0177,dmask=0077" // FAT has no modes: the keys on it are secrets, 0600
	}
	if _, err := o.run(ctx, "mount", "-o", opts, dev, dir); err != nil {
		return "", fmt.Errorf("mount the configuration volume %s: %w", dev, err)
	}
	o.logf("configuration volume %s mounted at %s", dev, ConfigDir)
	return p, existing(p)
}

func existing(p string) error {
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("%w: the configuration volume has no %s: put the BootstrapConfiguration there (README.txt and bootstrap.yaml.example on the medium)", ErrNoConfig, filepath.Base(p))
	}
	return nil
}

// mounted reports whether dir is a mount point (listed in /proc/self/mounts).
func mounted(o *Options, dir string) bool {
	b, err := os.ReadFile(o.path("/proc/self/mounts"))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == dir {
			return true
		}
	}
	return false
}

// networkFile renders the systemd-networkd unit of one host interface (systemd.network(5)).
func networkFile(in config.HostInterface) string {
	var b strings.Builder
	b.WriteString("# Written by appliance firstboot from host.interfaces.\n[Match]\n")
	if in.MACAddress != "" {
		b.WriteString("MACAddress=" + strings.ToLower(in.MACAddress) + "\n")
	} else {
		b.WriteString("Name=" + in.Name + "\n")
	}
	b.WriteString("\n[Network]\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n")
	for _, a := range in.Addresses {
		b.WriteString("Address=" + a.String() + "\n")
	}
	if in.Gateway.IsValid() {
		b.WriteString("Gateway=" + in.Gateway.String() + "\n")
	}
	return b.String()
}

// network writes one .network file per host interface, has networkd reload, and waits until an
// address of networks.controlPlane.cidrs is on an interface.
func network(ctx context.Context, o *Options, cfg *config.BootstrapConfiguration) error {
	changed := false
	var want []netip.Addr
	for i, in := range cfg.Host.Interfaces {
		p := o.path(filepath.Join(NetworkDir, fmt.Sprintf("10-appliance-%d.network", i)))
		ch, err := atomicfile.Write(p, []byte(networkFile(in)), 0o644)
		if err != nil {
			return fmt.Errorf("host.interfaces[%d]: %w", i, err)
		}
		changed = changed || ch
		for _, a := range in.Addresses {
			for _, cp := range cfg.Networks.ControlPlane.CIDRs {
				if cp.Contains(a.Addr()) {
					want = append(want, a.Addr())
				}
			}
		}
	}
	if changed {
		if _, err := o.run(ctx, "networkctl", "reload"); err != nil {
			return fmt.Errorf("host.interfaces: %w", err)
		}
	}
	wait := o.AddressWait
	if wait == 0 {
		wait = 30 * time.Second
	}
	deadline := time.Now().Add(wait)
	for {
		if has, err := hasAddress(want); err == nil && has {
			o.logf("network up: %v", want)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("host.interfaces: none of %v is up after %s: check the interface names or MAC addresses (`ip link`) and the cabling", want, wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// hasAddress reports whether one of want is assigned to a local interface.
var hasAddress = func(want []netip.Addr) (bool, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false, err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && slices.Contains(want, ip.Unmap()) {
				return true, nil
			}
		}
	}
	return false, nil
}

// stateDisk mounts host.stateDevice at stateDir, formatting it ext4 (label config.StateLabel) only
// when blkid finds no signature on it. Without a state device the state stays in RAM (warned).
func stateDisk(ctx context.Context, o *Options, cfg *config.BootstrapConfiguration) error {
	dev := cfg.Host.StateDevice
	if dev == "" {
		o.logf("warning: host.stateDevice is not set: the state (CA, tokens, registry) lives in RAM and is lost at reboot")
		return nil
	}
	if mounted(o, cfg.StateDir) {
		return nil
	}
	for i := 0; ; i++ {
		if _, err := os.Stat(o.path(dev)); err == nil {
			break
		} else if i >= 100 {
			return fmt.Errorf("host.stateDevice: %s does not exist: check the device path (`lsblk`)", dev)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	// blkid -p probes the device itself (no cache); exit 2 means nothing was found.
	out, err := o.run(ctx, "blkid", "-p", "-o", "export", dev)
	probe := parseExport(out)
	switch {
	case err != nil && len(probe) == 0 && isExit(err, 2):
		o.logf("%s is blank: formatting it ext4, label %s", dev, config.StateLabel)
		if _, err := o.run(ctx, "mkfs.ext4", "-q", "-L", config.StateLabel, dev); err != nil {
			return fmt.Errorf("host.stateDevice: format %s: %w", dev, err)
		}
	case err != nil:
		return fmt.Errorf("host.stateDevice: probe %s: %w", dev, err)
	case probe["TYPE"] == "ext4" && probe["LABEL"] == config.StateLabel:
		o.logf("%s holds the appliance's state (ext4, label %s)", dev, config.StateLabel)
	default:
		return fmt.Errorf("host.stateDevice: %s is not blank and is not the appliance's state disk (found %s): the appliance never formats a disk that holds data; give a blank disk, or wipe this one yourself (wipefs -a %s) if its content is not needed",
			dev, describe(probe), dev)
	}
	if err := os.MkdirAll(o.path(cfg.StateDir), 0o700); err != nil {
		return err
	}
	if _, err := o.run(ctx, "mount", "-t", "ext4", dev, cfg.StateDir); err != nil {
		return fmt.Errorf("host.stateDevice: mount %s at %s: %w", dev, cfg.StateDir, err)
	}
	o.logf("state disk %s mounted at %s", dev, cfg.StateDir)
	return nil
}

func isExit(err error, code int) bool {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode() == code
	}
	var ce interface{ ExitCode() int }
	return errors.As(err, &ce) && ce.ExitCode() == code
}

// parseExport reads blkid -o export output (KEY=value lines).
func parseExport(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok && k != "" && k == strings.ToUpper(k) {
			m[k] = v
		}
	}
	return m
}

func describe(p map[string]string) string {
	var parts []string
	for _, k := range []string{"TYPE", "PTTYPE", "LABEL", "USAGE"} {
		if v := p[k]; v != "" {
			parts = append(parts, strings.ToLower(k)+" "+v)
		}
	}
	if len(parts) == 0 {
		return "an unknown signature"
	}
	return strings.Join(parts, ", ")
}

// sshServer installs host.sshAuthorizedKeys for root and starts sshd; without keys sshd stays off.
// The host key lives in STATE/ssh (an ed25519 key made by ssh-keygen on the first boot, kept on the state disk),
// so that a reboot keeps the identity clients pinned.
func sshServer(ctx context.Context, o *Options, cfg *config.BootstrapConfiguration) error {
	keys := cfg.Host.SSHAuthorizedKeys
	if len(keys) == 0 {
		return nil
	}
	if _, err := atomicfile.Write(o.path("/root/.ssh/authorized_keys"), []byte(strings.Join(keys, "\n")+"\n"), 0o600); err != nil {
		return fmt.Errorf("host.sshAuthorizedKeys: %w", err)
	}
	kept := o.path(filepath.Join(cfg.StateDir, "ssh"))
	etc := o.path("/etc/ssh")
	saved, _ := filepath.Glob(filepath.Join(kept, "ssh_host_*"))
	for _, f := range saved {
		if err := copyFile(f, filepath.Join(etc, filepath.Base(f))); err != nil {
			return fmt.Errorf("host.sshAuthorizedKeys: restore the SSH host keys: %w", err)
		}
	}
	if len(saved) == 0 {
		// ed25519 only: ssh-keygen -A also makes RSA 3072 and ECDSA keys, 4.9 s of a TCG-emulated first
		// boot (most of it RSA) on the way to appliance-bootstrap.service; every OpenSSH since 6.5 speaks
		// ed25519, and sshd serves the host keys that exist.
		if _, err := o.run(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "appliance", "-f", o.path("/etc/ssh/ssh_host_ed25519_key")); err != nil {
			return fmt.Errorf("host.sshAuthorizedKeys: %w", err)
		}
		made, _ := filepath.Glob(filepath.Join(etc, "ssh_host_*"))
		for _, f := range made {
			if err := copyFile(f, filepath.Join(kept, filepath.Base(f))); err != nil {
				return fmt.Errorf("host.sshAuthorizedKeys: keep the SSH host keys on the state disk: %w", err)
			}
		}
	}
	if _, err := o.run(ctx, "systemctl", "start", "ssh.service"); err != nil {
		return fmt.Errorf("host.sshAuthorizedKeys: %w", err)
	}
	o.logf("SSH server started for %d key(s)", len(keys))
	return nil
}

// copyFile copies src to dst atomically, private keys 0600 and public ones 0644.
func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	mode := os.FileMode(0o600)
	if strings.HasSuffix(dst, ".pub") {
		mode = 0o644
	}
	_, err = atomicfile.Write(dst, data, mode)
	return err
}

// WriteBanner writes the console banner: the appliance URL(s), the CA pin once the CA exists, every
// node's state, and where the logs are; or, when problem is set, the problem and what to provide.
// cfg nil (no valid configuration) shows only the problem.
func WriteBanner(o *Options, cfg *config.BootstrapConfiguration, cfgPath, problem string) error {
	var b bytes.Buffer
	b.WriteString("\n  Bootstrap appliance\n  ===================\n")
	if problem != "" {
		b.WriteString("\n  NOT RUNNING: " + strings.ReplaceAll(problem, "\n", "\n    ") + "\n")
		b.WriteString("\n  Details: journalctl -u appliance-firstboot\n\n")
		return writeBanner(o, b.Bytes())
	}
	if cfg != nil {
		fmt.Fprintf(&b, "\n  configuration  %s\n", cfgPath)
		for _, in := range cfg.Host.Interfaces {
			for _, a := range in.Addresses {
				for _, cp := range cfg.Networks.ControlPlane.CIDRs {
					if cp.Contains(a.Addr()) {
						fmt.Fprintf(&b, "  appliance      https://%s\n", netip.AddrPortFrom(a.Addr(), cfg.Server.Port))
					}
				}
			}
		}
		if pin, err := caPin(filepath.Join(o.path(statedir.PKI(cfg.StateDir)), pki.CACertFile)); err == nil {
			fmt.Fprintf(&b, "  CA pin         %s\n", pin)
		} else {
			b.WriteString("  CA pin         (not created yet)\n")
		}
		fmt.Fprintf(&b, "  API VIP        %s\n\n  NODE            STATE\n", cfg.APIServer.VIP)
		store := nodestate.Open(o.path(statedir.Nodes(cfg.StateDir)))
		for _, n := range cfg.Nodes {
			state := agentapi.StatePending
			reason := ""
			if st, err := store.Get(n.Name); err == nil {
				state, reason = st.State, st.Reason
			}
			line := fmt.Sprintf("  %-15s %s", n.Name, state)
			if reason != "" && state == agentapi.StateFailed {
				line += ": " + reason
			}
			b.WriteString(line + "\n")
		}
	}
	b.WriteString("\n  Logs: journalctl -u appliance-bootstrap -u appliance (or the serve log in the state directory)\n\n")
	return writeBanner(o, b.Bytes())
}

func writeBanner(o *Options, data []byte) error {
	_, err := atomicfile.Write(o.path(BannerPath), data, 0o644)
	return err
}

// caPin reads a PEM certificate and returns its pin (agentapi.PinOf).
func caPin(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	blk, _ := pem.Decode(data)
	if blk == nil {
		return "", errors.New("no PEM block")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", err
	}
	return agentapi.PinOf(cert), nil
}

// Banner refreshes the banner from the configuration firstboot found (appliance-console.timer).
func Banner(o Options) error {
	if _, err := os.Stat(o.path(ProblemPath)); err == nil {
		return nil // the failure stays on the console until firstboot succeeds
	}
	p := o.path(filepath.Join(ConfigDir, ConfigFile))
	cfg, _, err := config.Load(p, config.ValidateOptions{})
	if err != nil {
		return nil // firstboot's banner (the problem) stays
	}
	return WriteBanner(&o, cfg, p, "")
}
