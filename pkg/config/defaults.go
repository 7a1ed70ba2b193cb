package config

import (
	"crypto/sha256"
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults applied by SetDefaults.
const (
	// DefaultKubernetesVersion is the Kubernetes version installed when kubernetesVersion is unset, a
	// release of a minor pkg/k8sversion supports (today its newest, v1.37). It is also the version of
	// the lab and of the fixture bundle: TestDefaultVersionEverywhere (test/fixtures/kubernetes) fails
	// when the Makefile's KUBERNETES_VERSION, test/fixtures/build-bundle.sh, build-kubernetes.sh's
	// DEFAULT_MINOR, test/lab/demo.sh or test/labns.KubernetesVersion name another.
	DefaultKubernetesVersion = "v1.37.2"
	// DefaultPodsCIDR is networks.pods when unset (Kubespray's default, clear of 10.96.0.0/12).
	DefaultPodsCIDR = "10.233.0.0/16"
	// DefaultServicesCIDR is networks.services when unset (kubeadm's default serviceSubnet).
	DefaultServicesCIDR = "10.96.0.0/12"
	// DefaultAPIServerPort is apiServer.port when unset (kubeadm's default bindPort).
	DefaultAPIServerPort uint16 = 6443
	// DefaultServerListenAddress is server.listenAddress when unset: every IPv4 address.
	DefaultServerListenAddress = "0.0.0.0"
	// DefaultServerPort is server.port when unset.
	DefaultServerPort uint16 = 8443
	// DefaultStateDir is stateDir when unset.
	DefaultStateDir = "/var/lib/appliance"
	// DefaultSSHPort is added to an ssh power address without a port.
	DefaultSSHPort uint16 = 22
	// DefaultSSHUser is power.username for ssh when unset.
	DefaultSSHUser = "root"
	// DefaultIPMIPort is added to an ipmi power address without a port (RMCP+, IPMI v2.0 §13).
	DefaultIPMIPort uint16 = 623
	// DefaultBootDevice is power.bootDevice for ipmi and redfish when unset.
	DefaultBootDevice = BootPXE
)

// Default VRRP advertisement intervals (apiServer.keepalived.advertInterval).
const (
	// DefaultAdvertInterval is the interval with VRRPv3 (no authPasswordFile): a backup takes over
	// within about 0.9 s of the holder's last advertisement.
	DefaultAdvertInterval = 250 * time.Millisecond
	// DefaultAdvertIntervalPASS is the interval with VRRPv2 PASS authentication (authPasswordFile
	// set), whose advertisements carry whole seconds only (RFC 3768 §5.3.7): the RFC default, 1 s.
	DefaultAdvertIntervalPASS = time.Second
)

// DefaultVirtualRouterID derives the VRRP virtual router ID (1..255) from the cluster name and the
// API VIP, so that clusters on one L2 segment are unlikely to collide without anyone choosing IDs,
// also when they share a name (every lab calls its cluster "lab"): the first 8 bytes of
// SHA-256(clusterName + "\x00" + vip.String()) as a big-endian integer, mod 255, plus 1 (an invalid
// vip counts as ""). Any two (name, VIP) pairs collide with probability about 1/255, so k clusters
// on a segment all differ with probability ∏(1 − i/255), i < k (the birthday bound: 4 clusters
// 97.7%, 10 clusters 83.6%); set virtualRouterID explicitly where several clusters share a segment
// and check that no two collide (the pre-flight refuses a VRID another speaker already uses).
//
// Releases before this derivation hashed the cluster name alone (32-bit FNV-1a, mod 255, plus 1),
// so a cluster bootstrapped by one of them has a different default VRID. Changing the VRID of a
// running cluster is not safe (while the speakers are reconfigured one by one, each VRID elects its
// own master and the VIP has two holders), so a rerun keeps the VRID the cluster was bootstrapped
// with: the render phase reads it back from the state directory (pkg/plan ReadRecorded, VRRPFor) and
// uses it whenever virtualRouterID was derived rather than written (VirtualRouterIDDerived).
func DefaultVirtualRouterID(clusterName string, vip netip.Addr) uint8 {
	v := ""
	if vip.IsValid() {
		v = vip.String()
	}
	sum := sha256.Sum256([]byte(clusterName + "\x00" + v))
	return uint8(binary.BigEndian.Uint64(sum[:8])%255) + 1
}

// SetDefaults fills every unset field of c with its default, in place. It is idempotent, leaves set
// fields alone (except normalising: MACs are lowercased, ssh/ipmi power addresses get their default
// port), and leaves malformed values untouched so Validate reports them as written. A nil c is a no-op.
//
// Defaults: apiVersion/kind; kubernetesVersion DefaultKubernetesVersion; kubernetes.enabled true; networks.workloadPlane.cidrs
// a copy of networks.controlPlane.cidrs; networks.pods DefaultPodsCIDR; networks.services
// DefaultServicesCIDR; networks.cni DefaultCNI; apiServer.port DefaultAPIServerPort; apiServer.keepalived.enabled true;
// apiServer.keepalived.virtualRouterID DefaultVirtualRouterID(clusterName, apiServer.vip);
// apiServer.keepalived.advertInterval DefaultAdvertInterval, or DefaultAdvertIntervalPASS with
// authPasswordFile; server.listenAddress
// 0.0.0.0; server.port DefaultServerPort; stateDir DefaultStateDir; per node: ssh username root,
// ssh address the node's first address, port 22 (ssh) or 623 (ipmi), bootDevice pxe (ipmi, redfish);
// boot (setBootDefaults, after the nodes): dhcp, httpPort, nodeISO, enrolment.approval automatic and
// enrolment.sourceAddress lease with dhcp server, any otherwise.
func SetDefaults(c *BootstrapConfiguration) {
	if c == nil {
		return
	}
	if c.APIVersion == "" {
		c.APIVersion = APIVersion
	}
	if c.Kind == "" {
		c.Kind = Kind
	}
	if c.KubernetesVersion == "" {
		c.KubernetesVersion = DefaultKubernetesVersion
	}
	if c.Kubernetes.Enabled == nil {
		enabled := true
		c.Kubernetes.Enabled = &enabled
	}
	n := &c.Networks
	if len(n.WorkloadPlane.CIDRs) == 0 && len(n.ControlPlane.CIDRs) > 0 {
		n.WorkloadPlane.CIDRs = slices.Clone(n.ControlPlane.CIDRs)
	}
	if !n.Pods.IsValid() {
		n.Pods = netip.MustParsePrefix(DefaultPodsCIDR)
	}
	if !n.Services.IsValid() {
		n.Services = netip.MustParsePrefix(DefaultServicesCIDR)
	}
	setCNIDefaults(n)
	a := &c.APIServer
	if a.Port == 0 {
		a.Port = DefaultAPIServerPort
	}
	if a.Keepalived.Enabled == nil {
		enabled := true
		a.Keepalived.Enabled = &enabled
	}
	if a.LoadBalancer.Enabled == nil {
		enabled := true
		a.LoadBalancer.Enabled = &enabled
	}
	if a.Keepalived.VirtualRouterID == 0 {
		a.Keepalived.VirtualRouterID = DefaultVirtualRouterID(c.ClusterName, a.VIP)
		c.vridDerived = true
	}
	setIngressDefaults(c)
	if a.Keepalived.AdvertInterval == 0 {
		c.advertDerived = true
		a.Keepalived.AdvertInterval = DefaultAdvertInterval
		if a.Keepalived.VRRPVersion() == 2 {
			a.Keepalived.AdvertInterval = DefaultAdvertIntervalPASS
		}
	}
	if !c.Server.ListenAddress.IsValid() {
		c.Server.ListenAddress = netip.MustParseAddr(DefaultServerListenAddress)
	}
	if c.Server.Port == 0 {
		c.Server.Port = DefaultServerPort
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	for i := range c.Nodes {
		setNodeDefaults(&c.Nodes[i])
	}
	setBootDefaults(c)
}

func setNodeDefaults(n *Node) {
	if hw, err := net.ParseMAC(n.MAC); err == nil && len(hw) == 6 {
		n.MAC = hw.String() // lowercase, colon-separated
	}
	if validUUID(n.SystemUUID) {
		n.SystemUUID = strings.ToLower(n.SystemUUID)
	}
	p := &n.Power
	switch p.Kind {
	case PowerSSH:
		if p.Username == "" {
			p.Username = DefaultSSHUser
		}
		if p.Address == "" && len(n.Addresses) > 0 && n.Addresses[0].IsValid() {
			p.Address = netip.AddrPortFrom(n.Addresses[0], DefaultSSHPort).String()
		} else {
			p.Address = withDefaultPort(p.Address, DefaultSSHPort)
		}
	case PowerIPMI:
		p.Address = withDefaultPort(p.Address, DefaultIPMIPort)
		if p.BootDevice == "" {
			p.BootDevice = DefaultBootDevice
		}
	case PowerRedfish:
		if p.BootDevice == "" {
			p.BootDevice = DefaultBootDevice
		}
	}
}

// withDefaultPort returns "host:port" for a bare host (IP, [IPv6] or DNS name), and addr unchanged
// when it already has a port or is not a valid host (Validate reports it as written).
func withDefaultPort(addr string, port uint16) string {
	if addr == "" {
		return ""
	}
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	host := addr
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	if !validHost(host) {
		return addr
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// VirtualRouterIDDerived reports whether SetDefaults derived apiServer.keepalived.virtualRouterID
// (DefaultVirtualRouterID) because the document left it out; false when it was written, or when c
// was never defaulted. A derived VRID may give way to the one the cluster was bootstrapped with
// (see DefaultVirtualRouterID); a written one is the operator's choice and is used as written.
func (c *BootstrapConfiguration) VirtualRouterIDDerived() bool { return c != nil && c.vridDerived }

// AdvertIntervalDerived reports whether SetDefaults set apiServer.keepalived.advertInterval because
// the document left it out (see VirtualRouterIDDerived).
func (c *BootstrapConfiguration) AdvertIntervalDerived() bool { return c != nil && c.advertDerived }
