package applianced

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/netboot"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
)

// netbootConfig turns the configuration's boot section into the network-boot service's
// configuration (pkg/netboot), or returns false when boot.dhcp is off. It resolves the appliance's
// control-plane address in the current network namespace (as the resolve phase does, the VIP
// excluded): DHCP and TFTP bind to boot.interface, or the interface of that address; that address is
// the DHCP server identifier, the next-server and the host of the boot URLs. The machines are the
// network-bootable nodes (config.Node.NetworkBootable); other nodes with a mac are ignored by name. The kernel command line carries public data
// only: boot.kernelArgs, appliance.url (https://ADDRESS:server.port) and appliance.ca_pin (the pin of
// the CA in caPEM); pkg/netboot adds appliance.node. Errors name the field to fix.
func netbootConfig(cfg *config.BootstrapConfiguration, caPEM []byte, log *slog.Logger) (netboot.Config, bool, error) {
	b := cfg.Boot
	if !b.Enabled() {
		return netboot.Config{}, false, nil
	}
	cp, err := controlPlaneAddress(cfg)
	if err != nil {
		return netboot.Config{}, false, fmt.Errorf("boot.dhcp %s serves on the control-plane network: networks.controlPlane.cidrs: %w", b.DHCP, err)
	}
	ip := cp.Prefix.Addr()
	if !ip.Is4() {
		return netboot.Config{}, false, fmt.Errorf("boot.dhcp %s: the appliance's control-plane address %s is not IPv4 (PXE and iPXE boot over DHCPv4): give networks.controlPlane.cidrs an IPv4 network first, or set boot.dhcp: off", b.DHCP, ip)
	}
	pin, err := caPin(caPEM)
	if err != nil {
		return netboot.Config{}, false, err
	}
	nc := netboot.Config{
		Mode:      netboot.Mode(b.DHCP),
		Interface: b.Interface,
		ServerIP:  ip,
		HTTPPort:  b.HTTPPort,
		// The machines' install marks (pkg/netboot install.go; `appliance node reinstall` clears one).
		StateDir: filepath.Join(cfg.StateDir, "netboot"),
		KernelArgs: append(append([]string{}, b.KernelArgs...), agentapi.BootArgs{
			ApplianceURL: "https://" + net.JoinHostPort(ip.String(), strconv.Itoa(int(cfg.Server.Port))),
			CAPin:        pin,
		}.Words()...),
		Logger: log,
	}
	if b.Kernel == "" && b.Initrd == "" {
		// The node image's kernel, initramfs and root filesystem from inside its ISO (config's default).
		nc.ISO = b.NodeISO
	} else {
		// Files, with the node image's root filesystem when one lies beside the initrd
		// (iso/build-node-image.sh's output directory).
		nc.Kernel, nc.Initrd, nc.RootFS = b.Kernel, b.Initrd, nodeImageRootFS(b.Initrd)
	}
	if nc.Interface == "" {
		nc.Interface = cp.Interface
	}
	if b.DHCP == config.BootDHCPServer {
		nc.RangeStart, nc.RangeEnd, nc.Router = b.Range.Start, b.Range.End, b.Router
		for _, p := range cfg.Networks.ControlPlane.CIDRs {
			if p.Contains(b.Range.Start) {
				nc.Subnet = p.Masked()
				break
			}
		}
	}
	for _, n := range cfg.Nodes {
		if n.MAC == "" {
			continue
		}
		mac, err := net.ParseMAC(n.MAC)
		if err != nil {
			return netboot.Config{}, false, fmt.Errorf("node %s: mac %q: %w", n.Name, n.MAC, err)
		}
		switch {
		case n.NetworkBootable():
			nc.Machines = append(nc.Machines, netboot.Machine{Name: n.Name, MAC: mac, KernelArgs: installArgs(cfg, n).Words()})
		case b.DHCP == config.BootDHCPServer && n.InstallsItself():
			// Booted from virtual media on the network the appliance leases: its live system (and its
			// installed one, without static addresses) takes DHCP from here.
			nc.AddressOnly = append(nc.AddressOnly, netboot.Machine{Name: n.Name, MAC: mac})
		default:
			nc.Others = append(nc.Others, netboot.Machine{Name: n.Name, MAC: mac})
		}
	}
	return nc, true, nil
}

