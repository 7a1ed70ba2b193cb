package config

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/k8sversion"
	"github.com/airgap-appliance/appliance/pkg/strictyaml"
)

// ValidateOptions tunes Validate.
type ValidateOptions struct {
	// CheckFiles makes Validate look at the files the document names: bundle.path must be an existing
	// directory; credential files (power passwordFile, privateKeyFile, knownHostsFile, caFile,
	// keepalived authPasswordFile) and Ignition snippets must be readable regular files and parse as
	// what they claim to be. Off for `appliance config validate --offline` and for pure unit tests.
	CheckFiles bool
}

// maxReferencedFile bounds how much of a referenced file (key, CA bundle, known_hosts) is read.
const maxReferencedFile = 1 << 20

// Validate checks c after SetDefaults and returns every problem at once. errs are refusals (the
// configuration must not be used); warnings are legal but questionable choices (an even number of
// control planes, TLS verification off) to print for the operator. Every FieldError has the field
// path, the source line when c came from Decode, and says what to fix. A nil c is an error.
//
// Validate does not mutate c. Run SetDefaults first: unset fields that have defaults are reported as
// missing otherwise.
func Validate(c *BootstrapConfiguration, opts ValidateOptions) (warnings []*FieldError, errs ErrorList) {
	if c == nil {
		return nil, ErrorList{{Msg: "no configuration given"}}
	}
	v := &validator{c: c, opts: opts}
	v.typeMeta()
	v.cluster()
	v.networks()
	v.cni()
	v.apiServer()
	v.server()
	v.paths()
	v.nodes()
	v.host()
	v.boot()
	v.dns()
	v.ingress()
	v.escrow()
	v.ports()
	return v.warns, v.errs
}

type validator struct {
	c     *BootstrapConfiguration
	opts  ValidateOptions
	errs  ErrorList
	warns []*FieldError
}

// errorf records an error at path. String and error arguments are clipped (strictyaml.ClipArgs): a
// message never repeats a value of megabytes.
func (v *validator) errorf(path, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Path: path, Line: v.line(path), Msg: fmt.Sprintf(format, strictyaml.ClipArgs(args)...)})
}

func (v *validator) warnf(path, format string, args ...any) {
	v.warns = append(v.warns, &FieldError{Path: path, Line: v.line(path), Msg: fmt.Sprintf(format, strictyaml.ClipArgs(args)...)})
}

// line returns the source line of path, or of its nearest ancestor present in the document, or 0.
func (v *validator) line(path string) int { return v.c.lines.Line(path) }

func (v *validator) typeMeta() {
	if v.c.APIVersion != APIVersion {
		v.errorf("apiVersion", "%q is not supported: set apiVersion: %s", v.c.APIVersion, APIVersion)
	}
	if v.c.Kind != Kind {
		v.errorf("kind", "%q is not supported: set kind: %s", v.c.Kind, Kind)
	}
}

var (
	dns1123LabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	versionRE      = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)
)

// isDNS1123Label: RFC 1123 label as Kubernetes checks it (lowercase, at most 63 characters).
func isDNS1123Label(s string) bool { return len(s) <= 63 && dns1123LabelRE.MatchString(s) }

// isDNS1123Subdomain: dot-separated DNS-1123 labels, at most 253 characters (Kubernetes object names).
func isDNS1123Subdomain(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if !isDNS1123Label(label) {
			return false
		}
	}
	return true
}

// validHost reports whether host is an IP address (no zone) or a DNS name (case-insensitive).
func validHost(host string) bool {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Zone() == ""
	}
	return isDNS1123Subdomain(strings.ToLower(host))
}

const (
	labelRule     = "a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)"
	subdomainRule = "a DNS-1123 subdomain (dot-separated lowercase labels of letters, digits and '-', at most 253 characters)"
)

func (v *validator) cluster() {
	switch name := v.c.ClusterName; {
	case name == "":
		v.errorf("clusterName", "is required: name the cluster with %s, e.g. lab", labelRule)
	case !isDNS1123Label(name):
		v.errorf("clusterName", "%q is not a valid name: use %s", name, labelRule)
	}
	switch ver := v.c.KubernetesVersion; {
	case ver == "":
		v.errorf("kubernetesVersion", "is required: write vMAJOR.MINOR.PATCH, e.g. %s", k8sversion.Newest().Source)
	case !versionRE.MatchString(ver):
		v.errorf("kubernetesVersion", "%q is not a version: write vMAJOR.MINOR.PATCH, e.g. %s", ver, k8sversion.Newest().Source)
	default:
		v.kubernetesVersion(ver)
	}
}

// prefix checks one CIDR: set, no host bits.
func (v *validator) prefix(path string, p netip.Prefix) bool {
	switch {
	case !p.IsValid():
		v.errorf(path, "is required: write a CIDR such as 10.0.0.0/24")
		return false
	case p != p.Masked():
		v.errorf(path, "%q has host bits set: use %s", p, p.Masked())
		return false
	case p.Addr().Is4In6() && p.Bits() >= 96:
		v.errorf(path, "%q is an IPv4-mapped IPv6 network: write it as IPv4, %s", p, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96))
		return false
	}
	return true
}

