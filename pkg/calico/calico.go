// Package calico renders the manifest that deploys Calico as the cluster's CNI (networks.cni: calico):
// calico-node on every node in VXLAN mode with the Kubernetes API as its datastore, the Calico CNI
// and calico-ipam plugins installed on each node by the DaemonSet's install-cni init container.
//
// What is deployed, and why so little (issue 13: the smallest set that works):
//   - CalicoBackend "vxlan": felix programs VXLAN routes itself; no BIRD, no BGP (CLUSTER_TYPE
//     "k8s", not "k8s,bgp"). The default IP pool is networks.pods with VXLAN CrossSubnet (pods on
//     nodes in one subnet are routed directly, across subnets encapsulated; Calico's own
//     calico-vxlan.yaml does the same) and outgoing NAT, created by calico-node at its first start
//     (CALICO_IPV4POOL_*), so the manifest holds no Calico resource that must wait for its CRD.
//   - Node addresses: IP_AUTODETECTION_METHOD "cidr=" with the workload-plane CIDR list in the
//     configuration's order (Calico takes the first interface address inside any of them).
//   - Dataplane: felix's nftables mode (FELIX_NFTABLESMODE Enabled), beside kube-proxy's nftables
//     mode. felix still runs iptables-nft-save and ipset (to clean up what an iptables-mode felix
//     would have left, and it panics without them), so the image carries those too.
//   - The API server is reached through the VIP (KUBERNETES_SERVICE_HOST/PORT in calico-node and in
//     the CNI plugin's kubeconfig), not through the kubernetes Service, so the CNI does not depend
//     on kube-proxy having programmed the service address first.
//   - install-cni writes the plugins (calico, calico-ipam) into containerd.CNIBinDir, where the
//     node's containerd looks for CNI plugins (Debian's /usr/lib/cni, beside the portmap plugin the
//     network also uses), and the network into containerd.CNIConfDir.
//   - MTU: PodMTU for the veths and vxlan.calico (FELIX_VXLANMTU, the CNI's mtu); 0 lets Calico
//     detect it from the node's interface.
//   - No calico-kube-controllers (its node controller only garbage-collects the IPAM blocks of
//     deleted nodes), no Typha (for clusters of more than 50 nodes), no eBPF, no API server.
//
// The CustomResourceDefinitions are Calico's crd.projectcalico.org/v1 kinds (and
// policy.networking.k8s.io ClusterNetworkPolicy, which felix watches) with an open schema
// (x-kubernetes-preserve-unknown-fields): Calico's clients validate their own objects. Objects are
// typed (k8s.io/api) and serialised deterministically: the same Params give the same bytes.
package calico

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/airgap-appliance/appliance/pkg/containerd"
	"github.com/airgap-appliance/appliance/pkg/kubemanifest"
)

// Version is the Calico source the fixture's image is built from (`git describe` of
// projectcalico/calico at the snapshot of 2026-08-22).
const Version = "v3.34.0-0.dev-67-g87c15906f2"

// Image is the image of calico-node and its install-cni init container: Calico's single binary at
// /usr/bin/calico (felix, the CNI and IPAM plugins, `calico component ...`), /bin/sh (RunScript) and
// nft for felix's nftables dataplane, pulled through the appliance's mirror like every other image.
const Image = "quay.io/calico/node:" + Version

// Namespace is where calico-node runs.
const Namespace = "kube-system"

// CNIConfName is the CNI network file install-cni writes into the node's /etc/cni/net.d.
const CNIConfName = "10-calico.conflist"

// RunScript is calico-node's command (run by /bin/sh): the sequence of calico/node's start_runit and
// rc.local for the vxlan backend, without runit. `calico component node startup` registers the node
// (its address by autodetection, the default IP pool on the first node) and writes
// /var/lib/calico/nodename; allocate-tunnel-addrs gives the node its vxlan.calico address; then
// node-services (address monitoring, tunnel addresses, the CNI plugin's token) and felix run side by
// side, and when either exits the other is stopped and the container exits non-zero, so kubelet
// restarts it (runit would have restarted the one service).
const RunScript = `set -e
calico component node startup
NODENAME=$(cat /var/lib/calico/nodename)
export NODENAME FELIX_FELIXHOSTNAME="$NODENAME" FELIX_DATASTORETYPE="$DATASTORE_TYPE"
calico component node allocate-tunnel-addrs --run-once
calico component node node-services & services=$!
calico component felix & felix=$!
trap 'kill $services $felix 2>/dev/null' TERM INT
while kill -0 $services 2>/dev/null && kill -0 $felix 2>/dev/null; do sleep 1; done
kill $services $felix 2>/dev/null || true
echo "calico-node: node-services or felix exited" >&2
exit 1
`

