package ingressrouter

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// backend is a real HTTP server on 127.0.0.1 that answers its name, the Host it saw, the
// X-Forwarded-* headers and the request body.
type backend struct {
	name string
	srv  *httptest.Server
}

func startBackend(t testing.TB, name string) *backend {
	t.Helper()
	b := &backend{name: name}
	b.srv = httptest.NewServer(echoHandler(name))
	t.Cleanup(b.srv.Close)
	return b
}

// echoHandler answers its name, the Host it saw, the X-Forwarded-* headers, the path and the body.
func echoHandler(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s host=%s xff=%s xfh=%s xfp=%s path=%s body=%s", name, r.Host,
			r.Header.Get("X-Forwarded-For"), r.Header.Get("X-Forwarded-Host"), r.Header.Get("X-Forwarded-Proto"), r.URL.Path, body)
	})
}

// addrPort is the backend's 127.0.0.1:port.
func (b *backend) addrPort() netip.AddrPort {
	return netip.MustParseAddrPort(strings.TrimPrefix(b.srv.URL, "http://"))
}

// refusedPort is a 127.0.0.1 port nothing listens on (a listener opened and closed).
func refusedPort(t testing.TB) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return uint16(p)
}

// get sends one request through the handler's server with the Host header host.
func get(t testing.TB, url, host, path, body string) (int, string) {
	t.Helper()
	method := http.MethodGet
	var rd io.Reader
	if body != "" {
		method, rd = http.MethodPost, strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestProxy runs the proxy in front of real HTTP servers on 127.0.0.1 (no API server: the table is
// built from objects in memory): requests reach the matched Service's endpoints round robin with
// the original Host and the X-Forwarded headers, a refused endpoint is skipped (a POST body too),
// before the first table every request is 503, an unknown host is 404, a Service without ready
// endpoints 503, all endpoints refusing 503.
func TestProxy(t *testing.T) {
	one, two, other := startBackend(t, "one"), startBackend(t, "two"), startBackend(t, "other")
	ready := true
	ep := func(b *backend) endpointSpec { return endpointSpec{b.addrPort().Addr().String(), &ready} }
	// One Service "web" whose two endpoints and a dead one listen on different ports: one slice per
	// port, as the EndpointSlice controller makes them for pods with different target ports.
	slices := []*discoveryv1.EndpointSlice{
		sliceObj("ns", "web-1", "web", "http", int32(one.addrPort().Port()), ep(one)),
		sliceObj("ns", "web-2", "web", "http", int32(two.addrPort().Port()), ep(two)),
		sliceObj("ns", "web-3", "web", "http", int32(refusedPort(t)), endpointSpec{"127.0.0.1", nil}),
		sliceObj("ns", "other-1", "other", "http", int32(other.addrPort().Port()), ep(other)),
		sliceObj("ns", "dead-1", "dead", "http", int32(refusedPort(t)), endpointSpec{"127.0.0.1", nil}),
		sliceObj("ns", "empty-1", "empty", "http", 80, endpointSpec{"127.0.0.1", new(bool)}), // not ready
	}
	svcs := []*corev1.Service{serviceObj("ns", "web", "http"), serviceObj("ns", "other", "http"), serviceObj("ns", "dead", "http"), serviceObj("ns", "empty", "http")}
	ings := []*networkingv1.Ingress{ingressObj("ns", "i", time.Time{}, nil, "", map[string][]pathSpec{
		"web.apps.test":   {{"/", "Prefix", "web"}, {"/other", "Prefix", "other"}},
		"dead.apps.test":  {{"/", "Prefix", "dead"}},
		"empty.apps.test": {{"/", "Prefix", "empty"}},
	})}
	p := NewProxy(nil)
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	if code, got := get(t, front.URL, "web.apps.test", "/", ""); code != http.StatusServiceUnavailable || !strings.Contains(got, "not synced") {
		t.Errorf("before any table: %d %q, want 503 not synced", code, got)
	}
	p.SetTable(Build(ings, svcs, slices, nil))

	counts := map[string]int{}
	for i := 0; i < 12; i++ {
		body := ""
		if i%2 == 1 {
			body = fmt.Sprintf("payload-%d", i)
		}
		code, got := get(t, front.URL, "web.apps.test", "/x", body)
		if code != http.StatusOK {
			t.Fatalf("request %d: %d %q", i, code, got)
		}
		name, _, _ := strings.Cut(got, " ")
		counts[name]++
		for _, want := range []string{"host=web.apps.test ", "xff=127.0.0.1 ", "xfh=web.apps.test ", "xfp=http ", "path=/x ", "body=" + body} {
			if !strings.Contains(got, want) {
				t.Errorf("request %d: answer %q lacks %q", i, got, want)
			}
		}
	}
	// Three endpoints in rotation, the refused one's turns taken by the next: 12 requests, 4 + 8.
	if counts["one"]+counts["two"] != 12 || counts["one"] < 4 || counts["two"] < 4 {
		t.Errorf("requests per endpoint %v, want all 12 on one and two, at least 4 each", counts)
	}
	if code, got := get(t, front.URL, "web.apps.test", "/other/y", ""); code != http.StatusOK || !strings.HasPrefix(got, "other ") {
		t.Errorf("/other/y: %d %q, want other", code, got)
	}
	if code, got := get(t, front.URL, "nothing.apps.test", "/", ""); code != http.StatusNotFound || !strings.Contains(got, "no ingress rule") {
		t.Errorf("unknown host: %d %q, want 404", code, got)
	}
	if code, got := get(t, front.URL, "empty.apps.test", "/", ""); code != http.StatusServiceUnavailable || !strings.Contains(got, "ns/empty has no ready endpoint") {
		t.Errorf("no ready endpoint: %d %q, want 503", code, got)
	}
	if code, got := get(t, front.URL, "dead.apps.test", "/", "body"); code != http.StatusServiceUnavailable || !strings.Contains(got, "no backend endpoint accepted") {
		t.Errorf("every endpoint refusing: %d %q, want 503", code, got)
	}
}

// TestProxyUpgrade: a connection upgrade (RFC 9110 §7.8, as WebSocket uses it) passes through the
// router: the real backend answers 101 and then echoes what the client writes on the hijacked
// connection, through the proxy's tunnel.
func TestProxyUpgrade(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "upgrade required", http.StatusUpgradeRequired)
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		_ = rw.Flush()
		line, _ := rw.ReadString('\n')
		_, _ = rw.WriteString("echo " + line)
		_ = rw.Flush()
	}))
	t.Cleanup(be.Close)
	port := netip.MustParseAddrPort(strings.TrimPrefix(be.URL, "http://")).Port()
	p := NewProxy(nil)
	p.SetTable(Build(
		[]*networkingv1.Ingress{ingressObj("ns", "i", time.Time{}, nil, "ws", nil)},
		[]*corev1.Service{serviceObj("ns", "ws", "http")},
		[]*discoveryv1.EndpointSlice{sliceObj("ns", "ws-1", "ws", "http", int32(port), endpointSpec{"127.0.0.1", nil})}, nil))
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)

	conn, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /socket HTTP/1.1\r\nHost: ws.apps.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answered %s", resp.Status)
	}
	if _, err := io.WriteString(conn, "hello through the tunnel\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := br.ReadString('\n'); err != nil || got != "echo hello through the tunnel\n" {
		t.Errorf("tunnel answered %q, %v", got, err)
	}
}
