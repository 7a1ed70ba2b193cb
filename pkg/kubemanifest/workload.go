package kubemanifest

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// NameLabel is the label every object of an appliance component carries with the component's name
// (the recommended app.kubernetes.io/name label); a DaemonSet's selector is this label alone.
const NameLabel = "app.kubernetes.io/name"

// Labels are the labels of the objects of the component name: NameLabel = name and
// app.kubernetes.io/part-of = airgap-appliance.
func Labels(name string) map[string]string {
	return map[string]string{NameLabel: name, "app.kubernetes.io/part-of": "airgap-appliance"}
}

// Meta is the ObjectMeta of one of component's objects: name, namespace ("" for cluster-scoped
// objects) and Labels(component).
func Meta(component, name, namespace string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: Labels(component)}
}

// ServiceAccountWithRole is the ServiceAccount name in namespace and the ClusterRoleBinding that
// gives it the ClusterRole of the same name, each carrying Labels(name).
func ServiceAccountWithRole(name, namespace string) (*corev1.ServiceAccount, *rbacv1.ClusterRoleBinding) {
	sa := &corev1.ServiceAccount{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}, ObjectMeta: Meta(name, name, namespace)}
	binding := &rbacv1.ClusterRoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
		ObjectMeta: Meta(name, name, ""),
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: namespace}},
	}
	return sa, binding
}

// HostNetworkDaemonSet is the DaemonSet name in namespace that runs pod on every node it schedules to,
// in the host's network namespace: Labels(name) on the DaemonSet and its pods, selected by NameLabel,
// rolled one node at a time (maxUnavailable 1), the pods under the ServiceAccount name with
// hostNetwork and the ClusterFirstWithHostNet DNS policy (Kubernetes' rule for host-network pods that
// still resolve cluster names). pod gives the rest (containers, priority, placement); the fields set
// here overwrite its own.
func HostNetworkDaemonSet(name, namespace string, pod corev1.PodSpec) *appsv1.DaemonSet {
	pod.ServiceAccountName = name
	pod.HostNetwork = true
	pod.DNSPolicy = corev1.DNSClusterFirstWithHostNet
	one := intstr.FromInt32(1)
	return &appsv1.DaemonSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"},
		ObjectMeta: Meta(name, name, namespace),
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{NameLabel: name}},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{
				Type:          appsv1.RollingUpdateDaemonSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &one},
			},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: Labels(name)}, Spec: pod},
		},
	}
}

// RestrictedSecurityContext is a container's security context with no privilege escalation, a
// read-only root filesystem, and every Linux capability dropped but add (e.g. NET_ADMIN).
func RestrictedSecurityContext(add ...corev1.Capability) *corev1.SecurityContext {
	no, yes := false, true
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: &no,
		ReadOnlyRootFilesystem:   &yes,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: add},
	}
}