// namedPrefix is a CIDR and where it came from, for overlap messages.
type namedPrefix struct {
	path string
	p    netip.Prefix
}

func (v *validator) plane(path string, cidrs []netip.Prefix, required bool) []namedPrefix {
	if len(cidrs) == 0 {
		if required {
			v.errorf(path, "at least one CIDR is required: list the network(s) the control-plane nodes and the VIP live on, e.g. [10.100.0.0/24]")
		}
		return nil
	}
	var good []namedPrefix
	seen := map[netip.Prefix]string{}
	for i, p := range cidrs {
		ip := fmt.Sprintf("%s[%d]", path, i)
		if !v.prefix(ip, p) {
			continue
		}
		if p.Addr().Is6() {
			v.errorf(ip, "%s is IPv6: "+ipv4Only, p)
			continue
		}
		if first, dup := seen[p]; dup {
			v.errorf(ip, "%s is listed twice (also %s): remove one", p, first)
			continue
		}
		seen[p] = ip
		good = append(good, namedPrefix{ip, p})
	}
	return good
}

// nodeNetworks returns the valid controlPlane and workloadPlane networks (no value twice).
func (v *validator) nodeNetworks() []namedPrefix {
	var out []namedPrefix
	seen := map[netip.Prefix]bool{}
	for _, plane := range []struct {
		path  string
		cidrs []netip.Prefix
	}{{"networks.controlPlane.cidrs", v.c.Networks.ControlPlane.CIDRs}, {"networks.workloadPlane.cidrs", v.c.Networks.WorkloadPlane.CIDRs}} {
		for i, p := range plane.cidrs {
			// Host bits are reported by plane(); use the masked network here so that one mistake
			// does not cascade into "address outside every network" errors.
			if p = p.Masked(); p.IsValid() && !seen[p] {
				seen[p] = true
				out = append(out, namedPrefix{fmt.Sprintf("%s[%d]", plane.path, i), p})
			}
		}
	}
	return out
}

func (v *validator) networks() {
	n := v.c.Networks
	v.plane("networks.controlPlane.cidrs", n.ControlPlane.CIDRs, true)
	if !slices.Equal(n.WorkloadPlane.CIDRs, n.ControlPlane.CIDRs) { // the default copy: reported once
		v.plane("networks.workloadPlane.cidrs", n.WorkloadPlane.CIDRs, false)
	}
	podsOK := v.prefix("networks.pods", n.Pods) && v.ipv4("networks.pods", n.Pods)
	svcOK := v.prefix("networks.services", n.Services) && v.ipv4("networks.services", n.Services)
	if svcOK && n.Services.Bits() < 12 {
		v.errorf("networks.services", "%s is too large: kube-apiserver accepts at most a /12 for IPv4 service ranges; use e.g. %s", n.Services, DefaultServicesCIDR)
	}
	if podsOK {
		v.podCapacity(n.Pods)
	}
	if podsOK && svcOK && n.Pods.Overlaps(n.Services) {
		v.errorf("networks.services", "%s overlaps networks.pods %s: pick disjoint ranges", n.Services, n.Pods)
	}
	for _, np := range v.nodeNetworks() {
		if podsOK && n.Pods.Overlaps(np.p) {
			v.errorf("networks.pods", "%s overlaps %s %s: pod addresses would shadow node addresses; pick a disjoint range", n.Pods, np.path, np.p)
		}
		if svcOK && n.Services.Overlaps(np.p) {
			v.errorf("networks.services", "%s overlaps %s %s: service addresses would shadow node addresses; pick a disjoint range", n.Services, np.path, np.p)
		}
	}
}

// ipv4 refuses an IPv6 network (ipv4Only).
func (v *validator) ipv4(path string, p netip.Prefix) bool {
	if p.Addr().Is6() {
		v.errorf(path, "%s is IPv6: "+ipv4Only, p)
		return false
	}
	return true
}

// podCapacity checks that pods holds one node range per node: kube-controller-manager gives each node
// a /24 (IPv4) or /64 (IPv6) by default (--node-cidr-mask-size), as kubeadm configures it.
func (v *validator) podCapacity(pods netip.Prefix) {
	nodeBits := 24
	if pods.Addr().Is6() {
		nodeBits = 64
	}
	if pods.Bits() > nodeBits {
		v.errorf("networks.pods", "%s is too small: each node gets a /%d from it; use a /%d or larger", pods, nodeBits, nodeBits-4)
		return
	}
	if shift := nodeBits - pods.Bits(); shift < 30 && len(v.c.Nodes) > 1<<shift {
		v.errorf("networks.pods", "%s holds %d node ranges (/%d each) but there are %d nodes: use a larger range", pods, 1<<shift, nodeBits, len(v.c.Nodes))
	}
}

