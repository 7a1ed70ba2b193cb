package hostagent

import (
	"strings"
	"testing"
)

// TestParseBootArgs: the node image's kernel command line as pkg/netboot's script makes it, and the
// refusals that name what to fix.
func TestParseBootArgs(t *testing.T) {
	words := strings.Fields("initrd=initrd console=tty0 console=ttyS0,115200n8 appliance.url=https://10.0.0.2:8443 " +
		"appliance.ca_pin=sha256:ab appliance.rootdevice.serialNumber=NODE-DISK-1 appliance.rootdevice.model=QEMU+HARDDISK appliance.node=w1 " +
		"appliance.rootfs=http://10.0.0.2:8080/boot/rootfs.squashfs appliance.initrd=http://10.0.0.2:8080/boot/initrd " +
		"BOOTIF=01-52-54-00-00-00-21 appliance.ip=10.0.0.50::10.0.0.1:255.255.255.0")
	b, err := ParseBootArgs(words)
	if err != nil {
		t.Fatal(err)
	}
	if b.ApplianceURL != "https://10.0.0.2:8443" || b.CAPin != "sha256:ab" || b.Node != "w1" || b.InitrdURL != "http://10.0.0.2:8080/boot/initrd" {
		t.Errorf("ParseBootArgs = %+v", b)
	}
	if b.Hints.SerialNumber != "NODE-DISK-1" || b.Hints.Model != "QEMU HARDDISK" {
		t.Errorf("hints = %+v, want serialNumber NODE-DISK-1 and model \"QEMU HARDDISK\"", b.Hints)
	}
	if strings.Join(b.Console, " ") != "console=tty0 console=ttyS0,115200n8" {
		t.Errorf("console = %q", b.Console)
	}
	for _, bad := range []struct{ line, want string }{
		{"appliance.ca_pin=sha256:ab", "appliance.url= is missing"},
		{"appliance.url=https://x:8443", "appliance.ca_pin= is missing"},
		{"appliance.url=https://x:8443 appliance.ca_pin=sha256:ab appliance.initrd=ftp://x/i", "appliance.initrd="},
		{"appliance.url=https://x:8443 appliance.ca_pin=sha256:ab appliance.rootdevice.size=8", "unknown root-device hint"},
	} {
		if _, err := ParseBootArgs(strings.Fields(bad.line)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseBootArgs(%q) = %v, want an error containing %q", bad.line, err, bad.want)
		}
	}
}
