package config

import (
	"strings"
	"testing"
)

// redfishW1 turns the lab's IPMI worker w1 into a redfish node booting the virtual CD.
func redfishW1(image, bootDevice string) []string {
	power := "    kind: redfish\n    address: https://10.100.0.121\n    caFile: /etc/appliance/bmc-ca.pem"
	if bootDevice != "" {
		power += "\n    bootDevice: " + bootDevice
	}
	if image != "" {
		power += "\n    virtualMediaImage: " + image
	}
	return []string{"    kind: ipmi\n    address: 10.100.0.121", power}
}

func TestVirtualMediaImageValid(t *testing.T) {
	for _, img := range []string{"https://10.100.0.2:8443/boot/node.iso", "http://images.example.com/node.iso?v=2"} {
		c, _, errs := labWith(t, "", redfishW1(img, "cdrom")...)
		if len(errs) > 0 {
			t.Fatalf("%s: %v", img, errs)
		}
		if got := c.Nodes[3].Power.VirtualMediaImage; got != img {
			t.Errorf("nodes[3].power.virtualMediaImage = %q, want %q", got, img)
		}
	}
}

// TestVirtualMediaImageInvalid asserts the exact error path and what each message says.
func TestVirtualMediaImageInvalid(t *testing.T) {
	const path = "nodes[3].power.virtualMediaImage"
	tests := []struct {
		name  string
		edits []string
		msg   string
	}{
		{"ipmi", []string{"    passwordFile: /var/lib/appliance-lab/bmc/w1.password", "    passwordFile: /var/lib/appliance-lab/bmc/w1.password\n    bootDevice: cdrom\n    virtualMediaImage: https://10.100.0.2/node.iso"},
			"is only used with power.kind redfish (virtual media is a Redfish BMC feature; kind ipmi has none)"},
		{"pxe by default", redfishW1("https://10.100.0.2/node.iso", ""), "needs power.bootDevice: cdrom (the node boots the inserted image once; it is pxe)"},
		{"disk", redfishW1("https://10.100.0.2/node.iso", "disk"), "set bootDevice: cdrom, or remove virtualMediaImage to boot from disk"},
		{"not a URL", redfishW1("node.iso", "cdrom"), "is not an http:// or https:// URL with a host"},
		{"nfs", redfishW1("nfs://10.100.0.2/node.iso", "cdrom"), "is not an http:// or https:// URL with a host"},
		{"credentials", redfishW1("https://iso:s3cret@10.100.0.2/node.iso", "cdrom"), "https://iso:xxxxx@10.100.0.2/node.iso carries credentials"},
		{"fragment", redfishW1("https://10.100.0.2/node.iso#x", "cdrom"), "has a #fragment"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, errs := labWith(t, "", tt.edits...)
			requireErr(t, errs, path, tt.msg, 0)
			if got := errPaths(errs); len(got) != 1 {
				t.Errorf("errors at %v, want only %s:\n%v", got, path, errs)
			}
			if strings.Contains(errs.Error(), "s3cret") {
				t.Errorf("an error shows the URL's password: %v", errs)
			}
		})
	}
}
