package agentapi

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// This file is the boot contract: the kernel command-line arguments that tell the node image who
// boots it and from where. The Linux kernel hands words it does not know to user space unread
// (Documentation/admin-guide/kernel-parameters.rst: "parameters that are not recognised are passed
// to init"); the node image reads them from /proc/cmdline. Words are separated by white space, each
// KEY=VALUE or a bare KEY, and no argument here is quoted. They travel in the clear (an iPXE script
// over plain HTTP, an ISO's GRUB menu), so they carry public data only: never a token or a key.
//
// Writers: pkg/plan (the kernel-cmdline file of a BMC-booted node, also what pkg/applianced writes
// into the node ISO's embed area), pkg/applianced (the network boot's common and per-machine words,
// the enrolment answer's install parameters), pkg/netboot (the iPXE script's node and network-boot
// words), iso/node/grub.cfg (appliance.medium, console). Readers: pkg/hostagent (`hostagent install`,
// and the enrolment answer's install parameters), iso/node/init (the network-boot and medium words,
// in shell).

// Kernel-argument keys of the boot contract.
const (
	// ArgApplianceURL is BootArgs.ApplianceURL: appliance.url=https://10.83.0.2:8443.
	ArgApplianceURL = "appliance.url"
	// ArgCAPin is BootArgs.CAPin: appliance.ca_pin=sha256:<64 hex digits>.
	ArgCAPin = "appliance.ca_pin"
	// ArgNode is BootArgs.Node: appliance.node=w1.
	ArgNode = "appliance.node"
	// ArgRootDevicePrefix starts BootArgs.Hints' arguments: appliance.rootdevice.HINT=VALUE.
	ArgRootDevicePrefix = "appliance.rootdevice."
	// ArgAddress is repeated, one per BootArgs.Network.Addresses entry: appliance.address=10.83.0.21/24.
	ArgAddress = "appliance.address"
	// ArgGateway is BootArgs.Network.Gateway: appliance.gateway=10.83.0.1.
	ArgGateway = "appliance.gateway"
	// ArgMAC is BootArgs.MAC: appliance.mac=52:54:00:02:64:00.
	ArgMAC = "appliance.mac"
	// ArgMedium is BootArgs.Medium: appliance.medium=APPLNODE.
	ArgMedium = "appliance.medium"
	// ArgRootFS is BootArgs.RootFSURL: appliance.rootfs=http://10.83.0.2:8080/boot/rootfs.squashfs.
	ArgRootFS = "appliance.rootfs"
	// ArgRootFSSHA256 is BootArgs.RootFSSHA256: appliance.rootfs_sha256=<64 hex digits>.
	ArgRootFSSHA256 = "appliance.rootfs_sha256"
	// ArgInitrd is BootArgs.InitrdURL: appliance.initrd=http://10.83.0.2:8080/boot/initrd.
	ArgInitrd = "appliance.initrd"
	// ArgBootIF is BootArgs.BootIF: BOOTIF=01-52-54-00-00-00-21 (PXELINUX's IPAPPEND 2 form).
	ArgBootIF = "BOOTIF"
	// ArgIP is BootArgs.IP: appliance.ip=ADDR::GATEWAY:NETMASK.
	ArgIP = "appliance.ip"
	// ArgConsole is the kernel's own console= (BootArgs.Console).
	ArgConsole = "console"
)

