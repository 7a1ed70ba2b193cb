// Package netboot is the appliance's network-boot service: the path a BMC-powered machine with an
// empty disk takes from its firmware's PXE ROM to a running kernel. It is the only package that
// imports the DHCP (github.com/insomniacslk/dhcp) and TFTP (github.com/pin/tftp/v3) libraries.
//
// The chain is the standard iPXE chainloading recipe (https://ipxe.org/howto/chainloading, and
// Tinkerbell's smee):
//
//  1. DHCP. The firmware's PXE ROM broadcasts a DHCPDISCOVER carrying option 60 "PXEClient…" and
//     option 93 (client system architecture, RFC 4578 §2.1). In ModeProxy (the default) the appliance
//     answers as a proxyDHCP server (PXE specification 2.1 §2.2.5): an offer with no address (yiaddr
//     0.0.0.0), only the boot options, so it coexists with the datacenter's DHCP server, which gives
//     the address. In ModeServer it is the provisioning network's DHCP server: it leases an address
//     from a range and adds the boot options; a DHCPRELEASE frees a lease only when it comes from
//     the leased address itself (anyone can copy a MAC), and a REQUEST naming another server frees
//     only an offer not yet acknowledged. Only machines of the inventory (Config.Machines, by MAC)
//     get an answer; any other MAC is ignored and logged once per UnknownMACLogEvery, with at most
//     MaxUnknownMACs remembered and all such lines rate-limited (dhcp.go).
//  2. TFTP. The boot file for architecture 0 (BIOS) is undionly.kpxe, for 7 and 9 (x86-64 UEFI)
//     ipxe.efi (snponly.efi is served too): Debian's iPXE builds (package ipxe, /usr/lib/ipxe). The
//     TFTP server is read-only and serves only those files.
//  3. iPXE. The loaded iPXE DHCPs again, now with option 77 (user class) "iPXE" and option 175
//     (iPXE's encapsulated options); this time the boot file is the HTTP URL of the machine's iPXE
//     script, /ipxe/MAC (ScriptPath). /boot.ipxe is the same script for a client that asks without
//     a MAC: it chains to /ipxe/${netX/mac}.
//  4. HTTP. The script loads the kernel (/boot/vmlinuz) and initrd (/boot/initrd) from the same
//     HTTP server and boots with a command line carrying public data only: the appliance URL, the
//     pin of its CA and the node name (KernelArgs). No token or other secret ever appears in it (a
//     network-booted machine enrols afterwards); New refuses arguments whose key looks like one.
//  5. The node image (Config.RootFS, install.go): its initramfs fetches the root filesystem from the
//     same port; once the machine has installed itself to its disk it says so over the appliance's
//     HTTPS agent API with its node token (agentapi.InstalledPathV1, NoteInstalled), and from then on
//     its script boots the disk (reinstalling is explicit: ClearInstalled).
//
// Plain HTTP, on purpose and only here: Debian 12's iPXE (a 2019 build) has no HTTPS, so the script,
// kernel and initrd go over plain HTTP on a port of their own (Config.HTTPPort) that serves only
// these public boot artefacts and nothing else. Everything else of the appliance stays HTTPS with its
// own CA. The HTTP handler never answers a client's input with a 5xx.
package netboot

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Mode is how the appliance takes part in DHCP.
type Mode string

const (
	// ModeProxy answers PXE clients with boot options only, no address (proxyDHCP).
	ModeProxy Mode = "proxy"
	// ModeServer leases addresses from Config.Range and adds the boot options.
	ModeServer Mode = "server"
	// ModeOff runs no DHCP; TFTP and HTTP still serve (for a DHCP server configured by hand).
	ModeOff Mode = "off"
)

