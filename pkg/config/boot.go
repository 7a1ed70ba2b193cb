package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/nodeiso"
)

// BootDHCP is how the appliance takes part in DHCP for network boot (pkg/netboot).
type BootDHCP string

const (
	// BootDHCPProxy answers PXE clients with boot options only and no address (proxyDHCP, PXE 2.1
	// §2.2.5), beside the datacenter's own DHCP server, which hands out the addresses.
	BootDHCPProxy BootDHCP = "proxy"
	// BootDHCPServer makes the appliance the provisioning network's DHCP server: it leases addresses
	// from boot.range and adds the boot options.
	BootDHCPServer BootDHCP = "server"
	// BootDHCPOff runs no DHCP at all.
	BootDHCPOff BootDHCP = "off"
)

// DefaultBootHTTPPort is boot.httpPort when unset: the plain-HTTP port of the boot artefacts.
const DefaultBootHTTPPort uint16 = 8080

// DefaultBootNodeISO is boot.nodeISO's default path inside the bundle: the node image, whose kernel,
// initramfs and root filesystem network boot serves from inside it unless boot.kernel and
// boot.initrd name files.
const DefaultBootNodeISO = bundle.NetbootNodeISO

// NodeISOPath is the URL path where `appliance serve` serves boot.nodeISO over HTTPS (pkg/nodeiso),
// with its own URL and CA pin written into the ISO's embed area: what power.virtualMediaImage names
// for a BMC to boot the node image, https://APPLIANCE:server.port/boot/node.iso.
const NodeISOPath = nodeiso.Path

// Boot configures network boot served by the appliance (pkg/netboot): DHCP (proxy or server), TFTP
// for Debian's iPXE binaries and, over plain HTTP on HTTPPort, each machine's iPXE script, kernel and
// initrd. Only network-bootable machines (Node.NetworkBootable: nodes[].mac set, power.kind ipmi or
// redfish, power.bootDevice pxe) get answers; a pre-installed node that tries the network first on a
// reboot is left to boot its disk. With dhcp: off nothing of it runs.
type Boot struct {
	// DHCP: proxy, server or off. Default (see SetDefaults): proxy when some node can boot from the
	// network (nodes[].mac set, power.kind ipmi or redfish, power.bootDevice pxe), otherwise off, so
	// that an appliance with nothing to network-boot never binds the DHCP and TFTP ports nor answers
	// on the network.
	DHCP BootDHCP `yaml:"dhcp,omitempty"`
	// Interface is the network interface DHCP and TFTP bind to, e.g. ens3 (a Linux interface name,
	// at most 15 characters). Empty: the interface that carries the appliance's address in
	// networks.controlPlane.cidrs.
	Interface string `yaml:"interface,omitempty"`
	// Range is the pool of addresses leased with dhcp: server: both ends inside one
	// networks.controlPlane.cidrs entry, clear of every node address and the VIP. Required with
	// dhcp: server, refused otherwise (it would do nothing).
	Range BootRange `yaml:"range,omitempty"`
	// Router is the default gateway (DHCP option 3) given with dhcp: server; optional, inside the
	// range's network. Refused otherwise.
	Router netip.Addr `yaml:"router,omitempty"`
	// HTTPPort is the TCP port of the plain-HTTP server for the boot artefacts (iPXE in Debian 12
	// has no HTTPS). Default DefaultBootHTTPPort; never server.port or apiServer.port.
	HTTPPort uint16 `yaml:"httpPort,omitempty" strictyaml:"nonzero"`
	// Kernel is a file served as the machines' kernel (/boot/vmlinuz on HTTPPort): an absolute path
	// on the appliance, set together with Initrd (a root filesystem is then served only when a
	// rootfs.squashfs lies beside the initrd). Unset (the default): network boot serves the node
	// image's kernel, initramfs and root filesystem from inside NodeISO (pkg/nodeiso: /live/vmlinuz,
	// /live/initrd.img, /live/rootfs.squashfs).
	Kernel string `yaml:"kernel,omitempty"`
	// Initrd is a file served as the machines' initramfs (/boot/initrd), set together with Kernel.
	Initrd string `yaml:"initrd,omitempty"`
	// NodeISO is the node image's ISO (iso/build-node-image.sh: node-amd64.iso), an absolute path on
	// the appliance. With boot.dhcp proxy or server and no Kernel and Initrd, network boot serves the
	// kernel, initramfs and root filesystem from inside it. Whatever boot.dhcp is, it is served whole
	// over HTTPS at NodeISOPath with the appliance's URL and CA pin written into its embed area
	// (pkg/nodeiso): the image a Redfish BMC inserts as virtual media (power.virtualMediaImage:
	// https://APPLIANCE:server.port/boot/node.iso). Default: bundle.path/DefaultBootNodeISO. Required
	// to exist only when network boot or a node's virtualMediaImage uses it; otherwise an absent file
	// leaves NodeISOPath answering 404.
	NodeISO string `yaml:"nodeISO,omitempty"`
	// KernelArgs are extra kernel command-line arguments, one per element (e.g. console=ttyS0). The
	// appliance adds appliance.url, appliance.ca_pin and appliance.node itself. The boot path is
	// plain HTTP, so it carries public data only: an argument whose key reads like a secret (token,
	// passw, secret, private, credential) is refused.
	KernelArgs []string `yaml:"kernelArgs,omitempty"`
	// Enrolment binds the enrolment of the machines booted through their BMC (network boot or
	// virtual media) to the address the appliance leased them and, optionally, to the operator's
	// approval: enrolment.go.
	Enrolment Enrolment `yaml:"enrolment,omitempty"`
}

