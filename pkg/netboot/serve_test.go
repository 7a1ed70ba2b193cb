package netboot

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pin/tftp/v3"

	"github.com/airgap-appliance/appliance/test/labns"
)

// freePort returns a port that was free on 127.0.0.1 for network ("tcp4" or "udp4").
func freePort(t testing.TB, network string) int {
	t.Helper()
	if network == "udp4" {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// loopbackServer runs the service on 127.0.0.1 (HTTP and TFTP; DHCP off: it needs an interface, see
// the lab tests) with Debian's iPXE files.
func loopbackServer(t *testing.T) (*Server, Config) {
	t.Helper()
	labns.RequireTool(t, "curl")
	if _, err := os.Stat(filepath.Join(DefaultIPXEDir, BootFileBIOS)); err != nil {
		if labns.InCI() {
			t.Fatalf("Debian's ipxe package is missing (%v): make deps", err)
		}
		t.Skipf("Debian's ipxe package is missing (%v): make deps", err)
	}
	c := testConfig(t, ModeOff, nil)
	c.Interface = ""
	c.ServerIP = netip.MustParseAddr("127.0.0.1")
	c.HTTPPort = uint16(freePort(t, "tcp4"))
	c.TFTPPort = freePort(t, "udp4")
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, s.cfg
}

func get(t *testing.T, method, url string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestHTTP(t *testing.T) {
	_, c := loopbackServer(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", c.HTTPPort)
	want := fmt.Sprintf("#!ipxe\necho appliance: network boot of w1 (${netX/mac})\n"+
		"kernel %[1]s/boot/vmlinuz initrd=initrd console=ttyS0 appliance.url=https://10.77.0.1:8443 appliance.ca_pin=sha256:00ff appliance.node=w1\n"+
		"initrd %[1]s/boot/initrd\nboot\n", base)
	for _, mac := range []string{"52:54:00:00:00:21", "52-54-00-00-00-21", "525400000021", "52:54:00:00:00:21.ipxe"} {
		code, body := get(t, "GET", base+"/ipxe/"+mac)
		if code != 200 || body != want {
			t.Errorf("GET /ipxe/%s: %d\n%s\nwant 200\n%s", mac, code, body, want)
		}
	}
	code, body := get(t, "GET", base+"/boot.ipxe")
	if code != 200 || body != "#!ipxe\nchain "+base+"/ipxe/${netX/mac}\n" {
		t.Errorf("GET /boot.ipxe: %d %q", code, body)
	}
	kernel, _ := os.ReadFile(c.Kernel)
	code, body = get(t, "GET", base+"/boot/vmlinuz")
	if code != 200 || body != string(kernel) {
		t.Errorf("GET /boot/vmlinuz: %d, %d bytes, want 200 and %d bytes", code, len(body), len(kernel))
	}
	code, body = get(t, "GET", base+"/boot/initrd", "Range", "bytes=10-19")
	if code != http.StatusPartialContent || body != "IIIIIIIIII" {
		t.Errorf("ranged GET /boot/initrd: %d %q", code, body)
	}
	// Client input never gets a 5xx, and refusals say what to do.
	for _, tt := range []struct {
		method, path string
		code         int
		msg          string
	}{
		{"GET", "/ipxe/52:54:00:99:99:99", 404, "52:54:00:99:99:99 is not in the inventory: add it as nodes[].mac"},
		{"GET", "/ipxe/52:54:00:00:00:11", 404, "52:54:00:00:00:11 is node cp1, which does not boot from the network: give it power.kind ipmi or redfish and power.bootDevice pxe"},
		{"GET", "/ipxe/not-a-mac", 404, `"not-a-mac" is not a MAC address`},
		{"GET", "/ipxe/", 404, "is not a MAC address"},
		{"GET", "/ipxe/" + strings.Repeat("%ff", 300), 404, "is not a MAC address"},
		{"GET", "/ca.crt", 404, "serves only the network-boot artefacts"},
		{"GET", "/boot/../../etc/passwd", 404, ""},
		{"POST", "/ipxe/52:54:00:00:00:21", 405, "use GET"},
		{"PUT", "/boot/vmlinuz", 405, "use GET"},
	} {
		code, body := get(t, tt.method, base+tt.path)
		if code != tt.code || !strings.Contains(body, tt.msg) {
			t.Errorf("%s %s: %d %q, want %d with %q", tt.method, tt.path, code, body, tt.code, tt.msg)
		}
	}
	if strings.Contains(strings.ToLower(want), "token") {
		t.Error("the script carries a token")
	}
}

// TestTFTP fetches the BIOS iPXE with two real TFTP clients (pin/tftp's and curl's) and compares the
// bytes; names outside the boot files and every write are refused.
func TestTFTP(t *testing.T) {
	_, c := loopbackServer(t)
	addr := fmt.Sprintf("127.0.0.1:%d", c.TFTPPort)
	want, err := os.ReadFile(filepath.Join(DefaultIPXEDir, BootFileBIOS))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := tftp.NewClient(addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{BootFileBIOS, BootFileUEFI, BootFileSNP} {
		wt, err := cl.Receive(name, "octet")
		if err != nil {
			t.Fatalf("pin/tftp RRQ %s: %v", name, err)
		}
		var buf bytes.Buffer
		if _, err := wt.WriteTo(&buf); err != nil {
			t.Fatalf("pin/tftp %s: %v", name, err)
		}
		ref, _ := os.ReadFile(filepath.Join(DefaultIPXEDir, name))
		if !bytes.Equal(buf.Bytes(), ref) {
			t.Errorf("pin/tftp %s: %d bytes differ from %d on disk", name, buf.Len(), len(ref))
		}
	}
	out := filepath.Join(t.TempDir(), "undionly.kpxe")
	if b, err := exec.Command("curl", "-sS", "--max-time", "20", "-o", out, "tftp://"+addr+"/"+BootFileBIOS).CombinedOutput(); err != nil {
		t.Fatalf("curl tftp: %v: %s", err, b)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, want) {
		t.Errorf("curl tftp: %d bytes differ from %d on disk", len(got), len(want))
	}
	for _, name := range []string{"vmlinuz", "../ipxe/undionly.kpxe", "/usr/lib/ipxe/undionly.kpxe", "/etc/passwd", "qemu/pxe-virtio.rom", ""} {
		wt, err := cl.Receive(name, "octet")
		if err == nil {
			_, err = wt.WriteTo(io.Discard)
		}
		if err == nil {
			t.Errorf("RRQ %q served, want refused", name)
		}
	}
	rf, err := cl.Send("undionly.kpxe", "octet")
	if err == nil {
		_, err = rf.ReadFrom(bytes.NewReader([]byte("overwrite")))
	}
	if err == nil || !strings.Contains(err.Error(), "does not support write") {
		t.Errorf("WRQ: %v, want refused", err)
	}
	up := filepath.Join(t.TempDir(), "up")
	_ = os.WriteFile(up, []byte("x"), 0o600)
	if b, err := exec.Command("curl", "-sS", "--max-time", "20", "-T", up, "tftp://"+addr+"/new.bin").CombinedOutput(); err == nil {
		t.Errorf("curl tftp upload succeeded, want refused: %s", b)
	}
	if got, _ := os.ReadFile(filepath.Join(DefaultIPXEDir, BootFileBIOS)); !bytes.Equal(got, want) {
		t.Error("undionly.kpxe changed on disk")
	}
}

// FuzzHTTP: no request path or method makes the handler answer 5xx or panic.
func FuzzHTTP(f *testing.F) {
	for _, s := range []string{"/ipxe/52:54:00:00:00:21", "/ipxe/", "/boot.ipxe", "/boot/vmlinuz", "/ipxe/%00", "/x"} {
		f.Add("GET", s)
	}
	kernel, initrd := testKit(f)
	s, err := New(Config{Mode: ModeOff, ServerIP: netip.MustParseAddr("127.0.0.1"), Kernel: kernel, Initrd: initrd,
		Machines: []Machine{{Name: "w1", MAC: macW1}}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		f.Fatal(err)
	}
	h := s.Handler()
	f.Fuzz(func(t *testing.T, method, path string) {
		req, err := http.NewRequest("GET", "http://x/", nil)
		if err != nil {
			t.Skip()
		}
		req.Method = method
		req.URL.Path = path
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %q: %d", method, path, rec.Code)
		}
	})
}
