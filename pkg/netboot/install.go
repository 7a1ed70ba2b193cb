package netboot

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// The node image (iso/build-node-image.sh) boots in three parts: the kernel and initrd through iPXE,
// then its root filesystem, which the initramfs fetches itself (it is hundreds of MB: iPXE would hold
// it in RAM twice). With Config.RootFS set the script adds, besides Config.KernelArgs and the
// machine's own Machine.KernelArgs:
//
//	appliance.rootfs=http://SERVER:PORT/boot/rootfs.squashfs   the root filesystem (RootFSPath)
//	appliance.rootfs_sha256=HEX                                 its SHA-256, checked by the initramfs
//	appliance.initrd=http://SERVER:PORT/boot/initrd             the initramfs again, for the disk
//	BOOTIF=01-aa-bb-cc-dd-ee-ff                                 the NIC iPXE booted from (PXELINUX's form)
//	appliance.ip=ADDR::GATEWAY:NETMASK                          the address iPXE got by DHCP (not the
//	                                                            kernel's ip=, which systemd's network
//	                                                            generator would also read)
//
// Once the machine has installed itself to its disk it says so (POST InstalledPath+MAC, see
// MarkInstalled): from then on its script boots the local disk (sanboot of BIOS drive 0x80, else
// `exit` to the firmware's next boot device) instead of the network image, so a reboot keeps the
// installed system and its state. Reinstalling is explicit: ClearInstalled (`appliance node
// reinstall NAME`) removes the mark, and the next network boot installs again.
//
// The notice comes over the boot port's plain HTTP like everything else on it, so anyone on the
// provisioning network could send it: all it can do is make a machine try its disk before the image
// (a disk without a boot sector fails sanboot, and the firmware moves on); it can never cause an
// install, and only the appliance's operator clears a mark.
const (
	// RootFSPath serves Config.RootFS.
	RootFSPath = "/boot/rootfs.squashfs"
	// InstalledPath prefixes the install notice: POST InstalledPath + MAC.
	InstalledPath = "/installed/"
	// installedDir holds the marks under Config.StateDir: installedDir/NAME.json.
	installedDir = "installed"
)

// Installed is the mark of a machine that installed itself to its disk.
type Installed struct {
	Node string    `json:"node"`
	MAC  string    `json:"mac"`
	Time time.Time `json:"time"`
	// From is the address the notice came from.
	From string `json:"from"`
}

func installedFile(stateDir, node string) string {
	return filepath.Join(stateDir, installedDir, node+".json")
}

// InstalledMark returns node's mark under stateDir (Config.StateDir), and false when it has none.
func InstalledMark(stateDir, node string) (Installed, bool, error) {
	b, err := os.ReadFile(installedFile(stateDir, node))
	if errors.Is(err, fs.ErrNotExist) {
		return Installed{}, false, nil
	}
	if err != nil {
		return Installed{}, false, err
	}
	var m Installed
	if err := json.Unmarshal(b, &m); err != nil {
		return Installed{}, false, fmt.Errorf("%s: %w", installedFile(stateDir, node), err)
	}
	return m, true, nil
}

// MarkInstalled records that node installed itself (written atomically, 0600 in a 0700 directory).
func MarkInstalled(stateDir string, m Installed) error {
	if err := os.MkdirAll(filepath.Join(stateDir, installedDir), 0o700); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	_, err := atomicfile.Write(installedFile(stateDir, m.Node), append(b, '\n'), 0o600)
	return err
}

// ClearInstalled removes node's mark: its next network boot installs again. It reports whether there
// was a mark.
func ClearInstalled(stateDir, node string) (bool, error) {
	err := os.Remove(installedFile(stateDir, node))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// fileSHA256 is the lowercase hex SHA-256 of the file at p.
func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// serveInstalled takes a machine's install notice: POST InstalledPath+MAC from a machine of the
// inventory marks it installed (200); an unknown MAC is 404, another method 405.
func (s *Server) serveInstalled(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "method not allowed: POST "+InstalledPath+"MAC when the machine has installed itself", http.StatusMethodNotAllowed)
		return
	}
	raw := strings.TrimPrefix(r.URL.Path, InstalledPath)
	mac, ok := parseMAC(raw)
	if !ok {
		http.Error(w, fmt.Sprintf("%q is not a MAC address: POST %sMAC", clip(raw), InstalledPath), http.StatusNotFound)
		return
	}
	m, ok := s.dhcp.machines[mac.String()]
	if !ok {
		s.dhcp.logUnknown(mac.String(), "HTTP install notice")
		http.Error(w, fmt.Sprintf("%s is not a network-booted machine of the inventory", mac), http.StatusNotFound)
		return
	}
	if s.cfg.StateDir == "" {
		http.Error(w, "this appliance keeps no install marks (netboot without a state directory)", http.StatusNotFound)
		return
	}
	mark := Installed{Node: m.Name, MAC: mac.String(), Time: time.Now().UTC(), From: r.RemoteAddr}
	if err := MarkInstalled(s.cfg.StateDir, mark); err != nil {
		s.cfg.Logger.Warn("netboot: install mark not written", "node", m.Name, "err", err)
		http.Error(w, "the appliance could not record the install", http.StatusServiceUnavailable)
		return
	}
	s.cfg.Logger.Info("netboot: machine installed to its disk; its next boots boot the disk (appliance node reinstall to install again)", "node", m.Name, "mac", mac.String(), "remote", r.RemoteAddr)
	fmt.Fprintf(w, "%s recorded as installed\n", m.Name)
}
