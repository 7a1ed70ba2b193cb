// Package haproxy renders and checks the configuration of the control planes' API load balancer:
// Debian's HAProxy (2.6 in bookworm) in TCP mode, balancing the API across every kube-apiserver that
// answers /readyz, as OpenShift's on-prem haproxy static pod and k0s's control-plane load balancer do.
// TLS passes through untouched (clients verify the apiserver's certificate as without a balancer);
// only the health check speaks TLS, without verification, as it carries no credentials and learns
// nothing but a status code.
//
// The host runs it as Debian's haproxy.service (pkg/hostagent's apilb step writes ConfigPath and
// reloads the unit); this package holds no process management.
package haproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/template"
	"time"
)

// ConfigPath is where Debian's haproxy.service reads its configuration (CONFIG in /etc/default/haproxy).
const ConfigPath = "/etc/haproxy/haproxy.cfg"

// DefaultStatsPort is the loopback-only port of the statistics page (Config.StatsPort): CSV at
// http://127.0.0.1:9446/stats;csv (the HAProxy management guide's "CSV format").
const DefaultStatsPort uint16 = 9446

// Defaults of the health check (Config.CheckInterval, Config.Fall, Config.Rise): a stopped apiserver
// leaves the rotation within about 2 s, a started one joins on its first good answer; connections that
// reach it in between are retried on another server (option redispatch, retries 3).
const (
	DefaultCheckInterval = time.Second
	DefaultFall          = 2
	DefaultRise          = 1
)

// CheckTimeout bounds one health check's answer ("timeout check"): a check not answered in time
// counts as failed.
const CheckTimeout = 2 * time.Second

// Server is one kube-apiserver behind the balancer.
type Server struct {
	// Name identifies the server in statistics and logs (the node name).
	Name string
	// Address is the apiserver's node address and secure port, e.g. 10.100.0.11:6443.
	Address netip.AddrPort
}

// Config is the load balancer of one control plane.
type Config struct {
	// Port is the TCP port the frontend listens on, on every address of the host (firewall.
	// APILoadBalancerPort, 9445); IPv6 too when any server is IPv6.
	Port uint16
	// Bind is the one address to listen on; the zero Addr = every address (production: the VIP's
	// redirected traffic arrives on the node's own addresses and on loopback).
	Bind netip.Addr
	// Servers are the kube-apiservers, in the order they are tried (balance roundrobin). At least one.
	Servers []Server
	// HealthPath is the HTTP path of the health check; "" = "/readyz" (kube-apiserver's readiness, which
	// fails from the moment it is told to stop, while it keeps serving for its
	// --shutdown-delay-duration: longer than DrainWithin, see kubeadm-manifests.APIServerShutdownDelay).
	HealthPath string
	// CheckInterval, Fall and Rise tune the health check; zero values select the defaults above.
	CheckInterval time.Duration
	Fall, Rise    int
	// StatsPort is the loopback port of the statistics page; 0 = DefaultStatsPort.
	StatsPort uint16
	// Passthrough are further TCP frontends, each balanced round robin over its servers with a TCP
	// connect check (same interval, fall and rise): the ingress VIP's ports to the ingress routers.
	Passthrough []Frontend
}

// Frontend is a TCP passthrough: Port on every address (or Config.Bind) to Servers.
type Frontend struct {
	// Name names the frontend and its backend (letters, digits, '-', '_'), e.g. "ingress-80".
	Name string
	// Port is the frontend's TCP port, not Config.Port nor another frontend's.
	Port uint16
	// Servers are the backends; at least one.
	Servers []Server
	// HealthPort and HealthPath, when set, make the health check `GET HealthPath` over plain HTTP on
	// each server's HealthPort (expecting 200), as OpenShift checks its routers on 1936/healthz, so a
	// draining server leaves the rotation before it stops; 0 checks the TCP connect to the port.
	HealthPort uint16
	HealthPath string
}

