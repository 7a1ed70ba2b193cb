// Package kubeadmmanifests renders the kubeadm configuration the appliance hands to each node:
// the multi-document file for `kubeadm init --config` on the first control plane (InitConfiguration,
// ClusterConfiguration, KubeletConfiguration, KubeProxyConfiguration) and the JoinConfiguration for
// `kubeadm join --config` on every other node.
//
// The output targets kubeadm's API kubeadm.k8s.io/v1beta4, which kubeadm reads from v1.31 through
// v1.37 (the newest minor of pkg/k8sversion's table). In kubeadm v1.37.2 v1beta4 is still the
// preferred version and not deprecated (apis/kubeadm/scheme/scheme.go:47, util/config/common.go:93);
// kubeadm.k8s.io/v1 exists beside it but is experimental, refused without --allow-experimental-api
// (common.go:88). It is built from typed structs and serialised with go.yaml.in/yaml/v3, so the same input always gives the same bytes. The tests feed
// every rendered file to the real `kubeadm config validate` (strict decoding) and
// `kubeadm config images list`.
//
// The rendered files contain secrets (the bootstrap token and, for control planes, the certificate
// key): write them with mode 0600 and delete them after kubeadm has run.
package kubeadmmanifests

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/airgap-appliance/appliance/pkg/k8sversion"
)

// Fixed choices of the appliance, written into every configuration.
const (
	// CRISocket is containerd's CRI endpoint, used for nodeRegistration.criSocket and the kubelet's
	// containerRuntimeEndpoint.
	CRISocket = "unix:///run/containerd/containerd.sock"
	// DefaultDNSDomain is used when Cluster.DNSDomain is empty (kubeadm's own default).
	DefaultDNSDomain = "cluster.local"
	// DiscoveryTimeout is JoinConfiguration timeouts.discovery: how long `kubeadm join` keeps trying to
	// fetch and verify the cluster-info ConfigMap from Cluster.ControlPlaneEndpoint.
	DiscoveryTimeout = 5 * time.Minute
	// EtcdClientPort is the port a stacked etcd member serves clients on (kubeadm constants
	// EtcdListenClientPort).
	EtcdClientPort = 2379
	// EtcdDataDir is the local etcd member's data directory (kubeadm's default).
	EtcdDataDir = "/var/lib/etcd"
	// BootstrapTokenGroup is the group kubeadm's RBAC rules grant node bootstrap (CSR creation and
	// auto-approval, kubeadm-certs download for control planes).
	BootstrapTokenGroup = "system:bootstrappers:kubeadm:default-node-token"
	// APIServerShutdownDelay is every kube-apiserver's --shutdown-delay-duration (apiServer.extraArgs):
	// told to stop (kubelet stopping its static pod, a node's shutdown), it answers /readyz with
	// "[-]shutdown failed" at once but keeps accepting and serving requests for this long, and only
	// then closes its listener and drains. The control planes' API load balancer (pkg/haproxy) takes
	// a server whose /readyz fails out of the rotation within haproxy.Config.DrainWithin (4 s with its
	// defaults), so no connection is handed to an apiserver that no longer serves it. kube-apiserver's
	// default, 0, closed the listener at once and cut the connections it had just accepted: an
	// "unexpected EOF" or a 503 "apiserver is shutting down" through the VIP. It must stay below the
	// pod's termination grace period (30 s) and the nodes' stop timeouts.
	APIServerShutdownDelay = 5 * time.Second
)

