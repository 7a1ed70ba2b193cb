package haproxy

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/logbuf"
)

// apiserver is a stand-in kube-apiserver for the balancer: a TLS server answering /readyz (200 "ok",
// or 500 while draining) and / with its name. It is not a real apiserver (the Kubernetes e2e proves the
// balancer in front of three real ones); here the point is the real HAProxy's behaviour.
type apiserver struct {
	name     string
	srv      *httptest.Server
	draining atomic.Bool
	served   atomic.Int64
}

func newAPIServer(t *testing.T, name string) *apiserver {
	a := &apiserver{name: name}
	a.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			if a.draining.Load() {
				http.Error(w, "[-]shutdown failed: reason withheld", http.StatusInternalServerError)
				return
			}
			io.WriteString(w, "ok")
			return
		}
		a.served.Add(1)
		io.WriteString(w, a.name)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *apiserver) addr() netip.AddrPort {
	return netip.MustParseAddrPort(a.srv.Listener.Addr().String())
}

func freePort(t *testing.T) uint16 {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// startHAProxy runs the real haproxy (Debian's) in the foreground with c, stopped at the end of the test.
func startHAProxy(t *testing.T, c Config) {
	t.Helper()
	startHAProxyLog(t, c, os.Stderr)
}

// startHAProxyLog is startHAProxy with haproxy's stdout (its per-connection log) written to stdout.
func startHAProxyLog(t *testing.T, c Config, stdout io.Writer) {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Fatalf("haproxy not installed (make deps installs Debian's haproxy): %v", err)
	}
	conf, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(t.Context(), bin, t.TempDir(), conf); err != nil {
		t.Fatalf("haproxy refused the rendered configuration: %v\n%s", err, conf)
	}
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, conf, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-db", "-f", path)
	cmd.Stdout, cmd.Stderr = stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

func stats(t *testing.T, port uint16) map[string]ServerStat {
	t.Helper()
	out, err := tryStats(port)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func tryStats(port uint16) (map[string]ServerStat, error) { return tryStatsOf(port, "apiservers") }

// waitStatus polls the statistics until server's status starts with want (bounded: 15 s).
func waitStatus(t *testing.T, port uint16, server, want string) {
	t.Helper()
	var last ServerStat
	var err error
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		var st map[string]ServerStat
		if st, err = tryStats(port); err == nil {
			if last = st[server]; strings.HasPrefix(last.Status, want) {
				return
			}
		}
	}
	t.Fatalf("server %s: status %q (last error %v), want %s", server, last.Status, err, want)
}

// TestBalancesAcrossReadyAPIServers runs the rendered configuration in a real HAProxy in front of three
// TLS servers: fresh connections through it reach all three (round robin, TLS passed through: the client
// verifies the server's own certificate); a server whose /readyz fails (draining) leaves the rotation;
// a server that stops (connection refused) costs no request, before its health check even notices
// (option redispatch, retries); the statistics page reports each server's state and sessions.
func TestBalancesAcrossReadyAPIServers(t *testing.T) {
	as := []*apiserver{newAPIServer(t, "cp1"), newAPIServer(t, "cp2"), newAPIServer(t, "cp3")}
	c := Config{Port: freePort(t), Bind: netip.MustParseAddr("127.0.0.1"), StatsPort: freePort(t)}
	for _, a := range as {
		c.Servers = append(c.Servers, Server{Name: a.name, Address: a.addr()})
	}
	startHAProxy(t, c)
	for _, a := range as {
		waitStatus(t, c.StatsPort, a.name, "UP")
	}
	// Every server presents its own certificate: trust them all, as a client trusts the cluster CA.
	pool := as[0].srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "example.com"}}}
	get := func(n int) (map[string]int, int) {
		got, failed := map[string]int{}, 0
		for range n {
			resp, err := client.Get(fmt.Sprintf("https://127.0.0.1:%d/version", c.Port))
			if err != nil {
				failed++
				t.Logf("request failed: %v", err)
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got[string(b)]++
		}
		return got, failed
	}

	got, failed := get(30)
	if failed != 0 || got["cp1"] == 0 || got["cp2"] == 0 || got["cp3"] == 0 {
		t.Fatalf("30 requests: served %v, %d failed; want all three servers used and none failed", got, failed)
	}
	st := stats(t, c.StatsPort)
	for _, a := range as {
		if st[a.name].Sessions < int64(got[a.name]) {
			t.Errorf("statistics: %s has %d sessions, it served %d requests", a.name, st[a.name].Sessions, got[a.name])
		}
	}

	as[1].draining.Store(true)
	waitStatus(t, c.StatsPort, "cp2", "DOWN")
	before := as[1].served.Load()
	if got, failed = get(20); failed != 0 || got["cp2"] != 0 || as[1].served.Load() != before {
		t.Errorf("cp2 draining: served %v, %d failed; want none on cp2 and none failed", got, failed)
	}

	// Stop cp3 while HAProxy still counts it up: the refused connections are redispatched.
	as[2].srv.Close()
	if got, failed = get(20); failed != 0 || got["cp1"] != 20 {
		t.Errorf("cp3 stopped, cp2 draining: served %v, %d failed; want all 20 on cp1", got, failed)
	}
	waitStatus(t, c.StatsPort, "cp3", "DOWN")

	as[1].draining.Store(false)
	waitStatus(t, c.StatsPort, "cp2", "UP")
	if got, failed = get(10); failed != 0 || got["cp2"] == 0 {
		t.Errorf("cp2 ready again: served %v, %d failed; want cp2 back in the rotation", got, failed)
	}
}

