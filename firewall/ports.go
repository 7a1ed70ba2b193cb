package firewall

import (
	"fmt"
	"slices"
	"strings"
)

// Role is what a host does in the cluster; a host may have several roles and gets the union of their ports.
type Role string

// The roles of the port table. The bootstrap role is the appliance host itself: it serves the HTTPS front and
// holds the API VIP (VRRP) until the first control-plane node takes it over.
const (
	RoleBootstrap    Role = "bootstrap"
	RoleControlPlane Role = "control-plane"
	RoleEtcd         Role = "etcd"
	RoleWorker       Role = "worker"
)

// Roles lists every known role in table order.
func Roles() []Role { return []Role{RoleBootstrap, RoleControlPlane, RoleEtcd, RoleWorker} }

// NodeRoles maps a node's roles (bootstrap.yaml's nodes[].roles, agentapi.Configuration.Roles:
// "control-plane", "worker") to port-table roles, without duplicates, in the order they first
// appear: control-plane → control-plane and etcd (kubeadm's stacked etcd), worker → worker. Unknown
// roles are ignored. The appliance's validation (pkg/config) and the node's firewall step
// (pkg/hostagent) both use it, so they agree on a node's ports.
func NodeRoles(roles []string) []Role {
	var out []Role
	add := func(r Role) {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	for _, r := range roles {
		switch Role(r) {
		case RoleControlPlane:
			add(RoleControlPlane)
			add(RoleEtcd)
		case RoleWorker:
			add(RoleWorker)
		}
	}
	return out
}

// Valid reports whether r is one of the known roles.
func (r Role) Valid() bool {
	for _, k := range Roles() {
		if r == k {
			return true
		}
	}
	return false
}

// Source says who may reach a port.
type Source string

const (
	// SourceAnywhere accepts any source address (the port is protected by its own authentication).
	SourceAnywhere Source = "anywhere"
	// SourceNodeNetworks accepts only sources inside Spec.NodeNetworks.
	SourceNodeNetworks Source = "node-networks"
	// SourceVRRPPeers accepts only the exact addresses in Spec.VRRPPeers.
	SourceVRRPPeers Source = "vrrp-peers"
)

// Protocols of a Port.
const (
	ProtoTCP  = "tcp"
	ProtoUDP  = "udp"
	ProtoVRRP = "vrrp" // IP protocol 112 (RFC 5798 §5.1.1.4); a Port with this protocol has From == To == 0
)

// IPProtoVRRP is the IP protocol number of VRRP (RFC 5798 §5.1.1.4, IANA "Assigned Internet Protocol Numbers").
const IPProtoVRRP = 112

// Default ports used when Ports or Spec get 0.
const (
	DefaultHTTPSPort uint16 = 8443 // the appliance's HTTPS front (registry, repo, ignition, agent API)
	DefaultAPIPort   uint16 = 6443 // kube-apiserver --secure-port and the VIP's port (kubeadm default)
)

// ClusterMirrorPort is the HTTPS port of the in-cluster mirror each control plane runs after the
// hand-off (`appliance handoff`): /v2/ and /repo/ as the appliance serves them.
const ClusterMirrorPort uint16 = 5443

// DNSPort is the port of the appliance's DNS server for the cluster's zone (RFC 1035 §4.2).
const DNSPort uint16 = 53

// Ports of the network-boot service (pkg/netboot), opened only with Spec.Boot.
const (
	// DHCPPort is the BOOTP/DHCP server port (RFC 2131 §4.1).
	DHCPPort uint16 = 67
	// PXEPort is the PXE boot-server port a PXE client sends its proxyDHCP REQUEST to (PXE 2.1 §2.2.6).
	PXEPort uint16 = 4011
	// TFTPPort is the TFTP port (RFC 1350) the iPXE binaries are read from.
	TFTPPort uint16 = 69
	// DefaultBootHTTPPort is the plain-HTTP port of the boot artefacts when Spec.BootHTTPPort is 0.
	DefaultBootHTTPPort uint16 = 8080
)

// Ports of the cluster's ingress (ingress.vip; kcli's layout): HTTP and HTTPS of the *.apps names, on
// the control planes (HAProxy on the ingress VIP) and on the nodes running the ingress routers.
const (
	IngressHTTPPort  uint16 = 80  // RFC 9110 §4.2.1
	IngressHTTPSPort uint16 = 443 // RFC 9110 §4.2.2
	// IngressRouterHTTPPort and IngressRouterHTTPSPort are where the ingress routers listen (host
	// network), behind the control planes' HAProxy: never 80 and 443, which HAProxy holds on the
	// control planes, so routers can run there too (no worker) without a clash.
	IngressRouterHTTPPort  uint16 = 10080
	IngressRouterHTTPSPort uint16 = 10443
	// IngressRouterHealthPort is the ingress routers' health endpoint (OpenShift's router uses 1936),
	// which the control planes' HAProxy checks.
	IngressRouterHealthPort uint16 = 1936
)

// VXLANPort is the UDP port of the pod network's VXLAN between nodes (networks.cni flannel or calico):
// the port IANA assigned to VXLAN (RFC 7348 §5).
const VXLANPort uint16 = 4789

// References cited by the port table.
const (
	RefKubeadmPorts    = "https://kubernetes.io/docs/reference/networking/ports-and-protocols/"
	RefVRRP            = "RFC 5798 §5.1.1.4 (IP protocol 112)"
	RefSSH             = "RFC 4253 (SSH transport, port 22)"
	RefAppliance       = "appliance DESIGN.md (HTTPS front: registry, repo, ignition, agent API)"
	RefDNS             = "RFC 1035 §4.2 (DNS over UDP and TCP, port 53)"
	RefDHCP            = "RFC 2131 §4.1 (DHCP server port 67)"
	RefPXE             = "PXE 2.1 §2.2.6 (proxyDHCP boot-server port 4011)"
	RefTFTP            = "RFC 1350 (TFTP, port 69)"
	RefNetboot         = "appliance operator guide, Network boot (iPXE script, kernel, initrd over plain HTTP)"
	RefIngress         = "RFC 9110 §4.2 (http 80, https 443); kcli's OpenShift ingress VIP layout"
	RefAPILoadBalancer = "OpenShift on-prem API load balancer (haproxy on :9445, the API VIP's port redirected to it)"
	RefVXLAN           = "RFC 7348 §5 (VXLAN, UDP port 4789)"
)

// ConnsPerSource is the kernel's cap on the connections one source address holds at once to a port
// the appliance serves behind pkg/connlimit (the rows appliance-https, boot-http and cluster-mirror):
// a new connection past it is refused by the firewall with a TCP reset to its SYN (nftables `ct count
// over 80`, `reject with tcp reset`), before any accept, TLS handshake or goroutine.
//
// It is connlimit.DefaultMaxConnsPerSource (64) + 16, so that the user-space cap still acts first:
// a client past 64 connections gets connlimit's answer (its longest-idle connection closed to make
// room, or a 429 that names the cap), and the kernel resets only what it opens on top of that. The
// 16 cover what conntrack counts and connlimit does not — connections completed by the kernel but
// not yet accepted, connections connlimit has closed (an evicted idle one, a refused one after its
// 429) until the client's FIN ends them (conntrack stops counting at TIME_WAIT) — and let up to 16
// connections per source over the cap at once get the 429 rather than a reset. A client that opens
// far more (docs/measurements.md: wrk's 200 connections from one address, which left the 60 admitted
// ones a sixteenth of their throughput) now costs at most 16 TLS handshakes at a time instead of up
// to connlimit.MaxRefusing (64), each answered 429 and reopened at once; the rest is reset by the
// kernel, a packet each. A normal client (a node: a handful of connections; a BMC streaming virtual
// media: a few more) never comes near either cap.
//
// The count is per port and per address, as connlimit's (each listener counts its own, by remote
// IP): IPv4 and IPv6 alike, an IPv6 address as a whole /128. firewall cannot import pkg/connlimit
// (the node agent links firewall and must not link the appliance's store), so a test pins the sum.
const ConnsPerSource = 80

// Port is one inbound opening of the port table: traffic of Protocol to destination ports From..To
// (inclusive; both 0 for VRRP) is accepted on hosts with Role when it comes from Source.
type Port struct {
	Role        Role
	Name        string // short identifier, used as the nftables rule comment
	Protocol    string // ProtoTCP, ProtoUDP or ProtoVRRP
	From, To    uint16 // inclusive destination port range; From == To for a single port
	Source      Source
	Description string
	Reference   string // where the requirement comes from (kubeadm page, RFC)
	// ConnsPerSource, when not 0, caps the connections one source address holds at once to the port
	// (TCP only): past it a new connection is reset at its SYN (see the constant ConnsPerSource).
	ConnsPerSource int
}

// PortRange renders the range as "22", "2379-2380", or "-" for VRRP.
func (p Port) PortRange() string {
	switch {
	case p.Protocol == ProtoVRRP:
		return "-"
	case p.From == p.To:
		return fmt.Sprint(p.From)
	default:
		return fmt.Sprintf("%d-%d", p.From, p.To)
	}
}

// Ports returns the port table: every inbound opening by role, in a fixed order. httpsPort is the appliance's
// HTTPS port and apiPort the kube-apiserver/VIP port; 0 selects DefaultHTTPSPort / DefaultAPIPort.
//
// The Kubernetes entries follow the kubeadm "Ports and Protocols" page: its "All" becomes SourceAnywhere, its
// "Self", "Control plane", "kube-apiserver, etcd" and "Load balancers" become SourceNodeNetworks. SSH is open
// from anywhere so an operator outside the node networks is never locked out. The returned slice is fresh;
// callers may modify it.
func Ports(httpsPort, apiPort uint16) []Port {
	if httpsPort == 0 {
		httpsPort = DefaultHTTPSPort
	}
	if apiPort == 0 {
		apiPort = DefaultAPIPort
	}
	var out []Port
	add := func(roles []Role, p Port) {
		for _, r := range roles {
			p.Role = r
			out = append(out, p)
		}
	}
	all := Roles()
	bootCP := []Role{RoleBootstrap, RoleControlPlane}
	nodes := []Role{RoleControlPlane, RoleWorker}

	add(all, Port{Name: "ssh", Protocol: ProtoTCP, From: 22, To: 22, Source: SourceAnywhere,
		Description: "SSH (operator access, SSH power backend)", Reference: RefSSH})
	// The ports served behind pkg/connlimit are capped per source address in the kernel too.
	add([]Role{RoleBootstrap}, Port{Name: "appliance-https", Protocol: ProtoTCP, From: httpsPort, To: httpsPort,
		Source: SourceNodeNetworks, Description: "appliance HTTPS: OCI registry mirror, package repo, Ignition, agent API",
		Reference: RefAppliance, ConnsPerSource: ConnsPerSource})
	// The cluster's DNS zone (pkg/dnsrecords): the datacenter's resolvers, which sit outside the node
	// networks, query it. Opened only with Spec.DNS (dns.listenAddress set), when serve answers there,
	// authoritatively for the zone alone (no recursion: no open resolver).
	for _, proto := range []string{ProtoUDP, ProtoTCP} {
		add([]Role{RoleBootstrap}, Port{Name: "dns-" + proto, Protocol: proto, From: DNSPort, To: DNSPort, Source: SourceAnywhere,
			Description: "the cluster's DNS zone, answered authoritatively; opened only when dns.listenAddress is set", Reference: RefDNS})
	}
	// The control planes' CoreDNS static pods (issue 13): every node's resolver asks them for the
	// cluster's zone. Opened only with Spec.DNS (the node config carries a CoreDNS server: baseDomain
	// set), from the node networks; outside the zone they answer REFUSED (no open resolver).
	for _, proto := range []string{ProtoUDP, ProtoTCP} {
		add([]Role{RoleControlPlane}, Port{Name: "dns-" + proto, Protocol: proto, From: DNSPort, To: DNSPort, Source: SourceNodeNetworks,
			Description: "the cluster's DNS zone from the control plane's CoreDNS static pod; opened only when baseDomain is set", Reference: RefDNS})
	}
	// Network boot (pkg/netboot): opened only with Spec.Boot (boot.dhcp proxy or server), when serve
	// runs it. A PXE ROM's DISCOVER comes from 0.0.0.0, before it has an address: DHCP is open from
	// anywhere (the service answers only MACs of the inventory). The rest comes from the booting
	// machine's address on the control-plane network (leased by the appliance, or in proxy mode by
	// the datacenter's DHCP server on that network). 4011 only in proxy mode (Spec.BootProxy).
	add([]Role{RoleBootstrap}, Port{Name: "boot-dhcp", Protocol: ProtoUDP, From: DHCPPort, To: DHCPPort, Source: SourceAnywhere,
		Description: "DHCP for network boot (proxyDHCP or server); opened only when boot.dhcp is proxy or server", Reference: RefDHCP})
	add([]Role{RoleBootstrap}, Port{Name: "boot-proxydhcp", Protocol: ProtoUDP, From: PXEPort, To: PXEPort, Source: SourceNodeNetworks,
		Description: "proxyDHCP requests of PXE clients; opened only when boot.dhcp is proxy", Reference: RefPXE})
	add([]Role{RoleBootstrap}, Port{Name: "boot-tftp", Protocol: ProtoUDP, From: TFTPPort, To: TFTPPort, Source: SourceNodeNetworks,
		Description: "TFTP of Debian's iPXE binaries (read-only); opened only when boot.dhcp is proxy or server", Reference: RefTFTP})
	add([]Role{RoleBootstrap}, Port{Name: "boot-http", Protocol: ProtoTCP, From: DefaultBootHTTPPort, To: DefaultBootHTTPPort, Source: SourceNodeNetworks,
		Description: "plain HTTP of the public boot artefacts (iPXE scripts, kernel, initrd; boot.httpPort); opened only when boot.dhcp is proxy or server", Reference: RefNetboot,
		ConnsPerSource: ConnsPerSource})
	add(bootCP, Port{Name: "vrrp", Protocol: ProtoVRRP, Source: SourceVRRPPeers,
		Description: "keepalived VRRP advertisements for the API VIP", Reference: RefVRRP})
	add(bootCP, Port{Name: "kube-apiserver", Protocol: ProtoTCP, From: apiPort, To: apiPort, Source: SourceAnywhere,
		Description: "Kubernetes API server (and the VIP, which starts on the bootstrap host)", Reference: RefKubeadmPorts})
	add([]Role{RoleControlPlane}, Port{Name: "apiserver-lb", Protocol: ProtoTCP, From: APILoadBalancerPort, To: APILoadBalancerPort,
		Source: SourceAnywhere, Description: "API load balancer (HAProxy across every ready kube-apiserver); the VIP's API port is redirected to it (table inet " + DefaultRedirectTable + ")",
		Reference: RefAPILoadBalancer})
	add([]Role{RoleControlPlane}, Port{Name: "ingress-http", Protocol: ProtoTCP, From: IngressHTTPPort, To: IngressHTTPPort, Source: SourceAnywhere,
		Description: "ingress (*.apps over HTTP): HAProxy on the ingress VIP, to the routers; opened only when ingress.vip is set", Reference: RefIngress})
	add([]Role{RoleControlPlane}, Port{Name: "ingress-https", Protocol: ProtoTCP, From: IngressHTTPSPort, To: IngressHTTPSPort, Source: SourceAnywhere,
		Description: "ingress (*.apps over HTTPS, passed through to the routers); opened only when ingress.vip is set", Reference: RefIngress})
	add(nodes, Port{Name: "ingress-router", Protocol: ProtoTCP, From: IngressRouterHTTPPort, To: IngressRouterHTTPPort, Source: SourceNodeNetworks,
		Description: "the ingress routers' HTTP, behind the control planes' HAProxy; opened only when ingress.vip is set", Reference: RefIngress})
	add(nodes, Port{Name: "ingress-router-tls", Protocol: ProtoTCP, From: IngressRouterHTTPSPort, To: IngressRouterHTTPSPort, Source: SourceNodeNetworks,
		Description: "the ingress routers' HTTPS (TLS ends there), behind the control planes' HAProxy; opened only when ingress.vip is set", Reference: RefIngress})
	add(nodes, Port{Name: "ingress-router-health", Protocol: ProtoTCP, From: IngressRouterHealthPort, To: IngressRouterHealthPort, Source: SourceNodeNetworks,
		Description: "the ingress routers' /healthz, checked by the control planes' HAProxy; opened only when ingress.vip is set", Reference: RefIngress})
	add(nodes, Port{Name: "vxlan", Protocol: ProtoUDP, From: VXLANPort, To: VXLANPort, Source: SourceNodeNetworks,
		Description: "the pod network's VXLAN between the nodes' workload-plane addresses; opened only when networks.cni is flannel or calico", Reference: RefVXLAN})
	add([]Role{RoleEtcd}, Port{Name: "etcd", Protocol: ProtoTCP, From: 2379, To: 2380, Source: SourceNodeNetworks,
		Description: "etcd server client API and peer traffic", Reference: RefKubeadmPorts})
	add(nodes, Port{Name: "kubelet", Protocol: ProtoTCP, From: 10250, To: 10250, Source: SourceNodeNetworks,
		Description: "kubelet API", Reference: RefKubeadmPorts})
	add([]Role{RoleControlPlane}, Port{Name: "kube-scheduler", Protocol: ProtoTCP, From: 10259, To: 10259,
		Source: SourceNodeNetworks, Description: "kube-scheduler secure port", Reference: RefKubeadmPorts})
	add([]Role{RoleControlPlane}, Port{Name: "kube-controller-manager", Protocol: ProtoTCP, From: 10257, To: 10257,
		Source: SourceNodeNetworks, Description: "kube-controller-manager secure port", Reference: RefKubeadmPorts})
	add([]Role{RoleControlPlane}, Port{Name: "cluster-mirror", Protocol: ProtoTCP, From: ClusterMirrorPort, To: ClusterMirrorPort,
		Source: SourceNodeNetworks, Description: "in-cluster registry mirror and package repo after the hand-off (appliance cluster-mirror static pod)", Reference: RefAppliance,
		ConnsPerSource: ConnsPerSource})
	add(nodes, Port{Name: "kube-proxy-health", Protocol: ProtoTCP, From: 10256, To: 10256, Source: SourceNodeNetworks,
		Description: "kube-proxy health check (load balancers)", Reference: RefKubeadmPorts})
	add([]Role{RoleWorker}, Port{Name: "nodeport-tcp", Protocol: ProtoTCP, From: 30000, To: 32767, Source: SourceAnywhere,
		Description: "NodePort Services (TCP)", Reference: RefKubeadmPorts})
	add([]Role{RoleWorker}, Port{Name: "nodeport-udp", Protocol: ProtoUDP, From: 30000, To: 32767, Source: SourceAnywhere,
		Description: "NodePort Services (UDP)", Reference: RefKubeadmPorts})
	return out
}

// MarkdownTable renders Ports(httpsPort, apiPort) as a GitHub-flavoured Markdown table, one row per port and
// role, ordered by role, with each port's per-source connection cap where it has one (Port.ConnsPerSource),
// for docs/reference/ports.md (cmd/docgen), between <!-- BEGIN PORT TABLE --> and <!-- END PORT TABLE -->.
// The output is deterministic and ends with a newline.
func MarkdownTable(httpsPort, apiPort uint16) string {
	ports := Ports(httpsPort, apiPort)
	var b strings.Builder
	b.WriteString("| Role | Name | Protocol | Port(s) | Allowed from | Connections per source | Purpose | Source |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range Roles() {
		for _, p := range ports {
			if p.Role != r {
				continue
			}
			proto := p.Protocol
			if proto == ProtoVRRP {
				proto = fmt.Sprintf("vrrp (IP proto %d)", IPProtoVRRP)
			}
			ref := p.Reference
			if strings.HasPrefix(ref, "https://") {
				ref = "[kubeadm ports](" + ref + ")"
			}
			limit := ""
			if p.ConnsPerSource > 0 {
				limit = fmt.Sprintf("at most %d", p.ConnsPerSource)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n",
				r, p.Name, proto, p.PortRange(), p.Source, limit, mdEscape(p.Description), mdEscape(ref))
		}
	}
	return b.String()
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
