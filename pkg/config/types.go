// Package config defines the appliance's one input document, BootstrapConfiguration
// (apiVersion appliance.airgap.dev/v1alpha1), and the three steps every consumer runs on it, in the
// manner of kubeadm's apis/kubeadm/v1beta4 and the Talos config decoder:
//
//  1. Decode: strict YAML decoding (pkg/strictyaml). Unknown or duplicate keys, values of the wrong type
//     and values that do not parse (CIDRs, IP addresses, ports) are reported together, each as a
//     FieldError with the field path and the line, e.g. `networks.controlPlane.cidrs[1]: "10.0.0.0/33"
//     is not a CIDR (line 7)`.
//  2. SetDefaults: an explicit, idempotent function that fills every unset field with its default, so
//     `appliance config defaults` can print the effective document.
//  3. Validate: semantic checks across the whole document, returning every error at once (ErrorList)
//     plus warnings (e.g. an even number of control-plane nodes).
//
// Load runs the three in order on a file.
package config

import (
	"crypto/ed25519"
	"fmt"
	"net/netip"
	"time"

	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/strictyaml"
)

// APIVersion is the only apiVersion this package accepts.
const APIVersion = "appliance.airgap.dev/v1alpha1"

// Kind is the only kind this package accepts.
const Kind = "BootstrapConfiguration"

// BootstrapConfiguration is the whole input of `appliance bootstrap`: the cluster to build, the
// networks it lives on, the nodes and how to power them. The YAML keys are the yaml tags below.
type BootstrapConfiguration struct {
	// APIVersion must be APIVersion.
	APIVersion string `yaml:"apiVersion"`
	// Kind must be Kind.
	Kind string `yaml:"kind"`
	// ClusterName names the cluster (kubeadm ClusterConfiguration.clusterName). Required, a DNS-1123
	// label (RFC 1123: lowercase alphanumerics and '-', at most 63 characters). With apiServer.vip it
	// also seeds the default VRRP virtual router ID (DefaultVirtualRouterID).
	ClusterName string `yaml:"clusterName"`
	// KubernetesVersion is the version kubeadm installs, "vMAJOR.MINOR.PATCH" (e.g. v1.37.2), the
	// version the bundle carries. Its minor must be one the appliance supports (pkg/k8sversion):
	// v1.35, v1.36 or v1.37. Default DefaultKubernetesVersion.
	KubernetesVersion string `yaml:"kubernetesVersion"`
	// Kubernetes says whether the nodes get a Kubernetes cluster (kubeadm) or are only prepared.
	Kubernetes Kubernetes `yaml:"kubernetes"`
	// Networks are the node, pod and service networks.
	Networks Networks `yaml:"networks"`
	// APIServer is the Kubernetes API endpoint and the keepalived VIP that carries it.
	APIServer APIServer `yaml:"apiServer"`
	// Bundle is the offline bundle (images, packages) the appliance serves.
	Bundle Bundle `yaml:"bundle"`
	// Server is the appliance's own HTTPS server (registry mirror, package repo, Ignition configs).
	Server Server `yaml:"server"`
	// StateDir holds the appliance's state (PKI, journal, tokens). Absolute path. Default DefaultStateDir.
	StateDir string `yaml:"stateDir"`
	// Ignition lists user-supplied Ignition config files merged into the generated node configs.
	Ignition IgnitionSnippets `yaml:"ignition"`
	// Nodes is the inventory: every machine of the cluster. At least one must be a control plane.
	Nodes []Node `yaml:"nodes"`
	// Host describes the bootstrap host itself for when it boots from the appliance ISO (`appliance
	// firstboot`): its static addresses, the disk that keeps its state, whether it bootstraps
	// unattended. `appliance bootstrap` on a host set up by other means ignores it. Optional.
	Host Host `yaml:"host,omitempty"`
	// Boot is network boot served by the appliance (DHCP proxy/server, TFTP, iPXE over HTTP): boot.go.
	Boot Boot `yaml:"boot,omitempty"`
	// BaseDomain is the DNS domain the cluster's names live under, as in OpenShift's install-config:
	// the records are api.<clusterName>.<baseDomain> and the others pkg/dnsrecords lists, in the zone
	// <clusterName>.<baseDomain>. A DNS-1123 subdomain without a trailing dot, e.g. example.com.
	// Optional: without it the cluster has no DNS records (dns.go).
	BaseDomain string `yaml:"baseDomain,omitempty"`
	// DNS says whether and where `appliance serve` answers DNS queries for that zone: dns.go.
	DNS DNS `yaml:"dns,omitempty"`
	// Handoff says whether `appliance bootstrap` ends with the hand-off (its last phase): what nodes
	// need moves into the cluster so that the bootstrap host can be switched off. `appliance handoff`
	// does the same on demand. Optional.
	Handoff Handoff `yaml:"handoff,omitempty"`
	// Ingress is the cluster's ingress VIP on the control planes (ingress.go). Optional.
	Ingress Ingress `yaml:"ingress,omitempty"`
	// Escrow keeps the appliance's state encrypted in the cluster, for a new appliance to take over
	// when the bootstrap host is gone (escrow.go). Optional: without it the state lives only in
	// stateDir (a warning with handoff.enabled).
	Escrow Escrow `yaml:"escrow,omitempty"`

	// lines maps a field path ("nodes[0].power.kind") to the 1-based line it was read from; nil for
	// a configuration not produced by Decode. Validate uses it to put lines on its errors.
	lines strictyaml.Lines
	// vridDerived records that SetDefaults derived APIServer.Keepalived.VirtualRouterID
	// (VirtualRouterIDDerived).
	vridDerived bool
	// advertDerived records that SetDefaults set APIServer.Keepalived.AdvertInterval
	// (AdvertIntervalDerived).
	advertDerived bool
}