// CalicoBackend is CALICO_NETWORKING_BACKEND.
const CalicoBackend = "vxlan"

// Params are what the manifest depends on.
type Params struct {
	// PodCIDR is networks.pods: the default IPv4 pool (CALICO_IPV4POOL_CIDR). Required, IPv4.
	PodCIDR netip.Prefix
	// NodeCIDRs are networks.workloadPlane.cidrs in order: IP_AUTODETECTION_METHOD cidr=.... At
	// least one, IPv4.
	NodeCIDRs []netip.Prefix
	// PodMTU is the MTU of pod veths and of vxlan.calico in bytes (networks.workloadPlane.mtu less
	// the 50-byte VXLAN overhead); 0 lets Calico detect it.
	PodMTU int
	// APIServerHost and APIServerPort reach kube-apiserver from every node (the VIP and
	// apiServer.port). Required.
	APIServerHost netip.Addr
	APIServerPort uint16
	// Image is the calico-node image; "" means Image.
	Image string
}

// ErrParams is wrapped by Manifest's errors for Params it cannot render.
var ErrParams = errors.New("calico: invalid parameters")

// Manifest renders the YAML stream (documents separated by "---") to apply with `kubectl apply
// --server-side`: CRDs, service accounts, RBAC, the calico-config ConfigMap and the calico-node
// DaemonSet, in that order. It fails (ErrParams) for a missing or IPv6 pod CIDR, no node CIDR, an
// IPv6 node CIDR, a negative MTU or no API server address.
func Manifest(p Params) ([]byte, error) {
	switch {
	case !p.PodCIDR.IsValid() || !p.PodCIDR.Addr().Is4():
		return nil, fmt.Errorf("%w: the pod CIDR %s is not an IPv4 network", ErrParams, p.PodCIDR)
	case len(p.NodeCIDRs) == 0:
		return nil, fmt.Errorf("%w: no workload-plane CIDR for node address autodetection", ErrParams)
	case p.PodMTU < 0:
		return nil, fmt.Errorf("%w: pod MTU %d is negative", ErrParams, p.PodMTU)
	case !p.APIServerHost.IsValid() || p.APIServerPort == 0:
		return nil, fmt.Errorf("%w: no API server address", ErrParams)
	}
	cidrs := make([]string, len(p.NodeCIDRs))
	for i, c := range p.NodeCIDRs {
		if !c.IsValid() || !c.Addr().Is4() {
			return nil, fmt.Errorf("%w: workload-plane CIDR %s is not an IPv4 network", ErrParams, c)
		}
		cidrs[i] = c.Masked().String()
	}
	if p.Image == "" {
		p.Image = Image
	}
	objs := make([]any, 0, 40)
	for _, c := range crds {
		objs = append(objs, c.object())
	}
	objs = append(objs, serviceAccount("calico-node"), serviceAccount("calico-cni-plugin"))
	objs = append(objs, rbac()...)
	cm, err := configMap(p)
	if err != nil {
		return nil, err
	}
	objs = append(objs, cm, daemonSet(p, strings.Join(cidrs, ",")))
	return kubemanifest.Stream(objs...)
}

// crd is a CustomResourceDefinition (apiextensions.k8s.io/v1) with an open schema.
type crd struct {
	group, version, kind, plural string
	namespaced, status           bool
	annotations                  map[string]string
}

type crdObject struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Group string `json:"group"`
		Names struct {
			Kind     string `json:"kind"`
			ListKind string `json:"listKind"`
			Plural   string `json:"plural"`
			Singular string `json:"singular"`
		} `json:"names"`
		Scope    string       `json:"scope"`
		Versions []crdVersion `json:"versions"`
	} `json:"spec"`
}

