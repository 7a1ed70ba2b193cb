package kubeapi

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/pki"
)

// TestLoadKubeconfig: the kubeconfig shapes kubeadm and the appliance write load (inline data,
// files relative to the kubeconfig, a token), and every refusal names the field to fix without
// printing key material.
func TestLoadKubeconfig(t *testing.T) {
	ca, _, err := pki.EnsureCA(t.TempDir(), "kubeapi-test-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cc, err := pki.IssueClientCert(ca, "kubernetes-admin", []string{"kubeadm:cluster-admins"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	crt, key := cc.CertPEM, cc.KeyPEM
	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	doc := func(cluster, user string) string {
		return "apiVersion: v1\nkind: Config\ncurrent-context: admin@lab\n" +
			"contexts:\n- name: other\n  context: {cluster: nope, user: nope}\n- name: admin@lab\n  context: {cluster: lab, user: admin}\n" +
			"clusters:\n- name: lab\n  cluster:\n" + cluster + "users:\n- name: admin\n  user:\n" + user
	}
	server := "    server: https://10.100.0.100:6443\n"
	inlineCA := "    certificate-authority-data: " + b64(ca.CertPEM) + "\n"
	inlineUser := "    client-certificate-data: " + b64(crt) + "\n    client-key-data: " + b64(key) + "\n"

	dir := t.TempDir()
	write(t, dir, "ca.crt", ca.CertPEM)
	write(t, dir, "admin.crt", crt)
	write(t, dir, "admin.key", key)
	write(t, dir, "token", []byte("abc.def\n"))

	ok := []struct {
		name, cluster, user, token string
	}{
		{"inline data (admin.conf)", server + inlineCA, inlineUser, ""},
		{"relative files", server + "    certificate-authority: ca.crt\n", "    client-certificate: admin.crt\n    client-key: " + filepath.Join(dir, "admin.key") + "\n", ""},
		{"token file", server + inlineCA, "    tokenFile: token\n", "abc.def"},
		{"token", server + inlineCA, "    token: xyz\n", "xyz"},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			p := write(t, dir, "kc", []byte(doc(tc.cluster, tc.user)))
			c, err := Load(p)
			if err != nil {
				t.Fatal(err)
			}
			if c.server != "https://10.100.0.100:6443" || c.token != tc.token {
				t.Errorf("server %q token %q, want https://10.100.0.100:6443 %q", c.server, c.token, tc.token)
			}
		})
	}

	bad := []struct {
		name, text, want string
	}{
		{"no current context", "apiVersion: v1\nkind: Config\n", "current-context: is empty"},
		{"unknown context", "current-context: x\n", `current-context: "x" is not one of contexts[].name`},
		{"http server", doc("    server: http://10.100.0.100:6443\n"+inlineCA, inlineUser), `clusters[0].cluster.server: "http://10.100.0.100:6443" is not an https:// URL`},
		{"insecure", doc(server+"    insecure-skip-tls-verify: true\n", inlineUser), "clusters[0].cluster.insecure-skip-tls-verify: is not supported"},
		{"CA not base64", doc(server+"    certificate-authority-data: '%%%'\n", inlineUser), "clusters[0].cluster.certificate-authority-data: is not base64"},
		{"CA not PEM", doc(server+"    certificate-authority-data: "+b64([]byte("hello"))+"\n", inlineUser), "certificate-authority-data: holds no PEM certificate"},
		{"CA file missing", doc(server+"    certificate-authority: missing.crt\n", inlineUser), "clusters[0].cluster.certificate-authority: open " + filepath.Join(dir, "missing.crt")},
		{"key does not match", doc(server+inlineCA, "    client-certificate-data: "+b64(crt)+"\n    client-key-data: "+b64(ca.CertPEM)+"\n"), "users[0].user.client-certificate-data: and client-key-data are not a PEM certificate and its key"},
		{"no credentials", doc(server+inlineCA, "    username: bob\n"), "users[0].user: has no client certificate or token"},
		{"exec", doc(server+inlineCA, "    exec: {command: x}\n"), "users[0].user: exec and auth-provider credentials are not supported"},
		{"missing cluster", strings.Replace(doc(server+inlineCA, inlineUser), "- name: lab\n", "- name: lab2\n", 1), `contexts[1].context.cluster: "lab" is not one of clusters[].name`},
		{"missing user", strings.Replace(doc(server+inlineCA, inlineUser), "- name: admin\n", "- name: root\n", 1), `contexts[1].context.user: "admin" is not one of users[].name`},
		{"not YAML", "clusters: [", "does not parse"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			p := write(t, dir, "kc", []byte(tc.text))
			_, err := Load(p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), p) {
				t.Errorf("error %v does not name the kubeconfig %s", err, p)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), b64(key)[:20]) {
				t.Errorf("error %v carries key material", err)
			}
		})
	}
	if _, err := Load(filepath.Join(dir, "absent")); !os.IsNotExist(err) {
		t.Errorf("absent kubeconfig: %v, want a not-exist error", err)
	}
}

func write(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