// BootArgs is the boot contract's set of kernel arguments. Every field is optional to the format
// (the zero value formats as ""); what a reader requires is its own rule (RequireAppliance). Values
// are single words: no white space (Format does not quote), the root-device hints excepted, which
// Format percent-encodes.
type BootArgs struct {
	// ApplianceURL is appliance.url=: https://HOST:PORT of the appliance's HTTPS front, where the
	// node enrols.
	ApplianceURL string
	// CAPin is appliance.ca_pin=: the appliance CA's pin, PinOf's format ("sha256:" and 64 hex
	// digits). Not checked here: the enrolment checks it (ParsePin) before it trusts anything.
	CAPin string
	// Node is appliance.node=: the node's name in the inventory. Informational: the enrolment
	// decides who the machine is.
	Node string
	// Hints are appliance.rootdevice.HINT=VALUE, one per hint given, HINT a RootDeviceHints YAML key
	// (deviceName, hctl, model, vendor, serialNumber, minSizeGigabytes, wwn, wwnWithExtension,
	// wwnVendorExtension, rotational), VALUE percent-encoded (url.QueryEscape: a model such as
	// "QEMU HARDDISK" has a space): the disk `hostagent install` chooses.
	Hints RootDeviceHints
	// Network is appliance.address= (repeated, ADDRESS/PREFIX) and appliance.gateway= (ADDRESS):
	// the static addresses the installed system keeps on its boot NIC. Zero: DHCP.
	Network Network
	// MAC is appliance.mac=: the NIC the installed system's Network goes on when the boot named none
	// (a virtual-media boot): nodes[].mac, in the enrolment answer only.
	MAC string
	// Medium is appliance.medium=: the volume label of the node image's ISO when it boots from it
	// (virtual media; iso/node/grub.cfg writes APPLNODE), which iso/node/init mounts the root
	// filesystem from. Empty on a network boot.
	Medium string
	// RootFSURL, RootFSSHA256 and InitrdURL are a network boot's appliance.rootfs= (the node image's
	// root filesystem, http://SERVER:PORT/boot/rootfs.squashfs, which iso/node/init fetches),
	// appliance.rootfs_sha256= (its SHA-256, hex) and appliance.initrd= (the initramfs again, for the
	// installed system, http://SERVER:PORT/boot/initrd; ParseBootArgs refuses another scheme). Empty
	// on an ISO boot.
	RootFSURL, RootFSSHA256, InitrdURL string
	// BootIF is BOOTIF=: the NIC a network boot came from, "01-" and the MAC with '-' (PXELINUX's
	// IPAPPEND 2 convention; iPXE's script writes it from ${netX/mac:hexhyp}).
	BootIF string
	// IP is appliance.ip=: what iPXE got by DHCP at this boot, ADDR::GATEWAY:NETMASK (the order of
	// the kernel's ip=, Documentation/admin-guide/nfs/nfsroot.rst, under another key so that
	// systemd's network generator does not read it); DHCPGateway reads its gateway.
	IP string
	// Console are the values of the kernel's console= arguments, in order (console=ttyS0,115200n8:
	// "ttyS0,115200n8"); the installed system keeps them (ConsoleArgs).
	Console []string
}

// RootDeviceHints choose the disk a node booting the node image installs itself to. The names and
// the matching are Metal3's BareMetalHost rootDeviceHints (the same as OpenStack Ironic's root
// device hints): every hint given must match; deviceName, hctl, serialNumber and the wwn fields
// match exactly, model and vendor as substrings; the first disk in the kernel's order that matches
// them all is chosen (pkg/install.Choose). The operator writes them as nodes[].rootDevice
// (pkg/config, which validates them); they reach the node as BootArgs.Hints.
type RootDeviceHints struct {
	// DeviceName is the disk's device path: /dev/vda, or better a stable link under
	// /dev/disk/by-path/ (e.g. /dev/disk/by-path/pci-0000:00:05.0), which names the slot, not the
	// order the kernel found the disks in.
	DeviceName string `yaml:"deviceName,omitempty"`
	// HCTL is the SCSI address Host:Channel:Target:Lun, e.g. 0:0:0:0 (/sys/block/DEV/device/scsi_device).
	HCTL string `yaml:"hctl,omitempty"`
	// Model is a substring of the disk's model (/sys/block/DEV/device/model; udev's ID_MODEL).
	Model string `yaml:"model,omitempty"`
	// Vendor is a substring of the disk's vendor (/sys/block/DEV/device/vendor).
	Vendor string `yaml:"vendor,omitempty"`
	// SerialNumber is the disk's serial number exactly (/sys/block/DEV/device/serial, or
	// /sys/block/DEV/serial for virtio; udev's ID_SERIAL_SHORT).
	SerialNumber string `yaml:"serialNumber,omitempty"`
	// MinSizeGigabytes is the smallest acceptable size in GiB (2^30 bytes).
	MinSizeGigabytes uint32 `yaml:"minSizeGigabytes,omitempty"`
	// WWN is the World Wide Name exactly, e.g. 0x5000c500a0b1c2d3 (/sys/block/DEV/device/wwid
	// without its "naa." prefix; udev's ID_WWN).
	WWN string `yaml:"wwn,omitempty"`
	// WWNWithExtension is the WWN with the vendor extension appended (udev's ID_WWN_WITH_EXTENSION).
	WWNWithExtension string `yaml:"wwnWithExtension,omitempty"`
	// WWNVendorExtension is the vendor extension alone (udev's ID_WWN_VENDOR_EXTENSION).
	WWNVendorExtension string `yaml:"wwnVendorExtension,omitempty"`
	// Rotational: true for spinning disks only, false for solid-state only (/sys/block/DEV/queue/rotational).
	Rotational *bool `yaml:"rotational,omitempty"`
}

// IsZero reports whether no hint is given.
func (h RootDeviceHints) IsZero() bool {
	return h.DeviceName == "" && h.HCTL == "" && h.Model == "" && h.Vendor == "" && h.SerialNumber == "" &&
		h.MinSizeGigabytes == 0 && h.WWN == "" && h.WWNWithExtension == "" && h.WWNVendorExtension == "" && h.Rotational == nil
}