// Boot files of Debian's ipxe package, served by TFTP from Config.IPXEDir.
const (
	// BootFileBIOS is iPXE for BIOS PXE ROMs (uses the ROM's UNDI driver), client architecture 0.
	BootFileBIOS = "undionly.kpxe"
	// BootFileUEFI is iPXE for x86-64 UEFI with its own NIC drivers, client architectures 7 and 9.
	BootFileUEFI = "ipxe.efi"
	// BootFileSNP is iPXE for x86-64 UEFI using the firmware's SNP driver (served, not offered).
	BootFileSNP = "snponly.efi"
	// DefaultIPXEDir is where Debian's ipxe package installs the boot files.
	DefaultIPXEDir = "/usr/lib/ipxe"
)

// Default ports and times.
const (
	// DefaultHTTPPort is the plain-HTTP port of the boot artefacts.
	DefaultHTTPPort uint16 = 8080
	// DefaultLeaseTime is the lease ModeServer gives.
	DefaultLeaseTime = time.Hour
	// DHCPServerPort is the BOOTP/DHCP server port (RFC 2131 §4.1).
	DHCPServerPort = 67
	// PXEPort is the PXE boot-server port a PXE client sends its proxyDHCP REQUEST to (PXE 2.1 §2.2.6).
	PXEPort = 4011
	// TFTPPort is the TFTP port (RFC 1350).
	TFTPPort = 69
)

// HTTP paths of the boot artefacts.
const (
	// ScriptPath prefixes a machine's iPXE script: ScriptPath + MAC (any of 52:54:00:00:00:21,
	// 52-54-00-00-00-21, 525400000021).
	ScriptPath = "/ipxe/"
	// ChainPath is a script that chains to the machine's script by ${netX/mac}.
	ChainPath = "/boot.ipxe"
	// KernelPath and InitrdPath serve Config.Kernel and Config.Initrd.
	KernelPath = "/boot/vmlinuz"
	InitrdPath = "/boot/initrd"
)

// Machine is one machine of the inventory that may boot from the network.
type Machine struct {
	// Name is the node name (public: it goes on the kernel command line as appliance.node=Name).
	Name string
	// MAC is its boot NIC's 48-bit address.
	MAC net.HardwareAddr
	// KernelArgs are this machine's own kernel arguments, after Config.KernelArgs (public data only,
	// checked like them), e.g. its root-device hints (agentapi.BootArgs.Words).
	KernelArgs []string
}

