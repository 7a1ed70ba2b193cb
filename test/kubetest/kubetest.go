// Package kubetest runs a real control plane for a test: etcd and kube-apiserver from the
// Kubernetes fixture (`make fixtures`, test/fixtures/build-kubernetes.sh) on 127.0.0.1 with
// ephemeral ports, certificates from the product's own pkg/pki, an admin kubeconfig and a
// *kubeapi.Client. No kube-controller-manager, scheduler or kubelet runs: a test plays their part
// where it needs one (status writes, deletes).
//
// It may import pkg/kubeapi, pkg/pki and test/labns, and nothing whose tests import it (a cycle
// shows in `go vet ./...`, which compiles every test).
package kubetest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/airgap-appliance/appliance/pkg/kubeapi"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/test/labns"
)

// ServiceClusterIPRange is the API server's --service-cluster-ip-range: kubeadm's default service
// subnet (ClusterConfiguration networking.serviceSubnet).
const ServiceClusterIPRange = "10.96.0.0/16"

// ServiceAccountIssuer is the API server's --service-account-issuer, kubeadm's default.
const ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

// File names in Options.PKIDir, as kubeadm names them in /etc/kubernetes/pki.
const (
	ServiceAccountKeyFile       = "sa.key"
	ServiceAccountPublicKeyFile = "sa.pub"
)

// AdminUser and AdminGroup are the identity of the admin kubeconfig's client certificate (CN and O):
// kubeadm's super-admin.conf, whose group system:masters the API server authorizes for everything
// without any RBAC binding (kubeadm's admin.conf group, kubeadm:cluster-admins, is bound only by
// `kubeadm init`, which does not run here).
const (
	AdminUser  = "kubernetes-admin"
	AdminGroup = "system:masters"
)

// Options are what differs between the tests' API servers. The zero value is an API server
// configured as kubeadm configures one (authorization Node,RBAC, the default admission plugins),
// without bootstrap token authentication.
type Options struct {
	// PKIDir holds the cluster CA and the service-account key in kubeadm's layout
	// (/etc/kubernetes/pki): ca.crt/ca.key, made by pki.EnsureCA when missing and reused when
	// present, and sa.key/sa.pub (ECDSA P-256, PKCS #8 and PKIX PEM, 0600), made when sa.key is
	// missing. kubeadm's `init phase certs sa` reuses an sa.key it finds there, as on a control
	// plane that holds the key of its cluster. Empty: a temporary directory.
	PKIDir string
	// AuthorizationMode is --authorization-mode: "" means Node,RBAC (kubeadm's); AlwaysAllow
	// allows every authenticated request (anonymous requests stay refused).
	AuthorizationMode string
	// BootstrapTokenAuth sets --enable-bootstrap-token-auth, as kubeadm does: a bootstrap token
	// Secret in kube-system authenticates as system:bootstrap:<token-id>.
	BootstrapTokenAuth bool
	// DisableAdmissionPlugins is --disable-admission-plugins, e.g. ServiceAccount for a test that
	// creates pods: with no kube-controller-manager, no namespace gets its default service account
	// and that plugin refuses every pod.
	DisableAdmissionPlugins []string
	// EtcdServers is --etcd-servers: the client URLs of an etcd cluster the API server uses
	// (StartEtcdCluster), as a control plane's apiserver lists every stacked member
	// (kubeadm-manifests Cluster.EtcdMembers). Empty: StartAPIServer runs an etcd of its own.
	EtcdServers []string
	// AdminKubeconfig is where the admin kubeconfig is written (mode 0600; missing parent
	// directories are made 0700), e.g. STATE/kubernetes/admin.conf where kubeadm writes its
	// admin.conf. Empty: admin.conf in a temporary directory.
	AdminKubeconfig string
	// APIServerArgs are further kube-apiserver flags, appended to the others, e.g. the
	// --shutdown-delay-duration the appliance's kubeadm configuration gives every control plane.
	APIServerArgs []string
}

