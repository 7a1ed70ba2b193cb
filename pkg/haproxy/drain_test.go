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

// TestStoppingAPIServerLosesNoRequest: two real kube-apiservers (each with its etcd, one cluster CA)
// run with the --shutdown-delay-duration the appliance gives every control plane, behind the real
// HAProxy with the rendered configuration; clients make a request through it every few milliseconds,
// each on a new connection as a kubectl process does (HTTP/2, the admin's client certificate), while
// one apiserver is told to stop as kubelet stops its static pod (SIGTERM; its etcd keeps running).
// The balancer must mark it DOWN before it stops accepting connections, it must exit by itself, and
// not one request may fail. With kube-apiserver's default delay (0) it closes its listener at once
// and cuts what it had just accepted, before its failing /readyz takes it out: the "unexpected EOF"
// (or 503 "apiserver is shutting down") the e2e's VIP pollers saw while a control plane rebooted.
func TestStoppingAPIServerLosesNoRequest(t *testing.T) {
	labns.NotInShort(t, "runs two etcd and kube-apiserver pairs")
	pkiDir := t.TempDir()
	opts := kubetest.Options{PKIDir: pkiDir, APIServerArgs: []string{"--shutdown-delay-duration=" + km.APIServerShutdownDelay.String()}}
	as := []*kubetest.APIServer{kubetest.StartAPIServer(t, opts), kubetest.StartAPIServer(t, opts)}
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
