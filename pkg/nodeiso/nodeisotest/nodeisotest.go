// Package nodeisotest builds and reads ISO 9660 images with Debian's xorriso for the tests of
// pkg/nodeiso and of what serves it (pkg/applianced): a writer and a reader that are not ours.
package nodeisotest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Make writes at iso an ISO 9660 image (Rock Ridge, volume label APPLNODE as the node image's) holding
// files (slash-separated paths relative to the image's root → contents). Fails the test when
// xorriso is missing (Debian package xorriso, `make deps`) or fails.
func Make(t testing.TB, iso string, files map[string][]byte) {
	t.Helper()
	if _, err := exec.LookPath("xorriso"); err != nil {
		t.Fatalf("xorriso (Debian package xorriso, make deps): %v", err)
	}
	root := t.TempDir()
	for name, b := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(iso), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("xorriso", "-as", "mkisofs", "-quiet", "-R", "-V", "APPLNODE", "-o", iso, root).CombinedOutput(); err != nil {
		t.Fatalf("xorriso -as mkisofs: %v\n%s", err, out)
	}
}

// Extract reads the file at path (absolute inside the image: "/boot/grub/grub.cfg") out of the ISO
// image file iso with xorriso.
func Extract(t testing.TB, iso, path string) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "extracted")
	if b, err := exec.Command("xorriso", "-osirrox", "on", "-indev", iso, "-extract", path, out).CombinedOutput(); err != nil {
		t.Fatalf("xorriso -extract %s: %v\n%s", path, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