// Config is everything the service needs. Zero values take the defaults named on each field.
type Config struct {
	// Mode: ModeProxy, ModeServer or ModeOff. Empty: ModeProxy.
	Mode Mode
	// Interface is the network interface DHCP and TFTP bind to (SO_BINDTODEVICE). Required unless
	// Mode is ModeOff.
	Interface string
	// ServerIP is the appliance's IPv4 address on that network: DHCP server identifier (option 54),
	// next-server (siaddr) and the host of the HTTP URLs. Required.
	ServerIP netip.Addr
	// HTTPListen is the address the plain-HTTP server binds. Zero: ServerIP.
	HTTPListen netip.Addr
	// HTTPPort is the plain-HTTP port. 0: DefaultHTTPPort.
	HTTPPort uint16
	// RangeStart..RangeEnd (inclusive) are the addresses ModeServer leases, inside Subnet.
	RangeStart, RangeEnd netip.Addr
	// Subnet is the provisioning network (ModeServer: option 1 subnet mask).
	Subnet netip.Prefix
	// Router is option 3 in ModeServer; zero: none.
	Router netip.Addr
	// LeaseTime is option 51 in ModeServer; 0: DefaultLeaseTime.
	LeaseTime time.Duration
	// Machines are the machines that get answers, by MAC.
	Machines []Machine
	// Others are machines of the inventory that do not boot from the network (a pre-installed node
	// whose firmware tries PXE first): ignored like an unknown MAC, but logged once by name, with
	// what to change to network-boot them. A MAC in both lists is refused.
	Others []Machine
	// AddressOnly are machines of the inventory that ModeServer leases an address to but never boots
	// (no boot file, no script): machines booted from virtual media, whose live system and installed
	// system take DHCP on the provisioning network. ModeServer only (a proxy gives no addresses); a
	// MAC in two lists is refused.
	AddressOnly []Machine
	// IPXEDir holds the iPXE boot files. Empty: DefaultIPXEDir.
	IPXEDir string
	// Kernel and Initrd are the files served at KernelPath and InitrdPath. Required unless ISO is set.
	Kernel, Initrd string
	// RootFS is the node image's root filesystem, served at RootFSPath; the script then adds the
	// node image's arguments (see install.go). Empty: none (a kernel and initrd that need nothing more).
	RootFS string
	// ISO is the node image's ISO (pkg/nodeiso: node-amd64.iso, the form a bundle carries). When set,
	// Kernel, Initrd and RootFS must be empty: the kernel, initramfs and root filesystem are served
	// from inside it (nodeiso.KernelFile, InitrdFile, RootFSFile: byte ranges of the one file, whose
	// hash the bundle's signature covers), and all three must be there.
	ISO string
	// StateDir keeps the machines' install marks (StateDir/installed/NAME.json) and, in ModeServer,
	// the leases (StateDir/LeasesFile, so a restart keeps each machine's address); empty: no marks
	// (every boot is a network boot) and leases in memory only.
	StateDir string
	// KernelArgs are the kernel command-line arguments every machine gets (public data only: the
	// appliance URL, the CA pin, console settings). New refuses an argument whose key contains
	// "token", "passw", "secret", "private" or "credential" (case-insensitive).
	KernelArgs []string
	// DHCPPort, PXEPort and TFTPPort override the standard ports (tests); 0: the standard one.
	DHCPPort, PXEPort, TFTPPort int
	// Logger receives events; nil: slog.Default().
	Logger *slog.Logger
	// Seen, when set, is called with a Machines or AddressOnly node's name and what the service did
	// for it each time it answers that machine: a DHCP reply sent ("DHCP OFFER to n1 (undionly.kpxe)",
	// "DHCP ACK to n2 (address only)") or its iPXE script served ("iPXE script served: ..."). It runs
	// on the serving goroutine: keep it short. The appliance records these as the machine's contacts
	// (nodestate.ContactNetboot).
	Seen func(node, what string)
}

// secretKeyRE matches kernel-argument keys that would carry a secret.
var secretKeyRE = regexp.MustCompile(`(?i)(token|passw|secret|private|credential)`)

// ErrConfig is matched (errors.Is) by every error New returns for a bad Config.
var ErrConfig = errors.New("netboot: invalid configuration")

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
}

