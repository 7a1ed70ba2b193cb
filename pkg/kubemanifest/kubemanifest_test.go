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