// Kubernetes configures the cluster hostagent builds with kubeadm on the nodes.
type Kubernetes struct {
	// Enabled: nil means true (see IsEnabled). When true, every node installs containerd, runc, the
	// CNI plugins, kubelet, kubeadm and kubectl from the appliance's package repo and joins the cluster
	// (the first control plane runs kubeadm init), and every node needs a static address inside
	// networks.workloadPlane.cidrs (the bridge CNI routes each node's pod range via it). When false
	// the nodes are only prepared (firewall, containerd mirrors, keepalived) and nothing answers on the
	// API port, so the VIP stays with the bootstrap host.
	Enabled *bool `yaml:"enabled"`
	// IgnorePreflightErrors are kubeadm preflight checks to downgrade to warnings on every node
	// (kubeadm nodeRegistration.ignorePreflightErrors, e.g. SystemVerification where the kernel
	// config cannot be read, as in containers, or on a cgroup v1 host, which kubeadm refuses for
	// Kubernetes v1.35 and newer). Empty by default.
	IgnorePreflightErrors []string `yaml:"ignorePreflightErrors,omitempty"`
}

// IsEnabled reports whether the nodes get Kubernetes: true unless Enabled is explicitly false.
func (k Kubernetes) IsEnabled() bool { return k.Enabled == nil || *k.Enabled }

// Networks lists the networks of the cluster. Node networks are tried in order when the appliance and
// the nodes look for their local address (first CIDR that matches a local interface wins).
type Networks struct {
	// ControlPlane: the networks the API server, etcd and the VIP live on. Required, at least one CIDR.
	ControlPlane NetworkPlane `yaml:"controlPlane"`
	// WorkloadPlane: the networks node-to-node workload traffic uses. Default: a copy of ControlPlane.
	// It may equal or overlap ControlPlane.
	WorkloadPlane NetworkPlane `yaml:"workloadPlane"`
	// Pods is the pod network (kubeadm networking.podSubnet). Default DefaultPodsCIDR. Each node gets a
	// /24 (IPv4) or /64 (IPv6) out of it (kube-controller-manager --node-cidr-mask-size defaults).
	Pods netip.Prefix `yaml:"pods"`
	// Services is the service network (kubeadm networking.serviceSubnet). Default DefaultServicesCIDR.
	// kube-apiserver refuses IPv4 ranges larger than /12 and IPv6 ranges larger than /108.
	Services netip.Prefix `yaml:"services"`
	// CNI is the pod network's plugin, CNIBridge, CNIFlannel or CNICalico. Default DefaultCNI (CNIBridge); see
	// pkg/config/cni.go for what each does and why bridge is the default.
	CNI string `yaml:"cni"`
}

