package netboot

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
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
// Once the machine has installed itself to its disk it says so, and from then on its script boots
// the local disk (sanboot of BIOS drive 0x80, else `exit` to the firmware's next boot device)
// instead of the network image, so a reboot keeps the installed system and its state. Reinstalling is
// explicit: ClearInstalled (`appliance node reinstall NAME`) removes the mark, and the next network
// boot installs again.
//
// The notice is authenticated: it is POST agentapi.InstalledPathV1 on the appliance's HTTPS agent API
// (the CA pinned by the machine), with the node token the machine's enrolment gave it, and the API
// passes it to NoteInstalled, which marks the machine only when the notice's MAC is that node's own.
// Nothing on the boot port's plain HTTP changes a machine's boot any more (a notice there was open to
// anyone on the provisioning network).
const (
	// RootFSPath serves Config.RootFS.
	RootFSPath = "/boot/rootfs.squashfs"
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

// NoteInstalled takes node's install notice from the appliance's agent API (pkg/server
// AgentAPI.Installed; node is the one the request's token names, remote its address) and marks the
// machine installed (MarkInstalled), so that its next network boots boot its disk. Errors:
//   - agentapi.ErrInstallNoticeRefused: mac is not a MAC address, is no network-booted machine of the
//     inventory, or is another node's nodes[].mac (a node may mark only its own machine); each says
//     what to fix.
//   - agentapi.ErrInstallNoticeNotServed: node is not network-booted by this appliance, or no
//     Config.StateDir keeps marks.
//   - a write error of the mark (the appliance's disk).
func (s *Server) NoteInstalled(node string, n agentapi.InstallNotice, remote string) error {
	mac, ok := parseMAC(n.MAC)
	if !ok {
		return fmt.Errorf("%w: mac %q is not a MAC address: send the boot NIC's MAC, e.g. 52:54:00:00:00:21", agentapi.ErrInstallNoticeRefused, clip(n.MAC))
	}
	own := ""
	for _, m := range s.dhcp.machines {
		if m.Name == node {
			own = m.MAC.String()
		}
	}
	m, ok := s.dhcp.machines[mac.String()]
	switch {
	case ok && m.Name != node:
		return fmt.Errorf("%w: %s is node %s's nodes[].mac, and this token is node %s's: a machine sends the notice with its own node's token (check the machine's /etc/hostagent/config.yaml and nodes[].mac of both nodes)",
			agentapi.ErrInstallNoticeRefused, mac, m.Name, node)
	case !ok && own != "":
		return fmt.Errorf("%w: %s is not node %s's nodes[].mac (%s): the machine booted from another NIC; correct nodes[].mac to the boot NIC's MAC",
			agentapi.ErrInstallNoticeRefused, mac, node, own)
	case !ok:
		return fmt.Errorf("%w: node %s is not network-booted by this appliance (it needs nodes[].mac, power.kind ipmi or redfish and power.bootDevice pxe); there is no network boot to turn into a disk boot",
			agentapi.ErrInstallNoticeNotServed, node)
	case s.cfg.StateDir == "":
		return fmt.Errorf("%w: this appliance keeps no install marks (network boot without a state directory)", agentapi.ErrInstallNoticeNotServed)
	}
	mark := Installed{Node: m.Name, MAC: mac.String(), Time: time.Now().UTC(), From: remote}
	if err := MarkInstalled(s.cfg.StateDir, mark); err != nil {
		s.cfg.Logger.Warn("netboot: install mark not written", "node", m.Name, "err", err)
		return fmt.Errorf("record the install of %s: %w", m.Name, err)
	}
	s.cfg.Logger.Info("netboot: machine installed to its disk; its next boots boot the disk (appliance node reinstall to install again)", "node", m.Name, "mac", mac.String(), "remote", remote)
	return nil
}
