package netboot

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/airgap-appliance/appliance/test/logbuf"
)

var (
	macW1      = mustMAC("52:54:00:00:00:21")
	macW2      = mustMAC("52:54:00:00:00:22")
	macUnknown = mustMAC("52:54:00:99:99:99")
)

func mustMAC(s string) net.HardwareAddr {
	hw, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return hw
}

// syncBuffer is a log sink safe for concurrent writers (test/logbuf).
type syncBuffer = logbuf.Buffer

// testKit writes a stand-in kernel and initrd (bytes, not bootable: the QEMU test boots a real one).
func testKit(t testing.TB) (kernel, initrd string) {
	dir := t.TempDir()
	kernel, initrd = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd")
	if err := os.WriteFile(kernel, bytes.Repeat([]byte("K"), 100_000), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(initrd, bytes.Repeat([]byte("I"), 50_000), 0o644); err != nil {
		t.Fatal(err)
	}
	return kernel, initrd
}

func testConfig(t testing.TB, mode Mode, log *syncBuffer) Config {
	kernel, initrd := testKit(t)
	c := Config{
		Mode: mode, Interface: "nb0", ServerIP: netip.MustParseAddr("10.77.0.1"), HTTPPort: 8080,
		Subnet: netip.MustParsePrefix("10.77.0.0/24"), RangeStart: netip.MustParseAddr("10.77.0.100"),
		RangeEnd: netip.MustParseAddr("10.77.0.101"), Router: netip.MustParseAddr("10.77.0.254"),
		Machines: []Machine{{Name: "w1", MAC: macW1}, {Name: "w2", MAC: macW2}},
		Others:   []Machine{{Name: "cp1", MAC: mustMAC("52:54:00:00:00:11")}},
		Kernel:   kernel, Initrd: initrd,
		KernelArgs: []string{"console=ttyS0", "appliance.url=https://10.77.0.1:8443", "appliance.ca_pin=sha256:00ff"},
	}
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if log != nil {
		c.Logger = slog.New(slog.NewTextHandler(log, nil))
	}
	return c
}

func newResponder(t testing.TB, mode Mode, log *syncBuffer) *dhcpResponder {
	c, err := testConfig(t, mode, log).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return newDHCPResponder(c)
}

// pxeOptions are the options a PXE ROM puts in its DISCOVER and REQUEST: option 60 PXEClient,
// option 93 arch, option 97 client UUID (PXE 2.1 §2.2.1), then extra.
func pxeOptions(arch iana.Arch, extra ...dhcpv4.Modifier) []dhcpv4.Modifier {
	return append([]dhcpv4.Modifier{
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(arch)),
		dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, append([]byte{0}, bytes.Repeat([]byte{0xab}, 16)...)),
	}, extra...)
}