// Cluster is what every node's kubeadm configuration shares. Both InitConfig and JoinConfig validate
// all of it (a caller always holds the whole Cluster), except CACertHashes, which only JoinConfig
// requires.
type Cluster struct {
	// Name is ClusterConfiguration.clusterName (names the cluster in the kubeconfig files kubeadm
	// writes). Required; an RFC 1123 subdomain ("lab").
	Name string
	// KubernetesVersion is ClusterConfiguration.kubernetesVersion, an exact version with a leading "v"
	// ("v1.37.2"). kubeadm's labels ("stable", "latest") are refused: resolving them needs the internet.
	// It selects the control-plane image tags.
	KubernetesVersion string
	// ControlPlaneEndpoint is ClusterConfiguration.controlPlaneEndpoint and the join discovery
	// apiServerEndpoint: "host:port" of the API server VIP, IPv6 in brackets ("10.100.0.100:6443",
	// "[fd00::100]:6443"). Its port is also each control plane's localAPIEndpoint.bindPort (the VIP
	// moves between control planes, it does not translate ports). Required.
	ControlPlaneEndpoint string
	// ImageRepository is ClusterConfiguration.imageRepository: the registry (and optional path) every
	// control-plane, CoreDNS, pause and etcd image is pulled from ("registry.k8s.io",
	// "10.100.0.1:5000/k8s"). Required: kubeadm's default is on the internet.
	ImageRepository string
	// PodSubnet is networking.podSubnet and kube-proxy's clusterCIDR ("10.233.0.0/16"). Required;
	// masked; same address family as ServiceSubnet and not overlapping it.
	PodSubnet netip.Prefix
	// ServiceSubnet is networking.serviceSubnet ("10.96.0.0/16"); kubeadm derives the API server's
	// service IP (.1) and CoreDNS's (.10) from it. Required; masked.
	ServiceSubnet netip.Prefix
	// DNSDomain is networking.dnsDomain, the cluster DNS suffix; "" means DefaultDNSDomain.
	DNSDomain string
	// APIServerCertSANs are extra subject alternative names for the API server's serving certificate
	// (apiServer.certSANs): the VIP and every control plane's address; IP addresses or DNS names
	// (wildcards allowed, as kubeadm allows). Rendered deduplicated and sorted. kubeadm adds the
	// node's advertise address, the ControlPlaneEndpoint host and the in-cluster names itself.
	APIServerCertSANs []string
	// EtcdMembers are the control planes' addresses, each running a stacked etcd member that kubeadm
	// makes listen for clients on https://ADDRESS:2379 (its advertise address; the etcd server
	// certificate names it). Rendered, in this order, as every kube-apiserver's --etcd-servers
	// (apiServer.extraArgs, which replaces kubeadm's https://127.0.0.1:2379), as OpenShift's
	// apiservers list every member: when a node shuts down, systemd stops its apiserver and its etcd
	// member at once, and an apiserver that knew only its own member could not serve a request
	// during its shutdown delay (APIServerShutdownDelay) — requests hung, its /readyz hung so the
	// balancer took it out late, and the requests it held were cut when it exited ("unexpected EOF"
	// through the VIP). With every member listed, etcd's client fails over to the others. A member
	// not yet joined is only unreachable until it is. Empty: kubeadm's default, the local member.
	// Each is a valid address without zone, no duplicates.
	EtcdMembers []netip.Addr
	// BootstrapToken is the kubeadm bootstrap token "[a-z0-9]{6}.[a-z0-9]{16}" (id.secret) that init
	// creates and joining nodes authenticate with. SECRET. Required.
	BootstrapToken string
	// BootstrapTokenTTL is how long the bootstrap token lives after init (bootstrapTokens[0].ttl).
	// Must be positive: kubeadm reads 0 as "never expires".
	BootstrapTokenTTL time.Duration
	// NodeBootstrapTokens are further bootstrap tokens InitConfig lists after BootstrapToken, with
	// its TTL, usages and group and a description naming the node: the workers' own join tokens
	// (one per worker), which `kubeadm init` and `kubeadm init phase bootstrap-token` create in the
	// cluster. Each has the token format and an ID of its own. SECRET. JoinConfig ignores them.
	NodeBootstrapTokens []NodeToken
	// CertificateKey is the AES-256 key, 64 hex characters, that `kubeadm init` encrypts the
	// kubeadm-certs Secret with (uploaded because InitConfiguration carries it) and joining control
	// planes decrypt it with. kubeadm deletes that Secret after 2 hours. SECRET. Required.
	CertificateKey string
	// CACertHashes pin the cluster CA for join discovery: "sha256:" + 64 hex characters, the SHA-256
	// of the CA certificate's SubjectPublicKeyInfo (what `kubeadm token create --print-join-command`
	// prints). Rendered deduplicated and sorted. Required by JoinConfig; unused by InitConfig.
	CACertHashes []string
}

// NodeToken is one node's own bootstrap token (Cluster.NodeBootstrapTokens).
type NodeToken struct {
	// Node names the node, in the token's description. Required.
	Node string
	// Token is "[a-z0-9]{6}.[a-z0-9]{16}". SECRET. Required.
	Token string
}

// NodeTokenDescription is the description InitConfig gives a node's own bootstrap token (what
// `kubeadm token list` shows in its DESCRIPTION column).
func NodeTokenDescription(node string) string {
	return "appliance: join token of node " + node + " only"
}

// Node is one node's part of the configuration.
type Node struct {
	// Name is nodeRegistration.name, the Kubernetes Node name. Required; an RFC 1123 subdomain.
	Name string
	// Address is the node's cluster address: the kubelet's --node-ip (nodeRegistration.kubeletExtraArgs)
	// and, on control planes, localAPIEndpoint.advertiseAddress. Required; no zone.
	Address netip.Addr
	// ControlPlane selects a control-plane node. InitConfig requires it (init makes the first control
	// plane); JoinConfig adds the controlPlane section when it is set.
	ControlPlane bool
	// IgnorePreflightErrors is nodeRegistration.ignorePreflightErrors: preflight check names whose
	// errors kubeadm downgrades to warnings ("Swap", "SystemVerification"), or "all" alone. kubeadm
	// compares them case-insensitively; rendered lowercased, deduplicated and sorted.
	IgnorePreflightErrors []string
}

