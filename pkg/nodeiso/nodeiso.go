// Package nodeiso serves the node image's ISO (iso/build-node-image.sh: node-amd64.iso, what a
// Redfish BMC inserts as virtual media) with one appliance's kernel arguments in it, written at serve
// time: the ISO is the same for every appliance, and the appliance's URL and CA pin exist only once
// it has its CA.
//
// The ISO carries an embed area, as coreos-installer's `iso kargs modify` does for CoreOS live ISOs:
// the file /boot/grub/appliance-args.cfg, AreaSize bytes, which the ISO's GRUB menu sources before it
// boots the kernel. ISO 9660 stores a file's data uncompressed and contiguous from the start of a
// 2048-byte sector, so the area is found by its first line (Magic) at a sector start, and serving the
// ISO with the area replaced needs neither xorriso nor a copy of the image: every read is the file's
// bytes, with the area's range taken from Area(args) instead. GRUB reads the file at boot through its
// ISO 9660 driver (BIOS and UEFI alike), so nothing else in the image changes and nothing in it is
// checksummed over the area.
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
	"net/http"
	"os"
	"strings"
	"time"
)

// Path is the URL path `appliance serve` serves the node image ISO at, over HTTPS on server.port
// (what power.virtualMediaImage names: https://APPLIANCE:8443/boot/node.iso).
const Path = "/boot/node.iso"

// Magic is the embed area's first line. iso/build-node-image.sh writes the same bytes.
const Magic = "# appliance node ISO kernel arguments, v1 (appliance serve rewrites this file)\n"

// AreaSize is the embed area's size in bytes: two ISO 9660 sectors.
const AreaSize = 4096

// sector is the ISO 9660 logical block size (ECMA-119 6.1.2); files start on one.
const sector = 2048

// ErrArea: the image has no embed area, or more than one (not a node image ISO of this format), or
// the arguments do not fit in one.
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

// Find returns the byte offset of the one embed area in the image r of size bytes: the only
// sector-aligned offset where Magic starts. Errors wrap ErrArea (none, or more than one) or are r's.
func Find(r io.ReaderAt, size int64) (int64, error) {
	const chunk = 1 << 20 // a multiple of sector
	buf := make([]byte, chunk)
	found := int64(-1)
	for off := int64(0); off < size; off += chunk {
		n, err := r.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		for i := 0; i+len(Magic) <= n; i += sector {
			if string(buf[i:i+len(Magic)]) != Magic {
				continue
			}
			if found >= 0 {
				return 0, fmt.Errorf("%w: two areas, at bytes %d and %d: not a node image ISO this appliance can rewrite", ErrArea, found, off+int64(i))
			}
			found = off + int64(i)
		}
	}
	if found < 0 {
		return 0, fmt.Errorf("%w: none found (no sector starts with the line %q): build the ISO with iso/build-node-image.sh of this version", ErrArea, strings.TrimSpace(Magic))
	}
	if found+AreaSize > size {
		return 0, fmt.Errorf("%w: the area at byte %d runs past the image's end (%d bytes)", ErrArea, found, size)
	}
	return found, nil
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
// It reads the whole image once to find the area. Errors name path.
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
