package hostagent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netns"
)

// apiStandIn answers https://<node>:<apiServerPort>/healthz with "ok" until kube-apiserver exists.
//
// STAND-IN: the kubeadm milestone replaces it with the real kube-apiserver (static pod) on the same
// port; keepalived's track script then checks the real /healthz. The agent never starts the stand-in
// when something already answers on the port.
type apiStandIn struct {
	srv  *http.Server
	addr string
}

func (s *apiStandIn) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
}

// CheckAPI GETs url (an https /healthz of this node's API) and succeeds when it answers 200 "ok"
// within 2 s. It does not verify the certificate: it is a liveness probe of the local API (the
// keepalived track script, like kubeadm's keepalived guides' `curl -k`), not a trust decision.
func CheckAPI(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, Proxy: nil} //nolint:gosec // liveness probe only
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != "ok" {
		return fmt.Errorf("%s: HTTP %d %q", url, resp.StatusCode, b)
	}
	return nil
}

// stepAPI makes sure an API health endpoint answers on the API port: the real one, or the stand-in.
func (a *Agent) stepAPI(ctx context.Context) (string, error) {
	a.mu.Lock()
	nc, cp := a.nc, a.cp
	a.mu.Unlock()
	addr := a.opts.APIListen
	if addr == "" {
		addr = ":" + strconv.Itoa(int(nc.APIServerPort))
	}
	if a.api != nil {
		return "unchanged: API stand-in serving on " + a.api.addr, nil
	}
	ln, err := listenIn(a.nsPath(), addr)
	if err != nil {
		// Something holds the port: fine if it is a healthy API (kube-apiserver after kubeadm).
		if cerr := a.checkInNS(ctx, "https://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(int(nc.APIServerPort)))+"/healthz"); cerr == nil {
			return "unchanged: an API already answers on port " + strconv.Itoa(int(nc.APIServerPort)), nil
		}
		return "", fmt.Errorf("listen for the API stand-in on %s: %w", addr, err)
	}
	cert, err := selfSigned(a.opts.Config.Node, cp.Prefix.Addr(), nc.APIServerVIP)
	if err != nil {
		_ = ln.Close()
		return "", err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	a.api = &apiStandIn{srv: srv, addr: ln.Addr().String()}
	return "API stand-in serving /healthz on " + a.api.addr + " (until kubeadm installs kube-apiserver)", nil
}

// checkInNS runs CheckAPI from the agent's namespace (127.0.0.1 there).
func (a *Agent) checkInNS(ctx context.Context, url string) error {
	if a.nsPath() == "" {
		return CheckAPI(ctx, url)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := setNS(a.nsPath()); err != nil {
			errc <- err
			return
		}
		errc <- CheckAPI(ctx, url)
	}()
	return <-errc
}

// listenIn opens a TCP listener in the network namespace at nsPath ("" = current). The socket keeps
// its namespace; the OS thread that switched namespaces is locked and discarded.
func listenIn(nsPath, addr string) (net.Listener, error) {
	if nsPath == "" {
		return net.Listen("tcp", addr)
	}
	type res struct {
		ln  net.Listener
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: Go terminates the thread when this goroutine ends
		if err := setNS(nsPath); err != nil {
			ch <- res{nil, err}
			return
		}
		ln, err := net.Listen("tcp", addr)
		ch <- res{ln, err}
	}()
	r := <-ch
	return r.ln, r.err
}

func setNS(nsPath string) error {
	h, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", nsPath, err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		return fmt.Errorf("enter network namespace %s: %w", nsPath, err)
	}
	return nil
}

// selfSigned makes the stand-in's certificate: ECDSA P-256, one year, SANs node name, localhost,
// 127.0.0.1, ::1, the node's control-plane address and the VIP.
func selfSigned(node string, addrs ...netip.Addr) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: node + " API stand-in"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	if node != "" {
		tmpl.DNSNames = append(tmpl.DNSNames, node)
	}
	for _, a := range addrs {
		if a.IsValid() {
			tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, errors.Join(errors.New("self-sign the API stand-in certificate"), err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