// NetworkPlane is an ordered list of CIDRs (network address, no host bits).
type NetworkPlane struct {
	CIDRs []netip.Prefix `yaml:"cidrs"`
	// MTU is the link MTU in bytes (IP packet size, RFC 894) of the plane's node interfaces; only
	// networks.workloadPlane.mtu is used: with the calico or flannel CNI the pods get MTU - VXLANOverhead
	// (Calico's veth and vxlan.calico MTU; flannel.1's and cni0's). 0 (the default) lets Calico detect
	// it from the node's interface; flannel then assumes 1500 (DefaultPodMTU for pods).
	MTU uint32 `yaml:"mtu,omitempty"`
}

// APIServer describes the Kubernetes API endpoint (kubeadm controlPlaneEndpoint = VIP:Port).
type APIServer struct {
	// VIP is the virtual IP carried by keepalived. Required when keepalived is enabled, and then it
	// must lie inside a controlPlane CIDR. Never equal to a node address.
	VIP netip.Addr `yaml:"vip"`
	// Port is the API server port (TCP). Default DefaultAPIServerPort.
	Port uint16 `yaml:"port" strictyaml:"nonzero"`
	// Keepalived configures the VRRP daemon that moves the VIP between control planes.
	Keepalived Keepalived `yaml:"keepalived"`
	// LoadBalancer configures the control planes' API load balancer behind the VIP.
	LoadBalancer APILoadBalancer `yaml:"loadBalancer"`
}

// APILoadBalancer is the control planes' API load balancer, OpenShift's on-prem layout: with
// Kubernetes and keepalived enabled, every control plane runs Debian's HAProxy on port 9445
// (firewall.APILoadBalancerPort) and redirects the VIP's port to it (nftables, table inet
// appliance-apilb), so requests through the VIP are balanced across every kube-apiserver that answers
// /readyz instead of all being served by the VIP holder's, and one stopped or draining apiserver does
// not take the API with it. The keepalived track script then checks the API through the balancer, so
// the VIP stays where it is while the holder's own apiserver restarts. The bundle must carry the
// haproxy package (a default package of `appliance bundle create`).
type APILoadBalancer struct {
	// Enabled: nil means true (see IsEnabled). false serves the VIP's port with the holder's own
	// kube-apiserver, as before the balancer existed.
	Enabled *bool `yaml:"enabled"`
}

// IsEnabled reports whether the control planes balance the API: true unless Enabled is explicitly false.
func (l APILoadBalancer) IsEnabled() bool { return l.Enabled == nil || *l.Enabled }

// Keepalived configures VRRP for the API VIP: keepalived in unicast mode on the bootstrap host and
// every control plane (pkg/keepalived).
//
// By default the speakers use VRRPv3 (RFC 5798) without authentication and advertise every
// DefaultAdvertInterval (250 ms), so a backup takes the VIP within about 0.9 s of the holder's last
// advertisement when the holder dies (Master_Down_Interval = 3 intervals + a skew below one
// interval, RFC 5798 §6.1). VRRPv2 (RFC 3768) with PASS authentication remains an
// option (AuthPasswordFile), but it carries the interval in whole seconds (at least 1 s: failover
// about 3.6 s) and its password travels in clear text in every advertisement, so it protects nothing
// that the firewall's VRRP rule (accepted only from the configured peers, on the bootstrap host and
// every node) does not already protect. The guards against foreign speakers are that rule and the
// pre-flight check before a VIP is claimed, not the password.
type Keepalived struct {
	// Enabled: nil means true (see IsEnabled).
	Enabled *bool `yaml:"enabled"`
	// VirtualRouterID is the VRRP VRID, 1..255. Default DefaultVirtualRouterID(clusterName,
	// apiServer.vip). Two clusters on one L2 segment must not share it.
	VirtualRouterID uint8 `yaml:"virtualRouterID" strictyaml:"nonzero"`
	// AdvertInterval is the VRRP advertisement interval, a duration such as "250ms". Without
	// AuthPasswordFile (VRRPv3): a multiple of 10ms from 10ms to 40.95s, default
	// DefaultAdvertInterval (250ms). With AuthPasswordFile (VRRPv2): whole seconds from 1s to 255s,
	// default DefaultAdvertIntervalPASS (1s). A backup declares the holder dead after 3 to 4
	// intervals without an advertisement; shorter intervals fail over faster but cost one small
	// packet per peer per interval and make a holder that stalls for a moment (CPU starvation, a
	// paused VM) look dead sooner.
	AdvertInterval time.Duration `yaml:"advertInterval"`
	// AuthPasswordFile optionally names a file holding the VRRP PASS authentication secret: 1 to 8
	// bytes (keepalived truncates longer ones), one trailing newline ignored (see ReadSecretFile).
	// Setting it selects VRRPv2 with whole-second advertisements (see Keepalived); the password is
	// sent in clear text.
	AuthPasswordFile string `yaml:"authPasswordFile,omitempty"`
}