// hostAddr checks an address that a host carries: valid, unicast, not 4-in-6.
func (v *validator) hostAddr(path string, a netip.Addr) bool {
	switch {
	case !a.IsValid():
		v.errorf(path, "is required: write an IP address such as 10.0.0.1")
	case a.Is4In6():
		v.errorf(path, "%s is an IPv4-mapped IPv6 address: write it as %s", a, a.Unmap())
	case a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a == ipv4Broadcast:
		v.errorf(path, "%s is not a unicast address a host can carry: use the address on the node network", a)
	default:
		return true
	}
	return false
}

func (v *validator) apiServer() {
	a := v.c.APIServer
	if a.Port == 0 {
		v.errorf("apiServer.port", "is required: the API server port, usually %d", DefaultAPIServerPort)
	}
	k := a.Keepalived
	if k.VirtualRouterID == 0 {
		v.errorf("apiServer.keepalived.virtualRouterID", "0 is out of range: use 1..255, or omit it to derive one from clusterName and apiServer.vip")
	}
	v.advertInterval(k)
	if k.IsEnabled() {
		switch {
		case !a.VIP.IsValid():
			v.errorf("apiServer.vip", "is required when apiServer.keepalived.enabled is true: choose a free address inside networks.controlPlane.cidrs, or set keepalived.enabled: false and point vip at your load balancer")
		case !v.hostAddr("apiServer.vip", a.VIP):
		case a.VIP.Is6():
			v.errorf("apiServer.vip", "%s is IPv6: "+ipv4Only, a.VIP)
		default:
			v.vipInControlPlane(a.VIP)
		}
	} else if a.VIP.IsValid() {
		v.hostAddr("apiServer.vip", a.VIP)
	} else if v.c.Kubernetes.IsEnabled() {
		v.errorf("apiServer.vip", "is required when kubernetes.enabled is true: it is the cluster's controlPlaneEndpoint (kubeadm), so give your load balancer's address, or enable apiServer.keepalived")
	}
	if k.AuthPasswordFile != "" && v.opts.CheckFiles {
		path := "apiServer.keepalived.authPasswordFile"
		if v.file(path, k.AuthPasswordFile, true) {
			secret, err := ReadSecretFile(k.AuthPasswordFile)
			switch {
			case err != nil:
				v.errorf(path, "%s cannot be read: %v", k.AuthPasswordFile, err)
			case len(secret) == 0:
				v.errorf(path, "%s is empty: write a 1 to 8 byte VRRP password into it", k.AuthPasswordFile)
			case len(secret) > 8:
				v.errorf(path, "%s holds %d bytes: VRRP PASS authentication uses at most 8 (keepalived would silently truncate it); shorten it", k.AuthPasswordFile, len(secret))
			}
		}
	}
}

// advertInterval checks apiServer.keepalived.advertInterval against the VRRP version it is carried
// in (Keepalived.VRRPVersion).
func (v *validator) advertInterval(k Keepalived) {
	const path = "apiServer.keepalived.advertInterval"
	iv := k.AdvertInterval
	switch {
	case iv == 0:
		v.errorf(path, "is required: a duration such as %s, or leave it out of the document for the default", DefaultAdvertInterval)
	case k.VRRPVersion() == 2 && iv < time.Second:
		v.errorf(path, "%s is below 1s, but apiServer.keepalived.authPasswordFile selects VRRPv2 with PASS authentication, whose advertisements carry whole seconds (RFC 3768 §5.3.7): "+
			"remove authPasswordFile to use VRRPv3 with sub-second intervals (the PASS password is sent in clear text and protects nothing the firewall's peer-only VRRP rule does not), or use 1s or more", iv)
	case k.VRRPVersion() == 2 && (iv%time.Second != 0 || iv > 255*time.Second):
		v.errorf(path, "%s is not a whole number of seconds from 1s to 255s, as VRRPv2 (selected by apiServer.keepalived.authPasswordFile) requires (RFC 3768 §5.3.7)", iv)
	case k.VRRPVersion() == 3 && (iv%(10*time.Millisecond) != 0 || iv < 10*time.Millisecond || iv > 40950*time.Millisecond):
		v.errorf(path, "%s is not a multiple of 10ms from 10ms to 40.95s, as VRRPv3 requires (RFC 5798 §5.2.7: the interval is carried in centiseconds); the default is %s", iv, DefaultAdvertInterval)
	}
}

func (v *validator) vipInControlPlane(vip netip.Addr) {
	var cps []string
	for _, p := range v.c.Networks.ControlPlane.CIDRs {
		if !p.IsValid() {
			continue
		}
		cps = append(cps, p.String())
		if !p.Contains(vip) {
			continue
		}
		if p.Addr().Is4() && p.Bits() < 31 {
			if vip == p.Masked().Addr() {
				v.errorf("apiServer.vip", "%s is the network address of %s: choose a host address inside it", vip, p)
			} else if vip == lastAddr(p) {
				v.errorf("apiServer.vip", "%s is the broadcast address of %s: choose a host address inside it", vip, p)
			}
		}
		return
	}
	if len(cps) == 0 {
		return // networks.controlPlane.cidrs already reported
	}
	v.errorf("apiServer.vip", "%s is outside every networks.controlPlane.cidrs (%s): keepalived carries the VIP on a control-plane network, so choose a free address inside one", vip, strings.Join(cps, ", "))
}

