package agentapi

import (
	"errors"
	"net/netip"
	"time"
)

// The agent API: HTTPS on the appliance's front, authenticated with the node's bearer token
// ("Authorization: Bearer <token>"); a node can read and write only its own records.
const (
	// ConfigPathV1: GET → NodeConfig (JSON).
	ConfigPathV1 = "/agent/v1/config"
	// ReportPathV1: POST a Report (JSON) → 204. Reports are idempotent: the same (BootID, Step,
	// Status) twice records once.
	ReportPathV1 = "/agent/v1/report"
	// ConfigWaitParam is the query parameter of a watch on ConfigPathV1: GET
	// ConfigPathV1?wait=<ETag> answers as soon as the node's config differs from the one that ETag
	// (the response header of an earlier GET, quoted as sent) names, or after ConfigWaitMax with
	// the same config; without it, or with another ETag, it answers at once. Every answer carries
	// the ETag of the config it holds. A hostagent watches between its resyncs so that a config
	// change (a join order's Proceed, a hand-off stage, an upgrade) reaches it in about a second, not
	// at its next resync. An appliance that predates the watch ignores the parameter and answers at
	// once: the hostagent then waits a few seconds between requests.
	ConfigWaitParam = "wait"
	// InstalledPathV1: POST an InstallNotice (JSON) → 204 once the node's machine has installed the
	// node image to its disk (`hostagent install`), before it reboots. After a network boot the
	// appliance's network boot then answers that machine with a script that boots its disk
	// (pkg/netboot); after a virtual-media boot (nodes[].power.virtualMediaImage) the node's BMC
	// replaces the boot from the CD with one from the disk at once and ejects the CD once the
	// installed system reports from its disk. The node is the one the bearer token names, and a
	// network boot's MAC must be that node's nodes[].mac: a notice for another node's machine is
	// refused with 403 (ErrInstallNoticeRefused), one without a valid token with the agent API's 401,
	// and an appliance with nothing to do for the node (boot.dhcp off, a node neither network- nor
	// virtual-media-booted) answers 404. Resending a notice is harmless; one sent while the node's
	// previous notice is still being acted on (its BMC call) answers 429 (ErrInstallNoticeBusy).
	InstalledPathV1 = "/agent/v1/installed"
)

// InstallNotice is the body of POST InstalledPathV1.
type InstallNotice struct {
	// MAC is the 48-bit MAC address of the NIC the machine network-booted from (iPXE's BOOTIF,
	// "52:54:00:01:64:00"), which must be the node's nodes[].mac; empty after a boot from the node
	// image's ISO (virtual media), which knows no boot NIC.
	MAC string `json:"mac"`
	// BootID is the installing (live) system's /proc/sys/kernel/random/boot_id: a report with
	// another boot ID comes from the installed system.
	BootID string `json:"bootID,omitempty"`
}

// ErrInstallNoticeRefused is wrapped by the appliance's install-notice handler for a notice it
// refuses on its content (another node's MAC, a MAC outside the inventory, not a MAC at all): the
// agent API answers 403 with the error's text, which says what to fix.
var ErrInstallNoticeRefused = errors.New("install notice refused")

// ErrInstallNoticeNotServed is wrapped when the appliance keeps no install marks for the node (it
// does not network-boot it): the agent API answers 404 with the error's text.
var ErrInstallNoticeNotServed = errors.New("install notice not taken")

// ErrInstallNoticeBusy is wrapped when the appliance is still acting on an earlier notice of the
// same node (its BMC call is in progress): the agent API answers 429 with a Retry-After, and the
// machine sends its notice again.
var ErrInstallNoticeBusy = errors.New("install notice of this node in progress")

// ConfigWaitMax is how long the appliance holds a watch (ConfigWaitParam) on an unchanged config
// before answering with it: below the hostagent client's 30 s request timeout.
const ConfigWaitMax = 25 * time.Second