// VRRPVersion is the VRRP version the speakers use: 2 with AuthPasswordFile (PASS authentication
// exists only in VRRPv2), else 3.
func (k Keepalived) VRRPVersion() int {
	if k.AuthPasswordFile != "" {
		return 2
	}
	return 3
}

// IsEnabled reports whether keepalived runs: true unless Enabled is explicitly false.
func (k Keepalived) IsEnabled() bool { return k.Enabled == nil || *k.Enabled }

// Bundle locates the offline bundle.
type Bundle struct {
	// Path is the bundle directory. Required; with ValidateOptions.CheckFiles it must exist.
	Path string `yaml:"path"`
	// PublicKeys pin the keys the bundle may be signed with, each "ed25519:<base64 of the 32-byte
	// key>" as `appliance bundle inspect` prints it (pkg/bundle.PublicKeyString). A bundle whose
	// SHA256SUMS.sig does not verify under one of PublicKeys or PublicKeyFiles is refused. At least
	// one key is required in one of the two lists.
	PublicKeys []string `yaml:"publicKeys"`
	// PublicKeyFiles are files that each hold one such key (one line): the form for keys
	// distributed as files.
	PublicKeyFiles []string `yaml:"publicKeyFiles"`
}

// TrustedKeys reads the pinned bundle keys: PublicKeys, then the keys in PublicKeyFiles. Errors name
// the field path.
func (b Bundle) TrustedKeys() ([]ed25519.PublicKey, error) {
	var out []ed25519.PublicKey
	for i, k := range b.PublicKeys {
		pub, err := bundle.ParsePublicKey(k)
		if err != nil {
			return nil, fmt.Errorf("bundle.publicKeys[%d]: %w", i, err)
		}
		out = append(out, pub)
	}
	for i, f := range b.PublicKeyFiles {
		data, err := readRegularFile(f, maxReferencedFile)
		if err != nil {
			return nil, fmt.Errorf("bundle.publicKeyFiles[%d]: %w", i, withName(f, err))
		}
		pub, err := bundle.ParsePublicKey(string(data))
		if err != nil {
			return nil, fmt.Errorf("bundle.publicKeyFiles[%d]: %s: %w", i, f, err)
		}
		out = append(out, pub)
	}
	return out, nil
}

// Server is the appliance's HTTPS server.
type Server struct {
	// ListenAddress is the IP the server binds. Default 0.0.0.0 (all IPv4 addresses).
	ListenAddress netip.Addr `yaml:"listenAddress"`
	// Port is the TCP port. Default DefaultServerPort.
	Port uint16 `yaml:"port" strictyaml:"nonzero"`
	// Names are extra DNS SANs for the serving certificate, each a DNS-1123 subdomain.
	Names []string `yaml:"names"`
}

// StateLabel is the filesystem label of the appliance's state disk (host.stateDevice): a blank disk is
// formatted ext4 with it; a disk that carries it is mounted; any other content is refused.
const StateLabel = "APPL-STATE"

// Host is the bootstrap host's own setup when it boots from the appliance ISO.
type Host struct {
	// Interfaces are the host's static addresses, one entry per network interface, configured with
	// systemd-networkd. Required when booting from the ISO; at least one address must lie in
	// networks.controlPlane.cidrs (the nodes reach the appliance there).
	Interfaces []HostInterface `yaml:"interfaces,omitempty"`
	// StateDevice is the block device that holds stateDir, e.g. /dev/disk/by-id/ata-…, /dev/sdb,
	// /dev/vdb (an absolute path under /dev). A blank device (no filesystem or partition table
	// signature) is formatted ext4 with the label StateLabel; one with that label is mounted as it is;
	// anything else is refused and never formatted. Empty: the state lives in RAM and is lost at
	// reboot (a warning).
	StateDevice string `yaml:"stateDevice,omitempty"`
	// AutoBootstrap runs `appliance bootstrap` at every boot once the host is set up (it is
	// idempotent: a converged cluster changes nothing). False: the host only prepares itself and the
	// operator runs bootstrap.
	AutoBootstrap bool `yaml:"autoBootstrap,omitempty"`
	// SSHAuthorizedKeys, when set, enables the SSH server with these public keys for root (OpenSSH
	// authorized_keys lines). Empty: no SSH server runs.
	SSHAuthorizedKeys []string `yaml:"sshAuthorizedKeys,omitempty"`
}