// lastAddr is the highest address of an IPv4 prefix (its broadcast address).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	hostBits := 32 - p.Bits()
	for i := 3; i >= 0 && hostBits > 0; i-- {
		n := min(hostBits, 8)
		b[i] |= byte(1<<n - 1)
		hostBits -= n
	}
	return netip.AddrFrom4(b)
}

func (v *validator) server() {
	s := v.c.Server
	switch a := s.ListenAddress; {
	case !a.IsValid():
		v.errorf("server.listenAddress", "is required: the address the appliance listens on, e.g. %s for all", DefaultServerListenAddress)
	case a.Is4In6() || a.IsMulticast() || a == ipv4Broadcast:
		v.errorf("server.listenAddress", "%s cannot be listened on: use %s (all IPv4 addresses), :: (all) or one local unicast address", a, DefaultServerListenAddress)
	case a.Is6() && !a.IsUnspecified():
		v.errorf("server.listenAddress", "%s is IPv6: the nodes reach the appliance on its IPv4 control-plane address; listen on %s (all IPv4 addresses), :: (all) or one local IPv4 address", a, DefaultServerListenAddress)
	}
	if s.Port == 0 {
		v.errorf("server.port", "is required: the appliance's HTTPS port, usually %d", DefaultServerPort)
	}
	seen := map[string]string{}
	for i, name := range s.Names {
		path := fmt.Sprintf("server.names[%d]", i)
		if !isDNS1123Subdomain(name) {
			v.errorf(path, "%q is not a DNS name: use %s (IP addresses are added to the certificate automatically)", name, subdomainRule)
			continue
		}
		if first, dup := seen[name]; dup {
			v.errorf(path, "%q is listed twice (also %s): remove one", name, first)
			continue
		}
		seen[name] = path
	}
}

// host checks host (the bootstrap host's setup when booting from the ISO).
func (v *validator) host() {
	h := v.c.Host
	inCP := false
	seen := map[string]string{}
	for i, in := range h.Interfaces {
		path := fmt.Sprintf("host.interfaces[%d]", i)
		switch {
		case in.Name == "" && in.MACAddress == "":
			v.errorf(path, "names no interface: set name (e.g. ens3) or macAddress (e.g. 52:54:00:12:34:56)")
		case in.Name != "" && in.MACAddress != "":
			v.errorf(path, "sets both name and macAddress: keep one")
		case in.MACAddress != "":
			if hw, err := net.ParseMAC(in.MACAddress); err != nil || len(hw) != 6 {
				v.errorf(path+".macAddress", "%q is not a MAC address: write six hex bytes, e.g. 52:54:00:12:34:56", in.MACAddress)
			}
		case len(in.Name) > 15 || strings.ContainsAny(in.Name, "/ \t:") || in.Name == "." || in.Name == "..":
			v.errorf(path+".name", "%q is not a Linux interface name (at most 15 characters, no '/', ':' or spaces)", in.Name)
		}
		key := in.Name + in.MACAddress
		if first, dup := seen[strings.ToLower(key)]; dup && key != "" {
			v.errorf(path, "the interface %s is also %s: merge the two entries", key, first)
		}
		seen[strings.ToLower(key)] = path
		if len(in.Addresses) == 0 {
			v.errorf(path+".addresses", "is required: at least one address/prefix, e.g. 10.100.0.2/24")
		}
		for j, a := range in.Addresses {
			ap := fmt.Sprintf("%s.addresses[%d]", path, j)
			if !v.hostAddr(ap, a.Addr()) {
				continue
			}
			if a.Masked().Addr() == a.Addr() && a.Bits() < a.Addr().BitLen()-1 {
				v.errorf(ap, "%s is a network, not a host address: write the host's address with the prefix, e.g. %s", a, a.Addr().Next().String()+"/"+strconv.Itoa(a.Bits()))
			}
			for _, cp := range v.c.Networks.ControlPlane.CIDRs {
				if cp.Contains(a.Addr()) {
					inCP = true
				}
			}
		}
		if in.Gateway.IsValid() {
			v.hostAddr(path+".gateway", in.Gateway)
		}
	}
	if len(h.Interfaces) > 0 && !inCP {
		v.errorf("host.interfaces", "no address lies in networks.controlPlane.cidrs: the nodes reach the appliance there; add one")
	}
	if d := h.StateDevice; d != "" && (!strings.HasPrefix(d, "/dev/") || filepath.Clean(d) != d) {
		v.errorf("host.stateDevice", "%q is not a device path: write an absolute path under /dev, e.g. /dev/disk/by-id/… or /dev/sdb", d)
	}
	for i, k := range h.SSHAuthorizedKeys {
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil {
			v.errorf(fmt.Sprintf("host.sshAuthorizedKeys[%d]", i), "is not an OpenSSH public key line (%v): paste a line of ~/.ssh/id_ed25519.pub", err)
		}
	}
}