type crdVersion struct {
	Name    string `json:"name"`
	Served  bool   `json:"served"`
	Storage bool   `json:"storage"`
	Schema  struct {
		OpenAPIV3Schema struct {
			Type                  string `json:"type"`
			PreserveUnknownFields bool   `json:"x-kubernetes-preserve-unknown-fields"`
		} `json:"openAPIV3Schema"`
	} `json:"schema"`
	Subresources *struct {
		Status struct{} `json:"status"`
	} `json:"subresources,omitempty"`
}

func (c crd) object() crdObject {
	var o crdObject
	o.APIVersion, o.Kind = "apiextensions.k8s.io/v1", "CustomResourceDefinition"
	o.Metadata.Name = c.plural + "." + c.group
	o.Metadata.Annotations = c.annotations
	o.Spec.Group = c.group
	o.Spec.Names.Kind, o.Spec.Names.ListKind = c.kind, c.kind+"List"
	o.Spec.Names.Plural, o.Spec.Names.Singular = c.plural, strings.ToLower(c.kind)
	o.Spec.Scope = "Cluster"
	if c.namespaced {
		o.Spec.Scope = "Namespaced"
	}
	v := crdVersion{Name: c.version, Served: true, Storage: true}
	v.Schema.OpenAPIV3Schema.Type = "object"
	v.Schema.OpenAPIV3Schema.PreserveUnknownFields = true
	if c.status {
		v.Subresources = &struct {
			Status struct{} `json:"status"`
		}{}
	}
	o.Spec.Versions = []crdVersion{v}
	return o
}

// crds are the kinds Calico's Kubernetes datastore stores (crd.projectcalico.org/v1) and
// ClusterNetworkPolicy (policy.networking.k8s.io/v1alpha2, sig-network's network-policy-api), which
// felix watches. A CRD in a *.k8s.io group needs the api-approved.kubernetes.io annotation.
var crds = func() []crd {
	const g, v = "crd.projectcalico.org", "v1"
	c := func(kind, plural string, namespaced, status bool) crd {
		return crd{group: g, version: v, kind: kind, plural: plural, namespaced: namespaced, status: status}
	}
	return []crd{
		c("BGPConfiguration", "bgpconfigurations", false, false),
		c("BGPFilter", "bgpfilters", false, false),
		c("BGPPeer", "bgppeers", false, false),
		c("BlockAffinity", "blockaffinities", false, false),
		c("CalicoNodeStatus", "caliconodestatuses", false, true),
		c("ClusterInformation", "clusterinformations", false, false),
		c("FelixConfiguration", "felixconfigurations", false, false),
		c("GlobalNetworkPolicy", "globalnetworkpolicies", false, false),
		c("GlobalNetworkSet", "globalnetworksets", false, false),
		c("HostEndpoint", "hostendpoints", false, false),
		c("IPAMBlock", "ipamblocks", false, false),
		c("IPAMConfig", "ipamconfigs", false, false),
		c("IPAMHandle", "ipamhandles", false, false),
		c("IPPool", "ippools", false, true),
		c("IPReservation", "ipreservations", false, false),
		c("KubeControllersConfiguration", "kubecontrollersconfigurations", false, true),
		c("NetworkPolicy", "networkpolicies", true, false),
		c("NetworkSet", "networksets", true, false),
		c("StagedGlobalNetworkPolicy", "stagedglobalnetworkpolicies", false, false),
		c("StagedKubernetesNetworkPolicy", "stagedkubernetesnetworkpolicies", true, false),
		c("StagedNetworkPolicy", "stagednetworkpolicies", true, false),
		c("Tier", "tiers", false, true),
		{group: "policy.networking.k8s.io", version: "v1alpha2", kind: "ClusterNetworkPolicy", plural: "clusternetworkpolicies", status: true,
			annotations: map[string]string{"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/network-policy-api/pull/347"}},
	}
}()

func meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: Namespace}
}

func serviceAccount(name string) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}, ObjectMeta: meta(name)}
}