var cfgTemplate = template.Must(template.New("haproxy.cfg").Parse(`# Rendered by the appliance's hostagent (apilb step); changes here are overwritten.
# The API load balancer: TCP passthrough to every kube-apiserver that answers {{.Path}}.
global
	# maxconn: HAProxy derives it from the file-descriptor limit (haproxy.service's LimitNOFILE).
	# One line per connection on stdout, which haproxy.service (foreground, -Ws) sends to the
	# journal: the client, the server chosen, the times and the termination state ("SD": the server
	# closed it mid-stream), so a failed API request through the VIP can be traced to its backend.
	log stdout format raw local0 info

defaults
	mode tcp
	timeout connect 5s
	# API watches live long; kube-apiserver ends them itself (--min-request-timeout, 30-60 min).
	timeout client 24h
	timeout server 24h
	timeout check {{.CheckTimeout}}
	retries 3
	option redispatch

frontend apiserver
	bind {{.Bind}}
	log global
	option tcplog
	option dontlognull
	default_backend apiservers

backend apiservers
	balance roundrobin
	option httpchk
	http-check send meth GET uri {{.Path}} ver HTTP/1.1 hdr Host localhost
	http-check expect status 200
	default-server check check-ssl verify none inter {{.Inter}} fall {{.Fall}} rise {{.Rise}}
{{- range .Servers}}
	server {{.Name}} {{.Address}}
{{- end}}

{{- range .Passthrough}}

frontend {{.Name}}
	bind {{.Bind}}
	log global
	option tcplog
	option dontlognull
	default_backend {{.Name}}

backend {{.Name}}
	balance roundrobin
{{- if .HealthPort}}
	option httpchk
	http-check send meth GET uri {{.HealthPath}} ver HTTP/1.1 hdr Host localhost
	http-check expect status 200
	default-server check port {{.HealthPort}} inter {{$.Inter}} fall {{$.Fall}} rise {{$.Rise}}
{{- else}}
	default-server check inter {{$.Inter}} fall {{$.Fall}} rise {{$.Rise}}
{{- end}}
{{- range .Servers}}
	server {{.Name}} {{.Address}}
{{- end}}
{{- end}}

listen stats
	bind 127.0.0.1:{{.StatsPort}}
	mode http
	timeout client 10s
	timeout server 10s
	stats enable
	stats uri /stats
	stats refresh 0
`))

// DrainWithin bounds how long the balancer keeps handing new connections to a server whose health
// check starts failing, as a kube-apiserver's /readyz does the moment it is told to stop: the next
// check starts within one interval, Fall failed checks an interval apart take it out, and the last
// one answers within CheckTimeout: Fall × CheckInterval + CheckTimeout (4 s with the defaults). A
// server must keep serving at least that long after its check fails (kube-apiserver:
// --shutdown-delay-duration, kubeadm-manifests.APIServerShutdownDelay), or the connections handed to
// it in between are cut: TCP passthrough cannot replay them elsewhere.
func (c Config) DrainWithin() time.Duration {
	inter, fall := c.CheckInterval, c.Fall
	if inter <= 0 {
		inter = DefaultCheckInterval
	}
	if fall <= 0 {
		fall = DefaultFall
	}
	return time.Duration(fall)*inter + CheckTimeout
}