// paths checks stateDir, bundle and ignition snippets.
func (v *validator) paths() {
	switch d := v.c.StateDir; {
	case d == "":
		v.errorf("stateDir", "is required: an absolute directory such as %s", DefaultStateDir)
	case !filepath.IsAbs(d):
		v.errorf("stateDir", "%q is not absolute: write an absolute path such as %s", d, DefaultStateDir)
	default:
		v.stateDir(d)
	}
	switch b := v.c.Bundle.Path; {
	case b == "":
		v.errorf("bundle.path", "is required: the directory of the offline bundle, e.g. /var/cache/appliance/bundle")
	case v.opts.CheckFiles:
		st, err := os.Stat(b)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			v.errorf("bundle.path", "%s does not exist: unpack the offline bundle there or fix the path", b)
		case err != nil:
			v.errorf("bundle.path", "%s cannot be read: %v", b, err)
		case !st.IsDir():
			v.errorf("bundle.path", "%s is not a directory: point it at the unpacked bundle directory", b)
		default:
			v.bundleVersion(b)
		}
	}
	bk := v.c.Bundle
	if len(bk.PublicKeys) == 0 && len(bk.PublicKeyFiles) == 0 {
		v.errorf("bundle.publicKeys", "is required: pin the public key the bundle is signed with (\"ed25519:…\", as `appliance bundle inspect DIR` prints it), or name a file holding it in bundle.publicKeyFiles; an unsigned bundle is refused")
	}
	for i, k := range bk.PublicKeys {
		if _, err := bundle.ParsePublicKey(k); err != nil {
			v.errorf(fmt.Sprintf("bundle.publicKeys[%d]", i), "%v", err)
		}
	}
	for i, f := range bk.PublicKeyFiles {
		p := fmt.Sprintf("bundle.publicKeyFiles[%d]", i)
		if f == "" {
			v.errorf(p, "is empty: name a file holding one \"ed25519:…\" key")
		} else if v.opts.CheckFiles && v.file(p, f, false) {
			if data, ok := v.readFile(p, f); ok {
				if _, err := bundle.ParsePublicKey(string(data)); err != nil {
					v.errorf(p, "%s: %v", f, err)
				}
			}
		}
	}
	ig := v.c.Ignition
	v.snippets("ignition.all", ig.All)
	v.snippets("ignition.controlPlane", ig.ControlPlane)
	v.snippets("ignition.worker", ig.Worker)
}

func (v *validator) snippets(path string, files []string) {
	for i, f := range files {
		p := fmt.Sprintf("%s[%d]", path, i)
		if f == "" {
			v.errorf(p, "is empty: name an Ignition config file, or remove the entry")
			continue
		}
		if v.opts.CheckFiles {
			v.file(p, f, false)
		}
	}
}

// file checks that name is a readable regular file; secret files readable by group or others give a
// warning (secrets are kept 0600).
func (v *validator) file(path, name string, secret bool) bool {
	st, err := os.Stat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		v.errorf(path, "%s does not exist: create it or fix the path", name)
		return false
	case err != nil:
		v.errorf(path, "%s cannot be read: %v", name, err)
		return false
	case !st.Mode().IsRegular():
		v.errorf(path, "%s is not a regular file: name a file", name)
		return false
	}
	f, err := os.Open(name)
	if err != nil {
		v.errorf(path, "%s cannot be read: %v", name, err)
		return false
	}
	_ = f.Close()
	if secret && st.Mode().Perm()&0o077 != 0 {
		v.warnf(path, "%s is readable by group or others (mode %04o): it holds a secret, chmod 600 it", name, st.Mode().Perm())
	}
	return true
}

// readFile reads a referenced file after file() accepted it, bounded by maxReferencedFile (and
// refused if it has become something other than a regular file since).
func (v *validator) readFile(path, name string) ([]byte, bool) {
	data, err := readRegularFile(name, maxReferencedFile)
	switch {
	case errors.Is(err, errTooLarge):
		v.errorf(path, "%s is larger than %d bytes: name the right file", name, maxReferencedFile)
		return nil, false
	case err != nil:
		v.errorf(path, "%s cannot be read: %v", name, err)
		return nil, false
	}
	return data, true
}

// ReadSecretFile reads a one-line secret (password) file as consumers must: one trailing "\n" or
// "\r\n" is dropped, so `echo secret > file` works. Only a regular file of at most 1 MiB is read (a
// FIFO or device is refused, never waited on). Errors are the *fs.PathError of the stat, open or
// read, or say that the file is not a regular file or too large.
func ReadSecretFile(name string) ([]byte, error) {
	data, err := readRegularFile(name, maxReferencedFile)
	if err != nil {
		return nil, withName(name, err)
	}
	data = bytes.TrimSuffix(data, []byte("\n"))
	return bytes.TrimSuffix(data, []byte("\r")), nil
}

