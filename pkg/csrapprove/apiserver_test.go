package csrapprove

// A real control plane for the approver's tests: test/kubetest's etcd and kube-apiserver v1.37.2
// from the Kubernetes fixture (`make fixtures`, test/fixtures/build-kubernetes.sh) on 127.0.0.1,
// authorization Node,RBAC as kubeadm configures it. No kube-controller-manager runs, so approved
// CSRs are not signed: the tests look at the approval conditions only.

import (
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/airgap-appliance/appliance/test/kubetest"
)

// cluster is a running etcd + kube-apiserver.
type cluster struct{ *kubetest.APIServer }

// startCluster starts etcd and kube-apiserver (authorization Node,RBAC, as kubeadm configures it)
// and waits until /readyz answers ok. Without the fixture it skips loudly (fails under CI).
func startCluster(t *testing.T) *cluster {
	t.Helper()
	return &cluster{kubetest.StartAPIServer(t, kubetest.Options{})}
}

// client authenticates with a client certificate CN=user, O=groups, as kubelets and kubeadm's
// admin.conf do.
func (c *cluster) client(t *testing.T, user string, groups ...string) kubernetes.Interface {
	t.Helper()
	cert := c.ClientCert(t, user, groups...)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: c.URL,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CA.CertPEM, CertData: cert.CertPEM, KeyData: cert.KeyPEM}})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// writeKubeconfig writes an admin kubeconfig like kubeadm's admin.conf (embedded certificate and
// key, mode 0600) to path.
func (c *cluster) writeKubeconfig(t *testing.T, path string) {
	t.Helper()
	c.WriteKubeconfig(t, path, "kubernetes-admin", "kubeadm:cluster-admins", "system:masters")
}