// NodeConfig is everything a node's hostagent needs to configure the node, derived by the
// appliance from bootstrap.yaml and its state. It holds secrets (VRRP auth): keep it 0600.
type NodeConfig struct {
	Node        string   `json:"node"`
	Roles       []string `json:"roles"`
	ClusterName string   `json:"clusterName"`
	// ControlPlaneCIDRs and WorkloadPlaneCIDRs are tried in order to find the node's own addresses.
	ControlPlaneCIDRs  []netip.Prefix `json:"controlPlaneCIDRs"`
	WorkloadPlaneCIDRs []netip.Prefix `json:"workloadPlaneCIDRs"`
	// NodeNetworks are the sources the node's firewall accepts cluster traffic from.
	NodeNetworks []netip.Prefix `json:"nodeNetworks"`
	// ApplianceAddress is the bootstrap host's control-plane address (a VRRP peer while it holds the VIP).
	ApplianceAddress netip.Addr `json:"applianceAddress"`
	APIServerVIP     netip.Addr `json:"apiServerVIP,omitempty"`
	APIServerPort    uint16     `json:"apiServerPort"`
	// Keepalived is set on control-plane nodes when keepalived is enabled.
	Keepalived *KeepalivedConfig `json:"keepalived,omitempty"`
	// APILoadBalancer is set on control-plane nodes of a Kubernetes cluster whose API VIP keepalived
	// carries, unless bootstrap.yaml turns it off (apiServer.loadBalancer.enabled: false): the node's
	// HAProxy balances the VIP's port across every kube-apiserver that answers /readyz (StepAPILB).
	APILoadBalancer *APILoadBalancerConfig `json:"apiLoadBalancer,omitempty"`
	// Ingress is set on Kubernetes nodes when bootstrap.yaml sets ingress.vip: control planes carry
	// the ingress VIP (a second keepalived instance) and, with routers on other nodes, balance its
	// ports to them (their HAProxy); every node opens the ingress ports for the routers.
	Ingress *IngressConfig `json:"ingress,omitempty"`
	// Mirrors are the containerd registry mirrors (hosts.toml) pointing at the appliance.
	Mirrors []Mirror `json:"mirrors"`
	// CAPEM is the appliance CA certificate (PEM).
	CAPEM string `json:"caPEM"`
	// Kubernetes is set when the node joins a Kubernetes cluster (bootstrap.yaml kubernetes.enabled).
	// It holds secrets (bootstrap tokens, certificate key, on the init node the cluster CA key),
	// each only while the node needs it (WithholdSecrets, secrets.go): it travels only over the
	// token-authenticated agent API and is cached 0600.
	Kubernetes *KubernetesConfig `json:"kubernetes,omitempty"`
	// Handoff is set once `appliance handoff` has begun (issue 15): what moves from the appliance into
	// the cluster so that the bootstrap host can be switched off. nil before; the hostagent's handoff
	// step (StepHandoff) acts on it.
	Handoff *HandoffConfig `json:"handoff,omitempty"`
	// DNS is set on Kubernetes nodes when bootstrap.yaml sets baseDomain: the cluster's DNS zone,
	// served by CoreDNS static pods on the control planes, and the node's resolver pointed at them.
	// The hostagent's dns step (StepDNS) acts on it.
	DNS *DNSConfig `json:"dns,omitempty"`
	// AgentUpgrade is set by the appliance's upgrade phase on the one node it is upgrading in place
	// (issue 15, "a node runs the hostagent of the appliance that serves it"): a hostagent whose own
	// build differs downloads the executable, checks it, replaces its own and restarts into it.
	// nil otherwise.
	AgentUpgrade *AgentUpgrade `json:"agentUpgrade,omitempty"`
}

// APILoadBalancerConfig is a control plane's API load balancer (pkg/haproxy): HAProxy listening on
// Port, with the VIP's port (NodeConfig.APIServerVIP:APIServerPort) redirected to it on the node
// (firewall.Redirect), balancing over Servers.
type APILoadBalancerConfig struct {
	// Port is the balancer's TCP port (firewall.APILoadBalancerPort, 9445).
	Port uint16 `json:"port"`
	// Servers are every control plane's kube-apiserver: node name and control-plane address with the
	// API port, in nodes[] order.
	Servers []APIServerEndpoint `json:"servers"`
}

// IngressConfig is the cluster's ingress VIP as a node needs it (config.Ingress; kcli's layout).
type IngressConfig struct {
	// VIP is the ingress VIP and VirtualRouterID its VRRP VRID (control planes' VRRPIngressInstanceName).
	VIP             netip.Addr `json:"vip"`
	VirtualRouterID uint8      `json:"virtualRouterID"`
	// Ports are the ingress VIP's ports (firewall.IngressHTTPPort, IngressHTTPSPort) and the routers'
	// ports each is passed to.
	Ports []IngressPort `json:"ports"`
	// Routers are the nodes running the ingress routers, whom the control planes' HAProxy balances the
	// VIP's ports to, by control-plane address, in nodes[] order: the workers, or with none the
	// control planes themselves (kcli's rule).
	Routers []RouterEndpoint `json:"routers"`
	// RouterHealthPort and RouterHealthPath are the routers' health endpoint (plain HTTP, 200 when
	// serving, 503 while draining), which HAProxy checks; 0: a TCP connect check of each port.
	RouterHealthPort uint16 `json:"routerHealthPort,omitempty"`
	RouterHealthPath string `json:"routerHealthPath,omitempty"`
}