// Enabled reports whether the appliance serves network boot (boot.dhcp proxy or server).
func (b Boot) Enabled() bool { return b.DHCP == BootDHCPProxy || b.DHCP == BootDHCPServer }

// BootRange is an inclusive range of IPv4 addresses.
type BootRange struct {
	Start netip.Addr `yaml:"start,omitempty"`
	End   netip.Addr `yaml:"end,omitempty"`
}

// IsZero reports whether neither end is set.
func (r BootRange) IsZero() bool { return !r.Start.IsValid() && !r.End.IsValid() }

// NetworkBootable reports whether n can boot from the network served by the appliance: it has a MAC
// and a BMC (power.kind ipmi or redfish) that sets a one-time PXE boot.
func (n Node) NetworkBootable() bool {
	return n.MAC != "" && (n.Power.Kind == PowerIPMI || n.Power.Kind == PowerRedfish) && n.Power.BootDevice == BootPXE
}

// InstallsItself reports whether n boots the node image and installs itself to a disk: a
// network-bootable node, or a redfish node booted from virtual media (mac, power.bootDevice cdrom,
// power.virtualMediaImage), which gets its root-device hints in its enrolment answer.
func (n Node) InstallsItself() bool {
	return n.NetworkBootable() || (n.MAC != "" && n.Power.Kind == PowerRedfish && n.Power.BootDevice == BootCDROM && n.Power.VirtualMediaImage != "")
}

// BootNetwork is the static network n's installed system keeps on its boot NIC (agentapi.Network,
// BootArgs.Network): n's addresses that lie inside networks.controlPlane.cidrs (the network the
// appliance network-boots on: pkg/netboot serves on the control-plane interface), with that CIDR's
// prefix length, in nodes[].addresses order, and boot.router when one of those CIDRs holds it.
// Addresses only in networks.workloadPlane.cidrs are left out: they may be on another NIC, which the
// boot gives no MAC for.
func (c *BootstrapConfiguration) BootNetwork(n Node) agentapi.Network {
	var nw agentapi.Network
	var nets []netip.Prefix
	for _, a := range n.Addresses {
		for _, p := range c.Networks.ControlPlane.CIDRs {
			if p.Contains(a) {
				nw.Addresses = append(nw.Addresses, netip.PrefixFrom(a, p.Bits()))
				nets = append(nets, p)
				break
			}
		}
	}
	if r := c.Boot.Router; r.IsValid() {
		for _, p := range nets {
			if p.Contains(r) {
				nw.Gateway = r
				break
			}
		}
	}
	return nw
}