func (v *validator) nodes() {
	nodes := v.c.Nodes
	if len(nodes) == 0 {
		v.errorf("nodes", "is empty: list the machines of the cluster; at least one needs roles: [control-plane]")
		return
	}
	cp := len(v.c.ControlPlaneNodes())
	switch {
	case cp == 0:
		v.errorf("nodes", "no node has role control-plane: give at least one node roles: [control-plane] (three for high availability)")
	case cp > 1 && cp%2 == 0:
		v.warnf("nodes", "%d control-plane nodes: etcd needs a majority (%d of %d) to keep quorum, so %d members survive no more failures (%d) than %d do; use an odd number (%d or %d)",
			cp, cp/2+1, cp, cp, cp/2-1, cp-1, cp-1, cp+1)
	}
	names := map[string]string{}
	addrs := map[netip.Addr]string{}
	macs := map[string]string{}
	uuids := map[string]string{}
	nets := v.nodeNetworks()
	for i, n := range nodes {
		path := fmt.Sprintf("nodes[%d]", i)
		switch {
		case n.Name == "":
			v.errorf(path+".name", "is required: the node's name (its Kubernetes Node name), %s", subdomainRule)
		case !isDNS1123Subdomain(n.Name):
			v.errorf(path+".name", "%q is not a valid node name: use %s", n.Name, subdomainRule)
		default:
			if first, dup := names[n.Name]; dup {
				v.errorf(path+".name", "%q is also %s: node names must be unique", n.Name, first)
			} else {
				names[n.Name] = path + ".name"
			}
		}
		v.roles(path+".roles", n.Roles)
		for j, a := range n.Addresses {
			ap := fmt.Sprintf("%s.addresses[%d]", path, j)
			if !v.hostAddr(ap, a) {
				continue
			}
			if first, dup := addrs[a]; dup {
				v.errorf(ap, "%s is also %s: node addresses must be unique", a, first)
				continue
			}
			addrs[a] = ap
			if v.c.APIServer.Keepalived.IsEnabled() && a == v.c.APIServer.VIP {
				v.errorf(ap, "%s is the API server VIP (apiServer.vip): keepalived moves the VIP between nodes, so give the node its own address", a)
			}
			if len(nets) > 0 && !containedIn(a, nets) {
				v.errorf(ap, "%s is outside every networks.controlPlane.cidrs and networks.workloadPlane.cidrs: give the node an address on one of them, or add its network", a)
			}
		}
		if n.MAC != "" {
			hw, err := net.ParseMAC(n.MAC)
			switch {
			case err != nil || len(hw) != 6:
				v.errorf(path+".mac", "%q is not a MAC address: write six hex octets, e.g. 52:54:00:00:00:11", n.MAC)
			case hw[0]&1 == 1:
				v.errorf(path+".mac", "%q is a multicast address: write the node's NIC address", n.MAC)
			default:
				if first, dup := macs[hw.String()]; dup {
					v.errorf(path+".mac", "%q is also %s: MAC addresses must be unique", n.MAC, first)
				} else {
					macs[hw.String()] = path + ".mac"
				}
			}
		}
		if n.SystemUUID != "" {
			up := path + ".systemUUID"
			switch {
			case !validUUID(n.SystemUUID):
				v.errorf(up, "%q is not a UUID: write the SMBIOS system UUID as 8-4-4-4-12 hex digits, as `cat /sys/class/dmi/id/product_uuid` or `dmidecode -s system-uuid` prints it", n.SystemUUID)
			case n.Power.Kind != PowerIPMI && n.Power.Kind != PowerRedfish:
				v.errorf(up, "is set but power.kind is %q: only BMC-powered nodes (ipmi, redfish) enrol and have their system UUID checked; remove it", n.Power.Kind)
			default:
				if first, dup := uuids[strings.ToLower(n.SystemUUID)]; dup {
					v.errorf(up, "%q is also %s: system UUIDs must be unique", n.SystemUUID, first)
				} else {
					uuids[strings.ToLower(n.SystemUUID)] = up
				}
			}
		}
		// A node whose addresses are already refused above (unparsable, outside the node networks) or a
		// document without node networks gets no second, consequential error here.
		addrsOK := len(v.c.Networks.ControlPlane.CIDRs) > 0 && len(nets) > 0 && !slices.ContainsFunc(n.Addresses, func(a netip.Addr) bool { return !a.IsValid() || !containedIn(a, nets) })
		if v.c.Kubernetes.IsEnabled() && addrsOK && !slices.ContainsFunc(n.Addresses, func(a netip.Addr) bool {
			return slices.ContainsFunc(v.c.Networks.WorkloadPlane.CIDRs, func(p netip.Prefix) bool { return p.Contains(a) })
		}) {
			v.errorf(path+".addresses", "has no address inside networks.workloadPlane.cidrs: with kubernetes.enabled the bridge CNI routes this node's pod range via that address, so list the node's static workload-plane address (or set kubernetes.enabled: false)")
		}
		if v.c.APIServer.Keepalived.IsEnabled() && addrsOK && slices.Contains(n.Roles, RoleControlPlane) && !slices.ContainsFunc(n.Addresses, func(a netip.Addr) bool {
			return slices.ContainsFunc(v.c.Networks.ControlPlane.CIDRs, func(p netip.Prefix) bool { return p.Contains(a) })
		}) {
			v.errorf(path+".addresses", "has no address inside networks.controlPlane.cidrs: keepalived's unicast peers and every firewall's VRRP rule list each control plane by that address, so a control plane without one would be left out of the VRRP group and claim the VIP beside it; list the node's static control-plane address")
		}
		v.snippets(path+".ignition", n.Ignition)
		v.power(path+".power", n)
		v.rootDevice(path+".rootDevice", n)
	}
}