// Render returns the haproxy.cfg of c. Errors: no port, no server, a server without a name or with an
// invalid address, two servers with one name, a health path that is not an absolute path.
func Render(c Config) ([]byte, error) {
	if c.Port == 0 {
		return nil, errors.New("haproxy: no frontend port")
	}
	if len(c.Servers) == 0 {
		return nil, errors.New("haproxy: no kube-apiserver to balance")
	}
	path := c.HealthPath
	if path == "" {
		path = "/readyz"
	}
	if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \t\r\n#") {
		return nil, fmt.Errorf("haproxy: health path %q is not an absolute path", path)
	}
	inter, fall, rise, stats := c.CheckInterval, c.Fall, c.Rise, c.StatsPort
	if inter <= 0 {
		inter = DefaultCheckInterval
	}
	if fall <= 0 {
		fall = DefaultFall
	}
	if rise <= 0 {
		rise = DefaultRise
	}
	if stats == 0 {
		stats = DefaultStatsPort
	}
	v6 := false
	seen := map[string]bool{}
	for _, s := range c.Servers {
		if s.Name == "" || strings.ContainsAny(s.Name, " \t\r\n#") {
			return nil, fmt.Errorf("haproxy: server name %q is empty or has blanks", s.Name)
		}
		if seen[s.Name] {
			return nil, fmt.Errorf("haproxy: server %q twice", s.Name)
		}
		seen[s.Name] = true
		if !s.Address.IsValid() || s.Address.Port() == 0 {
			return nil, fmt.Errorf("haproxy: server %s has no address and port", s.Name)
		}
		v6 = v6 || s.Address.Addr().Unmap().Is6()
	}
	bind := fmt.Sprintf(":%d", c.Port) // every IPv4 address
	switch {
	case c.Bind.IsValid():
		bind = netip.AddrPortFrom(c.Bind, c.Port).String()
	case v6:
		bind = fmt.Sprintf(":::%d v4v6", c.Port)
	}
	type passthrough struct {
		Name, Bind string
		Servers    []Server
		HealthPort uint16
		HealthPath string
	}
	var pts []passthrough
	ports := map[uint16]bool{c.Port: true, stats: true}
	for _, f := range c.Passthrough {
		if f.Name == "" || strings.IndexFunc(f.Name, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
		}) >= 0 {
			return nil, fmt.Errorf("haproxy: frontend name %q: use letters, digits, '-' and '_'", f.Name)
		}
		if f.Port == 0 || ports[f.Port] {
			return nil, fmt.Errorf("haproxy: frontend %s: port %d is zero or already taken", f.Name, f.Port)
		}
		ports[f.Port] = true
		if len(f.Servers) == 0 {
			return nil, fmt.Errorf("haproxy: frontend %s has no server", f.Name)
		}
		for _, sv := range f.Servers {
			if sv.Name == "" || strings.ContainsAny(sv.Name, " \t\r\n#") || !sv.Address.IsValid() || sv.Address.Port() == 0 {
				return nil, fmt.Errorf("haproxy: frontend %s: server %q needs a name without blanks and an address with a port", f.Name, sv.Name)
			}
		}
		fb := fmt.Sprintf(":%d", f.Port)
		if c.Bind.IsValid() {
			fb = netip.AddrPortFrom(c.Bind, f.Port).String()
		}
		hp := f.HealthPath
		if f.HealthPort != 0 && hp == "" {
			hp = "/healthz"
		}
		if f.HealthPort != 0 && (!strings.HasPrefix(hp, "/") || strings.ContainsAny(hp, " \t\r\n#")) {
			return nil, fmt.Errorf("haproxy: frontend %s: health path %q is not an absolute path", f.Name, hp)
		}
		pts = append(pts, passthrough{Name: f.Name, Bind: fb, Servers: f.Servers, HealthPort: f.HealthPort, HealthPath: hp})
	}
	var b bytes.Buffer
	err := cfgTemplate.Execute(&b, map[string]any{
		"Bind": bind, "Path": path, "Servers": c.Servers, "StatsPort": stats, "Passthrough": pts,
		"Inter": fmt.Sprintf("%dms", inter.Milliseconds()), "Fall": fall, "Rise": rise,
		"CheckTimeout": fmt.Sprintf("%ds", int(CheckTimeout/time.Second)), // whole seconds: "2s"
	})
	return b.Bytes(), err
}

// Check runs `haproxy -c -f FILE` (bin "" = haproxy on PATH) on conf, written to a temporary file in
// dir (dir "" = the system's temporary directory). Errors: haproxy not found; its own diagnostics
// when it refuses the configuration.
func Check(ctx context.Context, bin, dir string, conf []byte) error {
	if bin == "" {
		bin = "haproxy"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return fmt.Errorf("haproxy not found (%w): install Debian's haproxy package (the bundle's default packages carry it)", err)
	}
	f, err := os.CreateTemp(dir, ".haproxy-check-*.cfg")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(conf); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "-c", "-f", f.Name()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("haproxy -c refused the configuration (%s): %s", filepath.Base(f.Name()), strings.TrimSpace(string(out)))
	}
	return nil
}