// calicoResources are the crd.projectcalico.org kinds calico-node reads.
var calicoResources = []string{"globalfelixconfigs", "globalbgpconfigs", "felixconfigurations", "bgppeers", "bgpfilters",
	"bgpconfigurations", "ippools", "ipreservations", "ipamblocks", "globalnetworkpolicies", "stagedglobalnetworkpolicies",
	"networkpolicies", "stagednetworkpolicies", "stagedkubernetesnetworkpolicies", "globalnetworksets", "networksets",
	"clusterinformations", "hostendpoints", "blockaffinities", "caliconodestatuses", "tiers"}

var calicoGroups = []string{"projectcalico.org", "crd.projectcalico.org"}

// rbac is calico-node's and the CNI plugin's ClusterRoles and bindings (the rules of Calico's
// calico-vxlan.yaml).
func rbac() []any {
	rule := func(groups, resources, verbs []string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: groups, Resources: resources, Verbs: verbs}
	}
	core := []string{""}
	node := &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: "calico-node"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: core, Resources: []string{"serviceaccounts/token"}, ResourceNames: []string{"calico-cni-plugin"}, Verbs: []string{"create"}},
			rule(core, []string{"pods", "nodes", "namespaces", "configmaps"}, []string{"get"}),
			rule([]string{"discovery.k8s.io"}, []string{"endpointslices"}, []string{"watch", "list"}),
			rule(core, []string{"endpoints", "services"}, []string{"watch", "list", "get"}),
			rule(core, []string{"nodes/status"}, []string{"patch", "update"}),
			rule([]string{"networking.k8s.io"}, []string{"networkpolicies"}, []string{"watch", "list"}),
			rule([]string{"policy.networking.k8s.io"}, []string{"clusternetworkpolicies"}, []string{"watch", "list"}),
			rule(core, []string{"pods", "namespaces", "serviceaccounts", "nodes"}, []string{"list", "watch"}),
			rule(core, []string{"pods/status"}, []string{"patch"}),
			rule(calicoGroups, calicoResources, []string{"get", "list", "watch"}),
			rule(calicoGroups, []string{"tiers"}, []string{"create"}),
			rule(calicoGroups, []string{"ippools", "felixconfigurations", "bgpconfigurations", "bgppeers", "clusterinformations"}, []string{"create", "update"}),
			rule(calicoGroups, []string{"caliconodestatuses"}, []string{"update"}),
			rule(calicoGroups, []string{"blockaffinities", "ipamblocks", "ipamhandles"}, []string{"get", "list", "create", "update", "delete"}),
			rule(calicoGroups, []string{"ipamconfigurations", "ipamconfigs"}, []string{"get", "create"}),
			rule(calicoGroups, []string{"blockaffinities"}, []string{"watch"}),
			rule([]string{"apps"}, []string{"daemonsets"}, []string{"get"}),
			// felix lists KubeVirt's live migrations even where KubeVirt is not installed, and is
			// never ready while that list is forbidden (e2e run 3).
			rule([]string{"kubevirt.io"}, []string{"virtualmachineinstancemigrations"}, []string{"get", "list", "watch"}),
		},
	}
	cni := &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: "calico-cni-plugin"},
		Rules: []rbacv1.PolicyRule{
			rule(core, []string{"pods", "nodes", "namespaces"}, []string{"get"}),
			rule(core, []string{"pods/status"}, []string{"patch"}),
			rule(calicoGroups, []string{"blockaffinities", "ipamblocks", "ipamhandles", "clusterinformations", "ippools",
				"ipreservations", "ipamconfigurations", "ipamconfigs"}, []string{"get", "list", "create", "update", "delete"}),
			rule([]string{"kubevirt.io"}, []string{"virtualmachineinstances", "virtualmachines"}, []string{"get"}),
		},
	}
	binding := func(name string) *rbacv1.ClusterRoleBinding {
		return &rbacv1.ClusterRoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: Namespace}},
		}
	}
	return []any{node, cni, binding("calico-node"), binding("calico-cni-plugin")}
}

// cniNetwork is the CNI network install-cni writes (CNIConfName), with install-cni's placeholders
// __KUBERNETES_NODE_NAME__, __CNI_MTU__ and __KUBECONFIG_FILEPATH__.
type cniNetwork struct {
	Name       string `json:"name"`
	CNIVersion string `json:"cniVersion"`
	Plugins    []any  `json:"plugins"`
}