// IngressPort is one port of the ingress VIP and the routers' port HAProxy passes it to.
type IngressPort struct {
	Port       uint16 `json:"port"`
	RouterPort uint16 `json:"routerPort"`
}

// RouterEndpoint is one node running an ingress router.
type RouterEndpoint struct {
	Node    string     `json:"node"`
	Address netip.Addr `json:"address"`
}

// APIServerEndpoint is one kube-apiserver behind the API load balancer.
type APIServerEndpoint struct {
	Node    string         `json:"node"`
	Address netip.AddrPort `json:"address"`
}

// AgentUpgrade names the hostagent build a node must run and where the appliance serves it.
type AgentUpgrade struct {
	// Version is the build's version (pkg/version.String of `hostagent version`).
	Version string `json:"version"`
	// SHA256 is the hex SHA-256 of the executable; the download must match it.
	SHA256 string `json:"sha256"`
	// Path is the executable's path on the appliance front (HostagentArtifactPath), fetched over the
	// same pinned HTTPS as the agent API.
	Path string `json:"path"`
}

// HostagentArtifactPath is where the appliance front serves the hostagent executable (the one
// Ignition installs at a first boot, verified by its SHA-256).
const HostagentArtifactPath = "/artifacts/hostagent"

// DNSConfig is the node's part of the cluster's DNS (pkg/dnsrecords).
type DNSConfig struct {
	// Zone is the cluster's zone, "<clusterName>.<baseDomain>" without the trailing dot: the only
	// names the resolver sends to Nameservers when systemd-resolved runs (Domains=~Zone).
	Zone string `json:"zone"`
	// Nameservers are the control planes' CoreDNS addresses the node's resolver asks first (a control
	// plane lists itself first), before the servers it had already, which it keeps for every other
	// name. The control planes answer REFUSED outside Zone, so a stub resolver moves on to those.
	Nameservers []netip.Addr `json:"nameservers"`
	// Server is set on control planes: the CoreDNS static pod serving Zone.
	Server *DNSServer `json:"server,omitempty"`
}

// DNSServer is a control plane's CoreDNS static pod (DNSConfig.Server).
type DNSServer struct {
	// Image is CoreDNS's image, the one kubeadm deploys as the cluster DNS (in the bundle, pulled
	// through the node's containerd mirrors).
	Image string `json:"image"`
	// Corefile is CoreDNS's configuration (dnsrecords.Corefile): the zone on port 53 of the node's
	// addresses only, no forwarding.
	Corefile string `json:"corefile"`
	// ZoneFile is the zone as an RFC 1035 master file (dnsrecords.ZoneFile).
	ZoneFile string `json:"zoneFile"`
	// Listen are the addresses the Corefile binds port 53 on; HealthPort is CoreDNS's health plugin
	// port on 127.0.0.1 (the pod's liveness probe).
	Listen     []netip.Addr `json:"listen"`
	HealthPort uint16       `json:"healthPort"`
}

// HandoffConfig is the node's part of the hand-off.
type HandoffConfig struct {
	// Mirror is set on control planes: run the in-cluster mirror (`appliance cluster-mirror`) as a
	// kubelet static pod, which copies the appliance's registry and package repo to the node's disk once
	// and then serves them without the appliance.
	Mirror *ClusterMirror `json:"mirror,omitempty"`
	// RepoURLs, once set, replace the appliance in the node's apt source (AptSourcePath): the control
	// planes' in-cluster mirrors' repo URLs (https://ADDR:PORT/repo), one deb line each, in order. The
	// appliance sets them (and points Mirrors[].Endpoints at the same mirrors) only after it pulled every
	// digest from at least two of them.
	RepoURLs []string `json:"repoURLs,omitempty"`
}