// InitConfig renders the multi-document YAML for `kubeadm init --config` on the first control plane:
// InitConfiguration, ClusterConfiguration, KubeletConfiguration and KubeProxyConfiguration, in that
// order. The KubeletConfiguration and KubeProxyConfiguration are cluster-wide: kubeadm stores them in
// the kubelet-config and kube-proxy ConfigMaps, and joining nodes take them from there.
//
// Invalid input returns an error listing every invalid field by its path ("Cluster.BootstrapToken: ...");
// secret values never appear in errors. The output contains secrets (see the package doc).
func InitConfig(c Cluster, n Node) ([]byte, error) {
	v, err := validate(c, n, false)
	if err != nil {
		return nil, err
	}
	if !n.ControlPlane {
		return nil, joinErrors([]error{fieldErr("Node.ControlPlane", "must be true: kubeadm init makes the first control plane")})
	}
	docs := []any{
		initConfiguration{
			APIVersion:       kubeadmAPIVersion,
			Kind:             "InitConfiguration",
			BootstrapTokens:  bootstrapTokens(c),
			NodeRegistration: v.nodeRegistration,
			LocalAPIEndpoint: v.localAPIEndpoint,
			CertificateKey:   c.CertificateKey,
		},
		clusterConfiguration{
			APIVersion:           kubeadmAPIVersion,
			Kind:                 "ClusterConfiguration",
			ClusterName:          c.Name,
			KubernetesVersion:    c.KubernetesVersion,
			ControlPlaneEndpoint: c.ControlPlaneEndpoint,
			ImageRepository:      c.ImageRepository,
			Networking: networking{
				PodSubnet:     c.PodSubnet.String(),
				ServiceSubnet: c.ServiceSubnet.String(),
				DNSDomain:     v.dnsDomain,
			},
			APIServer: apiServer{CertSANs: v.certSANs, ExtraArgs: v.apiServerArgs},
			// The appliance assigns each node's pod /24 itself (bridge CNI with host-local IPAM), so
			// the node IPAM controller must not.
			ControllerManager: controlPlaneProcess{ExtraArgs: []arg{{Name: "allocate-node-cidrs", Value: "false"}}},
			Etcd:              etcd{Local: localEtcd{DataDir: EtcdDataDir}},
		},
		kubeletConfiguration{
			APIVersion:               kubeletAPIVersion,
			Kind:                     "KubeletConfiguration",
			CgroupDriver:             "systemd",
			ContainerRuntimeEndpoint: CRISocket,
			FailSwapOn:               false,
			// kubelet v1.35 and newer default failCgroupV1 to true and refuse to start on a cgroup v1
			// host (pkg/kubelet/apis/config/v1beta1/defaults.go:291 in v1.37.2; false in v1.34); the
			// lab host is v1. kubeadm's SystemVerification preflight fails there too for such a
			// kubelet (k8s.io/system-validators v1.12.1 CgroupsValidator), so those hosts also need
			// kubernetes.ignorePreflightErrors: [SystemVerification], as the lab's configuration has.
			FailCgroupV1: false,
			// The kubelet asks for its serving certificate with a CSR (signer
			// kubernetes.io/kubelet-serving) instead of signing one itself, so clients verify it
			// against the cluster CA. kubeadm never approves those CSRs (kubernetes #73356): the
			// appliance does (pkg/csrapprove), for the inventory's nodes only.
			ServerTLSBootstrap: true,
		},
		kubeProxyConfiguration{
			APIVersion:  kubeProxyAPIVersion,
			Kind:        "KubeProxyConfiguration",
			Mode:        "nftables",
			ClusterCIDR: c.PodSubnet.String(),
			Conntrack: conntrack{
				MaxPerCore:            0,
				Min:                   0,
				TCPEstablishedTimeout: "0s",
				TCPCloseWaitTimeout:   "0s",
				TCPBeLiberal:          false,
				UDPTimeout:            "0s",
				UDPStreamTimeout:      "0s",
			},
		},
	}
	return encode(docs)
}

