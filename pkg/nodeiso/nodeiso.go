// Package nodeiso reads and serves the node image's ISO (iso/build-node-image.sh: node-amd64.iso,
// the one form of the node image a bundle carries): served whole over HTTPS as what a Redfish BMC
// inserts as virtual media, with one appliance's kernel arguments in it written at serve time; and
// read for the files network boot serves (the kernel, the initramfs and the root filesystem under
// /live), which are byte ranges of the same file.
//
// ISO 9660 (ECMA-119) stores a file's data uncompressed in one contiguous extent that starts on a
// 2048-byte sector; Locate finds a file's extent through the image's directory records (with Rock
// Ridge names), read by github.com/kdomanski/iso9660, the one package here that parses ISO 9660.
//
// The ISO carries an embed area, as coreos-installer's `iso kargs modify` does for CoreOS live ISOs:
// the file AreaFile, AreaSize bytes starting with the line Magic, which the ISO's GRUB menu sources
// before it boots the kernel. Serving the ISO with the area replaced needs neither xorriso nor a copy
// of the image: every read is the file's bytes, with the area's range taken from Area(args) instead.
// GRUB reads the file at boot through its ISO 9660 driver (BIOS and UEFI alike), so nothing else in
// the image changes and nothing in it is checksummed over the area.
//
// Area layout (AreaSize bytes, ASCII):
//
//	# appliance node ISO kernel arguments, v1 (…)\n          Magic
//	set appliance_args="appliance.url=… appliance.ca_pin=…"\n
//	##…##\n                                                  padding lines of '#' up to AreaSize
package nodeiso

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kdomanski/iso9660"
)

// Path is the URL path `appliance serve` serves the node image ISO at, over HTTPS on server.port
// (what power.virtualMediaImage names: https://APPLIANCE:8443/boot/node.iso).
const Path = "/boot/node.iso"

// Magic is the embed area's first line. iso/build-node-image.sh writes the same bytes.
const Magic = "# appliance node ISO kernel arguments, v1 (appliance serve rewrites this file)\n"

// AreaSize is the embed area's size in bytes: two ISO 9660 sectors.
const AreaSize = 4096

// ErrArea: the image has no embed area (not a node image ISO of this format), or the arguments do not
// fit in one.
var ErrArea = errors.New("node ISO embed area")

// Area returns the embed area carrying args as GRUB's $appliance_args: AreaSize bytes. args is
// kernel-argument words separated by single spaces; it must be printable ASCII without '"', '\\', '$'
// or '`' (GRUB would expand or end the quoted string) and fit in the area. Errors wrap ErrArea.
func Area(args string) ([]byte, error) {
	for _, c := range args {
		if c < 0x20 || c > 0x7e || strings.ContainsRune("\"\\$`", c) {
			return nil, fmt.Errorf("%w: kernel arguments %q hold %q: only printable ASCII without quotes, backslashes, '$' or '`'", ErrArea, args, c)
		}
	}
	var b bytes.Buffer
	b.WriteString(Magic)
	b.WriteString(`set appliance_args="` + args + "\"\n")
	if b.Len()+1 > AreaSize {
		return nil, fmt.Errorf("%w: kernel arguments of %d bytes do not fit in the %d-byte area", ErrArea, len(args), AreaSize)
	}
	// Padding: comment lines of at most 64 bytes (GRUB reads a sourced file line by line).
	for b.Len() < AreaSize {
		n := min(AreaSize-b.Len(), 64)
		b.WriteString(strings.Repeat("#", n-1) + "\n")
	}
	return b.Bytes(), nil
}

// Files inside the node image ISO (iso/build-node-image.sh writes them there).
const (
	// AreaFile is the embed area.
	AreaFile = "/boot/grub/appliance-args.cfg"
	// KernelFile, InitrdFile and RootFSFile are the node image's kernel, initramfs and root
	// filesystem (squashfs): what network boot serves at /boot/vmlinuz, /boot/initrd and
	// /boot/rootfs.squashfs, and what an ISO-booted node installs from.
	KernelFile = "/live/vmlinuz"
	InitrdFile = "/live/initrd.img"
	RootFSFile = "/live/rootfs.squashfs"
)

// Extent is a file's data inside an ISO image: Size bytes from byte Offset of the image.
type Extent struct{ Offset, Size int64 }

// ErrCut: a file's extent runs past the image's end (a truncated image).
var ErrCut = errors.New("the image is cut short")

// ErrNotISO: the image is not ISO 9660 (no primary volume descriptor at sector 16, ECMA-119 8.4).
var ErrNotISO = errors.New("not an ISO 9660 image")

