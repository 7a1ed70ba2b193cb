package hostagent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/haproxy"
)

// HAProxyUnit is Debian's haproxy service, which reads haproxy.ConfigPath and reloads without dropping
// connections (master-worker mode, `haproxy -Ws`).
const HAProxyUnit = "haproxy.service"

// HAProxyConfig is the node's API load balancer configuration (pkg/haproxy) from nc.APILoadBalancer:
// a server per control plane, named by node; with nc.Ingress routers, a TCP passthrough frontend
// "ingress-PORT" per ingress port to them. Errors: nc has no load balancer; Render's.
func HAProxyConfig(nc agentapi.NodeConfig) (haproxy.Config, []byte, error) {
	lb := nc.APILoadBalancer
	if lb == nil {
		return haproxy.Config{}, nil, errors.New("node config has no API load balancer")
	}
	c := haproxy.Config{Port: lb.Port}
	for _, s := range lb.Servers {
		c.Servers = append(c.Servers, haproxy.Server{Name: s.Node, Address: s.Address})
	}
	// The ingress VIP's ports to the routers (on the workers, or on the control planes without any).
	if in := nc.Ingress; in != nil && len(in.Routers) > 0 {
		for _, p := range in.Ports {
			f := haproxy.Frontend{Name: fmt.Sprintf("ingress-%d", p.Port), Port: p.Port,
				HealthPort: in.RouterHealthPort, HealthPath: in.RouterHealthPath}
			for _, r := range in.Routers {
				f.Servers = append(f.Servers, haproxy.Server{Name: r.Node, Address: netip.AddrPortFrom(r.Address, p.RouterPort)})
			}
			c.Passthrough = append(c.Passthrough, f)
		}
	}
	conf, err := haproxy.Render(c)
	return c, conf, err
}

// stepAPILB makes the node's API load balancer run (agentapi.StepAPILB, before kubeadm): it writes
// haproxy.ConfigPath when the rendered configuration differs (checked with `haproxy -c` first, so a
// configuration HAProxy refuses never replaces a working one), reloads haproxy.service when it runs
// another configuration than this one (HAProxyAppliedPath: also after a kill between the write and
// the reload) or starts it when it is not running, and installs the VIP's redirect to the balancer
// (firewall.RedirectTable: the node's own traffic for VIP:port from now on, and the traffic the VIP
// brings while the node holds it). Unchanged when all three already hold.
func (a *Agent) stepAPILB(ctx context.Context) (string, error) {
	if err := a.onHost(agentapi.StepAPILB); err != nil {
		return "", err
	}
	a.mu.Lock()
	nc := a.nc
	a.mu.Unlock()
	c, conf, err := HAProxyConfig(nc)
	if err != nil {
		return "", err
	}
	path := a.path(haproxy.ConfigPath)
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	if !bytes.Equal(old, conf) {
		if err := haproxy.Check(ctx, "", filepath.Dir(path), conf); err != nil {
			return "", err
		}
		if _, err := atomicfile.Write(path, conf, 0o644); err != nil {
			return "", err
		}
	}
	// What the running HAProxy was last (re)started with: a kill between the write above and the
	// reload below must not leave the old configuration running behind a file that looks current.
	sum := sha256.Sum256(conf)
	want := hex.EncodeToString(sum[:])
	applied, _ := os.ReadFile(a.path(HAProxyAppliedPath))
	stale := strings.TrimSpace(string(applied)) != want
	active, err := unitActive(ctx, HAProxyUnit)
	if err != nil {
		return "", err
	}
	verb := "unchanged: HAProxy running"
	switch {
	case !active:
		if err := restartUnit(ctx, HAProxyUnit); err != nil {
			return "", err
		}
		verb = "started HAProxy"
	case stale:
		if err := reloadOrRestartUnit(ctx, HAProxyUnit); err != nil {
			return "", err
		}
		verb = "reloaded HAProxy"
	}
	if stale || !active {
		if _, err := atomicfile.Write(a.path(HAProxyAppliedPath), []byte(want+"\n"), 0o600); err != nil {
			return "", err
		}
	}
	rt := &firewall.RedirectTable{}
	redirected, err := rt.Apply(ctx, firewall.Redirect{VIP: nc.APIServerVIP, Port: nc.APIServerPort, ToPort: c.Port})
	if err != nil {
		return "", fmt.Errorf("redirect the API VIP to the load balancer: %w", err)
	}
	if redirected && verb == "unchanged: HAProxy running" {
		verb = "HAProxy running"
	}
	red := "redirected to it"
	if redirected {
		red = "now redirected to it (" + rt.Objects() + ")"
	}
	detail := fmt.Sprintf("%s on :%d across %d kube-apiservers (/readyz), %s:%d %s", verb, c.Port, len(c.Servers),
		nc.APIServerVIP, nc.APIServerPort, red)
	for _, f := range c.Passthrough {
		detail += fmt.Sprintf("; :%d to %d ingress routers", f.Port, len(f.Servers))
	}
	return detail, nil
}

// HAProxyAppliedPath records the SHA-256 of the haproxy.cfg haproxy.service was last started or
// reloaded with (stepAPILB).
const HAProxyAppliedPath = "/var/lib/hostagent/haproxy-applied"

// Paths of the ingress routers' manifest on a control plane (applied by the api step like the CNI's).
const (
	// IngressRouterManifestPath is the manifest applied (0644: no secret in it).
	IngressRouterManifestPath = "/etc/kubernetes/appliance/ingress-router.yaml"
	// IngressRouterAppliedPath records the SHA-256 of the manifest last applied.
	IngressRouterAppliedPath = "/var/lib/hostagent/ingress-router-applied"
)

var nodeIngressRouterPaths = cniPaths{AdminKubeconfigPath, IngressRouterManifestPath, IngressRouterAppliedPath, KubeadmLogPath}