// String prints h as YAML-like flow for messages, the hints given in a fixed order:
// {serialNumber: "X", minSizeGigabytes: 20}; "{}" when none is.
func (h RootDeviceHints) String() string {
	var parts []string
	for _, kv := range h.pairs() {
		if kv[0] == "minSizeGigabytes" || kv[0] == "rotational" {
			parts = append(parts, kv[0]+": "+kv[1])
		} else {
			parts = append(parts, kv[0]+": "+strconv.Quote(kv[1]))
		}
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// pairs are the hints given as (YAML key, value) in the fixed order of String and Words.
func (h RootDeviceHints) pairs() [][2]string {
	var out [][2]string
	add := func(k, v string) {
		if v != "" {
			out = append(out, [2]string{k, v})
		}
	}
	add("deviceName", h.DeviceName)
	add("hctl", h.HCTL)
	add("model", h.Model)
	add("vendor", h.Vendor)
	add("serialNumber", h.SerialNumber)
	if h.MinSizeGigabytes > 0 {
		add("minSizeGigabytes", strconv.FormatUint(uint64(h.MinSizeGigabytes), 10))
	}
	add("wwn", h.WWN)
	add("wwnWithExtension", h.WWNWithExtension)
	add("wwnVendorExtension", h.WWNVendorExtension)
	if h.Rotational != nil {
		add("rotational", strconv.FormatBool(*h.Rotational))
	}
	return out
}

// Network is the installed system's network on the NIC the machine booted from: static when the
// inventory gives the node addresses, so that the node keeps the address the plan expects with no
// DHCP server around (boot.dhcp proxy leaves the addresses to the datacenter's DHCP, which need not
// hand out that one, and the appliance's own DHCP leases from boot.range, which holds no node
// address).
type Network struct {
	// Addresses are the node's addresses on the boot network, each with the prefix length of the
	// networks.controlPlane.cidrs entry that holds it (nodes[].addresses[i] 10.83.0.21 in
	// 10.83.0.0/24: 10.83.0.21/24).
	Addresses []netip.Prefix
	// Gateway is the default route's next hop: boot.router when it lies on the boot network;
	// invalid when the configuration names none.
	Gateway netip.Addr
}

// IsZero reports whether nw configures nothing (the installed system then takes DHCP).
func (nw Network) IsZero() bool { return len(nw.Addresses) == 0 && !nw.Gateway.IsValid() }

// Words returns b's arguments, one word each, in this fixed order (each only when set): appliance.url,
// appliance.ca_pin, the root-device hints (in RootDeviceHints.String's order), appliance.address
// (each), appliance.gateway, appliance.mac, appliance.node, appliance.medium, appliance.rootfs,
// appliance.rootfs_sha256, appliance.initrd, BOOTIF, appliance.ip, console (each).
func (b BootArgs) Words() []string {
	var out []string
	add := func(k, v string) {
		if v != "" {
			out = append(out, k+"="+v)
		}
	}
	add(ArgApplianceURL, b.ApplianceURL)
	add(ArgCAPin, b.CAPin)
	for _, kv := range b.Hints.pairs() {
		out = append(out, ArgRootDevicePrefix+kv[0]+"="+url.QueryEscape(kv[1]))
	}
	for _, a := range b.Network.Addresses {
		out = append(out, ArgAddress+"="+a.String())
	}
	if b.Network.Gateway.IsValid() {
		out = append(out, ArgGateway+"="+b.Network.Gateway.String())
	}
	add(ArgMAC, b.MAC)
	add(ArgNode, b.Node)
	add(ArgMedium, b.Medium)
	add(ArgRootFS, b.RootFSURL)
	add(ArgRootFSSHA256, b.RootFSSHA256)
	add(ArgInitrd, b.InitrdURL)
	add(ArgBootIF, b.BootIF)
	add(ArgIP, b.IP)
	out = append(out, b.ConsoleArgs()...)
	return out
}

// Format is Words joined by single spaces: a kernel command line (or the part of one that b
// holds). ParseBootArgs(b.Format()) is b for every b ParseBootArgs returns.
func (b BootArgs) Format() string { return strings.Join(b.Words(), " ") }

// ConsoleArgs are b.Console as kernel arguments: console=VALUE each.
func (b BootArgs) ConsoleArgs() []string {
	out := make([]string, 0, len(b.Console))
	for _, c := range b.Console {
		out = append(out, ArgConsole+"="+c)
	}
	return out
}

// DHCPGateway is the gateway of b.IP (ADDR::GATEWAY:NETMASK), what iPXE got by DHCP at this boot;
// invalid when there is none: no IP, fewer than three fields, not an address, or 0.0.0.0 (iPXE's
// "none").
func (b BootArgs) DHCPGateway() netip.Addr {
	if f := strings.Split(b.IP, ":"); len(f) >= 3 {
		if gw, err := netip.ParseAddr(f[2]); err == nil && !gw.IsUnspecified() {
			return gw
		}
	}
	return netip.Addr{}
}

// RequireAppliance checks what the node image needs to enrol: appliance.url and appliance.ca_pin.
// The error names the missing argument.
func (b BootArgs) RequireAppliance() error {
	switch {
	case b.ApplianceURL == "":
		return errors.New("appliance.url= is missing from the kernel command line: boot the node image from the appliance (network boot or its ISO)")
	case b.CAPin == "":
		return errors.New("appliance.ca_pin= is missing from the kernel command line")
	}
	return nil
}

// ParseBootArgs reads BootArgs from cmdline, a kernel command line (/proc/cmdline) or any
// white-space-separated words of one (the enrolment answer's install parameters). Words outside the
// contract are ignored; for a key given twice the last word counts (console and appliance.address
// accumulate). Errors name the argument to fix: an unknown root-device hint or a bad value
// (percent-encoding, minSizeGigabytes not a whole number, rotational not true or false), an
// appliance.address that is not ADDRESS/PREFIX, an appliance.gateway that is not an address, an
// appliance.initrd that is not an http:// URL. appliance.ip is kept as it is (DHCPGateway reads it
// leniently: iPXE writes an empty or 0.0.0.0 gateway).
func ParseBootArgs(cmdline string) (BootArgs, error) {
	var b BootArgs
	for _, w := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(w, "=")
		if hint, ok := strings.CutPrefix(k, ArgRootDevicePrefix); ok {
			if err := b.Hints.set(hint, v); err != nil {
				return b, err
			}
			continue
		}
		switch k {
		case ArgApplianceURL:
			b.ApplianceURL = v
		case ArgCAPin:
			b.CAPin = v
		case ArgNode:
			b.Node = v
		case ArgAddress:
			p, err := netip.ParsePrefix(v)
			if err != nil {
				return b, fmt.Errorf("%s=%q is not an address with its prefix length (10.83.0.21/24): %v", ArgAddress, v, err)
			}
			b.Network.Addresses = append(b.Network.Addresses, p)
		case ArgGateway:
			a, err := netip.ParseAddr(v)
			if err != nil {
				return b, fmt.Errorf("%s=%q is not an IP address: %v", ArgGateway, v, err)
			}
			b.Network.Gateway = a
		case ArgMAC:
			b.MAC = v
		case ArgMedium:
			b.Medium = v
		case ArgRootFS:
			b.RootFSURL = v
		case ArgRootFSSHA256:
			b.RootFSSHA256 = v
		case ArgInitrd:
			b.InitrdURL = v
		case ArgBootIF:
			b.BootIF = v
		case ArgIP:
			b.IP = v
		case ArgConsole:
			b.Console = append(b.Console, v)
		}
	}
	if b.InitrdURL != "" {
		if u, err := url.Parse(b.InitrdURL); err != nil || u.Scheme != "http" || u.Host == "" {
			return b, fmt.Errorf("%s=%q is not an http:// URL of the appliance's boot server", ArgInitrd, b.InitrdURL)
		}
	}
	return b, nil
}

// set decodes hint (a RootDeviceHints YAML key) from raw, the percent-encoded value of its
// appliance.rootdevice. argument. Errors name the argument.
func (h *RootDeviceHints) set(hint, raw string) error {
	v, err := url.QueryUnescape(raw)
	if err != nil {
		return fmt.Errorf("kernel argument %s%s: %w", ArgRootDevicePrefix, hint, err)
	}
	switch hint {
	case "deviceName":
		h.DeviceName = v
	case "hctl":
		h.HCTL = v
	case "model":
		h.Model = v
	case "vendor":
		h.Vendor = v
	case "serialNumber":
		h.SerialNumber = v
	case "minSizeGigabytes":
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return fmt.Errorf("kernel argument %sminSizeGigabytes=%q is not a whole number of GiB", ArgRootDevicePrefix, v)
		}
		h.MinSizeGigabytes = uint32(n)
	case "wwn":
		h.WWN = v
	case "wwnWithExtension":
		h.WWNWithExtension = v
	case "wwnVendorExtension":
		h.WWNVendorExtension = v
	case "rotational":
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("kernel argument %srotational=%q is not true or false", ArgRootDevicePrefix, v)
		}
		h.Rotational = &b
	default:
		return fmt.Errorf("kernel argument %s%s: unknown root-device hint (known: deviceName, hctl, model, vendor, serialNumber, minSizeGigabytes, wwn, wwnWithExtension, wwnVendorExtension, rotational)", ArgRootDevicePrefix, hint)
	}
	return nil
}