// ClusterMirror is the in-cluster mirror a control plane runs (HandoffConfig.Mirror).
type ClusterMirror struct {
	// Image is the appliance's own image by digest (registry.WriteExecutableImage), pulled through
	// the node's containerd mirrors like every other image.
	Image string `json:"image"`
	// Port is the HTTPS port it serves /v2/ and /repo/ on, on every address of the node.
	Port uint16 `json:"port"`
	// Upstream is the appliance URL it copies from (the same as the hostagent's).
	Upstream string `json:"upstream"`
	// CertPEM and KeyPEM are its serving certificate (SANs: the node's control-plane and workload-plane
	// addresses; signed by the appliance CA, so nodes trust it through the pin they already have) and
	// key (secret: written 0600).
	CertPEM string `json:"certPEM"`
	KeyPEM  string `json:"keyPEM"`
	// Inventory is the cluster's nodes (name, addresses) for the kubelet serving CSR approver the
	// static pod runs beside the mirror (`appliance csr-approve`, the rule of pkg/csrapprove), so that
	// serving certificates are still approved after the bootstrap host is switched off.
	Inventory []InventoryNode `json:"inventory,omitempty"`
	// Images are the references the mirror copies besides those the appliance registry's tags list:
	// the images the bundle names by digest only ("registry.k8s.io/etcd@sha256:…"), which no listing
	// shows (`appliance cluster-mirror --images-file`). Empty when the bundle has none.
	Images []string `json:"images,omitempty"`
}

// InventoryNode is one node of ClusterMirror.Inventory.
type InventoryNode struct {
	Name      string       `json:"name"`
	Addresses []netip.Addr `json:"addresses"`
}

// kubeadm actions, in the order a cluster is built (kubeadm init, then joins).
const (
	// ActionInit: `kubeadm init` on the first control plane of the inventory, before any control plane
	// has joined. Not the mark of the kubeadm leader: see KubernetesConfig.After.
	ActionInit = "init"
	// ActionJoinControlPlane: `kubeadm join --control-plane` on the other control planes, one at a time.
	ActionJoinControlPlane = "join-control-plane"
	// ActionJoin: `kubeadm join` on workers, after the first control plane is initialized.
	ActionJoin = "join"
)

