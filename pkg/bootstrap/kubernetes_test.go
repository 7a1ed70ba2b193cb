package bootstrap

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/test/labns"
)

// testState is the minimal *State ensureAdminKubeconfig reads: cluster name, API VIP and port, and a
// state directory.
func testState(t *testing.T, vip string, port uint16) *State {
	t.Helper()
	c := &config.BootstrapConfiguration{ClusterName: "lab"}
	c.APIServer.VIP = netip.MustParseAddr(vip)
	c.APIServer.Port = port
	return &State{Config: c, StateDir: t.TempDir()}
}

func clusterCA(t *testing.T, now time.Time) *pki.CA {
	t.Helper()
	ca, _, err := pki.EnsureCA(filepath.Join(t.TempDir(), "kubernetes"), "kubernetes", now)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestEnsureAdminKubeconfig(t *testing.T) {
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	st := testState(t, "10.10.0.100", 6443)
	ca := clusterCA(t, now)
	path := statedir.AdminKubeconfig(st.StateDir)
	if got := APIServerURL(st); got != "https://10.10.0.100:6443" {
		t.Errorf("APIServerURL = %s", got)
	}
	if v6 := testState(t, "fd00:10::100", 6443); APIServerURL(v6) != "https://[fd00:10::100]:6443" {
		t.Errorf("IPv6 APIServerURL = %s", APIServerURL(v6))
	}

	changed, err := ensureAdminKubeconfig(st, ca, now)
	if err != nil || !changed {
		t.Fatalf("first call: changed=%v err=%v", changed, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600 (it holds a cluster-admin key)", fi.Mode().Perm())
	}
	first, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !adminKubeconfigValid(first, "https://10.10.0.100:6443", ca, now) {
		t.Errorf("written file is not valid by its own check:\n%s", first)
	}
	// The *-data fields are base64 strings, as clientcmd writes them (a plain []byte would be written
	// as a YAML sequence of integers, which kubectl happens to accept but other kubeconfig readers,
	// such as pkg/csrapprove's, refuse), and kubectl itself reads them.
	var raw struct {
		Clusters []struct {
			Cluster map[string]any `yaml:"cluster"`
		} `yaml:"clusters"`
		Users []struct {
			User map[string]any `yaml:"user"`
		} `yaml:"users"`
	}
	if err := yaml.Unmarshal(first, &raw); err != nil || len(raw.Clusters) != 1 || len(raw.Users) != 1 {
		t.Fatalf("written kubeconfig does not parse as one cluster and one user: %v", err)
	}
	for field, v := range map[string]any{"certificate-authority-data": raw.Clusters[0].Cluster["certificate-authority-data"],
		"client-certificate-data": raw.Users[0].User["client-certificate-data"], "client-key-data": raw.Users[0].User["client-key-data"]} {
		if _, ok := v.(string); !ok {
			t.Errorf("%s is a YAML %T, want a base64 string", field, v)
		}
	}
	kubectl := labns.KubernetesBin(t, "kubectl")
	out, err := exec.Command(kubectl, "--kubeconfig", path, "config", "view", "--raw", "-o",
		"jsonpath={.clusters[0].cluster.certificate-authority-data} {.users[0].user.client-certificate-data}").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl config view: %v\n%s", err, out)
	}
	if f := strings.Fields(string(out)); len(f) != 2 || f[0] != base64.StdEncoding.EncodeToString(ca.CertPEM) {
		t.Errorf("kubectl reads certificate-authority-data %q, want the cluster CA's PEM in base64", out)
	}

	// Reused: same server, CA, valid certificate.
	for _, at := range []time.Time{now, now.Add(300 * 24 * time.Hour)} {
		changed, err = ensureAdminKubeconfig(st, ca, at)
		if err != nil || changed {
			t.Errorf("reuse at %v: changed=%v err=%v", at, changed, err)
		}
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, first) {
		t.Error("reuse rewrote the file")
	}

	// Rewritten when the certificate has less than 30 days left…
	changed, err = ensureAdminKubeconfig(st, ca, now.Add(340*24*time.Hour))
	if err != nil || !changed {
		t.Errorf("near expiry: changed=%v err=%v", changed, err)
	}
	// …when the VIP (server) changes…
	st.Config.APIServer.VIP = netip.MustParseAddr("10.10.0.101")
	changed, err = ensureAdminKubeconfig(st, ca, now)
	if err != nil || !changed {
		t.Errorf("new VIP: changed=%v err=%v", changed, err)
	}
	if b, _ := os.ReadFile(path); !bytes.Contains(b, []byte("server: https://10.10.0.101:6443")) {
		t.Errorf("new VIP not in the file:\n%s", b)
	}
	if changed, err = ensureAdminKubeconfig(st, ca, now); err != nil || changed {
		t.Errorf("after the VIP change: changed=%v err=%v", changed, err)
	}
	// …when the port changes…
	st.Config.APIServer.Port = 16443
	if changed, err = ensureAdminKubeconfig(st, ca, now); err != nil || !changed {
		t.Errorf("new port: changed=%v err=%v", changed, err)
	}
	// …when the cluster CA changes (certificate and CA data no longer match)…
	other := clusterCA(t, now)
	if changed, err = ensureAdminKubeconfig(st, other, now); err != nil || !changed {
		t.Errorf("new CA: changed=%v err=%v", changed, err)
	}
	b, _ := os.ReadFile(path)
	if adminKubeconfigValid(b, APIServerURL(st), ca, now) || !adminKubeconfigValid(b, APIServerURL(st), other, now) {
		t.Error("file after the CA change is not bound to the new CA")
	}
	// …and when the file is garbage.
	if err := os.WriteFile(path, []byte("not: [yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	if changed, err = ensureAdminKubeconfig(st, other, now); err != nil || !changed {
		t.Errorf("garbage file: changed=%v err=%v", changed, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("after rewrite: %v %v", fi.Mode(), err)
	}
}

// kubectlPath is the kubectl the lab builds (test/fixtures), failing under CI and skipping loudly
// elsewhere when it is missing.
func kubectlPath(t *testing.T) string {
	t.Helper()
	return labns.KubernetesBin(t, "kubectl")
}

// TestAdminKubeconfigKubectl has the real kubectl read the file (server, user, context), OpenSSL verify
// its embedded client certificate against its embedded CA, and kubectl authenticate with it to a TLS
// server that requires a client certificate from the cluster CA (what kube-apiserver does).
func TestAdminKubeconfigKubectl(t *testing.T) {
	kubectl := kubectlPath(t)
	openssl := labns.RequireTool(t, "openssl")
	now := time.Now()
	ca := clusterCA(t, now)

	// An API-server stand-in on 127.0.0.1: serving certificate from the cluster CA, client
	// certificates required and verified against it; it answers with the client's identity.
	serving, _, err := pki.EnsureServingCert(t.TempDir(), ca, []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := r.TLS.PeerCertificates[0]
		_, _ = w.Write([]byte(c.Subject.CommonName + " " + strings.Join(c.Subject.Organization, ",")))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serving}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()
	_, portS, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portS)

	st := testState(t, "127.0.0.1", uint16(port))
	if _, err := ensureAdminKubeconfig(st, ca, now); err != nil {
		t.Fatal(err)
	}
	path := statedir.AdminKubeconfig(st.StateDir)
	home := t.TempDir() // kubectl's discovery cache goes here, not into root's ~/.kube

	kc := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", path}, args...)...)
		cmd.Env = append(os.Environ(), "HOME="+home, "KUBECACHEDIR="+filepath.Join(home, "cache"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	view := func(jsonpath string) string {
		t.Helper()
		return kc("config", "view", "--raw", "-o", "jsonpath="+jsonpath)
	}
	for _, tc := range []struct{ jsonpath, want string }{
		{"{.clusters[0].cluster.server}", APIServerURL(st)},
		{"{.clusters[0].name}", "lab"},
		{"{.users[0].name}", "kubernetes-admin"},
		{"{.current-context}", "kubernetes-admin@lab"},
		{"{.contexts[0].context.user}", "kubernetes-admin"},
		{"{.contexts[0].context.cluster}", "lab"},
	} {
		if got := view(tc.jsonpath); got != tc.want {
			t.Errorf("kubectl %s = %q, want %q", tc.jsonpath, got, tc.want)
		}
	}

	dir := t.TempDir()
	for name, jsonpath := range map[string]string{
		"ca.crt":    "{.clusters[0].cluster.certificate-authority-data}",
		"admin.crt": "{.users[0].user.client-certificate-data}",
		"admin.key": "{.users[0].user.client-key-data}",
	} {
		b, err := base64.StdEncoding.DecodeString(view(jsonpath))
		if err != nil {
			t.Fatalf("%s: %v", jsonpath, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "ca.crt")); !bytes.Equal(b, ca.CertPEM) {
		t.Error("certificate-authority-data is not the cluster CA")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, openssl, "verify", "-x509_strict", "-purpose", "sslclient",
		"-CAfile", filepath.Join(dir, "ca.crt"), filepath.Join(dir, "admin.crt")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), ": OK") {
		t.Errorf("openssl verify of the embedded client certificate: %v\n%s", err, out)
	}
	subj, err := exec.CommandContext(ctx, openssl, "x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in", filepath.Join(dir, "admin.crt")).CombinedOutput()
	if err != nil || strings.TrimSpace(string(subj)) != "subject=CN=kubernetes-admin,O=kubeadm:cluster-admins" {
		t.Errorf("client certificate subject: %v %s", err, subj)
	}

	// kubectl presents the certificate and key and trusts the server through the embedded CA.
	if got := kc("get", "--raw", "/healthz", "--request-timeout=10s"); got != "kubernetes-admin kubeadm:cluster-admins" {
		t.Errorf("the server saw %q, want the kubeadm admin identity", got)
	}
}