// TestLogsEachConnection: the real HAProxy logs a connection through the API frontend once it ends, in
// the TCP log format with the server it was given to and its termination state ("--": a normal end),
// the evidence a failed request through the VIP is traced with; health checks are not logged.
func TestLogsEachConnection(t *testing.T) {
	a := newAPIServer(t, "cp1")
	c := Config{Port: freePort(t), Bind: netip.MustParseAddr("127.0.0.1"), StatsPort: freePort(t),
		Servers: []Server{{Name: a.name, Address: a.addr()}}}
	var log logbuf.Buffer
	startHAProxyLog(t, c, &log)
	waitStatus(t, c.StatsPort, a.name, "UP")
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // the stand-in's certificate is not the point here
	resp, err := client.Get(fmt.Sprintf("https://127.0.0.1:%d/version", c.Port))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	var lines []string
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		lines = nil
		for _, l := range strings.Split(log.String(), "\n") {
			if strings.Contains(l, " apiserver apiservers/cp1 ") {
				lines = append(lines, l)
			}
		}
		if len(lines) > 0 {
			break
		}
	}
	if len(lines) != 1 {
		t.Fatalf("want one log line of the connection through apiserver to apiservers/cp1, got %d; haproxy's stdout:\n%s", len(lines), log.String())
	}
	// The TCP log format: client [date] frontend backend/server Tw/Tc/Tt bytes STATE conns queues.
	// Which side ends this connection first is a race (the stand-in answers Connection: close and may
	// reset; the client closes too), so HAProxy rightly logs "--", "CD" or "SD" (all seen here): the
	// state's presence and shape are asserted, not one value.
	f := strings.Fields(lines[0])
	if len(f) < 7 || !regexp.MustCompile(`^[-CSPRIDLUKcs][-RQCHDLT]$`).MatchString(f[6]) {
		t.Errorf("the connection's log line has no termination state (two letters of HAProxy's, or \"--\") in field 7: %s", lines[0])
	}
}

