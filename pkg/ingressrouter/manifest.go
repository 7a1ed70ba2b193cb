package ingressrouter

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/airgap-appliance/appliance/pkg/kubemanifest"
)

// Names of the objects Manifest renders (ServiceAccount, ClusterRole, ClusterRoleBinding and
// DaemonSet share Name; the IngressClass is ManifestOptions.IngressClass).
const (
	Name      = "appliance-ingress-router"
	Namespace = "kube-system"
)

// ControlPlaneTaint is the taint kubeadm puts on control planes (node-role.kubernetes.io/control-plane,
// NoSchedule), tolerated when ManifestOptions.TolerateControlPlane is set; kubeadm labels them with
// the same key.
const ControlPlaneTaint = "node-role.kubernetes.io/control-plane"

// ManifestOptions are what the router's manifest depends on.
type ManifestOptions struct {
	// Image is the appliance image by digest (registry.ExecutableImage's pinned reference,
	// "host/repo@sha256:<64 hex>"), whose /appliance runs `appliance ingress-router`. Required.
	Image string
	// NodeSelector is the DaemonSet's spec.template.spec.nodeSelector: where routers run. kcli's
	// rule, the caller's to apply: the workers when there are any (the ingress VIP's HAProxy on the
	// control planes balances to them), else the control planes (with TolerateControlPlane).
	// Empty: every node that tolerates. kubeadm labels control planes only
	// (node-role.kubernetes.io/control-plane), and kubelet may not give itself a
	// node-role.kubernetes.io label: for "the workers" use WorkersOnly, not a selector.
	NodeSelector map[string]string
	// WorkersOnly keeps the routers off the control planes: a required node affinity on the
	// absence of kubeadm's control-plane label (ControlPlaneTaint's key). kcli's "workers when
	// there are workers" without a worker label.
	WorkersOnly bool
	// TolerateControlPlane adds the toleration of ControlPlaneTaint.
	TolerateControlPlane bool
	// IngressClass is the IngressClass created (marked default) and served; "" means
	// DefaultIngressClass.
	IngressClass string
	// ListenPort, TLSPort and HealthPort are the host ports of HTTP, HTTPS and HealthPath
	// (hostNetwork); 0 means ListenPort, TLSListenPort and HealthPort of this package.
	ListenPort, TLSPort, HealthPort uint16
	// StatusAddress, when valid, is passed as --status-address: the ingress VIP, written into the
	// served Ingresses' status.
	StatusAddress netip.Addr
	// APIServer, when set ("host:port", e.g. the API VIP and port), is given to the router as
	// KUBERNETES_SERVICE_HOST/PORT so it reaches the API without the kubernetes Service (kube-proxy),
	// as pkg/calico does.
	APIServer string
}

// ErrManifest is wrapped by Manifest's errors for options it cannot render.
var ErrManifest = errors.New("ingress-router manifest: invalid options")

// Flags of `appliance ingress-router`, shared by the command and the manifest.
const (
	FlagKubeconfig    = "kubeconfig"
	FlagListen        = "listen"
	FlagListenTLS     = "listen-tls"
	FlagHealthListen  = "health-listen"
	FlagIngressClass  = "ingress-class"
	FlagStatusAddress = "status-address"
	FlagDrainDelay    = "drain-delay"
)

// DefaultDrainDelay is the command's --drain-delay: long enough for a balancer checking HealthPath
// every second or two to take the router out (two failed checks) before its port closes, well
// within kubelet's default 30 s SIGTERM grace period.
const DefaultDrainDelay = 5 * time.Second

