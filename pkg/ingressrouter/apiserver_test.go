package ingressrouter

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/airgap-appliance/appliance/test/kubetest"
	"github.com/airgap-appliance/appliance/test/labns"
)

// TestMain lets the test binary run as a peer inside a lab namespace (labns probes): "router"
// (the controller, Run, as a process of its own) and "backends" (HTTP servers).
func TestMain(m *testing.M) {
	labns.ProbeMain(map[string]func([]string) int{"router": routerProbe, "backends": backendsProbe})
	os.Exit(m.Run())
}

// In the test's namespace: the router's HTTP and health addresses, the API server's forwarded
// address, and the backends' port (on a veth pair's addresses).
const (
	nsRouterListen = "127.0.0.1:80"
	nsHealthListen = "127.0.0.1:1936"
	nsTLSListen    = "127.0.0.1:443"
	nsAPIServer    = "127.0.0.1:6443"
	nsBackendPort  = 8080
)

// routerProbe is `router KUBECONFIG STATUS-IP`: Run until stdin closes, "ready" once listening
// (Run listens first thing; the health endpoint tells when it has synced).
func routerProbe(args []string) int {
	if len(args) != 3 {
		fmt.Println("error: router KUBECONFIG STATUS-IP")
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	fmt.Println("ready")
	err := Run(ctx, Options{Kubeconfig: args[1], Listen: nsRouterListen, HealthListen: nsHealthListen, ListenTLS: nsTLSListen,
		StatusAddress: netip.MustParseAddr(args[2]), Log: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		fmt.Fprintln(os.Stderr, "router:", err)
		return 1
	}
	return 0
}

// backendsProbe is `backends NAME=ADDR...`: echoHandler(NAME) on each ADDR until stdin closes.
func backendsProbe(args []string) int {
	for _, a := range args[1:] {
		name, addr, _ := strings.Cut(a, "=")
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Println("error:", err)
			return 1
		}
		go func() { _ = http.Serve(ln, echoHandler(name)) }()
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// nsClient is an HTTP client whose connections are made inside ns; tlsConfig is its TLS
// configuration for https URLs (nil: the default).
func nsClient(ns *labns.NS, tlsConfig *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: tlsConfig,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := labns.InNamespace(ns.Path(), func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}}}
}

// forwardAPIServer listens on nsAPIServer inside ns and forwards each connection to the API server
// on the root namespace's 127.0.0.1 (its serving certificate names 127.0.0.1: TLS still verifies).
func forwardAPIServer(t *testing.T, ns *labns.NS, port int) {
	t.Helper()
	var ln net.Listener
	if err := labns.InNamespace(ns.Path(), func() (err error) { ln, err = net.Listen("tcp", nsAPIServer); return err }); err != nil {
		t.Fatal(err)
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
				up, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
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

// eventually polls cond until it returns nil, failing the test with cond's last error after a
// bound that only catches a hang (nothing is asserted about time).
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// answer is what a request with Host host through the router gets: "CODE first-word-of-body".
func answer(c *http.Client, url, host, path string) string {
	req, _ := http.NewRequest(http.MethodGet, url+path, nil)
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	first, _, _ := strings.Cut(buf.String(), " ")
	return fmt.Sprintf("%d %s", resp.StatusCode, first)
}

func expect(c *http.Client, url, host, path, want string) func() error {
	return func() error {
		if got := answer(c, url, host, path); got != want {
			return fmt.Errorf("%s%s: %q, want %q", host, path, got, want)
		}
		return nil
	}
}

// TestRouterOnRealAPIServer runs the controller against a real kube-apiserver (test/kubetest: etcd
// and kube-apiserver of the Kubernetes fixture; no controller-manager, so the test writes the
// EndpointSlices itself) with real HTTP backends on 127.0.0.1. First the rendered manifest is
// applied server-side with kubectl (every object accepted, a second apply changes nothing); then
// the controller runs with the identity of the manifest's ServiceAccount, so its ClusterRole is
// proven sufficient (list/watch, and the status update). It proves: hosts, a wildcard and paths
// route to the right backends; an Ingress of another IngressClass is ignored; an Ingress without a
// class is served because the manifest's IngressClass is the default; an unknown host gets 404 and
// a Service without ready endpoints 503; an Ingress change, an endpoint going not-ready and a new
// Ingress are followed; the served Ingresses' status gets the ingress VIP, the others' does not.
// HTTPS: the certificate of an Ingress's spec.tls Secret is served by SNI (verified by the client
// against its CA) and the backend sees X-Forwarded-Proto https; another name fails the handshake.
func TestRouterOnRealAPIServer(t *testing.T) {
	labns.RequireRoot(t)
	s := kubetest.StartAPIServer(t, kubetest.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	// The manifest, as the lead's deployment applies it.
	manifest, err := Manifest(ManifestOptions{Image: testImage, WorkersOnly: true, StatusAddress: netip.MustParseAddr("192.0.2.80")})
	if err != nil {
		t.Fatal(err)
	}
	kubectl := labns.KubernetesBin(t, "kubectl")
	apply := func(doc []byte) string {
		t.Helper()
		cmd := exec.Command(kubectl, "--kubeconfig", s.AdminKubeconfig, "apply", "--server-side", "--field-manager", "appliance", "-f", "-")
		cmd.Stdin = bytes.NewReader(doc)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl apply: %v\n%s", err, out)
		}
		return string(out)
	}
	first := apply(manifest)
	if n := strings.Count(first, "serverside-applied"); n != 5 {
		t.Errorf("first apply: %d objects applied, want 5:\n%s", n, first)
	}
	if second := apply(manifest); second != first {
		t.Errorf("second apply differs:\n%s\nfirst:\n%s", second, first)
	}

	admin, err := RESTConfig(s.AdminKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(admin)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cs.NetworkingV1().IngressClasses().Create(ctx, &networkingv1.IngressClass{
		ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: networkingv1.IngressClassSpec{Controller: "example.com/other"}}, metav1.CreateOptions{}))
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}}, metav1.CreateOptions{}))

	// The lab: a namespace with the backends on addresses of a veth pair inside it (EndpointSlice
	// validation refuses loopback addresses), the API server forwarded into it.
	ns := labns.New(t, "irtr")
	ns.MustRun("ip", "link", "add", "ir0", "type", "veth", "peer", "name", "ir1")
	ns.MustRun("ip", "link", "set", "ir1", "up")
	ns.MustRun("ip", "link", "set", "ir0", "up")
	addrs := map[string]string{"a": "10.254.0.1", "b": "10.254.0.2", "c": "10.254.0.3", "d1": "10.254.0.4", "d2": "10.254.0.5"}
	var backendArgs []string
	for _, n := range []string{"a", "b", "c", "d1", "d2"} {
		ns.MustRun("ip", "addr", "add", addrs[n]+"/24", "dev", "ir0")
		backendArgs = append(backendArgs, fmt.Sprintf("%s=%s:%d", n, addrs[n], nsBackendPort))
	}
	labns.StartProbe(t, ns, append([]string{"backends"}, backendArgs...)...)
	forwardAPIServer(t, ns, s.Port)
	hc := nsClient(ns, nil)

	yes := true
	createSlice := func(name, svc, backend string, ready *bool) {
		t.Helper()
		sl := sliceObj("apps", name, svc, "http", nsBackendPort, endpointSpec{addrs[backend], ready})
		must(cs.DiscoveryV1().EndpointSlices("apps").Create(ctx, sl, metav1.CreateOptions{}))
	}
	for _, svc := range []string{"a", "b", "c", "d", "empty"} {
		must(cs.CoreV1().Services("apps").Create(ctx, serviceObj("apps", svc, "http"), metav1.CreateOptions{}))
	}
	createSlice("a-1", "a", "a", &yes)
	createSlice("b-1", "b", "b", nil)
	createSlice("c-1", "c", "c", &yes)
	createSlice("d-1", "d", "d1", &yes)
	createSlice("d-2", "d", "d2", &yes)
	class := DefaultIngressClass
	other := "other"
	create := func(in *networkingv1.Ingress) {
		t.Helper()
		in.CreationTimestamp = metav1.Time{}
		must(cs.NetworkingV1().Ingresses("apps").Create(ctx, in, metav1.CreateOptions{}))
	}
	create(ingressObj("apps", "main", time.Time{}, &class, "", map[string][]pathSpec{
		"shop.apps.test": {{"/", "Prefix", "a"}, {"/cart", "Prefix", "b"}, {"/cart/checkout", "Exact", "c"}},
		"*.apps.test":    {{"/", "Prefix", "d"}},
		"empty.test":     {{"/", "Prefix", "empty"}},
	}))
	create(ingressObj("apps", "foreign", time.Time{}, &other, "", map[string][]pathSpec{
		"foreign.test": {{"/", "Prefix", "a"}},
	}))
	// No class: the API server's DefaultIngressClass admission gives it the manifest's default
	// class; the router would serve it even without that (served()).
	create(ingressObj("apps", "classless", time.Time{}, nil, "", map[string][]pathSpec{
		"classless.test": {{"/", "Prefix", "c"}},
	}))

	// HTTPS: a kubernetes.io/tls Secret and an Ingress whose spec.tls names it.
	ca := testCA(t)
	must(cs.CoreV1().Secrets("apps").Create(ctx, tlsSecret(t, ca, "apps", "secure", "secure.apps.test"), metav1.CreateOptions{}))
	create(withTLS(ingressObj("apps", "secure", time.Time{}, &class, "", map[string][]pathSpec{
		"secure.apps.test": {{"/", "Prefix", "c"}},
	}), "secure", "secure.apps.test"))

	// The router, a process of its own in the namespace, as the DaemonSet's ServiceAccount.
	kc := filepath.Join(t.TempDir(), "router.conf")
	s.WriteKubeconfig(t, kc, "system:serviceaccount:"+Namespace+":"+Name)
	b, err := os.ReadFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kc, bytes.ReplaceAll(b, []byte(s.URL), []byte("https://"+nsAPIServer)), 0o600); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr("192.0.2.80")
	router := startRouter(t, ns, kc, vip)
	url, health := "http://"+nsRouterListen, "http://"+nsHealthListen+HealthPath
	eventually(t, "health 200", func() error {
		resp, err := hc.Get(health)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("health %d", resp.StatusCode)
		}
		return nil
	})

	for _, c := range []struct{ host, path, want string }{
		{"shop.apps.test", "/", "200 a"},
		{"shop.apps.test", "/cart", "200 b"},
		{"shop.apps.test", "/cart/items", "200 b"},
		{"shop.apps.test", "/cart/checkout", "200 c"},
		{"shop.apps.test", "/cart/checkout/x", "200 b"},
		{"shop.apps.test", "/cartx", "200 a"},
		{"deep.anything.apps.test", "/", "404 404"},
		{"foreign.test", "/", "404 404"}, // another IngressClass
		{"classless.test", "/", "200 c"},
		{"unknown.test", "/", "404 404"},
		{"empty.test", "/", "503 503"},
	} {
		if got := answer(hc, url, c.host, c.path); got != c.want {
			t.Errorf("%s%s: %q, want %q", c.host, c.path, got, c.want)
		}
	}

	// HTTPS: the Ingress's certificate by SNI, verified against its CA; the backend sees
	// X-Forwarded-Proto https. A name without a certificate fails the handshake.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	secure := nsClient(ns, &tls.Config{RootCAs: pool, ServerName: "secure.apps.test"})
	eventually(t, "HTTPS with the Ingress's certificate", func() error {
		req, _ := http.NewRequest(http.MethodGet, "https://"+nsTLSListen+"/x", nil)
		req.Host = "secure.apps.test"
		resp, err := secure.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), "c ") || !strings.Contains(string(b), "xfp=https ") {
			return fmt.Errorf("%d %q, want 200 from c with xfp=https", resp.StatusCode, b)
		}
		return nil
	})
	nocert := nsClient(ns, &tls.Config{RootCAs: pool, ServerName: "nocert.test"})
	if resp, err := nocert.Get("https://" + nsTLSListen + "/"); err == nil {
		resp.Body.Close()
		t.Errorf("HTTPS for a name without a certificate: %s, want a failed handshake", resp.Status)
	} else if !strings.Contains(err.Error(), "tls:") {
		t.Errorf("HTTPS for a name without a certificate: %v, want a TLS alert", err)
	}

	// Round robin over d's two endpoints.
	if got := []string{answer(hc, url, "anything.apps.test", "/"), answer(hc, url, "anything.apps.test", "/")}; !(got[0] == "200 d1" && got[1] == "200 d2") && !(got[0] == "200 d2" && got[1] == "200 d1") {
		t.Errorf("two requests to *.apps.test: %q, want d1 and d2", got)
	}

	// Followed: the Ingress changes (/ of shop goes to c), an endpoint goes not-ready (only d2
	// answers), a new Ingress appears.
	main, err := cs.NetworkingV1().Ingresses("apps").Get(ctx, "main", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range main.Spec.Rules {
		if r.Host == "shop.apps.test" {
			r.HTTP.Paths[0].Backend.Service.Name = "c" // path "/"
		}
	}
	must(cs.NetworkingV1().Ingresses("apps").Update(ctx, main, metav1.UpdateOptions{}))
	eventually(t, "the Ingress change followed", expect(hc, url, "shop.apps.test", "/", "200 c"))
	d1, err := cs.DiscoveryV1().EndpointSlices("apps").Get(ctx, "d-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	no := false
	d1.Endpoints[0].Conditions.Ready = &no
	must(cs.DiscoveryV1().EndpointSlices("apps").Update(ctx, d1, metav1.UpdateOptions{}))
	eventually(t, "the not-ready endpoint dropped", func() error {
		for i := 0; i < 4; i++ {
			if got := answer(hc, url, "x.apps.test", "/"); got != "200 d2" {
				return fmt.Errorf("x.apps.test: %q, want only d2", got)
			}
		}
		return nil
	})
	create(ingressObj("apps", "late", time.Time{}, &class, "", map[string][]pathSpec{"late.test": {{"/", "Prefix", "a"}}}))
	eventually(t, "a new Ingress followed", expect(hc, url, "late.test", "/", "200 a"))

	// Status: the served Ingresses carry the VIP, the other class's does not.
	eventually(t, "status of served Ingresses", func() error {
		for _, name := range []string{"main", "classless", "late", "secure"} {
			in, err := cs.NetworkingV1().Ingresses("apps").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if lb := in.Status.LoadBalancer.Ingress; len(lb) != 1 || lb[0].IP != vip.String() {
				return fmt.Errorf("%s: status.loadBalancer.ingress %+v, want ip %s", name, lb, vip)
			}
		}
		return nil
	})
	foreign, err := cs.NetworkingV1().Ingresses("apps").Get(ctx, "foreign", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lb := foreign.Status.LoadBalancer.Ingress; len(lb) != 0 {
		t.Errorf("the other class's Ingress got status %+v", lb)
	}

	// A graceful stop: stdin closed, the router exits 0.
	if err := router.stop(); err != nil {
		t.Errorf("router stop: %v", err)
	}
}

type routerProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// startRouter runs routerProbe in ns and waits for its "ready"; it is killed by PID at cleanup if
// still running.
func startRouter(t *testing.T, ns *labns.NS, kubeconfig string, vip netip.Addr) *routerProc {
	t.Helper()
	cmd := labns.ProbeCommand(t, ns, "router", kubeconfig, vip.String())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := false
	t.Cleanup(func() {
		if !done {
			_ = cmd.Process.Kill() // by PID: the process we started
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("router log:\n%s", logs.String())
		}
	})
	if l, _ := bufio.NewReader(out).ReadString('\n'); l != "ready\n" {
		t.Fatalf("router did not start: %q", l)
	}
	return &routerProc{cmd: cmd, stdin: &doneCloser{stdin, &done}}
}

type doneCloser struct {
	io.WriteCloser
	done *bool
}

func (r *routerProc) stop() error {
	_ = r.stdin.Close()
	*r.stdin.(*doneCloser).done = true
	return r.cmd.Wait()
}