// KubernetesConfig is what a node's hostagent needs to install Kubernetes and run kubeadm.
type KubernetesConfig struct {
	// Version is the Kubernetes version, "v1.37.2".
	Version string `json:"version"`
	// Action is ActionInit, ActionJoinControlPlane or ActionJoin.
	Action string `json:"action"`
	// Packages are the Debian packages to install from the appliance's repo (apt), e.g. containerd,
	// runc, containernetworking-plugins, kubelet, kubeadm, kubectl.
	Packages []string `json:"packages"`
	// SandboxImage is containerd's CRI sandbox (pause) image, the one kubeadm expects for Version.
	SandboxImage string `json:"sandboxImage"`
	// ControlPlaneEndpoint is "VIP:port", kubeadm's controlPlaneEndpoint and join discovery endpoint.
	ControlPlaneEndpoint string `json:"controlPlaneEndpoint"`
	// ImageRepository is kubeadm's imageRepository ("registry.k8s.io"; pulled through the mirror).
	ImageRepository string `json:"imageRepository"`
	// PodSubnet and ServiceSubnet are kubeadm's networking.podSubnet and serviceSubnet.
	PodSubnet     netip.Prefix `json:"podSubnet"`
	ServiceSubnet netip.Prefix `json:"serviceSubnet"`
	// APIServerCertSANs are extra API server certificate SANs: the VIP and every control plane's
	// static addresses.
	APIServerCertSANs []string `json:"apiServerCertSANs,omitempty"`
	// EtcdMembers are the control planes' addresses, each with a stacked etcd member: every
	// kube-apiserver's --etcd-servers (kubeadm-manifests Cluster.EtcdMembers). Empty: kubeadm's
	// default, the local member only (a node config from an appliance older than this field).
	EtcdMembers []netip.Addr `json:"etcdMembers,omitempty"`
	// BootstrapToken is the kubeadm bootstrap token "[a-z0-9]{6}.[a-z0-9]{16}" the node joins with:
	// on control planes the cluster's control-plane join token, on a worker its own token
	// (NodeBootstrapTokens). Secret; served only while the node needs it (WithholdSecrets).
	BootstrapToken string `json:"bootstrapToken"`
	// BootstrapTokenExpires is when the tokens (and the certificate key's uploaded certificates)
	// expire; kubeadm gets the remaining time as the tokens' ttl.
	BootstrapTokenExpires time.Time `json:"bootstrapTokenExpires"`
	// CertificateKey is the 64-hex-character key of kubeadm's kubeadm-certs Secret (control planes
	// only). Secret; served only while the node needs it (WithholdSecrets).
	CertificateKey string `json:"certificateKey,omitempty"`
	// NodeBootstrapTokens are the workers' own bootstrap tokens, one per worker, given to the
	// kubeadm leader only (the control plane whose config has no After), which creates them in the
	// cluster with its own (InitConfiguration bootstrapTokens), expiring at BootstrapTokenExpires.
	// Each worker receives only its own, as BootstrapToken. Secret.
	NodeBootstrapTokens []NodeBootstrapToken `json:"nodeBootstrapTokens,omitempty"`
	// CACertHashes pin the cluster CA for join discovery: "sha256:<hex of the SPKI>".
	CACertHashes []string `json:"caCertHashes"`
	// CACertPEM is the cluster CA certificate; CAKeyPEM its key, sent only to the control plane that
	// runs `kubeadm init` (which uses an existing /etc/kubernetes/pki/ca.{crt,key}) and only until it
	// has reported its kubeadm step done (WithholdSecrets). CAKeyPEM is secret.
	CACertPEM string `json:"caCertPEM"`
	CAKeyPEM  string `json:"caKeyPEM,omitempty"`
	// PodCIDR is this node's pod range (a /24 of PodSubnet) for the bridge CNI; PodRoutes are the other
	// nodes' ranges, each routed via that node's workload-plane address.
	PodCIDR   netip.Prefix `json:"podCIDR"`
	PodRoutes []PodRoute   `json:"podRoutes,omitempty"`
	// CNI is networks.cni: "bridge" ("" from an older appliance means bridge too), "calico", whose
	// calico-node writes the node's CNI network itself, or "flannel", whose overlay DaemonSet
	// (pkg/overlay) routes the pods while hostagent writes the bridge network on cni0 for PodCIDR
	// with PodMTU (PodRoutes are empty for both).
	CNI string `json:"cni,omitempty"`
	// PodMTU is the MTU of the pods' interfaces and cni0 with CNI "flannel" (the workload-plane MTU
	// less VXLAN's 50 bytes); 0 leaves the kernel's default.
	PodMTU int `json:"podMTU,omitempty"`
	// CNIManifest is the YAML stream that deploys the CNI (pkg/calico, pkg/overlay), sent to control planes only:
	// each applies it server-side with its admin.conf once its kube-apiserver is ready (step api)
	// and again whenever it changes.
	CNIManifest string `json:"cniManifest,omitempty"`
	// IngressRouterManifest is the YAML stream that deploys the ingress routers (pkg/ingressrouter),
	// sent to control planes only when the cluster has an ingress VIP: applied like CNIManifest
	// (step api), after it.
	IngressRouterManifest string `json:"ingressRouterManifest,omitempty"`
	// IgnorePreflightErrors are passed to kubeadm (nodeRegistration.ignorePreflightErrors).
	IgnorePreflightErrors []string `json:"ignorePreflightErrors,omitempty"`
	// Proceed is set by the appliance when the node is served its config: false while the node must
	// wait for another (a joining control plane for the one before it, a worker for the first control
	// plane); WaitingFor then names that node. A node that has already run kubeadm ignores it.
	Proceed    bool   `json:"proceed"`
	WaitingFor string `json:"waitingFor,omitempty"`
	// After is the node whose kubeadm step must be done before this one runs kubeadm; the appliance
	// derives Proceed and WaitingFor from it. "" on a control plane marks the kubeadm leader (the init
	// node, or after its removal the first remaining control plane that joined: plan.KubeadmLeader),
	// the one whose hostagent keeps the join secrets (bootstrap token, uploaded certificates) renewed
	// in the cluster (plan.RenewsJoinSecrets); a leader that joined keeps ActionJoinControlPlane.
	After string `json:"after,omitempty"`
}

// NodeBootstrapToken is one worker's own kubeadm bootstrap token (KubernetesConfig.NodeBootstrapTokens).
type NodeBootstrapToken struct {
	Node  string `json:"node"`
	Token string `json:"token"`
}

// PodRoute routes another node's pod range via its workload-plane address.
type PodRoute struct {
	Node   string       `json:"node"`
	Prefix netip.Prefix `json:"prefix"`
	Via    netip.Addr   `json:"via"`
}

