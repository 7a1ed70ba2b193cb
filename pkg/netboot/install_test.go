package netboot

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/nodeiso/nodeisotest"
)

// TestNodeImageScriptAndInstallMark: with RootFS set, the served script carries the node image's
// arguments (root filesystem URL and SHA-256, initrd URL, BOOTIF and ip= from iPXE's settings, the
// machine's own arguments) and the root filesystem is served; the install notice (NoteInstalled, what
// the HTTPS agent API passes on) marks the machine, after which its script boots the disk;
// ClearInstalled (appliance node reinstall) makes it network-boot again. The boot port's plain HTTP
// takes no notice at all (the old unauthenticated POST /installed/MAC is 404 and marks nothing), and
// NoteInstalled refuses another node's MAC, a MAC outside the inventory and a non-MAC, naming what to
// fix.
func TestNodeImageScriptAndInstallMark(t *testing.T) {
	c := testConfig(t, ModeOff, nil)
	c.Interface = ""
	dir := t.TempDir()
	c.RootFS = filepath.Join(dir, "rootfs.squashfs")
	rootfs := []byte("a node image root filesystem")
	if err := os.WriteFile(c.RootFS, rootfs, 0o644); err != nil {
		t.Fatal(err)
	}
	c.StateDir = filepath.Join(dir, "state")
	c.Machines[0].KernelArgs = []string{"appliance.rootdevice.serialNumber=NODE-DISK-1"}
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	get := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	sum := sha256.Sum256(rootfs)
	code, script := get("GET", ScriptPath+macW1.String())
	for _, want := range []string{
		"appliance.rootfs=http://10.77.0.1:8080" + RootFSPath,
		"appliance.rootfs_sha256=" + hex.EncodeToString(sum[:]),
		"appliance.initrd=http://10.77.0.1:8080" + InitrdPath,
		"BOOTIF=01-${netX/mac:hexhyp}", "appliance.ip=${netX/ip}::${netX/gateway}:${netX/netmask}",
		"appliance.rootdevice.serialNumber=NODE-DISK-1", "appliance.node=w1",
	} {
		if code != 200 || !strings.Contains(script, want) {
			t.Errorf("script of w1 (%d) lacks %q:\n%s", code, want, script)
		}
	}
	if _, s2 := get("GET", ScriptPath+macW2.String()); strings.Contains(s2, "rootdevice") {
		t.Errorf("w2's script carries w1's hints:\n%s", s2)
	}
	if code, body := get("GET", RootFSPath); code != 200 || body != string(rootfs) {
		t.Errorf("GET %s: %d %q", RootFSPath, code, body)
	}

	// The install notice: never over the boot port's plain HTTP.
	for _, m := range []string{"POST", "GET"} {
		if code, body := get(m, "/installed/"+macW1.String()); code != 404 {
			t.Errorf("%s /installed/%s on the boot port: %d %q, want 404 (the notice goes over the HTTPS agent API)", m, macW1, code, body)
		}
	}
	for _, tc := range []struct {
		node, mac string
		want      error
		says      string
	}{
		{"w1", macW2.String(), agentapi.ErrInstallNoticeRefused, "is node w2's nodes[].mac, and this token is node w1's"},
		{"w1", "52:54:00:99:99:99", agentapi.ErrInstallNoticeRefused, "is not node w1's nodes[].mac (52:54:00:00:00:21)"},
		{"w1", "not-a-mac", agentapi.ErrInstallNoticeRefused, `mac "not-a-mac" is not a MAC address`},
		{"cp1", "52:54:00:00:00:11", agentapi.ErrInstallNoticeNotServed, "node cp1 is not network-booted by this appliance"},
	} {
		err := s.NoteInstalled(tc.node, agentapi.InstallNotice{MAC: tc.mac}, "10.77.0.50:4000")
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("NoteInstalled(%s, %s) = %v, want %v saying %q", tc.node, tc.mac, err, tc.want, tc.says)
		}
	}
	for _, n := range []string{"w1", "w2"} {
		if _, ok, _ := InstalledMark(c.StateDir, n); ok {
			t.Fatalf("%s marked installed before its own notice", n)
		}
	}
	if err := s.NoteInstalled("w1", agentapi.InstallNotice{MAC: strings.ReplaceAll(macW1.String(), ":", "-")}, "10.77.0.50:4000"); err != nil {
		t.Fatalf("w1's own install notice: %v", err)
	}
	mark, ok, err := InstalledMark(c.StateDir, "w1")
	if err != nil || !ok || mark.MAC != macW1.String() {
		t.Fatalf("mark after the notice: %+v, %v, %v", mark, ok, err)
	}
	if st, err := os.Stat(filepath.Join(c.StateDir, "installed", "w1.json")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("mark file: %v, %v; want mode 0600", st, err)
	}
	_, script = get("GET", ScriptPath+macW1.String())
	if !strings.Contains(script, "sanboot --no-describe --drive 0x80 || exit") || strings.Contains(script, "kernel ") {
		t.Errorf("installed w1's script does not boot the disk:\n%s", script)
	}
	if _, s2 := get("GET", ScriptPath+macW2.String()); !strings.Contains(s2, "kernel ") {
		t.Errorf("w2 (not installed) no longer network-boots:\n%s", s2)
	}
	had, err := ClearInstalled(c.StateDir, "w1")
	if err != nil || !had {
		t.Fatalf("ClearInstalled = %v, %v", had, err)
	}
	if _, script = get("GET", ScriptPath+macW1.String()); !strings.Contains(script, "appliance.rootfs=") {
		t.Errorf("after the reinstall request w1 does not network-boot the image:\n%s", script)
	}
	if had, err := ClearInstalled(c.StateDir, "w1"); had || err != nil {
		t.Errorf("second ClearInstalled = %v, %v; want false, nil", had, err)
	}
}

