package config

import (
	"path"
	"regexp"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// RootDeviceHints choose the disk a network-booted node installs itself to (nodes[].rootDevice; the
// node image's `hostagent install`, pkg/install). The names and the matching are Metal3's
// BareMetalHost rootDeviceHints (the same as OpenStack Ironic's root device hints): every hint given
// must match; deviceName, hctl, serialNumber and the wwn fields match exactly, model and vendor as
// substrings; the first disk in the kernel's order that matches them all is chosen. With no hints at
// all the installer takes the smallest disk of at least 4 GiB (Ironic's default).
type RootDeviceHints = agentapi.RootDeviceHints // the boot contract's type: the node reads it from its kernel command line

var (
	hctlRE = regexp.MustCompile(`^[0-9]+:[0-9]+:[0-9]+:[0-9]+$`)
	wwnRE  = regexp.MustCompile(`^(0x)?[0-9a-fA-F]{16}([0-9a-fA-F]{16})?$`)
	// partitionRE matches partition device names and by-path/by-id partition links.
	partitionRE = regexp.MustCompile(`^/dev/(sd[a-z]+|vd[a-z]+|hd[a-z]+|xvd[a-z]+)[0-9]+$|^/dev/(nvme[0-9]+n[0-9]+|mmcblk[0-9]+)p[0-9]+$|-part[0-9]+$`)
)

// rootDevice checks nodes[i].rootDevice (path is "nodes[i].rootDevice"): only nodes that boot the
// node image (network boot or virtual media) install themselves to a disk, and each hint must be one a disk can match.
func (v *validator) rootDevice(p string, n Node) {
	h := n.RootDevice
	if h == nil {
		return
	}
	if !n.InstallsItself() {
		v.errorf(p, "is set but node %s does not install from the network or virtual media (it needs mac and either power.kind ipmi or redfish with power.bootDevice pxe, or power.kind redfish with power.bootDevice cdrom and power.virtualMediaImage): remove rootDevice, or make the node boot the node image", n.Name)
		return
	}
	if h.IsZero() {
		v.errorf(p, "is empty: give at least one hint (deviceName, hctl, model, vendor, serialNumber, minSizeGigabytes, wwn, wwnWithExtension, wwnVendorExtension, rotational), or remove it to install to the smallest disk of at least 4 GiB")
		return
	}
	if d := h.DeviceName; d != "" {
		switch {
		case !strings.HasPrefix(d, "/dev/") || path.Clean(d) != d:
			v.errorf(p+".deviceName", "%q is not a device path: write /dev/NAME or, better, a /dev/disk/by-path/ link (ls -l /dev/disk/by-path on the machine)", d)
		case strings.HasPrefix(d, "/dev/disk/by-") && !strings.HasPrefix(d, "/dev/disk/by-path/") && !strings.HasPrefix(d, "/dev/disk/by-id/"):
			v.errorf(p+".deviceName", "%q names a file system or partition link, which a blank disk does not have: write /dev/disk/by-path/… or /dev/disk/by-id/…", d)
		case partitionRE.MatchString(d):
			v.errorf(p+".deviceName", "%q is a partition: name the whole disk (the installer partitions it)", d)
		}
	}
	if h.HCTL != "" && !hctlRE.MatchString(h.HCTL) {
		v.errorf(p+".hctl", "%q is not a SCSI address: write Host:Channel:Target:Lun, e.g. 0:0:0:0 (lsblk -o NAME,HCTL)", h.HCTL)
	}
	for _, w := range []struct{ field, val string }{{"wwn", h.WWN}, {"wwnWithExtension", h.WWNWithExtension}} {
		if w.val != "" && !wwnRE.MatchString(w.val) {
			v.errorf(p+"."+w.field, "%q is not a World Wide Name: write 16 (or 32) hex digits, e.g. 0x5000c500a0b1c2d3, as `lsblk -o NAME,WWN` prints it", w.val)
		}
	}
	for _, s := range []struct{ field, val string }{{"model", h.Model}, {"vendor", h.Vendor}, {"serialNumber", h.SerialNumber}, {"wwnVendorExtension", h.WWNVendorExtension}} {
		if s.val != "" && strings.TrimSpace(s.val) == "" {
			v.errorf(p+"."+s.field, "is only white space: write the value as `lsblk -o NAME,MODEL,VENDOR,SERIAL` prints it, or remove it")
		}
		if strings.ContainsAny(s.val, "\x00\n") {
			v.errorf(p+"."+s.field, "contains a NUL or newline: write the value as `lsblk -o NAME,MODEL,VENDOR,SERIAL` prints it")
		}
	}
}
