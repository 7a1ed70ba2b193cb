package config

import (
	"os"
	"path/filepath"
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

// TestNodeISO: boot.nodeISO defaults to the bundle's netboot/node-amd64.iso whatever boot.dhcp is;
// with CheckFiles it must exist only when a node's virtualMediaImage is the appliance's own
// /boot/node.iso on server.port (the error names the nodes and the field); a relative path is refused.
func TestNodeISO(t *testing.T) {
	own := redfishW1("https://10.100.0.2:8443/boot/node.iso", "cdrom")
	c, _, errs := labWith(t, "", own...)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if c.Boot.NodeISO != "/var/cache/appliance/bundle/netboot/node-amd64.iso" {
		t.Errorf("boot.nodeISO defaulted to %q, want the bundle's netboot/node-amd64.iso", c.Boot.NodeISO)
	}
	if !c.Nodes[3].Power.ServesNodeISO(c.Server.Port) {
		t.Errorf("ServesNodeISO(%d) false for %s", c.Server.Port, c.Nodes[3].Power.VirtualMediaImage)
	}
	for _, other := range []string{"https://10.100.0.2:9443/boot/node.iso", "http://10.100.0.2:8443/boot/node.iso", "https://10.100.0.3:8443/images/node.iso"} {
		if p := (Power{VirtualMediaImage: other}); p.ServesNodeISO(c.Server.Port) {
			t.Errorf("ServesNodeISO(%d) true for %s", c.Server.Port, other)
		}
	}

	check := func(c *BootstrapConfiguration) ErrorList {
		v := validator{c: c, opts: ValidateOptions{CheckFiles: true}}
		v.nodeISO()
		return v.errs
	}
	c.Boot.NodeISO = filepath.Join(t.TempDir(), "node-amd64.iso")
	errs = check(c)
	requireErr(t, errs, "boot.nodeISO", c.Boot.NodeISO+" does not exist, and node(s) w1 boot the appliance's /boot/node.iso (power.virtualMediaImage)", 0)
	if len(errs) != 1 {
		t.Errorf("errors %v, want only boot.nodeISO", errs)
	}
	if err := os.WriteFile(c.Boot.NodeISO, []byte("iso"), 0o644); err != nil {
		t.Fatal(err)
	}
	if errs := check(c); len(errs) > 0 {
		t.Errorf("an existing ISO refused: %v", errs)
	}
	c.Boot.NodeISO = "node-amd64.iso"
	requireErr(t, check(c), "boot.nodeISO", `"node-amd64.iso" is not an absolute path`, 0)

	// Another server's image: an absent boot.nodeISO is nobody's business.
	other, _, errs := labWith(t, "", redfishW1("https://images.example.com/node.iso", "cdrom")...)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	other.Boot.NodeISO = filepath.Join(t.TempDir(), "absent.iso")
	if errs := check(other); len(errs) > 0 {
		t.Errorf("absent ISO refused although no node boots it: %v", errs)
	}
	other.Boot.NodeISO = ""
	if errs := check(other); len(errs) > 0 {
		t.Errorf("no ISO refused although no node boots it: %v", errs)
	}
	c.Boot.NodeISO = ""
	requireErr(t, check(c), "boot.nodeISO", "is required: node(s) w1 boot the appliance's /boot/node.iso", 0)
}
