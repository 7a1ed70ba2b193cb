package install

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/config"
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
func Choose(disks []Disk, h config.RootDeviceHints) (Disk, error) {
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
	return Disk{}, fmt.Errorf("%w: nodes[].rootDevice %s; disks seen: %s", ErrNoDisk, DescribeHints(h), seen(disks))
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
func Matches(d Disk, h config.RootDeviceHints) bool {
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

// DescribeHints prints h as YAML-like flow for messages: {serialNumber: "X", minSizeGigabytes: 20}.
func DescribeHints(h config.RootDeviceHints) string {
	var parts []string
	for _, kv := range hintPairs(h) {
		if kv[0] == "minSizeGigabytes" || kv[0] == "rotational" {
			parts = append(parts, kv[0]+": "+kv[1])
		} else {
			parts = append(parts, kv[0]+": "+strconv.Quote(kv[1]))
		}
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func hintPairs(h config.RootDeviceHints) [][2]string {
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

// KernelArgPrefix starts the kernel command-line arguments that carry the hints to the booted node
// image: appliance.rootdevice.HINT=VALUE, VALUE percent-encoded (url.QueryEscape: a model such as
// "QEMU HARDDISK" has a space). Hints are public data (no secret).
const KernelArgPrefix = "appliance.rootdevice."

// KernelArgs encodes h as kernel command-line arguments (KernelArgPrefix), one per hint given, in a
// fixed order.
func KernelArgs(h config.RootDeviceHints) []string {
	var out []string
	for _, kv := range hintPairs(h) {
		out = append(out, KernelArgPrefix+kv[0]+"="+url.QueryEscape(kv[1]))
	}
	return out
}

// HintsFromKernelArgs decodes the KernelArgPrefix arguments among args (the words of
// /proc/cmdline); other arguments are ignored. An unknown hint or a bad value is an error naming it.
func HintsFromKernelArgs(args []string) (config.RootDeviceHints, error) {
	var h config.RootDeviceHints
	for _, a := range args {
		rest, ok := strings.CutPrefix(a, KernelArgPrefix)
		if !ok {
			continue
		}
		k, raw, _ := strings.Cut(rest, "=")
		v, err := url.QueryUnescape(raw)
		if err != nil {
			return h, fmt.Errorf("kernel argument %s%s: %w", KernelArgPrefix, k, err)
		}
		switch k {
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
				return h, fmt.Errorf("kernel argument %sminSizeGigabytes=%q is not a whole number of GiB", KernelArgPrefix, v)
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
				return h, fmt.Errorf("kernel argument %srotational=%q is not true or false", KernelArgPrefix, v)
			}
			h.Rotational = &b
		default:
			return h, fmt.Errorf("kernel argument %s%s: unknown root-device hint (known: deviceName, hctl, model, vendor, serialNumber, minSizeGigabytes, wwn, wwnWithExtension, wwnVendorExtension, rotational)", KernelArgPrefix, k)
		}
	}
	return h, nil
}