func TestRenderRefusesBadInput(t *testing.T) {
	good := Server{Name: "cp1", Address: netip.MustParseAddrPort("10.0.0.1:6443")}
	for name, c := range map[string]Config{
		"no port":       {Servers: []Server{good}},
		"no server":     {Port: 9445},
		"unnamed":       {Port: 9445, Servers: []Server{{Address: good.Address}}},
		"blank in name": {Port: 9445, Servers: []Server{{Name: "cp 1", Address: good.Address}}},
		"twice":         {Port: 9445, Servers: []Server{good, good}},
		"no address":    {Port: 9445, Servers: []Server{{Name: "cp1"}}},
		"relative path": {Port: 9445, Servers: []Server{good}, HealthPath: "readyz"},
	} {
		if _, err := Render(c); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestRenderDualStack: an IPv6 server makes the frontend listen on IPv6 and IPv4 (v4v6), which the real
// haproxy accepts.
func TestRenderDualStack(t *testing.T) {
	conf, err := Render(Config{Port: 9445, Servers: []Server{
		{Name: "cp1", Address: netip.MustParseAddrPort("[fd00::11]:6443")},
		{Name: "cp2", Address: netip.MustParseAddrPort("10.0.0.12:6443")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(conf), "bind :::9445 v4v6") || !strings.Contains(string(conf), "server cp1 [fd00::11]:6443") {
		t.Errorf("rendered:\n%s", conf)
	}
	if err := Check(t.Context(), "", t.TempDir(), conf); err != nil {
		t.Error(err)
	}
	if err := Check(t.Context(), "", t.TempDir(), []byte("frontend x\n\tbind :1\n\tbogus-keyword\n")); err == nil {
		t.Error("Check accepted a configuration with an unknown keyword")
	}
}

func TestParseStatsRefusesOtherText(t *testing.T) {
	for _, in := range []string{"", "<html>stats</html>", "# pxname,svname\nx,y\n"} {
		if _, err := ParseStats([]byte(in)); err == nil {
			t.Errorf("ParseStats(%q): no error", in)
		}
	}
}

// TestPassthroughFrontend runs a TCP passthrough frontend (the ingress VIP's port to the routers) in
// the real HAProxy beside the API's: fresh connections reach both plain-HTTP servers; one stopped, every
// request is still answered (redispatched) and its TCP check marks it DOWN.
func TestPassthroughFrontend(t *testing.T) {
	api := newAPIServer(t, "cp1")
	var routers []*httptest.Server
	for _, name := range []string{"w1", "w2"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, name) }))
		t.Cleanup(srv.Close)
		routers = append(routers, srv)
	}
	f := Frontend{Name: "ingress-80", Port: freePort(t)}
	for i, srv := range routers {
		f.Servers = append(f.Servers, Server{Name: fmt.Sprintf("w%d", i+1), Address: netip.MustParseAddrPort(srv.Listener.Addr().String())})
	}
	c := Config{Port: freePort(t), Bind: netip.MustParseAddr("127.0.0.1"), StatsPort: freePort(t),
		Servers: []Server{{Name: "cp1", Address: api.addr()}}, Passthrough: []Frontend{f}}
	startHAProxy(t, c)
	up := func(server string) {
		for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/stats;csv", c.StatsPort))
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			ss, _ := ParseStats(b)
			for _, s := range ss {
				if s.Backend == "ingress-80" && s.Server == server && strings.HasPrefix(s.Status, "UP") {
					return
				}
			}
		}
		t.Fatalf("ingress-80/%s never UP", server)
	}
	up("w1")
	up("w2")
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	get := func(n int) (map[string]int, int) {
		got, failed := map[string]int{}, 0
		for range n {
			resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/", f.Port))
			if err != nil {
				failed++
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got[string(b)]++
		}
		return got, failed
	}
	if got, failed := get(10); failed != 0 || got["w1"] == 0 || got["w2"] == 0 {
		t.Fatalf("10 requests: %v, %d failed; want both routers and none failed", got, failed)
	}
	routers[1].Close()
	if got, failed := get(10); failed != 0 || got["w1"] != 10 {
		t.Errorf("w2 stopped: %v, %d failed; want all 10 on w1", got, failed)
	}
	if _, err := Render(Config{Port: 9445, Servers: c.Servers, Passthrough: []Frontend{{Name: "x", Port: 9445, Servers: f.Servers}}}); err == nil {
		t.Error("a passthrough on the API's port: no error")
	}
	if _, err := Render(Config{Port: 9445, Servers: c.Servers, Passthrough: []Frontend{{Name: "bad name", Port: 80, Servers: f.Servers}}}); err == nil {
		t.Error("a frontend name with a blank: no error")
	}
	if _, err := Render(Config{Port: 9445, Servers: c.Servers, Passthrough: []Frontend{{Name: "x", Port: 80}}}); err == nil {
		t.Error("a frontend without servers: no error")
	}
}

// TestPassthroughHTTPHealthCheck: with HealthPort the passthrough's servers are checked with GET
// /healthz on that port (OpenShift's routers on 1936): a router whose health says "draining" leaves the
// rotation while its data port still answers, and comes back when healthy.
func TestPassthroughHTTPHealthCheck(t *testing.T) {
	api := newAPIServer(t, "cp1")
	type router struct {
		data     *httptest.Server
		draining atomic.Bool
	}
	healthPort := freePort(t)
	var rs []*router
	f := Frontend{Name: "ingress-80", Port: freePort(t), HealthPort: healthPort}
	// Two routers on two loopback addresses, each with its data port and the shared health port.
	for i, ip := range []string{"127.0.0.2", "127.0.0.3"} {
		r := &router{}
		name := fmt.Sprintf("w%d", i+1)
		l, err := net.Listen("tcp", ip+":0")
		if err != nil {
			t.Fatal(err)
		}
		r.data = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) }))
		r.data.Listener.Close()
		r.data.Listener = l
		r.data.Start()
		t.Cleanup(r.data.Close)
		hl, err := net.Listen("tcp", fmt.Sprintf("%s:%d", ip, healthPort))
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path != "/healthz" || r.draining.Load() {
				http.Error(w, "draining", http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, "ok")
		})}
		go hs.Serve(hl)
		t.Cleanup(func() { hs.Close() })
		rs = append(rs, r)
		f.Servers = append(f.Servers, Server{Name: name, Address: netip.MustParseAddrPort(l.Addr().String())})
	}
	c := Config{Port: freePort(t), Bind: netip.MustParseAddr("127.0.0.1"), StatsPort: freePort(t),
		Servers: []Server{{Name: "cp1", Address: api.addr()}}, Passthrough: []Frontend{f}}
	conf, err := Render(c)
	if err != nil || !strings.Contains(string(conf), fmt.Sprintf("check port %d", healthPort)) || !strings.Contains(string(conf), "uri /healthz") {
		t.Fatalf("Render: %v\n%s", err, conf)
	}
	startHAProxy(t, c)
	status := func(server, want string) {
		t.Helper()
		var last string
		for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			st, err := tryStatsOf(c.StatsPort, "ingress-80")
			if err == nil {
				if last = st[server].Status; strings.HasPrefix(last, want) {
					return
				}
			}
		}
		t.Fatalf("ingress-80/%s is %q, want %s", server, last, want)
	}
	status("w1", "UP")
	status("w2", "UP")
	rs[1].draining.Store(true)
	status("w2", "DOWN")
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for range 10 {
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/", f.Port))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "w1" {
			t.Fatalf("w2 draining (its data port still answers): a request reached %q", b)
		}
	}
	rs[1].draining.Store(false)
	status("w2", "UP")
}

// tryStatsOf reads the statistics page's servers of one backend, by server name.
func tryStatsOf(port uint16, backend string) (map[string]ServerStat, error) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/stats;csv", port))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	ss, err := ParseStats(b)
	if err != nil {
		return nil, err
	}
	out := map[string]ServerStat{}
	for _, s := range ss {
		if s.Backend == backend {
			out[s.Server] = s
		}
	}
	return out, nil
}
