package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// labWith decodes testdata/lab.yaml with extra appended (top-level keys) after replacing each
// old→new pair of edits, then applies defaults and validates.
func labWith(t *testing.T, extra string, edits ...string) (*BootstrapConfiguration, []*FieldError, ErrorList) {
	t.Helper()
	data, err := os.ReadFile("testdata/lab.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	for i := 0; i+1 < len(edits); i += 2 {
		if !strings.Contains(doc, edits[i]) {
			t.Fatalf("lab.yaml has no %q to edit", edits[i])
		}
		doc = strings.Replace(doc, edits[i], edits[i+1], 1)
	}
	c, err := Decode([]byte(doc + extra))
	if err != nil {
		var errs ErrorList
		if errors.As(err, &errs) {
			return nil, nil, errs
		}
		t.Fatalf("Decode: %v", err)
	}
	SetDefaults(c)
	warns, errs := Validate(c, ValidateOptions{})
	return c, warns, errs
}

// w1MAC gives the lab's IPMI worker w1 a MAC, making it network-bootable.
var w1MAC = []string{"    passwordFile: /var/lib/appliance-lab/bmc/w1.password", "    passwordFile: /var/lib/appliance-lab/bmc/w1.password\n  mac: \"52:54:00:00:00:21\""}

func TestBootDefaults(t *testing.T) {
	tests := []struct {
		name     string
		extra    string
		edits    []string
		wantDHCP BootDHCP
		wantPort uint16
	}{
		{name: "no node with a mac: off", wantDHCP: BootDHCPOff},
		{name: "an ipmi pxe node with a mac: proxy", edits: w1MAC, wantDHCP: BootDHCPProxy, wantPort: DefaultBootHTTPPort},
		{name: "a mac but bootDevice disk: off", edits: append(append([]string{}, w1MAC...),
			"    username: admin\n    passwordFile: /var/lib/appliance-lab/bmc/w1.password", "    username: admin\n    bootDevice: disk\n    passwordFile: /var/lib/appliance-lab/bmc/w1.password"), wantDHCP: BootDHCPOff},
		{name: "written mode kept", extra: "boot:\n  dhcp: off\n", edits: w1MAC, wantDHCP: BootDHCPOff},
		{name: "written port kept", extra: "boot:\n  httpPort: 8081\n", edits: w1MAC, wantDHCP: BootDHCPProxy, wantPort: 8081},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, warns, errs := labWith(t, tt.extra, tt.edits...)
			if len(errs) > 0 {
				t.Fatalf("errors: %v", errs)
			}
			if len(warns) > 0 {
				t.Errorf("warnings: %v", warns)
			}
			if c.Boot.DHCP != tt.wantDHCP || c.Boot.HTTPPort != tt.wantPort {
				t.Errorf("boot = %+v, want dhcp %q httpPort %d", c.Boot, tt.wantDHCP, tt.wantPort)
			}
			before := c.Boot
			SetDefaults(c)
			if !reflect.DeepEqual(c.Boot, before) {
				t.Errorf("SetDefaults not idempotent: %+v then %+v", before, c.Boot)
			}
		})
	}
}

func TestBootValid(t *testing.T) {
	for name, extra := range map[string]string{
		"server":         "boot:\n  dhcp: server\n  interface: ens3\n  range: {start: 10.100.0.200, end: 10.100.0.250}\n  router: 10.100.0.1\n",
		"server one ip":  "boot:\n  dhcp: server\n  range: {start: 10.100.0.200, end: 10.100.0.200}\n",
		"proxy":          "boot:\n  dhcp: proxy\n  interface: br-prov.10\n",
		"off with port":  "boot:\n  dhcp: off\n  httpPort: 9000\n",
		"explicit proxy": "boot:\n  dhcp: proxy\n  httpPort: 8080\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, warns, errs := labWith(t, extra, w1MAC...)
			if len(errs) > 0 || len(warns) > 0 {
				t.Errorf("errors %v, warnings %v", errs, warns)
			}
		})
	}
}

