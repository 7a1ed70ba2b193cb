package netboot

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"time"

	"github.com/airgap-appliance/appliance/pkg/nodeiso"
)

// artefact is one boot file the HTTP server serves: the whole file at path, or, with inISO, the
// extent of the file inISO inside the node image ISO at path (pkg/nodeiso: ISO 9660 keeps a file's
// data contiguous, so it is a byte range of the ISO).
type artefact struct {
	path   string
	inISO  string
	extent nodeiso.Extent
}

// String names the artefact for logs and errors: "/b/netboot/node-amd64.iso:/live/vmlinuz".
func (a artefact) String() string {
	if a.inISO != "" {
		return a.path + ":" + a.inISO
	}
	return a.path
}

// artefacts resolves what c serves at KernelPath, InitrdPath and RootFSPath: c.Kernel, c.Initrd and
// c.RootFS, or the three files inside c.ISO (each must be there). Errors match ErrConfig.
func artefacts(c Config) (kernel, initrd, rootFS artefact, err error) {
	if c.ISO == "" {
		return artefact{path: c.Kernel}, artefact{path: c.Initrd}, artefact{path: c.RootFS}, nil
	}
	f, err := os.Open(c.ISO)
	if err != nil {
		return kernel, initrd, rootFS, configErr("ISO %s: %v", c.ISO, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return kernel, initrd, rootFS, configErr("ISO %s: %v", c.ISO, err)
	}
	var out [3]artefact
	for i, name := range []string{nodeiso.KernelFile, nodeiso.InitrdFile, nodeiso.RootFSFile} {
		e, err := nodeiso.Locate(f, st.Size(), name)
		if err != nil {
			return kernel, initrd, rootFS, configErr("ISO %s: %s: %v: give a node image ISO built by iso/build-node-image.sh", c.ISO, name, err)
		}
		out[i] = artefact{path: c.ISO, inISO: name, extent: e}
	}
	return out[0], out[1], out[2], nil
}

// open opens the artefact: the file (to close), its content and the file's modification time.
func (a artefact) open() (io.Closer, io.ReadSeeker, time.Time, error) {
	f, err := os.Open(a.path)
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, time.Time{}, err
	}
	if a.inISO == "" {
		return f, f, st.ModTime(), nil
	}
	return f, io.NewSectionReader(f, a.extent.Offset, a.extent.Size), st.ModTime(), nil
}

// sha256 is the lowercase hex SHA-256 of the artefact's content.
func (a artefact) sha256() (string, error) {
	f, content, _, err := a.open()
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, content); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