// Locate returns the extent of the regular file at name (absolute, slash-separated, as Rock Ridge
// names it: "/live/vmlinuz") in the ISO 9660 image r of size bytes. Errors wrap ErrNotISO,
// fs.ErrNotExist (no such file, or a directory), ErrCut (the extent runs past the image's end) or
// are r's.
func Locate(r io.ReaderAt, size int64, name string) (Extent, error) {
	img, err := iso9660.OpenImage(r)
	if err != nil {
		return Extent{}, fmt.Errorf("%w: %v", ErrNotISO, err)
	}
	f, err := img.RootDir()
	if err != nil {
		return Extent{}, fmt.Errorf("%w: %v", ErrNotISO, err)
	}
	for _, part := range strings.Split(strings.Trim(name, "/"), "/") {
		if !f.IsDir() {
			return Extent{}, fmt.Errorf("%s: %w", name, fs.ErrNotExist)
		}
		children, err := f.GetChildren()
		if err != nil {
			return Extent{}, fmt.Errorf("%s: read a directory: %w", name, err)
		}
		var next *iso9660.File
		for _, c := range children {
			if c.Name() == part {
				next = c
				break
			}
		}
		if next == nil {
			return Extent{}, fmt.Errorf("%s: %w", name, fs.ErrNotExist)
		}
		f = next
	}
	if f.IsDir() {
		return Extent{}, fmt.Errorf("%s is a directory: %w", name, fs.ErrNotExist)
	}
	// Reader is an *io.SectionReader over the file's extent (the package's documented shape since
	// v0.3); its Outer gives the extent without reading a byte of it.
	sr, ok := f.Reader().(*io.SectionReader)
	if !ok {
		return Extent{}, fmt.Errorf("%s: the ISO 9660 reader gave no extent", name)
	}
	_, off, n := sr.Outer()
	if off+n > size {
		return Extent{}, fmt.Errorf("%s: %w: its %d bytes at byte %d run past the image's end (%d bytes)", name, ErrCut, n, off, size)
	}
	return Extent{Offset: off, Size: n}, nil
}

// Find returns the byte offset of the embed area in the image r of size bytes: the extent of AreaFile,
// which must be AreaSize bytes and start with Magic. It reads the directory records and the area's
// first sector, never the whole image. Errors wrap ErrArea (no area, a file there that is not one, or
// one past the image's end) or are r's.
func Find(r io.ReaderAt, size int64) (int64, error) {
	e, err := Locate(r, size, AreaFile)
	switch {
	case errors.Is(err, ErrCut):
		return 0, fmt.Errorf("%w: %w", ErrArea, err)
	case errors.Is(err, ErrNotISO), errors.Is(err, fs.ErrNotExist):
		return 0, fmt.Errorf("%w: none found (%w): build the ISO with iso/build-node-image.sh of this version", ErrArea, err)
	case err != nil:
		return 0, err
	case e.Size != AreaSize:
		return 0, fmt.Errorf("%w: %s is %d bytes, not %d: build the ISO with iso/build-node-image.sh of this version", ErrArea, AreaFile, e.Size, AreaSize)
	}
	head := make([]byte, len(Magic))
	if _, err := r.ReadAt(head, e.Offset); err != nil {
		return 0, err
	}
	if string(head) != Magic {
		return 0, fmt.Errorf("%w: %s does not start with the line %q: build the ISO with iso/build-node-image.sh of this version", ErrArea, AreaFile, strings.TrimSpace(Magic))
	}
	return e.Offset, nil
}

// Image is a node image ISO served with an embed area of its own; its file stays open until Close.
// ServeHTTP answers GET and HEAD with Range support (BMCs stream virtual media with range requests).
type Image struct {
	f       *os.File
	size    int64
	off     int64
	area    []byte
	modTime time.Time
	name    string
}

// Open opens the ISO at path and prepares it to be served with args in its embed area (Area's rules).
// It reads the image's directory records to find the area (Find). Errors name path.
func Open(path, args string) (*Image, error) {
	area, err := Area(args)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	off, err := Find(f, st.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &Image{f: f, size: st.Size(), off: off, area: area, modTime: st.ModTime(), name: st.Name()}, nil
}

// Size is the image's size in bytes (the file's: the area replaces bytes, it adds none).
func (im *Image) Size() int64 { return im.size }

// Offset is the embed area's byte offset in the image.
func (im *Image) Offset() int64 { return im.off }

// ReadAt reads the image as served: the file's bytes, the embed area's range from the area.
func (im *Image) ReadAt(p []byte, off int64) (int, error) {
	n, err := im.f.ReadAt(p, off)
	// Overlay the part of [off, off+n) that falls inside [im.off, im.off+AreaSize).
	lo, hi := max(off, im.off), min(off+int64(n), im.off+AreaSize)
	if lo < hi {
		copy(p[lo-off:hi-off], im.area[lo-im.off:hi-im.off])
	}
	return n, err
}

// ServeHTTP serves the image (http.ServeContent: Range, If-Modified-Since, HEAD; other methods get 405).
func (im *Image) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed: the node ISO is read-only", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/x-iso9660-image")
	http.ServeContent(w, r, im.name, im.modTime, io.NewSectionReader(im, 0, im.size))
}

// Close closes the image's file.
func (im *Image) Close() error { return im.f.Close() }