func containedIn(a netip.Addr, nets []namedPrefix) bool {
	for _, np := range nets {
		if np.p.Contains(a) {
			return true
		}
	}
	return false
}

func (v *validator) roles(path string, roles []Role) {
	if len(roles) == 0 {
		v.errorf(path, "is required: write [control-plane], [worker] or [control-plane, worker]")
		return
	}
	seen := map[Role]bool{}
	for j, r := range roles {
		rp := fmt.Sprintf("%s[%d]", path, j)
		switch {
		case r != RoleControlPlane && r != RoleWorker:
			v.errorf(rp, "%q is not a role: use %s or %s", r, RoleControlPlane, RoleWorker)
		case seen[r]:
			v.errorf(rp, "%q is listed twice: remove one", r)
		}
		seen[r] = true
	}
}

func (v *validator) power(path string, n Node) {
	p := n.Power
	if p == (Power{}) {
		v.errorf(path, "is required: say how the appliance powers this node on (kind: ssh, ipmi or redfish)")
		return
	}
	unused := func(field string, set bool) {
		if set {
			v.errorf(path+"."+field, "is not used by kind %s: remove it", p.Kind)
		}
	}
	required := func(field, value, what string) bool {
		if value == "" {
			v.errorf(path+"."+field, "is required for kind %s: %s", p.Kind, what)
			return false
		}
		return true
	}
	v.virtualMedia(path, p)
	switch p.Kind {
	case "":
		v.errorf(path+".kind", "is required: ssh, ipmi or redfish")
		return
	case PowerSSH:
		if p.Address == "" {
			v.errorf(path+".address", "is required for kind ssh: set host or host:port, or give the node an address in %s.addresses (then the first one is used)", strings.TrimSuffix(path, ".power"))
		} else {
			v.hostPort(path+".address", p.Address)
		}
		required("username", p.Username, "the login user, usually "+DefaultSSHUser)
		if required("privateKeyFile", p.PrivateKeyFile, "the unencrypted private key the appliance logs in with") && v.opts.CheckFiles {
			v.privateKey(path+".privateKeyFile", p.PrivateKeyFile)
		}
		if p.HostKey == "" && p.KnownHostsFile == "" {
			v.errorf(path+".hostKey", "the node's SSH host key must be pinned: set hostKey (one authorized_keys line, e.g. \"ssh-ed25519 AAAA...\", from `ssh-keyscan` or /etc/ssh/ssh_host_ed25519_key.pub) or knownHostsFile; there is no trust on first use")
		}
		if p.HostKey != "" {
			v.hostKey(path+".hostKey", p.HostKey)
		}
		if p.KnownHostsFile != "" && v.opts.CheckFiles && v.file(path+".knownHostsFile", p.KnownHostsFile, false) {
			if _, err := knownhosts.New(p.KnownHostsFile); err != nil {
				v.errorf(path+".knownHostsFile", "%s is not an OpenSSH known_hosts file: %v", p.KnownHostsFile, err)
			}
		}
		unused("passwordFile", p.PasswordFile != "")
		unused("caFile", p.CAFile != "")
		unused("insecureSkipVerify", p.InsecureSkipVerify)
		unused("bootDevice", p.BootDevice != "")
	case PowerIPMI, PowerRedfish:
		if p.Kind == PowerIPMI {
			if required("address", p.Address, fmt.Sprintf("the BMC's host or host:port (default port %d)", DefaultIPMIPort)) {
				v.hostPort(path+".address", p.Address)
			}
			unused("caFile", p.CAFile != "")
			unused("insecureSkipVerify", p.InsecureSkipVerify)
		} else {
			if required("address", p.Address, "the BMC's Redfish URL, e.g. https://10.0.0.21") {
				v.redfishURL(path+".address", p.Address)
			}
			v.redfishTLS(path, p)
		}
		required("username", p.Username, "the BMC user")
		if required("passwordFile", p.PasswordFile, "a file holding the BMC password") && v.opts.CheckFiles && v.file(path+".passwordFile", p.PasswordFile, true) {
			if secret, err := ReadSecretFile(p.PasswordFile); err == nil && len(secret) == 0 {
				v.errorf(path+".passwordFile", "%s is empty: write the BMC password into it", p.PasswordFile)
			}
		}
		switch p.BootDevice {
		case "", BootPXE, BootCDROM, BootDisk:
		default:
			v.errorf(path+".bootDevice", "%q is not a boot device: use %s, %s or %s", p.BootDevice, BootPXE, BootCDROM, BootDisk)
		}
		unused("privateKeyFile", p.PrivateKeyFile != "")
		unused("hostKey", p.HostKey != "")
		unused("knownHostsFile", p.KnownHostsFile != "")
	default:
		v.errorf(path+".kind", "%q is not a power kind: use %s, %s or %s", p.Kind, PowerSSH, PowerIPMI, PowerRedfish)
	}
}