// installArgs are node n's install parameters (public data only): its root-device hints and the
// static addresses its installed system keeps (BootArgs.Hints, BootArgs.Network). The iPXE script of
// a network boot carries them; the enrolment answer carries them to every BMC-booted node, which is
// how a virtual-media node (its ISO the same for every node) gets them.
func installArgs(cfg *config.BootstrapConfiguration, n config.Node) agentapi.BootArgs {
	args := agentapi.BootArgs{Network: cfg.BootNetwork(n)}
	if n.RootDevice != nil {
		args.Hints = *n.RootDevice
	}
	return args
}

// nodeImageRootFS is the node image's rootfs.squashfs in initrd's directory, or "" when there is
// none there (a kernel and initrd that need no root filesystem, such as the lab's VM kit).
func nodeImageRootFS(initrd string) string {
	p := filepath.Join(filepath.Dir(initrd), "rootfs.squashfs")
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
		return p
	}
	return ""
}

// caPin is agentapi.PinOf of the first certificate in caPEM.
func caPin(caPEM []byte) (string, error) {
	blk, _ := pem.Decode(caPEM)
	if blk == nil {
		return "", errors.New("the appliance CA certificate holds no PEM block (run `appliance bootstrap` to repair the pki)")
	}
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", fmt.Errorf("the appliance CA certificate: %w", err)
	}
	return agentapi.PinOf(ca), nil
}

// startNetboot starts the network-boot service for cfg (see netbootConfig) and returns it, or nil
// (nothing to stop) when boot.dhcp is off. A port that cannot be bound (another DHCP or TFTP server
// on this host) is an error naming boot.dhcp.
func startNetboot(cfg *config.BootstrapConfiguration, caPEM []byte, store *nodestate.Store, log *slog.Logger) (*netboot.Server, error) {
	nc, on, err := netbootConfig(cfg, caPEM, log)
	if err != nil || !on {
		return nil, err
	}
	nc.Seen = (&bootContacts{store: store, log: log}).seen
	s, err := netboot.New(nc)
	if err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	if err := s.Start(); err != nil {
		return nil, fmt.Errorf("boot.dhcp %s on %s: %w: stop the other DHCP/TFTP server on this host, or set boot.dhcp: off", cfg.Boot.DHCP, nc.Interface, err)
	}
	return s, nil
}

// bootContacts records what the network boot answered each machine as the node's contacts
// (nodestate.ContactNetboot), so that the converge phase can say how far a silent machine got; the
// same answer to the same node at most once a minute (a machine retrying DHCP in a loop must not
// grow its events.jsonl without bound).
type bootContacts struct {
	store *nodestate.Store
	log   *slog.Logger
	noted nodestate.NoteThrottle // contactKey
}

// contactKey is the throttle key of a contact: the node and what was answered, without what the
// machine chose: a NAK's text names the address the request asked for, so any sender of the node's
// MAC could make every request a new key (and a new line in the node's events) by asking for
// another address each time; all the node's NAKs share one key.
func contactKey(node, what string) string {
	if strings.HasPrefix(what, "DHCP NAK") {
		what = "DHCP NAK"
	}
	return node + "\x00" + what
}

func (c *bootContacts) seen(node, what string) {
	if !c.noted.Allow(contactKey(node, what), time.Now()) {
		return
	}
	if err := c.store.NoteContact(node, nodestate.ContactNetboot, "network boot: "+what); err != nil {
		c.log.Warn("netboot: the contact was not recorded in the node's events", "node", node, "err", err)
	}
}