type calicoPlugin struct {
	Type          string            `json:"type"`
	LogLevel      string            `json:"log_level"`
	LogFilePath   string            `json:"log_file_path"`
	DatastoreType string            `json:"datastore_type"`
	Nodename      string            `json:"nodename"`
	MTU           int               `json:"mtu"` // 0 here, replaced by __CNI_MTU__`
	IPAM          map[string]string `json:"ipam"`
	Policy        map[string]string `json:"policy"`
	Kubernetes    map[string]string `json:"kubernetes"`
}

func configMap(p Params) (*corev1.ConfigMap, error) {
	net := cniNetwork{Name: "k8s-pod-network", CNIVersion: "1.0.0", Plugins: []any{
		calicoPlugin{Type: "calico", LogLevel: "info", LogFilePath: "/var/log/calico/cni/cni.log", DatastoreType: "kubernetes",
			Nodename: "__KUBERNETES_NODE_NAME__", IPAM: map[string]string{"type": "calico-ipam"},
			Policy: map[string]string{"type": "k8s"}, Kubernetes: map[string]string{"kubeconfig": "__KUBECONFIG_FILEPATH__"}},
		map[string]any{"type": "portmap", "snat": true, "capabilities": map[string]bool{"portMappings": true}},
	}}
	b, err := json.MarshalIndent(net, "", "  ")
	if err != nil {
		return nil, err
	}
	// __CNI_MTU__ is a bare number once install-cni replaces it, so it is written unquoted.
	conf := strings.Replace(string(b), `"mtu": 0`, `"mtu": __CNI_MTU__`, 1)
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: meta("calico-config"),
		Data: map[string]string{
			"calico_backend":     CalicoBackend,
			"veth_mtu":           strconv.Itoa(p.PodMTU),
			"cni_network_config": conf,
		},
	}, nil
}

