package csrapprove

// A real control plane for the approver's tests: etcd and kube-apiserver v1.34.4 from the Kubernetes
// fixture (`make fixtures`, test/fixtures/build-kubernetes.sh), on 127.0.0.1 with ephemeral ports
// and a throwaway CA made here. No kube-controller-manager runs, so approved CSRs are not signed:
// the tests look at the approval conditions only.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/airgap-appliance/appliance/test/labns"
)

type testCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "csrapprove-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

var serial struct {
	sync.Mutex
	n int64
}

// issue returns a PEM certificate and PEM PKCS #8 key signed by the CA.
func (ca *testCA) issue(t *testing.T, subject pkix.Name, ips []net.IP, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial.Lock()
	serial.n++
	sn := big.NewInt(serial.n + 1)
	serial.Unlock()
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      subject,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM8(t, key)
}

func keyPEM8(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	b, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: b})
}

func write(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// cluster is a running etcd + kube-apiserver.
type cluster struct {
	ca  *testCA
	url string
	dir string
}

// start runs a binary until the test ends (SIGKILL by PID at cleanup), its output in dir/NAME.log.
func start(t *testing.T, dir, name string, argv ...string) <-chan error {
	t.Helper()
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	waited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		log.Close()
		exited <- err
		close(waited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-waited
	})
	return exited
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// startCluster starts etcd and kube-apiserver (authorization Node,RBAC, as kubeadm configures it)
// and waits until /readyz answers ok. Without the fixture it skips loudly (fails under CI).
func startCluster(t *testing.T) *cluster {
	t.Helper()
	etcdBin := labns.KubernetesBin(t, "etcd")
	apiserverBin := labns.KubernetesBin(t, "kube-apiserver")
	dir := t.TempDir()
	ca := newCA(t)
	caFile := write(t, dir, "ca.crt", ca.certPEM)
	srvCert, srvKey := ca.issue(t, pkix.Name{CommonName: "kube-apiserver"}, []net.IP{net.ParseIP("127.0.0.1")}, x509.ExtKeyUsageServerAuth)
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	saFile := write(t, dir, "sa.key", keyPEM8(t, saKey))
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	saPubFile := write(t, dir, "sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}))

	clientPort, peerPort, apiPort := freePort(t), freePort(t), freePort(t)
	clientURL, peerURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort), fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	etcdExited := start(t, dir, "etcd", etcdBin, "--name=test", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+clientURL, "--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL, "--initial-cluster=test="+peerURL,
		"--unsafe-no-fsync", "--log-level=warn")
	apiExited := start(t, dir, "kube-apiserver", apiserverBin,
		"--etcd-servers="+clientURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(apiPort),
		"--cert-dir="+filepath.Join(dir, "apiserver-certs"),
		"--tls-cert-file="+write(t, dir, "apiserver.crt", srvCert), "--tls-private-key-file="+write(t, dir, "apiserver.key", srvKey),
		"--client-ca-file="+caFile,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+saPubFile, "--service-account-signing-key-file="+saFile,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=Node,RBAC",
		"--endpoint-reconciler-type=none",
	)
	c := &cluster{ca: ca, url: fmt.Sprintf("https://127.0.0.1:%d", apiPort), dir: dir}

	// Wait for /readyz (RBAC bootstrap roles included). The deadline only bounds a hang; the test
	// asserts nothing about time.
	admin := c.client(t, "kubernetes-admin", "system:masters")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for {
		body, err := admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && bytes.Equal(body, []byte("ok")) {
			return c
		}
		select {
		case err := <-etcdExited:
			t.Fatalf("etcd exited: %v\n%s", err, tail(filepath.Join(dir, "etcd.log")))
		case err := <-apiExited:
			t.Fatalf("kube-apiserver exited: %v\n%s", err, tail(filepath.Join(dir, "kube-apiserver.log")))
		case <-ctx.Done():
			t.Fatalf("kube-apiserver not ready (last: %v %s)\n%s", err, body, tail(filepath.Join(dir, "kube-apiserver.log")))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// restConfig authenticates with a client certificate CN=user, O=groups, as kubelets and kubeadm's
// admin.conf do.
func (c *cluster) restConfig(t *testing.T, user string, groups ...string) *rest.Config {
	t.Helper()
	crt, key := c.ca.issue(t, pkix.Name{CommonName: user, Organization: groups}, nil, x509.ExtKeyUsageClientAuth)
	if _, err := tls.X509KeyPair(crt, key); err != nil {
		t.Fatal(err)
	}
	return &rest.Config{Host: c.url, TLSClientConfig: rest.TLSClientConfig{CAData: c.ca.certPEM, CertData: crt, KeyData: key}}
}

func (c *cluster) client(t *testing.T, user string, groups ...string) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.restConfig(t, user, groups...))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// writeKubeconfig writes an admin kubeconfig like kubeadm's admin.conf (embedded certificate and
// key, mode 0600) to path.
func (c *cluster) writeKubeconfig(t *testing.T, path string) {
	t.Helper()
	rc := c.restConfig(t, "kubernetes-admin", "kubeadm:cluster-admins", "system:masters")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: c.url, CertificateAuthorityData: c.ca.certPEM}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData}
	kc.Contexts["admin@test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "admin"}
	kc.CurrentContext = "admin@test"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
}