// KeepalivedConfig is the node's VRRP instance for the API VIP (RFC 5798, keepalived unicast).
type KeepalivedConfig struct {
	VirtualRouterID uint8 `json:"virtualRouterID"`
	// AuthPass is the VRRP PASS secret, 1..8 bytes. Secret.
	AuthPass string `json:"authPass"`
	// Priority of this node (1..254); the appliance's own instance outranks control planes until
	// they answer on the API port.
	Priority uint8 `json:"priority"`
	// Peers are the other VRRP speakers' control-plane addresses (unicast_peer): the other control
	// planes and the bootstrap host.
	Peers []netip.Addr `json:"peers"`
	// AdvertIntervalMS is the VRRP advertisement interval in milliseconds (bootstrap.yaml
	// apiServer.keepalived.advertInterval), the same on every speaker of the VIP: a multiple of 10
	// (VRRPv3 carries centiseconds, RFC 5798 §5.2.7) from 10 to 40950 without AuthPass; whole seconds
	// (1000..255000, VRRPv2 carries seconds, RFC 3768 §5.3.7) with AuthPass. 0 or absent means 1000,
	// the RFC default every appliance used before this field existed, so an older appliance's node
	// config keeps its meaning. A hostagent that predates the field ignores it and advertises every
	// second: VRRPv3 speakers with different intervals still form one group (keepalived 2.2.7;
	// pkg/keepalived TestMixedAdvertIntervalsOneGroup), but the others take over from that node only
	// after its own, longer Master_Down_Interval, so upgrade hostagents with the appliance.
	AdvertIntervalMS uint32 `json:"advertIntervalMS,omitempty"`
}

// AdvertInterval is AdvertIntervalMS as a duration; 0 when unset, which keepalived.Instance reads
// as keepalived.DefaultAdvertInterval (1 s).
func (k KeepalivedConfig) AdvertInterval() time.Duration {
	return time.Duration(k.AdvertIntervalMS) * time.Millisecond
}

// Mirror is one containerd registry mirror.
type Mirror struct {
	// Registry is the source registry host[:port] as it appears in image references, e.g.
	// "registry.k8s.io" or "docker.io".
	Registry string `json:"registry"`
	// Endpoint is the mirror's full API URL for that registry (https), e.g.
	// "https://10.100.0.1:8443/v2/registry.k8s.io"; containerd uses it as is (override_path).
	Endpoint string `json:"endpoint"`
	// Endpoints, when set, are several mirrors of the same content, tried in order (after the hand-off:
	// the control planes' in-cluster mirrors); Endpoint is then Endpoints[0].
	Endpoints []string `json:"endpoints,omitempty"`
}

// Report is one progress record from a node's hostagent.
type Report struct {
	// BootID identifies the node boot (/proc/sys/kernel/random/boot_id): a reboot starts anew.
	BootID string `json:"bootID"`
	// Step is the hostagent step, e.g. "config", "firewall", "packages", "containerd", "cni",
	// "keepalived", "kubeadm", "api", "ready".
	Step   string    `json:"step"`
	Status string    `json:"status"` // running, done, failed
	Detail string    `json:"detail,omitempty"`
	Time   time.Time `json:"time"`
	// AgentVersion is the reporting hostagent's version (pkg/version.String, e.g. "v0.2.0+1a2b3c4d5e6f")
	// and AgentSHA256 the lowercase hex SHA-256 of its executable: the appliance records a change
	// of either as the node's "upgraded" history entry (pkg/nodestate). Empty from hostagents that
	// predate them.
	AgentVersion string `json:"agentVersion,omitempty"`
	AgentSHA256  string `json:"agentSHA256,omitempty"`
}

// Node lifecycle states as the appliance tracks them (`appliance status`).
const (
	StatePending        = "pending"
	StatePowering       = "powering"
	StateBooting        = "booting"
	StateAgentConnected = "agent-connected"
	StateConfigured     = "configured"
	StateReady          = "ready"
	StateFailed         = "failed"
)

// NodeStatus is the appliance's record of one node, STATE/nodes/<node>/status.json.
type NodeStatus struct {
	Node    string    `json:"node"`
	State   string    `json:"state"`
	Reason  string    `json:"reason,omitempty"`
	Updated time.Time `json:"updated"`
	BootID  string    `json:"bootID,omitempty"`
	// Steps is the last report per hostagent step.
	Steps map[string]Report `json:"steps,omitempty"`
	// AgentVersion and AgentSHA256 are the hostagent build the node last reported (Report's); empty
	// until a hostagent that reports them has.
	AgentVersion string `json:"agentVersion,omitempty"`
	AgentSHA256  string `json:"agentSHA256,omitempty"`
}