// withDefaults returns c with defaults filled in, or an error naming the field to fix.
func (c Config) withDefaults() (Config, error) {
	if c.Mode == "" {
		c.Mode = ModeProxy
	}
	switch c.Mode {
	case ModeProxy, ModeServer, ModeOff:
	default:
		return c, configErr("Mode %q is not proxy, server or off", c.Mode)
	}
	if !c.ServerIP.Is4() {
		return c, configErr("ServerIP %v is not an IPv4 address: give the appliance's address on the boot network", c.ServerIP)
	}
	if c.Mode != ModeOff && c.Interface == "" {
		return c, configErr("Interface is required with DHCP %s: name the boot network's interface", c.Mode)
	}
	if !c.HTTPListen.IsValid() {
		c.HTTPListen = c.ServerIP
	}
	if c.HTTPPort == 0 {
		c.HTTPPort = DefaultHTTPPort
	}
	if c.LeaseTime == 0 {
		c.LeaseTime = DefaultLeaseTime
	}
	if c.IPXEDir == "" {
		c.IPXEDir = DefaultIPXEDir
	}
	if c.DHCPPort == 0 {
		c.DHCPPort = DHCPServerPort
	}
	if c.PXEPort == 0 {
		c.PXEPort = PXEPort
	}
	if c.TFTPPort == 0 {
		c.TFTPPort = TFTPPort
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Mode == ModeServer {
		switch {
		case !c.Subnet.IsValid() || !c.Subnet.Addr().Is4():
			return c, configErr("Subnet %v is not an IPv4 prefix: server mode needs the provisioning network", c.Subnet)
		case !c.RangeStart.Is4() || !c.RangeEnd.Is4() || c.RangeEnd.Less(c.RangeStart):
			return c, configErr("Range %v-%v is not an IPv4 range (start <= end)", c.RangeStart, c.RangeEnd)
		case !c.Subnet.Contains(c.RangeStart) || !c.Subnet.Contains(c.RangeEnd):
			return c, configErr("Range %v-%v is not inside Subnet %v", c.RangeStart, c.RangeEnd, c.Subnet)
		}
	}
	if c.ISO != "" {
		if c.Kernel != "" || c.Initrd != "" || c.RootFS != "" {
			return c, configErr("ISO %s and Kernel/Initrd/RootFS are both set: give the node image ISO or its files, not both", c.ISO)
		}
		if st, err := os.Stat(c.ISO); err != nil || !st.Mode().IsRegular() {
			return c, configErr("ISO %s is not a readable regular file", c.ISO)
		}
	}
	for _, f := range []struct{ name, path string }{{"Kernel", c.Kernel}, {"Initrd", c.Initrd}, {"RootFS", c.RootFS}} {
		if c.ISO != "" {
			break
		}
		if f.path == "" {
			if f.name == "RootFS" {
				continue
			}
			return c, configErr("%s is required: the file served at %s", f.name, map[string]string{"Kernel": KernelPath, "Initrd": InitrdPath}[f.name])
		}
		if st, err := os.Stat(f.path); err != nil || !st.Mode().IsRegular() {
			return c, configErr("%s %s is not a readable regular file", f.name, f.path)
		}
	}
	if err := checkKernelArgs(c.KernelArgs); err != nil {
		return c, err
	}
	for _, m := range c.Machines {
		if err := checkKernelArgs(m.KernelArgs); err != nil {
			return c, configErr("machine %q: %v", m.Name, strings.TrimPrefix(err.Error(), ErrConfig.Error()+": "))
		}
	}
	seen := map[string]string{}
	for _, m := range c.Machines {
		if len(m.MAC) != 6 {
			return c, configErr("machine %q: MAC %v is not 48 bits", m.Name, m.MAC)
		}
		if other, dup := seen[m.MAC.String()]; dup {
			return c, configErr("MAC %v is both %q and %q", m.MAC, other, m.Name)
		}
		seen[m.MAC.String()] = m.Name
	}
	if len(c.AddressOnly) > 0 && c.Mode != ModeServer {
		return c, configErr("AddressOnly machines need ModeServer: a %s gives no addresses", c.Mode)
	}
	for _, m := range slices.Concat(c.Others, c.AddressOnly) {
		if len(m.MAC) != 6 {
			return c, configErr("machine %q: MAC %v is not 48 bits", m.Name, m.MAC)
		}
		if other, dup := seen[m.MAC.String()]; dup {
			return c, configErr("MAC %v is both %q and %q", m.MAC, other, m.Name)
		}
		seen[m.MAC.String()] = m.Name
	}
	return c, nil
}

// checkKernelArgs refuses an argument whose key reads like a secret, or with white space in it.
func checkKernelArgs(args []string) error {
	for _, a := range args {
		k, _, _ := strings.Cut(a, "=")
		if secretKeyRE.MatchString(k) {
			return configErr("kernel argument %q looks like a secret: the boot path carries public data only (the node enrols later)", k)
		}
		if strings.ContainsAny(a, " \t\n\r") {
			return configErr("kernel argument %q contains white space: give one argument per element", a)
		}
	}
	return nil
}

// bootFiles is the TFTP allow-list: name → path.
func (c Config) bootFiles() map[string]string {
	out := map[string]string{}
	for _, f := range []string{BootFileBIOS, BootFileUEFI, BootFileSNP} {
		out[f] = filepath.Join(c.IPXEDir, f)
	}
	return out
}
