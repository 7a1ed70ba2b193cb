package nodeiso

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/nodeiso/nodeisotest"
)

const (
	oldArgs = "appliance.url=https://10.0.0.2:8443 appliance.ca_pin=sha256:" + "00000000000000000000000000000000000000000000000000000000000000aa"
	newArgs = "appliance.url=https://10.100.0.2:8443 appliance.ca_pin=sha256:" + "af52008a7cf06346939121f5ca80154e53f8cb961ae2c7ff15720b177df6ec03"
)

func repoRoot() string { return filepath.Join("..", "..") }

// TestAreaMatchesBuildScript: iso/build-node-image.sh's embed_area writes byte for byte what Area
// returns (its function run by bash), for empty and real arguments.
func TestAreaMatchesBuildScript(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(repoRoot(), "iso", "build-node-image.sh"))
	if err != nil {
		t.Fatal(err)
	}
	fn := regexp.MustCompile(`(?ms)^embed_area\(\) \{.*?^\}\n`).Find(script)
	if fn == nil {
		t.Fatal("no embed_area() in iso/build-node-image.sh")
	}
	for _, args := range []string{"", oldArgs} {
		out := filepath.Join(t.TempDir(), "area")
		cmd := exec.Command("bash", "-c", "set -euo pipefail; die() { echo \"$*\" >&2; exit 1; }\n"+string(fn)+"embed_area \"$1\" \"$2\"", "bash", out, args)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("embed_area: %v\n%s", err, b)
		}
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		want, err := Area(args)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("args %q: the script's area (%d bytes) differs from Area's (%d bytes):\n%q\n%q", args, len(got), len(want), got[:200], want[:200])
		}
	}
}

func TestAreaRefusals(t *testing.T) {
	for _, args := range []string{`a="b"`, `a=$x`, "a=\\b", "a=`x`", "a=\nb", "a=é", strings.Repeat("x", AreaSize)} {
		if _, err := Area(args); !errors.Is(err, ErrArea) {
			t.Errorf("Area(%.20q) = %v, want ErrArea", args, err)
		}
	}
	a, err := Area(newArgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != AreaSize || !bytes.HasPrefix(a, []byte(Magic+`set appliance_args="`+newArgs+"\"\n")) {
		t.Errorf("Area: %d bytes starting %q", len(a), a[:160])
	}
}

// makeISO builds an ISO 9660 image with xorriso (Debian's) holding the embed area written for args
// at /boot/grub/appliance-args.cfg, beside other files (one of 3 MiB, so the area is not near the
// start and Find crosses its 1 MiB chunks).
func makeISO(t *testing.T, args string) string {
	t.Helper()
	area, err := Area(args)
	if err != nil {
		t.Fatal(err)
	}
	iso := filepath.Join(t.TempDir(), "node.iso")
	nodeisotest.Make(t, iso, map[string][]byte{
		"boot/grub/grub.cfg":           []byte("source ${prefix}/appliance-args.cfg\n"),
		"boot/grub/appliance-args.cfg": area,
		"live/aaa-rootfs.squashfs":     bytes.Repeat([]byte("squashfs"), 3<<20/8),
		"live/vmlinuz":                 []byte("kernel"),
		"notes/mentions-the-magic.txt": []byte("x" + Magic), // not at a sector start: ignored
	})
	return iso
}

// TestServeRewritesArea: the image served over HTTP (GET, HEAD, ranges) is the file's bytes with the
// area replaced; xorriso reads the served image's appliance-args.cfg with the new arguments and every
// other file unchanged; the file on disk is never written.
func TestServeRewritesArea(t *testing.T) {
	iso := makeISO(t, oldArgs)
	orig, err := os.ReadFile(iso)
	if err != nil {
		t.Fatal(err)
	}
	im, err := Open(iso, newArgs)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if im.Offset()%2048 != 0 {
		t.Errorf("area at %d, not on a sector", im.Offset())
	}
	if !bytes.HasPrefix(orig[im.Offset():], []byte(Magic+`set appliance_args="`+oldArgs)) {
		t.Fatalf("Offset %d does not hold the built area", im.Offset())
	}
	srv := httptest.NewServer(im)
	defer srv.Close()

	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	served, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET: %s %v", resp.Status, err)
	}
	if len(served) != len(orig) || resp.Header.Get("Content-Length") != fmt.Sprint(len(orig)) || resp.Header.Get("Accept-Ranges") != "bytes" {
		t.Fatalf("GET: %d bytes, Content-Length %s, Accept-Ranges %q; the file has %d", len(served), resp.Header.Get("Content-Length"), resp.Header.Get("Accept-Ranges"), len(orig))
	}
	want := append([]byte{}, orig...)
	area, _ := Area(newArgs)
	copy(want[im.Offset():], area)
	if !bytes.Equal(served, want) {
		t.Fatal("the served image is not the file with the area replaced")
	}
	servedISO := filepath.Join(t.TempDir(), "served.iso")
	if err := os.WriteFile(servedISO, served, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := nodeisotest.Extract(t, servedISO, "/boot/grub/appliance-args.cfg"); !bytes.Equal(got, area) {
		t.Errorf("xorriso reads appliance-args.cfg from the served image as %q…, want the new area", got[:120])
	}
	if got := nodeisotest.Extract(t, servedISO, "/live/vmlinuz"); string(got) != "kernel" {
		t.Errorf("live/vmlinuz from the served image: %q", got)
	}
	if now, _ := os.ReadFile(iso); !bytes.Equal(now, orig) {
		t.Error("the ISO file on disk changed")
	}

	// Ranges straddling the area's start and end, and one inside it, as a BMC streaming the CD asks.
	for _, r := range [][2]int64{{im.Offset() - 100, im.Offset() + 50}, {im.Offset() + AreaSize - 10, im.Offset() + AreaSize + 10}, {im.Offset() + 200, im.Offset() + 300}, {0, 2047}} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", r[0], r[1]))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(b, want[r[0]:r[1]+1]) {
			t.Errorf("Range %d-%d: %s, %d bytes, match %v", r[0], r[1], resp.Status, len(b), bytes.Equal(b, want[r[0]:r[1]+1]))
		}
	}
	resp, err = http.Head(srv.URL)
	if err != nil || resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(orig)) {
		t.Errorf("HEAD: %v %v length %d", resp.Status, err, resp.ContentLength)
	}
	resp, err = http.Post(srv.URL, "text/plain", strings.NewReader("x"))
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %v %v, want 405", resp.Status, err)
	}
}