// BootSummary says, for people, what network boot the appliance serves for c (`appliance config
// validate`, `appliance status`): "off (boot.dhcp: off)", or the DHCP mode, the ports, the interface,
// the kernel and the machines that get answers, e.g. "proxyDHCP (udp 67, 4011), TFTP (udp 69) and
// boot HTTP (tcp 8080) on the control-plane interface; the node image /b/netboot/node-amd64.iso;
// answers 1 machine: w1 52:54:00:00:00:21"; with boot.dhcp server, the nodes booted from virtual media
// that get an address only ("; leases an address only (no boot) to 1 booted from virtual media: n2 …").
func (c *BootstrapConfiguration) BootSummary() string {
	b := c.Boot
	if !b.Enabled() {
		return "off (boot.dhcp: " + string(b.DHCP) + ")"
	}
	var sb strings.Builder
	if b.DHCP == BootDHCPProxy {
		sb.WriteString("proxyDHCP (udp 67, 4011)")
	} else {
		fmt.Fprintf(&sb, "DHCP server leasing %s-%s (udp 67)", b.Range.Start, b.Range.End)
	}
	fmt.Fprintf(&sb, ", TFTP (udp 69) and boot HTTP (tcp %d) on ", b.HTTPPort)
	if b.Interface != "" {
		sb.WriteString(b.Interface)
	} else {
		sb.WriteString("the control-plane interface")
	}
	if b.Kernel != "" {
		fmt.Fprintf(&sb, "; kernel %s", b.Kernel)
	} else {
		fmt.Fprintf(&sb, "; the node image %s", b.NodeISO)
	}
	var machines []string
	for _, n := range c.Nodes {
		if n.NetworkBootable() {
			machines = append(machines, n.Name+" "+n.MAC)
		}
	}
	switch len(machines) {
	case 0:
		sb.WriteString("; answers no machine (no node has a mac, power.kind ipmi or redfish and power.bootDevice pxe)")
	case 1:
		sb.WriteString("; answers 1 machine: " + machines[0])
	default:
		fmt.Fprintf(&sb, "; answers %d machines: %s", len(machines), strings.Join(machines, ", "))
	}
	var vm []string
	for _, n := range c.Nodes {
		if b.DHCP == BootDHCPServer && n.InstallsItself() && !n.NetworkBootable() {
			vm = append(vm, n.Name+" "+n.MAC)
		}
	}
	if len(vm) > 0 {
		fmt.Fprintf(&sb, "; leases an address only (no boot) to %d booted from virtual media: %s", len(vm), strings.Join(vm, ", "))
	}
	return sb.String()
}

// setBootDefaults fills boot after the nodes are defaulted (it reads their power.bootDevice).
func setBootDefaults(c *BootstrapConfiguration) {
	b := &c.Boot
	if b.DHCP == "" {
		b.DHCP = BootDHCPOff
		for _, n := range c.Nodes {
			if n.NetworkBootable() {
				b.DHCP = BootDHCPProxy
				break
			}
		}
	}
	if b.HTTPPort == 0 && b.DHCP != BootDHCPOff {
		b.HTTPPort = DefaultBootHTTPPort
	}
	if b.NodeISO == "" && c.Bundle.Path != "" {
		b.NodeISO = filepath.Join(c.Bundle.Path, DefaultBootNodeISO)
	}
	setEnrolmentDefaults(c)
}

// secretArgRE matches kernel-argument keys that would carry a secret (pkg/netboot refuses the same).
var secretArgRE = regexp.MustCompile(`(?i)(token|passw|secret|private|credential)`)