// hostPort checks "host" or "host:port" (SetDefaults adds the default port).
func (v *validator) hostPort(path, addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host, port = strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]"), ""
	}
	if !validHost(host) {
		v.errorf(path, "%q is not host or host:port: write an IP address or DNS name, optionally with :port ([IPv6]:port)", addr)
		return
	}
	if err == nil {
		if n, perr := strconv.ParseUint(port, 10, 16); perr != nil || n == 0 {
			v.errorf(path, "%q has an invalid port %q: use 1..65535, or leave the port out for the default", addr, port)
		}
	}
}

func (v *validator) redfishURL(path, addr string) {
	u, err := url.Parse(addr)
	switch {
	case err != nil || u.Scheme != "https" || u.Host == "" || u.Opaque != "":
		v.errorf(path, "%q is not an https:// URL: write the BMC's Redfish endpoint, e.g. https://10.0.0.21", addr)
	case u.User != nil:
		v.errorf(path, "%q carries credentials: remove them and use username and passwordFile", addr)
	case !validHost(u.Hostname()):
		v.errorf(path, "%q has an invalid host %q: use an IP address or DNS name", addr, u.Hostname())
	case u.Port() != "":
		if n, perr := strconv.ParseUint(u.Port(), 10, 16); perr != nil || n == 0 {
			v.errorf(path, "%q has an invalid port %q: use 1..65535", addr, u.Port())
		}
	}
}

func (v *validator) redfishTLS(path string, p Power) {
	switch {
	case p.CAFile != "" && p.InsecureSkipVerify:
		v.errorf(path+".insecureSkipVerify", "contradicts caFile: remove insecureSkipVerify to verify the BMC with caFile")
	case p.InsecureSkipVerify:
		v.warnf(path+".insecureSkipVerify", "TLS verification of the BMC is off: anyone on the BMC network can impersonate it and capture the password; set caFile instead")
	case p.CAFile == "":
		v.errorf(path+".caFile", "is required for kind redfish: the PEM CA bundle the BMC certificate chains to (or set insecureSkipVerify: true, not recommended)")
	case v.opts.CheckFiles && v.file(path+".caFile", p.CAFile, false):
		if data, ok := v.readFile(path+".caFile", p.CAFile); ok && !x509.NewCertPool().AppendCertsFromPEM(data) {
			v.errorf(path+".caFile", "%s holds no PEM certificate: name the CA bundle (-----BEGIN CERTIFICATE-----)", p.CAFile)
		}
	}
}

func (v *validator) hostKey(path, key string) {
	pub, _, options, rest, err := ssh.ParseAuthorizedKey([]byte(key))
	switch {
	case err != nil:
		v.errorf(path, "is not an SSH public key: write one authorized_keys line such as \"ssh-ed25519 AAAA...\" (from `ssh-keyscan -t ed25519 HOST` or the node's /etc/ssh/ssh_host_ed25519_key.pub)")
	case len(options) > 0:
		v.errorf(path, "carries authorized_keys options (%s): write just the key type and key", strings.Join(options, ","))
	case len(bytes.TrimSpace(rest)) > 0:
		v.errorf(path, "holds more than one key: pin one, or list several in knownHostsFile")
	case pub.Type() == ssh.CertAlgoED25519v01 || strings.Contains(pub.Type(), "-cert-"):
		v.errorf(path, "is a certificate (%s): pin the plain host key", pub.Type())
	}
}

func (v *validator) privateKey(path, name string) {
	if !v.file(path, name, true) {
		return
	}
	data, ok := v.readFile(path, name)
	if !ok {
		return
	}
	_, err := ssh.ParseRawPrivateKey(data)
	var missing *ssh.PassphraseMissingError
	switch {
	case errors.As(err, &missing):
		v.errorf(path, "%s is encrypted with a passphrase: the appliance needs an unencrypted key (keep it mode 0600)", name)
	case err != nil:
		v.errorf(path, "%s is not an SSH private key: %v", name, err)
	}
}

// ipv4Broadcast is the limited broadcast address 255.255.255.255 (RFC 919).
var ipv4Broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// validUUID reports whether s is a UUID in its 36-character string form (RFC 9562 §4), any case.
func validUUID(s string) bool {
	_, err := uuid.Parse(s)
	return err == nil && len(s) == 36
}