// APIServer is a running etcd + kube-apiserver, killed by PID when the test ends.
type APIServer struct {
	// URL is https://127.0.0.1:Port, Port the API server's --secure-port.
	URL  string
	Port int
	// CA is the cluster CA: it signs the serving certificate (SAN 127.0.0.1) and the client
	// certificates the API server accepts (--client-ca-file). CAFile is its certificate, PEM.
	CA     *pki.CA
	CAFile string
	// AdminKubeconfig is the admin kubeconfig's path (Options.AdminKubeconfig or a temporary one)
	// and Client a client loaded from it (AdminUser in AdminGroup).
	AdminKubeconfig string
	Client          *kubeapi.Client

	proc *process // the kube-apiserver
}

// StartAPIServer runs etcd and kube-apiserver v1.37 (labns.KubernetesVersion) of the Kubernetes
// fixture on 127.0.0.1 until the test ends and returns once /readyz answers "ok" to the admin.
// Without the fixture it skips the test loudly (fails it under CI, labns.KubernetesBin). It fails
// the test when a process exits before that or the API server is not ready within 3 minutes (a
// bound on a hang; nothing is asserted about time). At cleanup it kills both processes by PID and,
// when the test failed, logs the last 3000 bytes of each one's output.
func StartAPIServer(t testing.TB, opts Options) *APIServer {
	t.Helper()
	etcdBin := labns.KubernetesBin(t, "etcd")
	apiBin := labns.KubernetesBin(t, "kube-apiserver")
	dir := t.TempDir()
	pkiDir := opts.PKIDir
	if pkiDir == "" {
		pkiDir = filepath.Join(dir, "pki")
	}
	now := time.Now()
	ca, _, err := pki.EnsureCA(pkiDir, "kubernetes", now)
	if err != nil {
		t.Fatal(err)
	}
	saKey, saPub := ensureServiceAccountKey(t, pkiDir)
	servingDir := filepath.Join(dir, "serving")
	if _, _, err := pki.EnsureServingCert(servingDir, ca, []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil, now); err != nil {
		t.Fatal(err)
	}
	mode := opts.AuthorizationMode
	if mode == "" {
		mode = "Node,RBAC"
	}

	ports := freePorts(t, 3)
	port := ports[0]
	exited := make(chan string, 2)
	etcdServers := strings.Join(opts.EtcdServers, ",")
	if etcdServers == "" {
		clientURL, peerURL := "http://127.0.0.1:"+ports[1], "http://127.0.0.1:"+ports[2]
		start(t, dir, exited, "etcd", etcdBin, "--name=test", "--data-dir="+filepath.Join(dir, "etcd"),
			"--listen-client-urls="+clientURL, "--advertise-client-urls="+clientURL,
			"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL, "--initial-cluster=test="+peerURL,
			"--unsafe-no-fsync", "--log-level=warn")
		etcdServers = clientURL
	}
	argv := []string{apiBin, "--etcd-servers=" + etcdServers,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + port,
		"--cert-dir=" + filepath.Join(dir, "apiserver-certs"),
		"--tls-cert-file=" + filepath.Join(servingDir, pki.ServingCertFile),
		"--tls-private-key-file=" + filepath.Join(servingDir, pki.ServingKeyFile),
		"--client-ca-file=" + filepath.Join(pkiDir, pki.CACertFile),
		"--service-account-issuer=" + ServiceAccountIssuer,
		"--service-account-key-file=" + saPub, "--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=" + ServiceClusterIPRange, "--authorization-mode=" + mode,
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true"} // as kubeadm's static pod sets it (privileged DaemonSets: CNIs, kube-proxy)
	if opts.BootstrapTokenAuth {
		argv = append(argv, "--enable-bootstrap-token-auth")
	}
	if len(opts.DisableAdmissionPlugins) > 0 {
		argv = append(argv, "--disable-admission-plugins="+strings.Join(opts.DisableAdmissionPlugins, ","))
	}
	argv = append(argv, opts.APIServerArgs...)
	api := start(t, dir, exited, "kube-apiserver", argv...)

	s := &APIServer{URL: "https://127.0.0.1:" + port, CA: ca, CAFile: filepath.Join(pkiDir, pki.CACertFile),
		AdminKubeconfig: opts.AdminKubeconfig, proc: api}
	s.Port, _ = strconv.Atoi(port)
	if s.AdminKubeconfig == "" {
		s.AdminKubeconfig = filepath.Join(dir, "admin.conf")
	}
	s.WriteKubeconfig(t, s.AdminKubeconfig, AdminUser, AdminGroup)
	if s.Client, err = kubeapi.Load(s.AdminKubeconfig); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // bounds a hang; nothing timed is asserted
	defer cancel()
	for {
		b, err := s.Client.Do(ctx, http.MethodGet, "/readyz", nil)
		if err == nil && string(b) == "ok" {
			return s
		}
		select {
		case msg := <-exited:
			t.Fatal(msg)
		case <-ctx.Done():
			t.Fatalf("kube-apiserver not ready: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Etcd is one running member of an etcd cluster (StartEtcdCluster), killed by PID when the test ends.
type Etcd struct {
	// Name is the member's --name; ClientURL its client URL, http://127.0.0.1:PORT.
	Name, ClientURL string

	proc *process
}

// Signal sends sig to the member, e.g. SIGTERM as a node's shutdown sends it to etcd's static pod.
func (e *Etcd) Signal(sig os.Signal) error { return e.proc.cmd.Process.Signal(sig) }

// StartEtcdCluster runs n etcd members (the Kubernetes fixture's etcd, plain HTTP on 127.0.0.1, no
// fsync) forming one new cluster, as kubeadm's stacked members of n control planes do, and returns
// once the cluster answers a linearizable read (etcdctl endpoint health on every member). It fails
// the test when a member exits before that or the cluster is not healthy within 2 minutes (a bound
// on a hang). At cleanup each member is killed by PID.
func StartEtcdCluster(t testing.TB, n int) []*Etcd {
	t.Helper()
	etcdBin := labns.KubernetesBin(t, "etcd")
	dir := t.TempDir()
	members := make([]*Etcd, n)
	peers := make([]string, n)
	ports := freePorts(t, 2*n) // distinct: freePort twice may return one port twice
	var initial []string
	for i := range members {
		members[i] = &Etcd{Name: fmt.Sprintf("m%d", i+1), ClientURL: "http://127.0.0.1:" + ports[2*i]}
		peers[i] = "http://127.0.0.1:" + ports[2*i+1]
		initial = append(initial, members[i].Name+"="+peers[i])
	}
	exited := make(chan string, n)
	for i, m := range members {
		m.proc = start(t, dir, exited, "etcd-"+m.Name, etcdBin, "--name="+m.Name,
			"--data-dir="+filepath.Join(dir, m.Name), "--listen-client-urls="+m.ClientURL, "--advertise-client-urls="+m.ClientURL,
			"--listen-peer-urls="+peers[i], "--initial-advertise-peer-urls="+peers[i],
			"--initial-cluster="+strings.Join(initial, ","), "--initial-cluster-state=new",
			// Heartbeats and elections ten times etcd's defaults (100 ms, 1 s): a loaded test
			// machine (CI's suites beside each other) must not make the members elect a new leader
			// while a test measures the API.
			"--heartbeat-interval=1000", "--election-timeout=10000",
			"--unsafe-no-fsync", "--log-level=warn")
	}
	var urls []string
	for _, m := range members {
		urls = append(urls, m.ClientURL)
	}
	ctl := labns.KubernetesBin(t, "etcdctl")
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) { // bounds a hang
		out, err := exec.Command(ctl, "--endpoints="+strings.Join(urls, ","), "endpoint", "health").CombinedOutput()
		if err == nil {
			return members
		}
		select {
		case msg := <-exited:
			t.Fatal(msg)
		default:
		}
		if time.Now().After(end) {
			t.Fatalf("etcd cluster of %d members not healthy: %v %s", n, err, out)
		}
	}
}

// Signal sends sig to the kube-apiserver, e.g. SIGTERM as kubelet sends it to stop a control plane's
// static pod (etcd keeps running). Exited says when it has exited.
func (s *APIServer) Signal(sig os.Signal) error { return s.proc.cmd.Process.Signal(sig) }

// Exited is closed once the kube-apiserver has exited.
func (s *APIServer) Exited() <-chan struct{} { return s.proc.done }

// ClientCert issues a client certificate from the cluster CA for user (CN) in groups (O), which is
// how the API server names and groups a client (kubelets are CN=system:node:NAME, O=system:nodes),
// valid for an hour.
func (s *APIServer) ClientCert(t testing.TB, user string, groups ...string) pki.ClientCert {
	t.Helper()
	c, err := pki.IssueClientCert(s.CA, user, groups, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// WriteKubeconfig writes a kubeconfig like kubeadm's admin.conf to path (client-go's clientcmd,
// mode 0600; missing parent directories are made 0700): the server URL and the CA certificate, and
// a new client certificate for user in groups with its key, all embedded.
func (s *APIServer) WriteKubeconfig(t testing.TB, path, user string, groups ...string) {
	t.Helper()
	cert := s.ClientCert(t, user, groups...)
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: s.URL, CertificateAuthorityData: s.CA.CertPEM}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: cert.CertPEM, ClientKeyData: cert.KeyPEM}
	kc.Contexts[user+"@test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: user}
	kc.CurrentContext = user + "@test"
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
}

// ServeIn makes the API server reachable at its URL (127.0.0.1:Port) from inside ns, a namespace the
// test made: a listener on 127.0.0.1:Port in ns forwards each connection to the API server on the
// root namespace's 127.0.0.1 (its serving certificate names 127.0.0.1, so TLS still verifies and
// every kubeconfig of WriteKubeconfig works there unchanged). It stops when the test ends.
func (s *APIServer) ServeIn(t testing.TB, ns *labns.NS) {
	t.Helper()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
	// labns.InNamespace: the listener is made on a thread that entered ns and is never handed back.
	var ln net.Listener
	if err := labns.InNamespace(ns.Path(), func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, ns.Name, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); up.Close() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
}

// ensureServiceAccountKey returns the paths of dir/sa.key and dir/sa.pub, first writing a new
// ECDSA P-256 key pair there (0600) when sa.key is missing.
func ensureServiceAccountKey(t testing.TB, dir string) (keyFile, pubFile string) {
	t.Helper()
	keyFile, pubFile = filepath.Join(dir, ServiceAccountKeyFile), filepath.Join(dir, ServiceAccountPublicKeyFile)
	if _, err := os.Stat(keyFile); err == nil {
		return keyFile, pubFile
	} else if !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		t.Fatal(err)
	}
	return keyFile, pubFile
}

// freePort returns a TCP port that was free on 127.0.0.1 a moment ago (the kernel's choice for
// port 0), as a string.
// freePorts returns n distinct free TCP ports of 127.0.0.1: each listener stays open until all are
// picked, so the kernel cannot hand one port out twice.
func freePorts(t testing.TB, n int) []string {
	t.Helper()
	var ports []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	return ports
}

// process is a command start runs; done is closed when it has exited.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// start runs argv until the test ends, its output in dir/NAME.log; a line on exited says when it
// exits. At cleanup it kills the process by PID, waits for it and, when the test failed, logs the
// last 3000 bytes of its output.
func start(t testing.TB, dir string, exited chan<- string, name string, argv ...string) *process {
	t.Helper()
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		err := cmd.Wait()
		exited <- fmt.Sprintf("%s exited: %v", name, err)
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("%s log (tail):\n%s", name, b[max(0, len(b)-3000):])
		}
	})
	return &process{cmd: cmd, done: done}
}
