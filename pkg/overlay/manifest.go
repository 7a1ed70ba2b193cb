package overlay

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airgap-appliance/appliance/pkg/kubemanifest"
)

// Names of the objects Manifest renders (ServiceAccount, ClusterRole, ClusterRoleBinding, ConfigMap
// and DaemonSet share Name).
const (
	Name      = "appliance-overlay"
	Namespace = "kube-system"
)

// Flags of `appliance overlay`, shared by the command and the manifest.
const (
	FlagKubeconfig  = "kubeconfig"
	FlagNodeName    = "node-name"
	FlagNetwork     = "network"
	FlagPublicCIDRs = "public-cidrs"
	FlagVNI         = "vni"
	FlagPort        = "port"
	FlagMTU         = "mtu"
	FlagStateDir    = "state-dir"
	FlagPodRanges   = "pod-ranges"
	FlagPublicAddrs = "public-addresses"
)

// PodRangesKey is the ConfigMap's key holding the pod ranges (JSON, node name → CIDR), mounted at
// ConfigDir.
const (
	PodRangesKey       = "pod-ranges.json"
	PublicAddressesKey = "public-addresses.json"
	ConfigDir          = "/etc/appliance-overlay"
)

// StateDir is the DaemonSet's state directory (an emptyDir: flannel's net-conf.json only).
const StateDir = "/run/appliance-overlay"

// Taints the DaemonSet tolerates (NoSchedule): kubeadm's control planes, and nodes not ready or
// without a network yet, which are exactly the nodes waiting for the overlay.
var tolerated = []string{"node-role.kubernetes.io/control-plane", "node.kubernetes.io/not-ready", "node.kubernetes.io/network-unavailable"}

// ManifestOptions are what the overlay's manifest depends on.
type ManifestOptions struct {
	// Image is the appliance image by digest ("host/repo@sha256:<64 hex>"), whose /appliance runs
	// `appliance overlay`. Required.
	Image string
	// Network is networks.pods (IPv4); PublicCIDRs networks.workloadPlane.cidrs in order (at least
	// one IPv4); VNI and Port the VXLAN identifier and UDP port; MTU the workload-plane link MTU
	// (0: each node's interface's).
	Network     netip.Prefix
	PublicCIDRs []netip.Prefix
	VNI, Port   int
	MTU         int
	// PodRanges is the appliance's pod range of every node (plan.PodRanges): the ConfigMap's
	// PodRangesKey, from which each node's overlay sets its spec.podCIDR (Options.PodRangesFile).
	// Nil: no ConfigMap, spec.podCIDR is used as found.
	PodRanges map[string]netip.Prefix
	// PublicAddresses is the workload-plane address the appliance knows for each node (the first of
	// nodes[].addresses inside networks.workloadPlane.cidrs, in their order: what the bridge CNI's
	// routes and the appliance use): the ConfigMap's PublicAddressesKey, from which each node's
	// overlay takes its VXLAN endpoint (Options.PublicAddressesFile). Nil: none (the CIDRs decide).
	PublicAddresses map[string]netip.Addr
	// APIServer, when set ("host:port", the API VIP and port), is given as
	// KUBERNETES_SERVICE_HOST/PORT: the overlay reaches the API before any Service works.
	APIServer string
}

// ErrManifest is wrapped by Manifest's errors for options it cannot render.
var ErrManifest = errors.New("overlay manifest: invalid options")