// TestOpenRefusals: an image that is not ISO 9660, an ISO without the area, one whose area file is not
// an area (wrong size, no magic line), a cut-short image and a directory are refused with ErrArea or a
// plain error naming the path.
func TestOpenRefusals(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain.iso")
	if err := os.WriteFile(plain, bytes.Repeat([]byte{0}, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(plain, newArgs); !errors.Is(err, ErrArea) || !errors.Is(err, ErrNotISO) || !strings.Contains(err.Error(), plain) || !strings.Contains(err.Error(), "none found") {
		t.Errorf("not ISO 9660: %v", err)
	}
	noArea := filepath.Join(dir, "no-area.iso")
	nodeisotest.Make(t, noArea, map[string][]byte{"live/vmlinuz": []byte("kernel")})
	if _, err := Open(noArea, newArgs); !errors.Is(err, ErrArea) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no area file: %v", err)
	}
	area, _ := Area("")
	for name, b := range map[string][]byte{
		"short":    area[:2048],
		"no magic": append([]byte("X"), area[1:]...),
	} {
		iso := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".iso")
		nodeisotest.Make(t, iso, map[string][]byte{"boot/grub/appliance-args.cfg": b})
		if _, err := Open(iso, newArgs); !errors.Is(err, ErrArea) {
			t.Errorf("area file %s: %v, want ErrArea", name, err)
		}
	}
	good := makeISO(t, oldArgs)
	b, _ := os.ReadFile(good)
	im, err := Open(good, newArgs)
	if err != nil {
		t.Fatal(err)
	}
	im.Close()
	cut := filepath.Join(dir, "cut.iso")
	if err := os.WriteFile(cut, b[:im.Offset()+100], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(cut, newArgs); !errors.Is(err, ErrArea) || !errors.Is(err, ErrCut) {
		t.Errorf("cut short: %v", err)
	}
	if _, err := Open(dir, newArgs); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
	if _, err := Open(good, `a="b"`); !errors.Is(err, ErrArea) {
		t.Errorf("bad arguments: %v", err)
	}
}

// TestLocate: the extents Locate gives hold exactly the files xorriso wrote, by their Rock Ridge names;
// an extent past the image's end is ErrCut; a missing file and a directory are fs.ErrNotExist.
func TestLocate(t *testing.T) {
	files := map[string][]byte{
		"live/vmlinuz":             []byte("the kernel"),
		"live/initrd.img":          bytes.Repeat([]byte("initramfs"), 5000),
		"live/rootfs.squashfs":     bytes.Repeat([]byte("squashfs"), 3<<20/8),
		"boot/grub/Mixed-Case.cfg": []byte("names as Rock Ridge keeps them"),
	}
	iso := filepath.Join(t.TempDir(), "node.iso")
	nodeisotest.Make(t, iso, files)
	f, err := os.Open(iso)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	size := st.Size()
	for name, want := range files {
		e, err := Locate(f, size, "/"+name)
		if err != nil {
			t.Errorf("Locate %s: %v", name, err)
			continue
		}
		got := make([]byte, e.Size)
		if _, err := f.ReadAt(got, e.Offset); err != nil || !bytes.Equal(got, want) || e.Offset%2048 != 0 {
			t.Errorf("%s: extent %+v (%v) does not hold the file", name, e, err)
		}
	}
	// The image as a truncated copy would be: the root filesystem's extent runs past its end.
	rootfs, err := Locate(f, size, "/live/rootfs.squashfs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Locate(f, rootfs.Offset+rootfs.Size-1, "/live/rootfs.squashfs"); !errors.Is(err, ErrCut) {
		t.Errorf("Locate in a cut image: %v, want ErrCut", err)
	}
	for _, name := range []string{"/live/missing", "/live", "/nothing/here"} {
		if _, err := Locate(f, size, name); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Locate %s: %v, want fs.ErrNotExist", name, err)
		}
	}
}