// HostInterface is one network interface of the bootstrap host.
type HostInterface struct {
	// Name (e.g. ens3) or MACAddress (e.g. 52:54:00:12:34:56) selects the interface: exactly one.
	Name       string `yaml:"name,omitempty"`
	MACAddress string `yaml:"macAddress,omitempty"`
	// Addresses are address/prefix pairs (CIDR notation with the host's address, e.g.
	// 10.100.0.2/24). At least one.
	Addresses []netip.Prefix `yaml:"addresses"`
	// Gateway is the default route through this interface. Optional (an air-gapped network often has
	// none).
	Gateway netip.Addr `yaml:"gateway,omitempty"`
}

// IgnitionSnippets lists Ignition config files (paths) merged into node configs: All into every node,
// ControlPlane and Worker into nodes of that role.
type IgnitionSnippets struct {
	All          []string `yaml:"all"`
	ControlPlane []string `yaml:"controlPlane"`
	Worker       []string `yaml:"worker"`
}

// Role is what a node does in the cluster.
type Role string

const (
	// RoleControlPlane runs the API server, etcd and keepalived.
	RoleControlPlane Role = "control-plane"
	// RoleWorker runs workloads.
	RoleWorker Role = "worker"
)

// Node is one machine of the inventory.
type Node struct {
	// Name is the node (and Kubernetes Node) name: a DNS-1123 subdomain, unique. Required.
	Name string `yaml:"name"`
	// Roles: non-empty, each RoleControlPlane or RoleWorker, no duplicates.
	Roles []Role `yaml:"roles"`
	// Addresses are the node's static IPs, each inside a controlPlane or workloadPlane CIDR, unique
	// across all nodes, never the VIP. Optional.
	Addresses []netip.Addr `yaml:"addresses,omitempty"`
	// MAC is the PXE/boot interface's 48-bit MAC ("52:54:00:00:00:11"); SetDefaults lowercases it.
	// Optional, unique.
	MAC string `yaml:"mac,omitempty"`
	// SystemUUID is the machine's SMBIOS system UUID (SMBIOS type 1 "UUID", what Linux shows in
	// /sys/class/dmi/id/product_uuid and `dmidecode -s system-uuid`), 8-4-4-4-12 hex digits;
	// SetDefaults lowercases it. Optional, unique, for BMC-powered nodes (power.kind ipmi or
	// redfish) only: when set, the node's enrolment (agentapi.EnrollPathV1) is accepted only from a
	// machine that reports this UUID, besides its MAC.
	SystemUUID string `yaml:"systemUUID,omitempty"`
	// Ignition lists Ignition config files merged into this node's config only.
	Ignition []string `yaml:"ignition,omitempty"`
	// Power says how the appliance turns the node on. Required.
	Power Power `yaml:"power"`
	// RootDevice chooses the disk a node booting the node image installs itself to (Metal3's
	// rootDeviceHints: rootdevice.go). Optional, for nodes that install themselves only (network boot
	// or virtual media: Node.InstallsItself); unset: the smallest disk of at least 4 GiB.
	RootDevice *RootDeviceHints `yaml:"rootDevice,omitempty"`
}

// HasRole reports whether the node has role r.
func (n Node) HasRole(r Role) bool {
	for _, have := range n.Roles {
		if have == r {
			return true
		}
	}
	return false
}

// PowerKind selects the power backend.
type PowerKind string