// Manifest renders the YAML stream (documents separated by "---") to apply with `kubectl apply
// --server-side`: the ServiceAccount, the ClusterRole flannel's Kubernetes subnet manager needs
// (nodes get/list/watch and patch, for its annotations; nodes/status patch, for the annotations it
// writes through the status subresource and the NetworkUnavailable condition; patch also sets
// spec.podCIDR), its ClusterRoleBinding, with PodRanges the ConfigMap of the pod ranges, and the
// DaemonSet: every node (control planes and not-ready nodes tolerated),
// host network, priority class system-node-critical, the appliance image running `appliance
// overlay` with only NET_ADMIN and NET_RAW, a read-only root, an emptyDir for StateDir and a readiness
// probe `appliance overlay ready` (Ready: the node registered). It fails
// (ErrManifest) for an image not pinned by digest, options Run refuses, or an APIServer that is not
// host:port. The same options give the same bytes.
func Manifest(o ManifestOptions) ([]byte, error) {
	if _, digest, ok := strings.Cut(o.Image, "@sha256:"); !ok || len(digest) != 64 || strings.Trim(digest, "0123456789abcdef") != "" {
		return nil, fmt.Errorf("%w: image %q: give the appliance image by digest (host/repo@sha256:<64 hex digits>)", ErrManifest, o.Image)
	}
	if err := (Options{NodeName: "-", Network: o.Network, PublicCIDRs: o.PublicCIDRs, VNI: o.VNI, Port: o.Port, MTU: o.MTU, StateDir: StateDir}).check(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrManifest, err)
	}
	var env []corev1.EnvVar
	env = append(env, corev1.EnvVar{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "spec.nodeName"}}})
	if o.APIServer != "" {
		h, p, err := net.SplitHostPort(o.APIServer)
		if n, perr := strconv.Atoi(p); err != nil || h == "" || perr != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%w: API server %q: give host:port, e.g. 10.0.0.10:6443", ErrManifest, o.APIServer)
		}
		env = append(env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: h}, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: p})
	}
	cidrs := make([]string, 0, len(o.PublicCIDRs))
	for _, c := range o.PublicCIDRs {
		cidrs = append(cidrs, c.String())
	}
	args := []string{"/appliance", "overlay",
		"--" + FlagNodeName + "=$(NODE_NAME)",
		"--" + FlagNetwork + "=" + o.Network.Masked().String(),
		"--" + FlagPublicCIDRs + "=" + strings.Join(cidrs, ","),
		"--" + FlagVNI + "=" + strconv.Itoa(o.VNI),
		"--" + FlagPort + "=" + strconv.Itoa(o.Port),
		"--" + FlagStateDir + "=" + StateDir}
	if o.MTU != 0 {
		args = append(args, "--"+FlagMTU+"="+strconv.Itoa(o.MTU))
	}
	var cm *corev1.ConfigMap
	mounts := []corev1.VolumeMount{{Name: "state", MountPath: StateDir}}
	volumes := []corev1.Volume{{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	if o.PodRanges != nil || o.PublicAddresses != nil {
		for n, a := range o.PublicAddresses {
			if !a.Is4() || !slices.ContainsFunc(o.PublicCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }) {
				return nil, fmt.Errorf("%w: public address %s of node %s: give an IPv4 address inside %v", ErrManifest, a, n, o.PublicCIDRs)
			}
		}
		for n, r := range o.PodRanges {
			if !r.IsValid() || !o.Network.Contains(r.Addr()) || r.Bits() < o.Network.Bits() {
				return nil, fmt.Errorf("%w: pod range %s of node %s: give a range inside %s", ErrManifest, r, n, o.Network)
			}
		}
		cm = &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: metav1.ObjectMeta{Name: Name, Namespace: Namespace},
			Data: map[string]string{}}
		for _, d := range []struct {
			key, flag string
			v         any
			set       bool
		}{{PodRangesKey, FlagPodRanges, o.PodRanges, o.PodRanges != nil}, {PublicAddressesKey, FlagPublicAddrs, o.PublicAddresses, o.PublicAddresses != nil}} {
			if !d.set {
				continue
			}
			b, err := json.Marshal(d.v) // map keys sorted: deterministic
			if err != nil {
				return nil, fmt.Errorf("overlay manifest: %w", err)
			}
			cm.Data[d.key] = string(b) + "\n"
			args = append(args, "--"+d.flag+"="+ConfigDir+"/"+d.key)
		}
		mounts = append(mounts, corev1.VolumeMount{Name: "config", MountPath: ConfigDir, ReadOnly: true})
		volumes = append(volumes, corev1.Volume{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: Name}}}})
	}

	sa, binding := kubemanifest.ServiceAccountWithRole(Name, Namespace)
	role := &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: kubemanifest.Meta(Name, Name, ""),
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
		},
	}
	var tolerations []corev1.Toleration
	for _, k := range tolerated {
		tolerations = append(tolerations, corev1.Toleration{Key: k, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	}
	ds := kubemanifest.HostNetworkDaemonSet(Name, Namespace, corev1.PodSpec{
		PriorityClassName: "system-node-critical",
		NodeSelector:      map[string]string{"kubernetes.io/os": "linux"},
		Tolerations:       tolerations,
		Containers: []corev1.Container{{
			Name:            "overlay",
			Image:           o.Image,
			ImagePullPolicy: corev1.PullIfNotPresent,
			Command:         args,
			Env:             env,
			SecurityContext: kubemanifest.RestrictedSecurityContext("NET_ADMIN", "NET_RAW"),
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/appliance", "overlay", "ready", "--" + FlagStateDir + "=" + StateDir}}},
				PeriodSeconds: 5,
			},
			VolumeMounts: mounts,
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("50Mi"),
			}},
		}},
		Volumes: volumes,
	})
	objs := []any{sa, role, binding}
	if cm != nil {
		cm.Labels = kubemanifest.Labels(Name)
		objs = append(objs, cm)
	}
	out, err := kubemanifest.Stream(append(objs, ds)...)
	if err != nil {
		return nil, fmt.Errorf("overlay manifest: %w", err)
	}
	return out, nil
}