// applianceArgs are the kernel arguments the appliance sets itself on the network-boot path.
var applianceArgs = []string{agentapi.ArgApplianceURL, agentapi.ArgCAPin, agentapi.ArgNode}

// ifaceNameRE: a Linux interface name (IFNAMSIZ 16 with the NUL; no '/', ':' or white space).
var ifaceNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)

// boot validates boot.
func (v *validator) boot() {
	b := v.c.Boot
	switch b.DHCP {
	case BootDHCPProxy, BootDHCPServer, BootDHCPOff:
	case "":
		v.errorf("boot.dhcp", "is required: proxy (boot options beside the datacenter's DHCP server), server (the appliance leases addresses from boot.range) or off")
	default:
		v.errorf("boot.dhcp", "%q is not a DHCP mode: use proxy, server or off", string(b.DHCP))
	}
	if b.Interface != "" && !ifaceNameRE.MatchString(b.Interface) {
		v.errorf("boot.interface", "%q is not a network interface name: give one such as ens3 (at most 15 letters, digits, '.', '-' or '_'), or leave it out to use the interface of the appliance's control-plane address", b.Interface)
	}
	if b.DHCP != BootDHCPOff && b.DHCP != "" {
		if b.HTTPPort == 0 {
			v.errorf("boot.httpPort", "is required: the plain-HTTP port of the boot artefacts, usually %d", DefaultBootHTTPPort)
		}
		switch b.HTTPPort {
		case 0:
		case v.c.Server.Port:
			v.errorf("boot.httpPort", "%d is also server.port: the appliance serves HTTPS there; choose another port (default %d)", b.HTTPPort, DefaultBootHTTPPort)
		case v.c.APIServer.Port:
			v.errorf("boot.httpPort", "%d is also apiServer.port: the appliance host carries the VIP at first; choose another port (default %d)", b.HTTPPort, DefaultBootHTTPPort)
		}
		bootable := 0
		for i, n := range v.c.Nodes {
			// A BMC-powered node without a MAC: warned, not refused. The power phase fails only that
			// node (it cannot enrol: the appliance matches a booted machine by its MAC), and the others
			// go on (issue 12's rule for bad input); an inventory may list a machine before its MAC is
			// known.
			if bmc := n.Power.Kind == PowerIPMI || n.Power.Kind == PowerRedfish; bmc && n.MAC == "" && n.Power.BootDevice == BootPXE {
				v.warnf(fmt.Sprintf("nodes[%d].mac", i), "is empty: node %q boots from the network (power.bootDevice pxe) but boot.dhcp answers only MACs of the inventory; give its boot NIC's MAC", n.Name)
			} else if bmc && n.MAC == "" {
				v.warnf(fmt.Sprintf("nodes[%d].mac", i), "is empty: node %q is powered by its BMC (power.kind %s, power.bootDevice %s) and a BMC-booted machine gets its node credential only by enrolling with its boot NIC's MAC, so bootstrap will not power it on; give its boot NIC's MAC",
					n.Name, n.Power.Kind, n.Power.BootDevice)
			}
			if n.NetworkBootable() {
				bootable++
			}
		}
		if bootable == 0 {
			v.warnf("boot.dhcp", "is %s but no node has a mac: no machine will get a boot answer; set nodes[].mac or boot.dhcp: off", b.DHCP)
		}
		if b.Enabled() {
			v.bootFiles()
		}
	}
	v.nodeISO()
	v.enrolment()
	if b.DHCP == BootDHCPServer {
		v.bootRange()
		return
	}
	if !b.Range.IsZero() {
		v.errorf("boot.range", "is only used with boot.dhcp: server (it is %s): remove it, or set boot.dhcp: server", b.DHCP)
	}
	if b.Router.IsValid() {
		v.errorf("boot.router", "is only used with boot.dhcp: server (it is %s): remove it, or set boot.dhcp: server", b.DHCP)
	}
}