// Manifest renders the YAML stream (documents separated by "---") to apply with `kubectl apply
// --server-side`: the ServiceAccount, ClusterRole (get/list/watch Ingresses, IngressClasses,
// Services, EndpointSlices and Secrets; update ingresses/status), ClusterRoleBinding, the IngressClass
// (spec.controller ControllerName, marked default) and the DaemonSet: host network, the appliance
// image, priority class system-cluster-critical, only NET_BIND_SERVICE, a readiness probe on
// HealthPath. It fails (ErrManifest) for an image not pinned by digest, an APIServer that is not
// host:port, two equal ports, or WorkersOnly with TolerateControlPlane. The same options give the same bytes.
func Manifest(o ManifestOptions) ([]byte, error) {
	if _, digest, ok := strings.Cut(o.Image, "@sha256:"); !ok || len(digest) != 64 || strings.Trim(digest, "0123456789abcdef") != "" {
		return nil, fmt.Errorf("%w: image %q: give the appliance image by digest (host/repo@sha256:<64 hex digits>)", ErrManifest, o.Image)
	}
	if o.IngressClass == "" {
		o.IngressClass = DefaultIngressClass
	}
	if o.ListenPort == 0 {
		o.ListenPort = ListenPort
	}
	if o.HealthPort == 0 {
		o.HealthPort = HealthPort
	}
	if o.WorkersOnly && o.TolerateControlPlane {
		return nil, fmt.Errorf("%w: WorkersOnly and TolerateControlPlane both set: choose the workers or the control planes", ErrManifest)
	}
	if o.TLSPort == 0 {
		o.TLSPort = TLSListenPort
	}
	if o.ListenPort == o.HealthPort || o.ListenPort == o.TLSPort || o.TLSPort == o.HealthPort {
		return nil, fmt.Errorf("%w: ports %d (HTTP), %d (HTTPS), %d (health) are not all different: give three ports", ErrManifest, o.ListenPort, o.TLSPort, o.HealthPort)
	}
	var apiHost, apiPort string
	if o.APIServer != "" {
		h, p, err := net.SplitHostPort(o.APIServer)
		if n, perr := strconv.Atoi(p); err != nil || h == "" || perr != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%w: API server %q: give host:port, e.g. 10.0.0.10:6443", ErrManifest, o.APIServer)
		}
		apiHost, apiPort = h, p
	}
	meta := func(name, ns string) metav1.ObjectMeta { return kubemanifest.Meta(Name, name, ns) }
	sa, binding := kubemanifest.ServiceAccountWithRole(Name, Namespace)
	read := []string{"get", "list", "watch"}
	role := &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: meta(Name, ""),
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"ingresses", "ingressclasses"}, Verbs: read},
			{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"ingresses/status"}, Verbs: []string{"update"}},
			{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: read},
			// TLS Secrets of the Ingresses' spec.tls (the router lists only type kubernetes.io/tls;
			// RBAC cannot narrow a rule by type).
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: read},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
		},
	}
	class := &networkingv1.IngressClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "IngressClass"},
		ObjectMeta: meta(o.IngressClass, ""),
		Spec:       networkingv1.IngressClassSpec{Controller: ControllerName},
	}
	class.Annotations = map[string]string{AnnotationDefaultClass: "true"}

	args := []string{"/appliance", "ingress-router",
		"--" + FlagKubeconfig, InCluster,
		"--" + FlagListen, ":" + strconv.Itoa(int(o.ListenPort)),
		"--" + FlagListenTLS, ":" + strconv.Itoa(int(o.TLSPort)),
		"--" + FlagHealthListen, ":" + strconv.Itoa(int(o.HealthPort)),
		"--" + FlagIngressClass, o.IngressClass}
	if o.StatusAddress.IsValid() {
		args = append(args, "--"+FlagStatusAddress, o.StatusAddress.String())
	}
	var env []corev1.EnvVar
	if apiHost != "" {
		env = []corev1.EnvVar{{Name: "KUBERNETES_SERVICE_HOST", Value: apiHost}, {Name: "KUBERNETES_SERVICE_PORT", Value: apiPort}}
	}
	var tolerations []corev1.Toleration
	if o.TolerateControlPlane {
		tolerations = []corev1.Toleration{{Key: ControlPlaneTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	}
	var affinity *corev1.Affinity
	if o.WorkersOnly {
		affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: ControlPlaneTaint, Operator: corev1.NodeSelectorOpDoesNotExist}},
			}}},
		}}
	}
	ds := kubemanifest.HostNetworkDaemonSet(Name, Namespace, corev1.PodSpec{
		PriorityClassName: "system-cluster-critical",
		NodeSelector:      o.NodeSelector,
		Affinity:          affinity,
		Tolerations:       tolerations,
		Containers: []corev1.Container{{
			Name:            "router",
			Image:           o.Image,
			ImagePullPolicy: corev1.PullIfNotPresent,
			Command:         args,
			Env:             env,
			Ports: []corev1.ContainerPort{
				{Name: "http", ContainerPort: int32(o.ListenPort), HostPort: int32(o.ListenPort), Protocol: corev1.ProtocolTCP},
				{Name: "https", ContainerPort: int32(o.TLSPort), HostPort: int32(o.TLSPort), Protocol: corev1.ProtocolTCP},
				{Name: "health", ContainerPort: int32(o.HealthPort), HostPort: int32(o.HealthPort), Protocol: corev1.ProtocolTCP},
			},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: HealthPath, Port: intstr.FromInt32(int32(o.HealthPort))}},
				PeriodSeconds: 5,
			},
			LivenessProbe: &corev1.Probe{
				ProbeHandler:        corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(int32(o.HealthPort))}},
				InitialDelaySeconds: 10,
				PeriodSeconds:       10,
			},
			SecurityContext: kubemanifest.RestrictedSecurityContext("NET_BIND_SERVICE"),
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi"),
			}},
		}},
	})
	out, err := kubemanifest.Stream(sa, role, binding, class, ds)
	if err != nil {
		return nil, fmt.Errorf("ingress-router manifest: %w", err)
	}
	return out, nil
}