// TestBootInvalid asserts the exact set of error paths, each with what its message must say.
func TestBootInvalid(t *testing.T) {
	type want = fieldWant
	tests := []struct {
		name  string
		extra string
		edits []string
		want  []want
	}{
		{"unknown mode", "boot:\n  dhcp: relay\n", nil, []want{{"boot.dhcp", `"relay" is not a DHCP mode: use proxy, server or off`}}},
		{"server without range", "boot:\n  dhcp: server\n", nil, []want{
			{"boot.range.start", "is required with boot.dhcp: server"},
			{"boot.range.end", "is required with boot.dhcp: server"}}},
		{"range reversed", "boot:\n  dhcp: server\n  range: {start: 10.100.0.250, end: 10.100.0.200}\n", nil, []want{
			{"boot.range.end", "10.100.0.200 is before boot.range.start 10.100.0.250: swap them"}}},
		{"range outside the control plane", "boot:\n  dhcp: server\n  range: {start: 10.200.0.200, end: 10.200.0.250}\n", nil, []want{
			{"boot.range", "10.200.0.200-10.200.0.250 is not inside one of networks.controlPlane.cidrs"}}},
		{"range across two networks", "boot:\n  dhcp: server\n  range: {start: 10.100.0.200, end: 10.200.0.250}\n", nil, []want{
			{"boot.range", "is not inside one of networks.controlPlane.cidrs"}}},
		{"range ipv6", "boot:\n  dhcp: server\n  range: {start: \"fd00::1\", end: 10.100.0.250}\n", nil, []want{
			{"boot.range.start", "fd00::1 is not an IPv4 address"}}},
		{"range includes a node", "boot:\n  dhcp: server\n  range: {start: 10.100.0.20, end: 10.100.0.30}\n", nil, []want{
			{"boot.range", "includes 10.100.0.21 (nodes[3].addresses[0], w1)"}}},
		{"range includes the VIP and the broadcast address", "boot:\n  dhcp: server\n  range: {start: 10.100.0.90, end: 10.100.0.255}\n", nil, []want{
			{"boot.range", "includes the API server VIP 10.100.0.100"},
			{"boot.range", "includes the network or broadcast address of 10.100.0.0/24"}}},
		{"router off the network", "boot:\n  dhcp: server\n  range: {start: 10.100.0.200, end: 10.100.0.250}\n  router: 10.200.0.1\n", nil, []want{
			{"boot.router", "10.200.0.1 is outside 10.100.0.0/24"}}},
		{"range with proxy", "boot:\n  dhcp: proxy\n  range: {start: 10.100.0.200, end: 10.100.0.250}\n  router: 10.100.0.1\n", w1MAC, []want{
			{"boot.range", "is only used with boot.dhcp: server (it is proxy)"},
			{"boot.router", "is only used with boot.dhcp: server (it is proxy)"}}},
		{"http port is the appliance port", "boot:\n  dhcp: proxy\n  httpPort: 8443\n", w1MAC, []want{
			{"boot.httpPort", "8443 is also server.port"}}},
		{"http port is the API port", "boot:\n  dhcp: proxy\n  httpPort: 6443\n", w1MAC, []want{
			{"boot.httpPort", "6443 is also apiServer.port"}}},
		{"http port zero", "boot:\n  httpPort: 0\n", w1MAC, []want{{"boot.httpPort", ""}}},
		{"bad interface", "boot:\n  dhcp: proxy\n  interface: \"eth0/1 \"\n", w1MAC, []want{
			{"boot.interface", `"eth0/1 " is not a network interface name`}}},
		{"interface too long", "boot:\n  dhcp: proxy\n  interface: abcdefghijklmnop\n", w1MAC, []want{
			{"boot.interface", "is not a network interface name"}}},
		{"unknown key", "boot:\n  dhcp: proxy\n  nextServer: 10.100.0.1\n", w1MAC, []want{{"boot.nextServer", ""}}},
		{"relative kernel", "boot:\n  dhcp: proxy\n  kernel: vmlinuz\n  initrd: /b/initrd.img\n", w1MAC, []want{
			{"boot.kernel", `"vmlinuz" is not an absolute path`}}},
		{"kernel arguments", "boot:\n  dhcp: proxy\n  kernelArgs: [console=ttyS0, \"a b\", ignition.token=x, Private_Key=y, appliance.url=http://x, \"\"]\n", w1MAC, []want{
			{"boot.kernelArgs[1]", `"a b" is not one kernel argument`},
			{"boot.kernelArgs[2]", `"ignition.token" looks like a secret: the network-boot path is plain HTTP`},
			{"boot.kernelArgs[3]", `"Private_Key" looks like a secret`},
			{"boot.kernelArgs[4]", "appliance.url is set by the appliance itself: remove it"},
			{"boot.kernelArgs[5]", `"" is not one kernel argument`}}},
		{"a MAC in two nodes", "", append(append([]string{}, w1MAC...),
			"  addresses: [10.100.0.13, 10.200.0.13]\n", "  addresses: [10.100.0.13, 10.200.0.13]\n  mac: \"52:54:00:00:00:21\"\n"), []want{
			{"nodes[3].mac", "is also nodes[2].mac: MAC addresses must be unique"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, errs := labWith(t, tt.extra, tt.edits...)
			requireExactly(t, errs, tt.want)
		})
	}
}

// TestBootFiles: with dhcp proxy or server, network boot serves the node image ISO (boot.nodeISO, by
// default the bundle's) unless boot.kernel and boot.initrd are given together; with CheckFiles a
// missing default says the bundle has no node image, a missing explicit file names its field, a
// kernel without its initramfs (or the reverse) is refused; existing files pass.
func TestBootFiles(t *testing.T) {
	c, _, errs := labWith(t, "", w1MAC...)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if c.Boot.Kernel != "" || c.Boot.Initrd != "" || c.Boot.NodeISO != "/var/cache/appliance/bundle/netboot/node-amd64.iso" {
		t.Errorf("defaults kernel %q initrd %q nodeISO %q, want no kernel or initrd and the bundle's netboot/node-amd64.iso", c.Boot.Kernel, c.Boot.Initrd, c.Boot.NodeISO)
	}

	bundleDir := t.TempDir()
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(kernel, []byte("kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	check := func() ErrorList {
		v := validator{c: c, opts: ValidateOptions{CheckFiles: true}}
		v.bootFiles()
		v.nodeISO()
		return v.errs
	}
	// A bundle without a node image, nothing else given.
	c.Bundle.Path, c.Boot.NodeISO = bundleDir, ""
	SetDefaults(c)
	errs = check()
	requireErr(t, errs, "boot.nodeISO", filepath.Join(bundleDir, DefaultBootNodeISO)+" does not exist, and network boot (boot.dhcp: proxy) serves the node image's kernel, initramfs and root filesystem from inside it: the bundle carries no node image: build it with nodeImage.build: true, give the node image ISO's path (iso/build-node-image.sh: node-amd64.iso), or give boot.kernel and boot.initrd, or set boot.dhcp: off", 0)
	if len(errs) != 1 {
		t.Errorf("errors %v, want boot.nodeISO alone", errs)
	}
	// No bundle, no node ISO.
	c.Boot.NodeISO = ""
	requireErr(t, check(), "boot.nodeISO", "is required: network boot (boot.dhcp: proxy) serves the node image's kernel, initramfs and root filesystem from inside it; give the node image ISO's path, set bundle.path", 0)
	// A kernel without its initramfs, and the other way round.
	c.Boot.Kernel = kernel
	requireErr(t, check(), "boot.initrd", "is required when boot.kernel is set", 0)
	c.Boot.Kernel, c.Boot.Initrd = "", filepath.Join(bundleDir, "absent.img")
	requireErr(t, check(), "boot.kernel", "is required when boot.initrd is set", 0)
	// Both, one absent.
	c.Boot.Kernel = kernel
	errs = check()
	requireErr(t, errs, "boot.initrd", filepath.Join(bundleDir, "absent.img")+" does not exist: create it or fix the path", 0)
	if len(errs) != 1 {
		t.Errorf("errors %v, want boot.initrd alone", errs)
	}
	c.Boot.Kernel, c.Boot.Initrd = kernel, kernel
	if errs := check(); len(errs) > 0 {
		t.Errorf("existing files refused: %v", errs)
	}
	c.Boot.Kernel, c.Boot.Initrd, c.Boot.NodeISO = "", "", kernel
	if errs := check(); len(errs) > 0 {
		t.Errorf("an existing node ISO refused: %v", errs)
	}
}

func TestBootWarnings(t *testing.T) {
	// w1 boots from the network (ipmi, bootDevice pxe by default) but has no mac.
	_, warns, errs := labWith(t, "boot:\n  dhcp: proxy\n")
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	requireErr(t, warns, "nodes[3].mac", `node "w1" boots from the network`, 0)
	requireErr(t, warns, "boot.dhcp", "no node has a mac", 0)

	// The same BMC-powered w1 booting its disk (or virtual media) without a mac: warned too, by field
	// path (the power phase would refuse to power it: it could not enrol).
	_, warns, errs = labWith(t, "boot:\n  dhcp: proxy\n", "    username: admin\n    passwordFile: /var/lib/appliance-lab/bmc/w1.password",
		"    username: admin\n    bootDevice: disk\n    passwordFile: /var/lib/appliance-lab/bmc/w1.password")
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	requireErr(t, warns, "nodes[3].mac", `is empty: node "w1" is powered by its BMC (power.kind ipmi, power.bootDevice disk) and a BMC-booted machine gets its node credential only by enrolling with its boot NIC's MAC, so bootstrap will not power it on; give its boot NIC's MAC`, 0)
}

// TestBootErrorLine: boot errors carry the source line.
func TestBootErrorLine(t *testing.T) {
	data, err := os.ReadFile("testdata/lab.yaml")
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Count(string(data), "\n") + 2 // "boot:" is the first appended line, dhcp the next
	_, _, errs := labWith(t, "boot:\n  dhcp: relay\n")
	requireErr(t, errs, "boot.dhcp", "is not a DHCP mode", line)
}

func TestBootSummary(t *testing.T) {
	off, _, _ := labWith(t, "")
	proxy, _, _ := labWith(t, "", w1MAC...)
	server, _, _ := labWith(t, "boot:\n  dhcp: server\n  interface: ens3\n  range: {start: 10.100.0.200, end: 10.100.0.250}\n", w1MAC...)
	vm := *server
	vm.Nodes = append(slices.Clone(server.Nodes), Node{Name: "n2", MAC: "52:54:00:00:00:31",
		Power: Power{Kind: PowerRedfish, BootDevice: BootCDROM, VirtualMediaImage: "https://10.100.0.2:8443/boot/node.iso"}})
	for _, c := range []struct {
		cfg  *BootstrapConfiguration
		want string
	}{
		{off, "off (boot.dhcp: off)"},
		{&vm, "DHCP server leasing 10.100.0.200-10.100.0.250 (udp 67), TFTP (udp 69) and boot HTTP (tcp 8080) on ens3; the node image /var/cache/appliance/bundle/netboot/node-amd64.iso; answers 1 machine: w1 52:54:00:00:00:21; leases an address only (no boot) to 1 booted from virtual media: n2 52:54:00:00:00:31"},
		{proxy, "proxyDHCP (udp 67, 4011), TFTP (udp 69) and boot HTTP (tcp 8080) on the control-plane interface; the node image /var/cache/appliance/bundle/netboot/node-amd64.iso; answers 1 machine: w1 52:54:00:00:00:21"},
		{server, "DHCP server leasing 10.100.0.200-10.100.0.250 (udp 67), TFTP (udp 69) and boot HTTP (tcp 8080) on ens3; the node image /var/cache/appliance/bundle/netboot/node-amd64.iso; answers 1 machine: w1 52:54:00:00:00:21"},
	} {
		if got := c.cfg.BootSummary(); got != c.want {
			t.Errorf("BootSummary() = %q\nwant %q", got, c.want)
		}
	}
}