// bootFiles checks, for dhcp proxy or server, what network boot serves: boot.kernel and boot.initrd
// together (absolute; with CheckFiles readable regular files), or neither (then the node image in
// boot.nodeISO, which nodeISO checks); and boot.kernelArgs.
func (v *validator) bootFiles() {
	b := v.c.Boot
	switch {
	case b.Kernel == "" && b.Initrd == "":
		// The node image in boot.nodeISO: nodeISO checks it.
	case b.Kernel == "":
		v.errorf("boot.kernel", "is required when boot.initrd is set (a kernel and its initramfs go together); or remove boot.initrd to boot the node image in boot.nodeISO")
	case b.Initrd == "":
		v.errorf("boot.initrd", "is required when boot.kernel is set (a kernel and its initramfs go together); or remove boot.kernel to boot the node image in boot.nodeISO")
	default:
		for _, f := range []struct{ path, name string }{{"boot.kernel", b.Kernel}, {"boot.initrd", b.Initrd}} {
			switch {
			case !filepath.IsAbs(f.name):
				v.errorf(f.path, "%q is not an absolute path: give the file's full path on the appliance", f.name)
			case v.opts.CheckFiles:
				v.file(f.path, f.name, false)
			}
		}
	}
	for i, a := range b.KernelArgs {
		path := fmt.Sprintf("boot.kernelArgs[%d]", i)
		k, _, _ := strings.Cut(a, "=")
		switch {
		case a == "" || strings.ContainsAny(a, " \t\n\r\"'"):
			v.errorf(path, "%q is not one kernel argument: give one argument per element, without white space or quotes", a)
		case secretArgRE.MatchString(k):
			v.errorf(path, "%q looks like a secret: the network-boot path is plain HTTP and carries public data only (a booted machine enrols for its credentials); remove it", k)
		case slices.Contains(applianceArgs, k):
			v.errorf(path, "%s is set by the appliance itself: remove it", k)
		}
	}
}

// bootRange checks boot.range and boot.router for dhcp: server.
func (v *validator) bootRange() {
	r := v.c.Boot.Range
	ok := true
	for _, end := range []struct {
		path string
		a    netip.Addr
	}{{"boot.range.start", r.Start}, {"boot.range.end", r.End}} {
		switch {
		case !end.a.IsValid():
			v.errorf(end.path, "is required with boot.dhcp: server: the range of addresses to lease, inside networks.controlPlane.cidrs")
			ok = false
		case !end.a.Is4():
			v.errorf(end.path, "%s is not an IPv4 address: DHCP leases IPv4 addresses only", end.a)
			ok = false
		}
	}
	if !ok {
		return
	}
	if r.End.Less(r.Start) {
		v.errorf("boot.range.end", "%s is before boot.range.start %s: swap them", r.End, r.Start)
		return
	}
	var net netip.Prefix
	for _, p := range v.c.Networks.ControlPlane.CIDRs {
		if p.Contains(r.Start) && p.Contains(r.End) {
			net = p
			break
		}
	}
	if !net.IsValid() {
		v.errorf("boot.range", "%s-%s is not inside one of networks.controlPlane.cidrs: the machines boot on the control-plane network; choose a range inside it", r.Start, r.End)
		return
	}
	last := lastAddr(net)
	if (r.Start == net.Addr() || r.End == last) && net.Bits() < 31 {
		v.errorf("boot.range", "%s-%s includes the network or broadcast address of %s: start after %s and end before %s", r.Start, r.End, net, net.Addr(), last)
	}
	in := func(a netip.Addr) bool { return a.IsValid() && !a.Less(r.Start) && !r.End.Less(a) }
	if vip := v.c.APIServer.VIP; in(vip) {
		v.errorf("boot.range", "%s-%s includes the API server VIP %s: keep the VIP out of the leased range", r.Start, r.End, vip)
	}
	for i, n := range v.c.Nodes {
		for j, a := range n.Addresses {
			if in(a) {
				v.errorf("boot.range", "%s-%s includes %s (nodes[%d].addresses[%d], %s): keep the nodes' static addresses out of the leased range", r.Start, r.End, a, i, j, n.Name)
			}
		}
	}
	if rt := v.c.Boot.Router; rt.IsValid() && !net.Contains(rt) {
		v.errorf("boot.router", "%s is outside %s, the network of boot.range: give a gateway on that network", rt, net)
	}
}