const (
	// PowerSSH: the node is already running an OS reachable over SSH; the appliance installs the
	// hostagent through it. Needs PrivateKeyFile and a pinned host key (HostKey or KnownHostsFile).
	PowerSSH PowerKind = "ssh"
	// PowerIPMI: IPMI v2.0 (RMCP+) BMC. Needs Address, Username, PasswordFile.
	PowerIPMI PowerKind = "ipmi"
	// PowerRedfish: DMTF Redfish BMC over HTTPS. Needs an https:// Address, Username, PasswordFile and
	// CAFile (or InsecureSkipVerify).
	PowerRedfish PowerKind = "redfish"
)

// BootDevice is the one-time boot override a BMC sets before powering on.
type BootDevice string

const (
	// BootPXE boots from the network (default for ipmi and redfish).
	BootPXE BootDevice = "pxe"
	// BootCDROM boots from (virtual) media.
	BootCDROM BootDevice = "cdrom"
	// BootDisk boots from the local disk.
	BootDisk BootDevice = "disk"
)

// Power describes how to reach a node's power control. Which fields apply depends on Kind; a field
// that does not apply to the kind is an error (it would silently do nothing).
type Power struct {
	// Kind: PowerSSH, PowerIPMI or PowerRedfish. Required.
	Kind PowerKind `yaml:"kind"`
	// Address: ssh "host" or "host:port" (default port 22; default host the node's first address);
	// ipmi "host" or "host:port" (default port 623); redfish an https:// URL. SetDefaults adds the
	// default port, so after defaulting ssh and ipmi addresses are always "host:port".
	Address string `yaml:"address,omitempty"`
	// Username: ssh default "root"; required for ipmi and redfish.
	Username string `yaml:"username,omitempty"`
	// PasswordFile holds the BMC password (ipmi, redfish; required there).
	PasswordFile string `yaml:"passwordFile,omitempty"`
	// PrivateKeyFile is the unencrypted SSH private key (ssh; required there).
	PrivateKeyFile string `yaml:"privateKeyFile,omitempty"`
	// HostKey pins the node's SSH host key, authorized_keys format ("ssh-ed25519 AAAA...").
	// ssh needs HostKey or KnownHostsFile: there is no trust-on-first-use.
	HostKey string `yaml:"hostKey,omitempty"`
	// KnownHostsFile is an OpenSSH known_hosts file holding the node's host key (ssh).
	KnownHostsFile string `yaml:"knownHostsFile,omitempty"`
	// CAFile is the PEM CA bundle the Redfish BMC's certificate must chain to (redfish; required
	// unless InsecureSkipVerify).
	CAFile string `yaml:"caFile,omitempty"`
	// InsecureSkipVerify disables Redfish TLS verification (redfish only; gives a warning).
	InsecureSkipVerify bool `yaml:"insecureSkipVerify,omitempty"`
	// BootDevice: ipmi and redfish, default BootPXE; must be empty for ssh.
	BootDevice BootDevice `yaml:"bootDevice,omitempty"`
	// VirtualMediaImage is the http:// or https:// URL of the ISO a redfish BMC inserts as its
	// virtual CD (Redfish VirtualMedia.InsertMedia "Image") before the node boots it once; needs
	// bootDevice cdrom. The BMC fetches it itself, from its own network. Empty: no virtual media
	// (bootDevice cdrom then boots whatever the drive holds). Only kind redfish; no credentials in it.
	VirtualMediaImage string `yaml:"virtualMediaImage,omitempty"`
}

// ControlPlaneNodes returns the nodes with RoleControlPlane, in document order.
func (c *BootstrapConfiguration) ControlPlaneNodes() []Node { return c.nodesWithRole(RoleControlPlane) }

// WorkerNodes returns the nodes with RoleWorker, in document order. A node with both roles appears in
// both ControlPlaneNodes and WorkerNodes.
func (c *BootstrapConfiguration) WorkerNodes() []Node { return c.nodesWithRole(RoleWorker) }

func (c *BootstrapConfiguration) nodesWithRole(r Role) []Node {
	var out []Node
	for _, n := range c.Nodes {
		if n.HasRole(r) {
			out = append(out, n)
		}
	}
	return out
}

// Handoff is the hand-off of the registry mirror and package repo to the control planes (issue 15).
type Handoff struct {
	// Enabled runs the hand-off as the last phase of every `appliance bootstrap`: once the cluster is
	// healthy, each control plane runs an in-cluster mirror (a static pod) holding a copy of the
	// registry and repo, and every node pulls from those instead of the appliance. Default false.
	Enabled bool `yaml:"enabled,omitempty"`
}