// TestNodeImageConfigRefusals: a missing RootFS and a secret-looking machine argument are refused
// with ErrConfig, naming them.
func TestNodeImageConfigRefusals(t *testing.T) {
	c := testConfig(t, ModeOff, nil)
	c.Interface = ""
	c.RootFS = filepath.Join(t.TempDir(), "missing.squashfs")
	if _, err := New(c); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "RootFS") {
		t.Errorf("missing RootFS: %v", err)
	}
	c = testConfig(t, ModeOff, nil)
	c.Interface = ""
	c.Machines[1].KernelArgs = []string{"appliance.token=abc"}
	if _, err := New(c); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), `machine "w2"`) || !strings.Contains(err.Error(), "looks like a secret") {
		t.Errorf("secret machine argument: %v", err)
	}
}

// TestNodeImageFromISO: with Config.ISO the kernel, initramfs and root filesystem are served from
// inside the node image ISO (built here by xorriso, a writer that is not ours), byte for byte, with
// Range; the script's rootfs hash is the squashfs's. An ISO without one of the three, or one given
// beside Kernel, is refused naming what to fix.
func TestNodeImageFromISO(t *testing.T) {
	files := map[string][]byte{
		"live/vmlinuz":         []byte("the node image kernel"),
		"live/initrd.img":      bytes.Repeat([]byte("initramfs"), 4000),
		"live/rootfs.squashfs": bytes.Repeat([]byte("squashfs"), 1<<20/8),
	}
	iso := filepath.Join(t.TempDir(), "node-amd64.iso")
	nodeisotest.Make(t, iso, files)
	c := testConfig(t, ModeOff, nil)
	c.Interface, c.Kernel, c.Initrd, c.ISO = "", "", "", iso
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	get := func(path, rng string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, ts.URL+path, nil)
		if rng != "" {
			req.Header.Set("Range", rng)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for path, name := range map[string]string{KernelPath: "live/vmlinuz", InitrdPath: "live/initrd.img", RootFSPath: "live/rootfs.squashfs"} {
		if code, b := get(path, ""); code != 200 || !bytes.Equal(b, files[name]) {
			t.Errorf("GET %s: %d, %d bytes; want %s's %d bytes", path, code, len(b), name, len(files[name]))
		}
	}
	if code, b := get(RootFSPath, "bytes=8-15"); code != http.StatusPartialContent || string(b) != "squashfs" {
		t.Errorf("Range of the root filesystem: %d %q", code, b)
	}
	sum := sha256.Sum256(files["live/rootfs.squashfs"])
	if _, script := get(ScriptPath+macW1.String(), ""); !strings.Contains(string(script), "appliance.rootfs_sha256="+hex.EncodeToString(sum[:])) {
		t.Errorf("the script does not carry the squashfs's hash:\n%s", script)
	}

	noRootFS := filepath.Join(t.TempDir(), "kernel-only.iso")
	nodeisotest.Make(t, noRootFS, map[string][]byte{"live/vmlinuz": files["live/vmlinuz"], "live/initrd.img": files["live/initrd.img"]})
	c.ISO = noRootFS
	if _, err := New(c); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "/live/rootfs.squashfs") {
		t.Errorf("an ISO without the root filesystem: %v", err)
	}
	c.ISO, c.Kernel = iso, iso
	if _, err := New(c); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "not both") {
		t.Errorf("ISO beside Kernel: %v", err)
	}
}