// ServesNodeISO reports whether p's virtualMediaImage is the appliance's own node ISO: an https URL
// whose path is NodeISOPath on port (server.port). The host is not compared: the configuration names
// the appliance by CIDR, its address is resolved at bootstrap.
func (p Power) ServesNodeISO(port uint16) bool {
	u, err := url.Parse(p.VirtualMediaImage)
	return err == nil && u.Scheme == "https" && u.Path == NodeISOPath && u.Port() == strconv.Itoa(int(port))
}

// NodeISOUsers are the names of the nodes whose power.virtualMediaImage is the appliance's own node
// ISO (Power.ServesNodeISO on server.port), in nodes[] order: they need boot.nodeISO.
func (c *BootstrapConfiguration) NodeISOUsers() []string {
	var users []string
	for _, n := range c.Nodes {
		if n.Power.VirtualMediaImage != "" && n.Power.ServesNodeISO(c.Server.Port) {
			users = append(users, n.Name)
		}
	}
	return users
}

// nodeISO checks boot.nodeISO: an absolute path; with CheckFiles, a readable regular file when
// something serves it: network boot without boot.kernel and boot.initrd (the kernel, initramfs and
// root filesystem come from inside it), or nodes whose power.virtualMediaImage is the appliance's
// NodeISOPath. Errors say who needs it and how to give it.
func (v *validator) nodeISO() {
	b := v.c.Boot
	// Who needs the file, and what else would do, as format text (constant pieces: only the
	// arguments are clipped) with its arguments.
	var needs, fixes []string
	var args []any
	if b.Enabled() && b.Kernel == "" && b.Initrd == "" {
		needs = append(needs, "network boot (boot.dhcp: %s) serves the node image's kernel, initramfs and root filesystem from inside it")
		args = append(args, b.DHCP)
		fixes = append(fixes, "give boot.kernel and boot.initrd", "set boot.dhcp: off")
	}
	if users := v.c.NodeISOUsers(); len(users) > 0 {
		needs = append(needs, "node(s) %s boot the appliance's %s (power.virtualMediaImage)")
		args = append(args, strings.Join(users, ", "), NodeISOPath)
		fixes = append(fixes, "point their virtualMediaImage at another server")
	}
	need := strings.Join(needs, ", and ")
	switch {
	case b.NodeISO == "" && len(needs) > 0:
		v.errorf("boot.nodeISO", "is required: "+need+"; give the node image ISO's path, set bundle.path to a bundle built with nodeImage.build: true (it has %s), or "+strings.Join(fixes, ", or "),
			append(args, DefaultBootNodeISO)...)
	case b.NodeISO == "":
	case !filepath.IsAbs(b.NodeISO):
		v.errorf("boot.nodeISO", "%q is not an absolute path: give the node image ISO's full path on the appliance", b.NodeISO)
	case !v.opts.CheckFiles || len(needs) == 0:
	default:
		if _, err := os.Stat(b.NodeISO); errors.Is(err, fs.ErrNotExist) {
			give := "give the node image ISO's path (iso/build-node-image.sh: node-amd64.iso)"
			if v.c.Bundle.Path != "" && b.NodeISO == filepath.Join(v.c.Bundle.Path, DefaultBootNodeISO) {
				give = "the bundle carries no node image: build it with nodeImage.build: true, " + give
			}
			v.errorf("boot.nodeISO", "%s does not exist, and "+need+": "+strings.Join(append([]string{give}, fixes...), ", or "),
				append([]any{b.NodeISO}, args...)...)
			return
		}
		v.file("boot.nodeISO", b.NodeISO, false)
	}
}
