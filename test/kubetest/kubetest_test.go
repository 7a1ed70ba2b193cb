package kubetest

import (
	"context"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/kubeapi"
	"github.com/airgap-appliance/appliance/pkg/pki"
)

// TestStartAPIServer: the harness against the real etcd and kube-apiserver it starts. A CA already
// in PKIDir is reused and the service-account key pair is added beside it (0600); the admin
// kubeconfig is written where asked (0600, its new directory 0700) and its client, the admin, is
// authorized for everything; the zero Options configure the API server as kubeadm does:
// authorization Node,RBAC (a node is refused kube-system's Secrets) and the default admission
// plugins (ServiceAccount refuses a pod in a namespace without its default service account, which
// only kube-controller-manager would make).
func TestStartAPIServer(t *testing.T) {
	pkiDir := t.TempDir()
	ca, _, err := pki.EnsureCA(pkiDir, "kubernetes", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "state", "kubernetes", "admin.conf")
	s := StartAPIServer(t, Options{PKIDir: pkiDir, AdminKubeconfig: kubeconfig})
	ctx := context.Background()

	if !s.CA.Cert.Equal(ca.Cert) || s.CAFile != filepath.Join(pkiDir, pki.CACertFile) {
		t.Errorf("the CA in PKIDir was not reused: CA %q, CAFile %s", s.CA.Cert.Subject, s.CAFile)
	}
	mode := func(p string) fs.FileMode {
		t.Helper()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	for _, f := range []string{ServiceAccountKeyFile, ServiceAccountPublicKeyFile} {
		if m := mode(filepath.Join(pkiDir, f)); m != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, m)
		}
	}
	if s.AdminKubeconfig != kubeconfig || mode(kubeconfig) != 0o600 || mode(filepath.Dir(kubeconfig)) != 0o700 {
		t.Errorf("admin kubeconfig %s (mode %v, directory %v), want %s 0600 in a 0700 directory",
			s.AdminKubeconfig, mode(s.AdminKubeconfig), mode(filepath.Dir(s.AdminKubeconfig)), kubeconfig)
	}
	if s.Client.Server() != s.URL || !strings.HasPrefix(s.URL, "https://127.0.0.1:") {
		t.Errorf("client for %s, server URL %s", s.Client.Server(), s.URL)
	}
	const secrets = "/api/v1/namespaces/kube-system/secrets"
	if _, err := s.Client.Do(ctx, http.MethodGet, secrets, nil); err != nil {
		t.Errorf("the admin lists Secrets: %v", err)
	}

	nodeConf := filepath.Join(t.TempDir(), "kubelet.conf")
	s.WriteKubeconfig(t, nodeConf, "system:node:w1", "system:nodes")
	node, err := kubeapi.Load(nodeConf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node.Do(ctx, http.MethodGet, secrets, nil); err == nil || !strings.Contains(err.Error(), "HTTP 403") {
		t.Errorf("a node lists kube-system's Secrets: %v, want HTTP 403 (Node,RBAC)", err)
	}

	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"registry.k8s.io/pause:3.10"}]}}`
	if _, err := s.Client.Do(ctx, http.MethodPost, "/api/v1/namespaces/default/pods", []byte(pod)); err == nil || !strings.Contains(err.Error(), `serviceaccount "default" not found`) {
		t.Errorf("a pod without its service account: %v, want the ServiceAccount admission plugin's refusal", err)
	}
}
