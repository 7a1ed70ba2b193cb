package haproxy

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	km "github.com/airgap-appliance/appliance/kubeadm-manifests"
	"github.com/airgap-appliance/appliance/test/kubetest"
	"github.com/airgap-appliance/appliance/test/labns"
)

// TestAPIServerOutlastsTheDrain: every kube-apiserver keeps serving after it is told to stop
// (kubeadm-manifests.APIServerShutdownDelay) for longer than the balancer, with the configuration the
// apilb step renders (the defaults), may keep handing it new connections.
func TestAPIServerOutlastsTheDrain(t *testing.T) {
	if d := (Config{}).DrainWithin(); km.APIServerShutdownDelay <= d {
		t.Errorf("kube-apiserver's shutdown delay %v is not longer than the balancer's drain (%v): connections handed to a stopping apiserver are cut",
			km.APIServerShutdownDelay, d)
	}
}

// TestStoppingAPIServerLosesNoRequest: two real kube-apiservers (one cluster CA) on a three-member
// etcd cluster, each listing every member in --etcd-servers as the appliance configures them
// (kubeadm-manifests Cluster.EtcdMembers) and run with its --shutdown-delay-duration, behind the real
// HAProxy with the rendered configuration; clients make a request through it every few milliseconds,
// each on a new connection as a kubectl process does (HTTP/2, the admin's client certificate), while
// one control plane stops:
//   - "static pod": kubelet stops the apiserver's static pod (SIGTERM; its etcd member keeps running);
//   - "node shutdown": the node shuts down, and systemd sends SIGTERM to every pod's processes at
//     once: the apiserver and its local etcd member together.
//
// The balancer must mark it DOWN before it stops accepting connections, it must exit by itself, and
// not one request may fail. With kube-apiserver's default delay (0) it closes its listener at once
// and cuts what it had just accepted, before its failing /readyz takes it out. With only the local
// member in --etcd-servers (kubeadm's default), a node shutdown leaves the apiserver without etcd for
// its whole delay: requests hang until they time out, its /readyz hangs too, so the balancer takes it
// out late, and the requests it holds are cut when it exits ("unexpected EOF" through the VIP, the
// e2e hand-off poll that failed at a control plane's reboot; this test saw 7 of 81 requests fail).
func TestStoppingAPIServerLosesNoRequest(t *testing.T) {
	labns.NotInShort(t, "runs three etcd members and two kube-apiservers, twice")
	for _, name := range []string{"static pod", "node shutdown"} {
		t.Run(name, func(t *testing.T) { stopLosesNoRequest(t, name == "node shutdown") })
	}
}

// stopLosesNoRequest is one case of TestStoppingAPIServerLosesNoRequest: cp2's apiserver is sent
// SIGTERM, and with withEtcd its etcd member too.
func stopLosesNoRequest(t *testing.T, withEtcd bool) {
	etcd := kubetest.StartEtcdCluster(t, 3)
	pkiDir := t.TempDir()
	var as []*kubetest.APIServer
	for i := range 2 {
		// Every member, this control plane's own first (the order does not matter to etcd's client,
		// which balances over them all).
		servers := []string{etcd[i].ClientURL}
		for j, m := range etcd {
			if j != i {
				servers = append(servers, m.ClientURL)
			}
		}
		as = append(as, kubetest.StartAPIServer(t, kubetest.Options{PKIDir: pkiDir, EtcdServers: servers,
			APIServerArgs: []string{"--shutdown-delay-duration=" + km.APIServerShutdownDelay.String()}}))
	}
	c := Config{Port: freePort(t), Bind: netip.MustParseAddr("127.0.0.1"), StatsPort: freePort(t)}
	for i, a := range as {
		c.Servers = append(c.Servers, Server{Name: fmt.Sprintf("cp%d", i+1), Address: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(a.Port))})
	}
	startHAProxy(t, c)
	waitStatus(t, c.StatsPort, "cp1", "UP")
	waitStatus(t, c.StatsPort, "cp2", "UP")

	cert := as[0].ClientCert(t, kubetest.AdminUser, kubetest.AdminGroup)
	pair, err := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(as[0].CA.CertPEM)
	url := fmt.Sprintf("https://127.0.0.1:%d/api/v1/namespaces/default", c.Port)
	request := func() error {
		tr := &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && (resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"name":"default"`)) {
			err = fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, b)
		}
		return err
	}
	if err := request(); err != nil {
		t.Fatalf("through the balancer before the stop: %v", err)
	}

	var (
		mu       sync.Mutex
		polls    int
		failures []string
		t0       time.Time // SIGTERM sent
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				start := time.Now()
				err := request()
				mu.Lock()
				polls++
				if err != nil {
					failures = append(failures, fmt.Sprintf("sent %+.2fs after SIGTERM: %v", start.Sub(t0).Seconds(), err))
				}
				mu.Unlock()
			}
		}()
	}
	// The stopping server's two moments: the balancer marks it DOWN, and its port refuses.
	var down, refused time.Time
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		addr := c.Servers[1].Address.String()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			now := time.Now()
			if down.IsZero() {
				if st, err := tryStats(c.StatsPort); err == nil && strings.HasPrefix(st["cp2"].Status, "DOWN") {
					down = now
				}
			}
			if refused.IsZero() {
				conn, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					refused = now
				} else {
					conn.Close()
				}
			}
		}
	}()

	time.Sleep(time.Second)
	mu.Lock()
	t0 = time.Now()
	mu.Unlock()
	if err := as[1].Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if withEtcd {
		if err := etcd[1].Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-as[1].Exited():
	case <-time.After(time.Minute): // a bound on a hang; nothing timed is asserted
		t.Error("the stopped kube-apiserver did not exit within a minute of SIGTERM")
	}
	exited := time.Since(t0)
	time.Sleep(time.Second) // requests after its exit: refused connections are redispatched
	close(stop)
	wg.Wait()
	<-watched

	at := func(x time.Time) string {
		if x.IsZero() {
			return "never"
		}
		return fmt.Sprintf("%+.2fs", x.Sub(t0).Seconds())
	}
	t.Logf("cp2 stopped (SIGTERM, --shutdown-delay-duration=%v): balancer DOWN %s, port refused %s, exited %+.2fs; %d requests through the balancer, %d failed",
		km.APIServerShutdownDelay, at(down), at(refused), exited.Seconds(), polls, len(failures))
	if down.IsZero() || refused.IsZero() || !down.Before(refused) {
		t.Errorf("the balancer marked the stopping kube-apiserver DOWN at %s, it stopped accepting at %s: it must be out of the rotation first",
			at(down), at(refused))
	}
	if len(failures) > 0 {
		t.Errorf("%d of %d requests through the balancer failed while a kube-apiserver stopped:\n%s", len(failures), polls, strings.Join(failures, "\n"))
	}
}
