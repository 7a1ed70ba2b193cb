package install

import (
	"fmt"
	"slices"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// MinDefaultSizeBytes is the smallest disk taken when no hint is given: 4 GiB (Ironic's default).
const MinDefaultSizeBytes = 4 << 30

// Choose returns the install disk among disks (in the kernel's order, as ListDisks returns them) for
// hints, with Metal3's semantics: every hint given must match (deviceName: the disk's path or one of
// its /dev/disk links; hctl, serialNumber, the wwn fields: exactly; model and vendor: as substrings;
// minSizeGigabytes: size ≥ that many GiB; rotational: equal); the first disk that matches is chosen.
// With no hint the smallest writable, non-removable disk of at least 4 GiB is chosen (a USB stick or
// a virtual-media drive is never taken by default; a hint can still name one). Read-only disks are
// never chosen. The error (ErrNoDisk) names the hints and every disk seen, so the operator can fix either.
func Choose(disks []Disk, h agentapi.RootDeviceHints) (Disk, error) {
	if h.IsZero() {
		var best *Disk
		for i := range disks {
			d := &disks[i]
			if d.ReadOnly || d.Removable || d.SizeBytes < MinDefaultSizeBytes {
				continue
			}
			if best == nil || d.SizeBytes < best.SizeBytes {
				best = d
			}
		}
		if best == nil {
			return Disk{}, fmt.Errorf("%w: no hints (nodes[].rootDevice unset) and no writable, non-removable disk of at least 4 GiB; disks seen: %s", ErrNoDisk, seen(disks))
		}
		return *best, nil
	}
	for _, d := range disks {
		if !d.ReadOnly && Matches(d, h) {
			return d, nil
		}
	}
	return Disk{}, fmt.Errorf("%w: nodes[].rootDevice %s; disks seen: %s", ErrNoDisk, h.String(), seen(disks))
}

func seen(disks []Disk) string {
	if len(disks) == 0 {
		return "none (is the disk controller's driver in the node image's initramfs?)"
	}
	s := make([]string, len(disks))
	for i, d := range disks {
		s[i] = d.String()
	}
	return strings.Join(s, "; ")
}

// Matches reports whether d matches every hint given in h.
func Matches(d Disk, h agentapi.RootDeviceHints) bool {
	if h.DeviceName != "" && h.DeviceName != d.Path && !slices.Contains(d.Links, h.DeviceName) {
		return false
	}
	exact := [][2]string{{h.HCTL, d.HCTL}, {h.SerialNumber, d.Serial}}
	for _, e := range exact {
		if e[0] != "" && e[0] != e[1] {
			return false
		}
	}
	if h.WWN != "" && !strings.EqualFold(normalizeWWN(h.WWN), wwnBase(d.WWN)) && !strings.EqualFold(h.WWN, d.WWN) {
		return false
	}
	if h.WWNWithExtension != "" && !strings.EqualFold(h.WWNWithExtension, d.WWN) {
		return false
	}
	if h.WWNVendorExtension != "" && !strings.EqualFold(h.WWNVendorExtension, wwnExt(d.WWN)) {
		return false
	}
	if h.Model != "" && !strings.Contains(d.Model, h.Model) {
		return false
	}
	if h.Vendor != "" && !strings.Contains(d.Vendor, h.Vendor) {
		return false
	}
	if h.MinSizeGigabytes > 0 && d.SizeBytes < int64(h.MinSizeGigabytes)<<30 {
		return false
	}
	if h.Rotational != nil && *h.Rotational != d.Rotational {
		return false
	}
	return true
}

// wwnBase and wwnExt split a 32-hex-digit NAA (IEEE Registered Extended) name into its 16-digit
// WWN and its vendor extension, as udev's ID_WWN and ID_WWN_VENDOR_EXTENSION do.
func wwnBase(w string) string {
	if strings.HasPrefix(w, "0x") && len(w) == 34 {
		return w[:18]
	}
	return w
}

func wwnExt(w string) string {
	if strings.HasPrefix(w, "0x") && len(w) == 34 {
		return "0x" + w[18:]
	}
	return ""
}