func daemonSet(p Params, cidrs string) *appsv1.DaemonSet {
	labels := map[string]string{"k8s-app": "calico-node"}
	privileged := true
	maxUnavailable := intstrOne()
	fromConfig := func(name, key string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "calico-config"}, Key: key}}}
	}
	nodeName := func(name string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}
	}
	env := func(kv ...string) []corev1.EnvVar {
		var out []corev1.EnvVar
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, corev1.EnvVar{Name: kv[i], Value: kv[i+1]})
		}
		return out
	}
	api := env("KUBERNETES_SERVICE_HOST", p.APIServerHost.String(), "KUBERNETES_SERVICE_PORT", strconv.Itoa(int(p.APIServerPort)))
	hostPath := func(name, path string, t corev1.HostPathType) corev1.Volume {
		v := corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}}
		if t != "" {
			v.HostPath.Type = &t
		}
		return v
	}
	mount := func(name, path string, ro bool) corev1.VolumeMount {
		return corev1.VolumeMount{Name: name, MountPath: path, ReadOnly: ro}
	}
	install := corev1.Container{
		Name:            "install-cni",
		Image:           p.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         []string{"/usr/bin/calico", "component", "cni", "install"},
		Env: append(append(api, env("CNI_CONF_NAME", CNIConfName, "SLEEP", "false")...),
			fromConfig("CNI_NETWORK_CONFIG", "cni_network_config"), nodeName("KUBERNETES_NODE_NAME"), fromConfig("CNI_MTU", "veth_mtu")),
		VolumeMounts:    []corev1.VolumeMount{mount("cni-bin-dir", "/host/opt/cni/bin", false), mount("cni-net-dir", "/host/etc/cni/net.d", false)},
		SecurityContext: &corev1.SecurityContext{Privileged: &privileged},
	}
	nodeEnv := append(api, env(
		"DATASTORE_TYPE", "kubernetes",
		"WAIT_FOR_DATASTORE", "true",
		"CLUSTER_TYPE", "k8s",
		"IP", "autodetect",
		"IP_AUTODETECTION_METHOD", "cidr="+cidrs,
		"CALICO_IPV4POOL_CIDR", p.PodCIDR.Masked().String(),
		"CALICO_IPV4POOL_BLOCK_SIZE", "26",
		"CALICO_IPV4POOL_IPIP", "Never",
		"CALICO_IPV4POOL_VXLAN", "CrossSubnet",
		"CALICO_IPV4POOL_NAT_OUTGOING", "true",
		"CALICO_DISABLE_FILE_LOGGING", "true",
		"FELIX_NFTABLESMODE", "Enabled",
		"FELIX_DEFAULTENDPOINTTOHOSTACTION", "ACCEPT",
		"FELIX_IPV6SUPPORT", "false",
		"FELIX_HEALTHENABLED", "true",
		"FELIX_LOGSEVERITYSCREEN", "info",
		// The settings of calico/node's /etc/calico/felix.cfg: log to stderr only, no metadata proxy.
		"FELIX_LOGFILEPATH", "None",
		"FELIX_LOGSEVERITYFILE", "None",
		"FELIX_LOGSEVERITYSYS", "None",
		"FELIX_METADATAADDR", "None",
		// Felix without eBPF first removes an eBPF connect-time load balancer an eBPF-mode felix may
		// have left; that opens BPF objects through libbpf, which Calico's CGO_ENABLED=0 build (the
		// image's) only stubs with a panic. This cluster's felix never runs eBPF: skip it.
		"FELIX_DebugSkipCTLBCleanup", "true",
	)...)
	nodeEnv = append(nodeEnv, nodeName("NODENAME"), fromConfig("CALICO_NETWORKING_BACKEND", "calico_backend"), fromConfig("FELIX_VXLANMTU", "veth_mtu"))
	probe := func(flag string, failure int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/usr/bin/calico", "component", "node", "health", flag}}},
			PeriodSeconds:    10,
			TimeoutSeconds:   10,
			FailureThreshold: failure,
		}
	}
	live := probe("--felix-live", 6)
	live.InitialDelaySeconds = 10
	node := corev1.Container{
		Name:            "calico-node",
		Image:           p.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         []string{"/bin/sh", "-c", RunScript},
		Env:             nodeEnv,
		SecurityContext: &corev1.SecurityContext{Privileged: &privileged},
		Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{
			Command: []string{"/usr/bin/calico", "component", "node", "shutdown"}}}},
		LivenessProbe:  live,
		ReadinessProbe: probe("--felix-ready", 3),
		VolumeMounts: []corev1.VolumeMount{
			mount("cni-net-dir", "/host/etc/cni/net.d", false),
			mount("lib-modules", "/lib/modules", true),
			mount("xtables-lock", "/run/xtables.lock", false),
			mount("var-run-calico", "/var/run/calico", false),
			mount("var-lib-calico", "/var/lib/calico", false),
			mount("cni-log-dir", "/var/log/calico/cni", true),
		},
	}
	var zero int64
	return &appsv1.DaemonSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"},
		ObjectMeta: metav1.ObjectMeta{Name: "calico-node", Namespace: Namespace, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: maxUnavailable}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"kubernetes.io/os": "linux"},
					HostNetwork:  true,
					Tolerations: []corev1.Toleration{
						{Effect: corev1.TaintEffectNoSchedule, Operator: corev1.TolerationOpExists},
						{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists},
						{Effect: corev1.TaintEffectNoExecute, Operator: corev1.TolerationOpExists},
					},
					ServiceAccountName:            "calico-node",
					TerminationGracePeriodSeconds: &zero,
					PriorityClassName:             "system-node-critical",
					InitContainers:                []corev1.Container{install},
					Containers:                    []corev1.Container{node},
					Volumes: []corev1.Volume{
						hostPath("lib-modules", "/lib/modules", corev1.HostPathDirectoryOrCreate),
						hostPath("var-run-calico", "/var/run/calico", corev1.HostPathDirectoryOrCreate),
						hostPath("var-lib-calico", "/var/lib/calico", corev1.HostPathDirectoryOrCreate),
						hostPath("xtables-lock", "/run/xtables.lock", corev1.HostPathFileOrCreate),
						hostPath("cni-bin-dir", containerd.CNIBinDir, corev1.HostPathDirectoryOrCreate),
						hostPath("cni-net-dir", containerd.CNIConfDir, corev1.HostPathDirectoryOrCreate),
						hostPath("cni-log-dir", "/var/log/calico/cni", corev1.HostPathDirectoryOrCreate),
					},
				},
			},
		},
	}
}

func intstrOne() *intstr.IntOrString {
	one := intstr.FromInt32(1)
	return &one
}
