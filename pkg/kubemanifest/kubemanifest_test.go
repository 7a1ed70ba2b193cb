package kubemanifest

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestMarshalPrunes: a typed DaemonSet and ConfigMap come out without status and creationTimestamp (top
// level and pod template), in one stream of two documents, keys sorted.
func TestMarshalPrunes(t *testing.T) {
	ds := &appsv1.DaemonSet{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"},
		ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "kube-system"},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "i"}}}}}}
	cm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: metav1.ObjectMeta{Name: "y"}}
	b, err := Stream(ds, cm)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, bad := range []string{"status", "creationTimestamp"} {
		if strings.Contains(s, bad) {
			t.Errorf("%s left in:\n%s", bad, s)
		}
	}
	if docs := strings.Split(s, "---\n"); len(docs) != 2 || !strings.HasPrefix(docs[0], "apiVersion: apps/v1\nkind: DaemonSet\n") {
		t.Errorf("stream:\n%s", s)
	}
	if _, err := Marshal([]int{1}); err == nil {
		t.Error("Marshal of a JSON array: no error")
	}
}

// TestHostNetworkDaemonSet: the DaemonSet's shape is the helper's whatever the pod spec says (its
// ServiceAccount, host network and DNS policy win), the selector matches the pods' labels, and the
// rest of the pod spec is kept.
func TestHostNetworkDaemonSet(t *testing.T) {
	ds := HostNetworkDaemonSet("x", "kube-system", corev1.PodSpec{ServiceAccountName: "other", DNSPolicy: corev1.DNSDefault,
		PriorityClassName: "system-node-critical", Containers: []corev1.Container{{Name: "c", SecurityContext: RestrictedSecurityContext("NET_ADMIN")}}})
	p := ds.Spec.Template.Spec
	if p.ServiceAccountName != "x" || !p.HostNetwork || p.DNSPolicy != corev1.DNSClusterFirstWithHostNet || p.PriorityClassName != "system-node-critical" || len(p.Containers) != 1 {
		t.Errorf("pod spec %+v", p)
	}
	sel, labels := ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels
	if len(sel) != 1 || sel[NameLabel] != "x" || labels[NameLabel] != "x" || ds.Labels[NameLabel] != "x" || ds.Namespace != "kube-system" {
		t.Errorf("selector %v, pod labels %v, DaemonSet meta %+v", sel, labels, ds.ObjectMeta)
	}
	sc := p.Containers[0].SecurityContext
	if *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Add[0] != "NET_ADMIN" {
		t.Errorf("security context %+v", sc)
	}
	sa, rb := ServiceAccountWithRole("x", "kube-system")
	if sa.Namespace != "kube-system" || rb.RoleRef.Name != "x" || rb.Subjects[0].Name != "x" || rb.Subjects[0].Namespace != "kube-system" || rb.Namespace != "" {
		t.Errorf("service account %+v, binding %+v", sa.ObjectMeta, rb)
	}
}