// bootstrapTokens is InitConfiguration.bootstrapTokens: Cluster.BootstrapToken, then each of
// Cluster.NodeBootstrapTokens, all with the same TTL, usages (signing for discovery's signed
// cluster-info, authentication for the kubelet's TLS bootstrap) and group (kubeadm's RBAC for node
// bootstrap is bound to it).
func bootstrapTokens(c Cluster) []bootstrapToken {
	tok := func(token, description string) bootstrapToken {
		return bootstrapToken{Token: token, Description: description, TTL: c.BootstrapTokenTTL.String(),
			Usages: []string{"signing", "authentication"}, Groups: []string{BootstrapTokenGroup}}
	}
	out := []bootstrapToken{tok(c.BootstrapToken, "")}
	for _, n := range c.NodeBootstrapTokens {
		out = append(out, tok(n.Token, NodeTokenDescription(n.Node)))
	}
	return out
}

// JoinConfig renders the JoinConfiguration for `kubeadm join --config`: bootstrap-token discovery
// against Cluster.ControlPlaneEndpoint pinned by Cluster.CACertHashes, with timeouts.discovery =
// DiscoveryTimeout. For a control-plane node it adds controlPlane {localAPIEndpoint (Node.Address and
// the endpoint's port), certificateKey}, which makes kubeadm download the shared certificates from the
// kubeadm-certs Secret and start a control plane and etcd member on the node.
//
// Invalid input returns an error listing every invalid field by its path; secret values never appear
// in errors. The output contains secrets (see the package doc).
func JoinConfig(c Cluster, n Node) ([]byte, error) {
	v, err := validate(c, n, true)
	if err != nil {
		return nil, err
	}
	jc := joinConfiguration{
		APIVersion:       kubeadmAPIVersion,
		Kind:             "JoinConfiguration",
		NodeRegistration: v.nodeRegistration,
		Discovery: discovery{BootstrapToken: bootstrapTokenDiscovery{
			Token:             c.BootstrapToken,
			APIServerEndpoint: c.ControlPlaneEndpoint,
			CACertHashes:      v.caCertHashes,
		}},
		Timeouts: timeouts{Discovery: DiscoveryTimeout.String()},
	}
	if n.ControlPlane {
		jc.ControlPlane = &joinControlPlane{
			LocalAPIEndpoint: v.localAPIEndpoint,
			CertificateKey:   c.CertificateKey,
		}
	}
	return encode([]any{jc})
}

// Images returns the image references `kubeadm config images list --config` prints for the
// configuration InitConfig renders from c, in kubeadm's order: kube-apiserver, kube-controller-manager,
// kube-scheduler, kube-proxy (tag = KubernetesVersion), CoreDNS, pause, etcd. The CoreDNS, pause and
// etcd tags are those kubeadm of the version's minor deploys (pkg/k8sversion's table, read from
// kubeadm's cmd/kubeadm/app/constants), e.g. for v1.37.2 from registry.k8s.io:
// registry.k8s.io/coredns/coredns:v1.14.6, registry.k8s.io/pause:3.10.2, registry.k8s.io/etcd:3.7.0-0.
// A minor outside the table returns an error naming Cluster.KubernetesVersion and the supported minors.
func Images(c Cluster) ([]string, error) {
	var errs []error
	checkVersion(c.KubernetesVersion, &errs)
	checkImageRepository(c.ImageRepository, &errs)
	if len(errs) > 0 {
		return nil, joinErrors(errs)
	}
	rel, err := k8sversion.Lookup(c.KubernetesVersion)
	if err != nil {
		return nil, joinErrors([]error{fieldErr("Cluster.KubernetesVersion", fmt.Sprintf("%q: %v", c.KubernetesVersion, err))})
	}
	repo := c.ImageRepository
	tag := strings.ReplaceAll(c.KubernetesVersion, "+", "_") // kubeadm's KubernetesVersionToImageTag
	return []string{
		repo + "/kube-apiserver:" + tag,
		repo + "/kube-controller-manager:" + tag,
		repo + "/kube-scheduler:" + tag,
		repo + "/kube-proxy:" + tag,
		rel.CoreDNSImage(repo),
		rel.PauseImage(repo),
		rel.EtcdImage(repo),
	}, nil
}

// encode serialises docs as one YAML stream, "---" between documents, two-space indent.
func encode(docs []any) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	for _, d := range docs {
		if err := enc.Encode(d); err != nil {
			return nil, fmt.Errorf("encoding kubeadm configuration: %w", err)
		}
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encoding kubeadm configuration: %w", err)
	}
	return buf.Bytes(), nil
}

// endpointPort returns the port of a "host:port" endpoint.
func endpointPort(endpoint string) (host string, port int32, err error) {
	h, p, err := net.SplitHostPort(endpoint)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("port %q is not a number in 1-65535", p)
	}
	return h, int32(n), nil
}
