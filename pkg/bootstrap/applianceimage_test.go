package bootstrap

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// opens counts the open(2)s of path while fn runs, from the kernel's inotify IN_OPEN events (IN_CLOSE
// is watched too: inotify merges an event identical to the one queued before it, so two opens in a
// row would count as one).
func opens(t *testing.T, path string, fn func()) int {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("inotify: %v", err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_OPEN|unix.IN_CLOSE); err != nil {
		t.Fatalf("inotify watch %s: %v", path, err)
	}
	fn()
	n := 0
	buf := make([]byte, 64*unix.SizeofInotifyEvent)
	for {
		r, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			return n
		} else if err != nil {
			t.Fatalf("read inotify events: %v", err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= r; {
			// struct inotify_event (inotify(7)): wd, mask, cookie, len (each 32 bits), then name.
			mask, nameLen := binary.NativeEndian.Uint32(buf[off+4:]), binary.NativeEndian.Uint32(buf[off+12:])
			if mask&unix.IN_OPEN != 0 {
				n++
			}
			off += unix.SizeofInotifyEvent + int(nameLen)
		}
	}
}

// TestApplianceImageReadsTheExecutableOnce: the bundle phase makes the appliance's own image by
// opening its executable once (the layer's digest names the tag; it used to hash the file for the
// tag, then read it again for the layer: 55 MB twice under TCG on the ISO's first boot), and a rerun
// with the same executable does not open it at all (the stamp). The tag is the version and the
// layer digest's first 12 hex digits.
func TestApplianceImageReadsTheExecutableOnce(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "appliance")
	if err := os.WriteFile(bin, []byte(strings.Repeat("\x7fELF and then some bytes\n", 4000)), 0o755); err != nil {
		t.Fatal(err)
	}
	st := &State{StateDir: filepath.Join(dir, "state"), Options: Options{ApplianceBinary: bin}}
	var first, second struct {
		ref string
		err error
	}
	if n := opens(t, bin, func() {
		_, img, _, err := applianceImage(context.Background(), st, false)
		first.ref, first.err = img.Ref, err
	}); first.err != nil || n != 1 {
		t.Fatalf("first run: %d opens of the executable, error %v; want 1 open", n, first.err)
	}
	if !strings.HasPrefix(first.ref, ApplianceImageRepository+":") || len(first.ref) != len(ApplianceImageRepository)+1+len("dev-")+12 {
		t.Errorf("ref %q, want %s:<version>-<12 hex>", first.ref, ApplianceImageRepository)
	}
	if n := opens(t, bin, func() {
		_, img, _, err := applianceImage(context.Background(), st, false)
		second.ref, second.err = img.Ref, err
	}); second.err != nil || n != 0 || second.ref != first.ref {
		t.Errorf("rerun: %d opens, ref %q, error %v; want 0 opens and ref %q", n, second.ref, second.err, first.ref)
	}
	if _, err := os.Stat(filepath.Join(statedir.ApplianceImage(st.StateDir), "layout", "index.json")); err != nil {
		t.Errorf("no layout: %v", err)
	}
}