// pxeDiscover is a DISCOVER as a PXE ROM sends it (pxeOptions).
func pxeDiscover(t testing.TB, mac net.HardwareAddr, arch iana.Arch, extra ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	m, err := dhcpv4.NewDiscovery(mac, pxeOptions(arch, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func asRequest(t testing.TB, offer *dhcpv4.DHCPv4, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	r, err := dhcpv4.NewRequestFromOffer(offer, mods...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var ipxeUserClass = dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE"))

func TestRespondProxy(t *testing.T) {
	r := newResponder(t, ModeProxy, nil)
	tests := []struct {
		name     string
		mac      net.HardwareAddr
		opts     []dhcpv4.Modifier
		wantFile string // "" = no reply
	}{
		{"BIOS", macW1, pxeOptions(iana.INTEL_X86PC), BootFileBIOS},
		{"UEFI x86-64 (7)", macW1, pxeOptions(iana.EFI_X86_64), BootFileUEFI},
		{"UEFI BC (9)", macW2, pxeOptions(iana.EFI_BC), BootFileUEFI},
		{"iPXE by user class", macW1, pxeOptions(iana.INTEL_X86PC, ipxeUserClass), "http://10.77.0.1:8080/ipxe/52:54:00:00:00:21"},
		{"iPXE by user class, RFC 3004 form", macW2, pxeOptions(iana.EFI_X86_64, dhcpv4.WithUserClass("iPXE", true)), "http://10.77.0.1:8080/ipxe/52:54:00:00:00:22"},
		{"iPXE by option 175", macW1, pxeOptions(iana.EFI_BC, dhcpv4.WithGeneric(dhcpv4.GenericOptionCode(optIPXEEncap), []byte{0xb1, 1, 1})), "http://10.77.0.1:8080/ipxe/52:54:00:00:00:21"},
		{"unknown MAC", macUnknown, pxeOptions(iana.INTEL_X86PC), ""},
		{"no iPXE for IA32 EFI (6)", macW1, pxeOptions(iana.EFI_IA32), ""},
		{"not a PXE client", macW1, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := dhcpv4.NewDiscovery(tt.mac, tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			offer, why := r.respond(req, netip.Addr{})
			if tt.wantFile == "" {
				if offer != nil {
					t.Fatalf("got %s, want silence", offer.Summary())
				}
				return
			}
			if offer == nil {
				t.Fatalf("no reply: %s", why)
			}
			checkProxyReply(t, offer, dhcpv4.MessageTypeOffer, tt.wantFile)
			ack, why := r.respond(asRequest(t, offer, tt.opts...), netip.Addr{})
			if ack == nil {
				t.Fatalf("no ACK: %s", why)
			}
			checkProxyReply(t, ack, dhcpv4.MessageTypeAck, tt.wantFile)
		})
	}
}

func checkProxyReply(t *testing.T, m *dhcpv4.DHCPv4, typ dhcpv4.MessageType, file string) {
	t.Helper()
	if m.MessageType() != typ {
		t.Errorf("type %s, want %s", m.MessageType(), typ)
	}
	if !m.YourIPAddr.IsUnspecified() {
		t.Errorf("proxy reply offers address %s, want 0.0.0.0", m.YourIPAddr)
	}
	if m.Options.Has(dhcpv4.OptionIPAddressLeaseTime) || m.Options.Has(dhcpv4.OptionSubnetMask) {
		t.Errorf("proxy reply carries lease options: %s", m.Summary())
	}
	if m.BootFileName != file || m.BootFileNameOption() != file {
		t.Errorf("boot file %q / option 67 %q, want %q", m.BootFileName, m.BootFileNameOption(), file)
	}
	if !m.ServerIPAddr.Equal(net.ParseIP("10.77.0.1")) || !m.ServerIdentifier().Equal(net.ParseIP("10.77.0.1")) {
		t.Errorf("siaddr %s, server id %s, want 10.77.0.1", m.ServerIPAddr, m.ServerIdentifier())
	}
	if m.ClassIdentifier() != "PXEClient" {
		t.Errorf("option 60 %q, want PXEClient", m.ClassIdentifier())
	}
	if got := m.Options.Get(dhcpv4.OptionVendorSpecificInformation); !bytes.Equal(got, pxeVendorOptions) {
		t.Errorf("option 43 %x, want %x", got, pxeVendorOptions)
	}
	if len(m.Options.Get(dhcpv4.OptionClientMachineIdentifier)) != 17 {
		t.Errorf("option 97 (client UUID) not echoed")
	}
}

func TestRespondServer(t *testing.T) {
	r := newResponder(t, ModeServer, nil)
	offer, why := r.respond(pxeDiscover(t, macW1, iana.INTEL_X86PC), netip.Addr{})
	if offer == nil {
		t.Fatalf("no offer: %s", why)
	}
	if offer.YourIPAddr.String() != "10.77.0.100" || offer.SubnetMask().String() != "ffffff00" || offer.BootFileName != BootFileBIOS {
		t.Fatalf("offer %s", offer.Summary())
	}
	if rt := offer.Router(); len(rt) != 1 || rt[0].String() != "10.77.0.254" {
		t.Errorf("router %v", rt)
	}
	if lt := offer.IPAddressLeaseTime(0); lt != DefaultLeaseTime {
		t.Errorf("lease time %s", lt)
	}
	ack, why := r.respond(asRequest(t, offer), netip.Addr{})
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || ack.YourIPAddr.String() != "10.77.0.100" {
		t.Fatalf("ACK %v (%s)", ack, why)
	}
	// The same machine again (iPXE's own DHCP) keeps its address and now gets the script URL.
	again, _ := r.respond(pxeDiscover(t, macW1, iana.INTEL_X86PC, ipxeUserClass), netip.Addr{})
	if again == nil || again.YourIPAddr.String() != "10.77.0.100" || !strings.HasPrefix(again.BootFileName, "http://10.77.0.1:8080/ipxe/") {
		t.Fatalf("iPXE offer %v", again)
	}
	// A plain (non-PXE) DHCP client of the inventory gets an address without boot options.
	plain, _ := dhcpv4.NewDiscovery(macW2)
	o2, why := r.respond(plain, netip.Addr{})
	if o2 == nil || o2.YourIPAddr.String() != "10.77.0.101" || o2.BootFileName != "" || o2.Options.Has(dhcpv4.OptionBootfileName) {
		t.Fatalf("plain offer %v (%s)", o2, why)
	}
	// A REQUEST for an address leased to another machine is NAKed.
	steal := asRequest(t, offer)
	steal.ClientHWAddr = macW2
	nak, _ := r.respond(steal, netip.Addr{})
	if nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("REQUEST for w1's address by w2: %v, want NAK", nak)
	}
	// A REQUEST naming another server releases the offer.
	other := asRequest(t, o2)
	other.UpdateOption(dhcpv4.OptServerIdentifier(net.ParseIP("10.77.0.9")))
	if m, _ := r.respond(other, netip.Addr{}); m != nil {
		t.Fatalf("REQUEST for another server answered: %s", m.Summary())
	}
	if _, ok := r.leases[macW2.String()]; ok {
		t.Error("w2's offer not released after it chose another server")
	}
}

// TestRespondAddressOnly: in ModeServer a machine booted from virtual media (Config.AddressOnly)
// gets a lease, also when its firmware asks as a PXE client, but never boot options, and no script;
// a proxy refuses such machines at New.
func TestRespondAddressOnly(t *testing.T) {
	macN2 := mustMAC("52:54:00:00:00:31")
	c := testConfig(t, ModeServer, nil)
	c.AddressOnly = []Machine{{Name: "n2", MAC: macN2}}
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := dhcpv4.NewDiscovery(macN2)
	for _, req := range []*dhcpv4.DHCPv4{plain, pxeDiscover(t, macN2, iana.INTEL_X86PC)} {
		o, why := s.dhcp.respond(req, netip.Addr{})
		if o == nil || o.YourIPAddr.String() != "10.77.0.100" || o.BootFileName != "" || o.Options.Has(dhcpv4.OptionBootfileName) ||
			o.Options.Has(dhcpv4.OptionClassIdentifier) || why != "OFFER to n2 (address only)" {
			t.Fatalf("offer to the address-only n2: %v (%s)", o, why)
		}
		ack, why := s.dhcp.respond(asRequest(t, o), netip.Addr{})
		if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || ack.YourIPAddr.String() != "10.77.0.100" || ack.BootFileName != "" {
			t.Fatalf("ACK to n2: %v (%s)", ack, why)
		}
	}
	if _, ok := s.Script(macN2); ok {
		t.Error("the address-only n2 has a boot script")
	}
	rec := httptest.NewRecorder()
	s.serveScript(rec, httptest.NewRequest(http.MethodGet, ScriptPath+macN2.String(), nil))
	if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "boots from virtual media") {
		t.Errorf("n2's script: %d %q", rec.Code, rec.Body.String())
	}
	c.Mode = ModeProxy
	if _, err := New(c); err == nil || !strings.Contains(err.Error(), "AddressOnly machines need ModeServer") {
		t.Errorf("AddressOnly in proxy mode: %v", err)
	}
	c.Mode = ModeServer
	c.AddressOnly = []Machine{{Name: "n2", MAC: macW1}}
	if _, err := New(c); err == nil || !strings.Contains(err.Error(), "is both") {
		t.Errorf("an AddressOnly MAC that is also a machine's: %v", err)
	}
}

func TestRespondServerExhausted(t *testing.T) {
	c := testConfig(t, ModeServer, nil)
	c.RangeEnd = c.RangeStart
	c, err := c.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r := newDHCPResponder(c)
	if o, _ := r.respond(pxeDiscover(t, macW1, iana.INTEL_X86PC), netip.Addr{}); o == nil {
		t.Fatal("no offer for the first machine")
	}
	o, why := r.respond(pxeDiscover(t, macW2, iana.INTEL_X86PC), netip.Addr{})
	if o != nil || !strings.Contains(why, "exhausted") {
		t.Fatalf("second machine: %v, %q; want silence because the range is exhausted", o, why)
	}
}

// TestUnknownMACLoggedOnce: an unknown MAC is logged once, however many packets it sends.
func TestUnknownMACLoggedOnce(t *testing.T) {
	var log syncBuffer
	r := newResponder(t, ModeProxy, &log)
	for range 5 {
		if m, _ := r.respond(pxeDiscover(t, macUnknown, iana.INTEL_X86PC), netip.Addr{}); m != nil {
			t.Fatal("answered an unknown MAC")
		}
	}
	other := mustMAC("52:54:00:99:99:98")
	r.respond(pxeDiscover(t, other, iana.INTEL_X86PC), netip.Addr{})
	if n := strings.Count(log.String(), "mac="+macUnknown.String()); n != 1 {
		t.Errorf("unknown MAC logged %d times, want once:\n%s", n, log.String())
	}
	if n := strings.Count(log.String(), "not in the inventory"); n != 2 {
		t.Errorf("%d log lines for two unknown MACs, want 2:\n%s", n, log.String())
	}
}

// TestOtherNodeLoggedByName: a node of the inventory that does not boot from the network
// (Config.Others) gets no answer either, and its one log line names it and what to change.
func TestOtherNodeLoggedByName(t *testing.T) {
	var log syncBuffer
	c := testConfig(t, ModeProxy, &log)
	c.Others = []Machine{{Name: "cp1", MAC: macUnknown}}
	c, err := c.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r := newDHCPResponder(c)
	for range 3 {
		if m, _ := r.respond(pxeDiscover(t, macUnknown, iana.INTEL_X86PC), netip.Addr{}); m != nil {
			t.Fatalf("answered cp1, which does not boot from the network: %s", m.Summary())
		}
	}
	if n := strings.Count(log.String(), "node=cp1"); n != 1 || !strings.Contains(log.String(), "power.bootDevice pxe") || strings.Contains(log.String(), "not in the inventory") {
		t.Errorf("want one line naming cp1 and power.bootDevice pxe:\n%s", log.String())
	}
}

func TestConfigRefused(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"token in kernel args", func(c *Config) { c.KernelArgs = append(c.KernelArgs, "appliance.token=abc") }, `"appliance.token" looks like a secret`},
		{"password in kernel args", func(c *Config) { c.KernelArgs = append(c.KernelArgs, "bmc_password=x") }, "looks like a secret"},
		{"space in an arg", func(c *Config) { c.KernelArgs = append(c.KernelArgs, "a=b c") }, "white space"},
		{"bad mode", func(c *Config) { c.Mode = "relay" }, `Mode "relay"`},
		{"no server IP", func(c *Config) { c.ServerIP = netip.Addr{} }, "ServerIP"},
		{"no interface", func(c *Config) { c.Interface = "" }, "Interface is required"},
		{"no kernel", func(c *Config) { c.Kernel = "" }, "Kernel is required"},
		{"missing initrd", func(c *Config) { c.Initrd = "/nonexistent/initrd" }, "Initrd /nonexistent/initrd is not a readable regular file"},
		{"range outside subnet", func(c *Config) { c.Mode = ModeServer; c.RangeEnd = netip.MustParseAddr("10.78.0.1") }, "not inside Subnet"},
		{"duplicate MAC", func(c *Config) { c.Machines = append(c.Machines, Machine{Name: "w3", MAC: macW1}) }, `is both "w1" and "w3"`},
		{"MAC booting and not", func(c *Config) { c.Others = []Machine{{Name: "cp1", MAC: macW2}} }, `is both "w2" and "cp1"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig(t, ModeProxy, nil)
			tt.edit(&c)
			_, err := New(c)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New: %v, want ErrConfig with %q", err, tt.want)
			}
		})
	}
}

// FuzzRespond: no packet a client can send makes the responder panic, and no reply offers an address
// in proxy mode or outside the range in server mode.
func FuzzRespond(f *testing.F) {
	f.Add(pxeDiscover(f, macW1, iana.INTEL_X86PC).ToBytes())
	f.Add(pxeDiscover(f, macW2, iana.EFI_X86_64, ipxeUserClass).ToBytes())
	req, _ := dhcpv4.NewRequestFromOffer(pxeDiscover(f, macW1, iana.EFI_BC))
	f.Add(req.ToBytes())
	proxy, server := newResponder(f, ModeProxy, nil), newResponder(f, ModeServer, nil)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := dhcpv4.FromBytes(b)
		if err != nil {
			return
		}
		if r, _ := proxy.respond(m, netip.Addr{}); r != nil && !r.YourIPAddr.IsUnspecified() {
			t.Fatalf("proxy reply offers %s", r.YourIPAddr)
		}
		if r, _ := server.respond(m, netip.Addr{}); r != nil && r.MessageType() != dhcpv4.MessageTypeNak {
			a, _ := netip.AddrFromSlice(r.YourIPAddr.To4())
			if a.Less(server.cfg.RangeStart) || server.cfg.RangeEnd.Less(a) {
				t.Fatalf("server reply offers %s outside the range", r.YourIPAddr)
			}
		}
	})
}
