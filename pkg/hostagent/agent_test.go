package hostagent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/server"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/pkg/version"
	"github.com/airgap-appliance/appliance/test/labns"
)

// appliance is an in-process appliance front (pkg/server with the agent API) on 127.0.0.1.
type appliance struct {
	t      *testing.T
	srv    *server.Server
	ts     *httptest.Server
	addr   string
	store  *nodestate.Store
	ca     *pki.CA
	token  string
	node   string
	stateD string
}

func newAppliance(t *testing.T, nc agentapi.NodeConfig) *appliance {
	t.Helper()
	return newApplianceWith(t, nc, nil)
}

// newApplianceWith is newAppliance that also serves artifacts (name under /artifacts/ → file).
func newApplianceWith(t *testing.T, nc agentapi.NodeConfig, artifacts map[string]string) *appliance {
	t.Helper()
	ca, cert := testPKI(t)
	state := t.TempDir()
	nc.CAPEM = string(ca.CertPEM)
	b, err := json.Marshal(nc)
	if err != nil {
		t.Fatal(err)
	}
	rendered := filepath.Join(state, "rendered")
	if err := os.MkdirAll(filepath.Join(rendered, nc.Node), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rendered, nc.Node, statedir.NodeConfigFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{nc.Node: "token-" + nc.Node, "other": "token-other"}
	store := nodestate.Open(filepath.Join(state, "nodes"))
	srv, err := server.New(server.Options{
		Listen: "127.0.0.1:0", Certificate: cert,
		Agent: server.NewAgentAPI(rendered, tokens, store, nil), CAPEM: ca.CertPEM, Artifacts: artifacts,
	})
	if err != nil {
		t.Fatal(err)
	}
	a := &appliance{t: t, srv: srv, store: store, ca: ca, token: tokens[nc.Node], node: nc.Node, stateD: state}
	a.start("127.0.0.1:0")
	return a
}

// start serves on addr (the same address again after stop).
func (a *appliance) start(addr string) {
	a.t.Helper()
	var ln net.Listener
	var err error
	for range 50 { // the port of a just-closed listener may linger briefly
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		a.t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(a.srv.Handler())
	ts.Listener.Close()
	ts.Listener = ln
	ts.TLS = a.srv.TLSConfig()
	ts.StartTLS()
	a.ts, a.addr = ts, ln.Addr().String()
	a.t.Cleanup(ts.Close)
}

// stop closes the listener and every connection, a config watch's too (an httptest.Server's Close
// waits for requests in progress, and a watch waits up to agentapi.ConfigWaitMax).
func (a *appliance) stop() {
	a.ts.Listener.Close()
	a.ts.CloseClientConnections()
	a.ts.Close()
}

func (a *appliance) config() agentapi.Configuration {
	return agentapi.Configuration{Node: a.node, Roles: []string{"worker"}, ApplianceURL: "https://" + a.addr,
		CAPin: agentapi.PinOf(a.ca.Cert), Token: a.token}
}

// waitFor polls cond until it holds, failing after a generous bound (a hang guard, not a timing
// assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodeNS is a namespace whose interface (returned) carries addr (CIDR notation), linked by a veth
// pair to a peer namespace holding peerAddr, where nothing else runs.
func nodeNS(t *testing.T, addr, peerAddr string) (*labns.NS, string) {
	t.Helper()
	labns.RequireTool(t, "nft")
	ns := labns.New(t, "hagt")
	peer := labns.New(t, "hpeer")
	ifc, _ := labns.Link(t, ns, addr, peer, peerAddr)
	return ns, ifc
}

type runningAgent struct {
	cancel context.CancelFunc
	done   chan error
}

func startAgent(t *testing.T, o Options) *runningAgent {
	t.Helper()
	a, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningAgent{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

func (r *runningAgent) stop() {
	r.cancel()
	<-r.done
	r.done <- nil // later stops return at once
}

func steps(evs []nodestate.Event, boot string) []string {
	var out []string
	for _, e := range evs {
		if e.BootID == boot && e.Step != "" && e.Status != "fetched" {
			out = append(out, e.Step+":"+e.Status)
		}
	}
	return out
}

// TestAgentWorkerAgainstAppliance runs the agent for a worker inside a network namespace against an
// in-process appliance: the firewall table appears in the namespace, hosts.toml and config_path
// are written under --root, and the appliance records every step in order. Then the agent restarts
// with the appliance down: it applies the cached config and reports once the appliance is back.
func TestAgentWorkerAgainstAppliance(t *testing.T) {
	labns.RequireRoot(t)
	ns, _ := nodeNS(t, "10.77.0.2/24", "10.77.0.1/24")
	nc := workerNodeConfig("10.77.0")
	app := newAppliance(t, nc)
	// The mirrors name the appliance's real address, known only now: rewrite the node config.
	nc.Mirrors = []agentapi.Mirror{{Registry: "registry.k8s.io", Endpoint: "https://" + app.addr + "/v2/registry.k8s.io"}}
	nc.CAPEM = string(app.ca.CertPEM)
	b, _ := json.Marshal(nc)
	if err := os.WriteFile(filepath.Join(app.stateD, "rendered", "w1", statedir.NodeConfigFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	root, cfgToml := nodeRoot(t, "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"\"\n")
	opts := Options{Config: app.config(), Root: root, NetNS: ns.Name, BootID: "boot-1",
		RetryInitial: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, Resync: time.Hour}

	ag := startAgent(t, opts)
	waitFor(t, "w1 ready", func() bool { st, _ := app.store.Get("w1"); return st.State == agentapi.StateReady })

	if out := ns.MustRun("nft", "list", "table", "inet", "appliance"); !strings.Contains(out, "10.77.0.0/24") || !strings.Contains(out, "policy drop") {
		t.Errorf("firewall table in %s:\n%s", ns.Name, out)
	}
	hosts, err := os.ReadFile(filepath.Join(root, "etc/containerd/certs.d/registry.k8s.io/hosts.toml"))
	if err != nil || !strings.Contains(string(hosts), `[host."https://`+app.addr+`/v2/registry.k8s.io"]`) {
		t.Errorf("hosts.toml: %v\n%s", err, hosts)
	}
	if ca, err := os.ReadFile(filepath.Join(root, "etc/containerd/certs.d/appliance-ca.crt")); err != nil || string(ca) != string(app.ca.CertPEM) {
		t.Errorf("containerd CA: %v", err)
	}
	if toml, _ := os.ReadFile(cfgToml); !strings.Contains(string(toml), `config_path = "/etc/containerd/certs.d"`) {
		t.Errorf("config.toml:\n%s", toml)
	}
	if fi, err := os.Stat(filepath.Join(root, NodeConfigCachePath)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("node config cache: %v", err)
	}
	evs, err := app.store.Events("w1")
	if err != nil {
		t.Fatal(err)
	}
	want := "config:running config:done firewall:running firewall:done containerd:running containerd:done ready:running ready:done"
	if got := strings.Join(steps(evs, "boot-1"), " "); got != want {
		t.Errorf("reports:\n got %s\nwant %s", got, want)
	}
	// The firewall report names the backend the chooser took (no firewalld here: nftables), for `appliance status`.
	if st, _ := app.store.Get("w1"); firewall.BackendOfDetail(st.Steps[agentapi.StepFirewall].Detail) != firewall.BackendNFTables ||
		!strings.Contains(st.Steps[agentapi.StepFirewall].Detail, "nftables (table inet appliance)") {
		t.Errorf("firewall report detail %q does not name the nftables backend", st.Steps[agentapi.StepFirewall].Detail)
	}

	// Every report carries this hostagent's version and executable hash; the appliance keeps them
	// and records the first ready in the node's history.
	exe, _ := os.Executable()
	bin, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(bin)
	if st, _ := app.store.Get("w1"); st.AgentVersion != version.String() || st.AgentSHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("recorded hostagent build %q %q, want %q %q", st.AgentVersion, st.AgentSHA256, version.String(), hex.EncodeToString(sum[:]))
	}
	if h, err := app.store.History("w1"); err != nil || len(h) != 1 || h[0].Kind != nodestate.Ready || h[0].BootID != "boot-1" {
		t.Errorf("history after the first ready: %+v %v", h, err)
	}

	// Restart with the appliance down, and a firewall the agent must restore from its cache.
	ag.stop()
	app.stop()
	ns.MustRun("nft", "delete", "table", "inet", "appliance")
	opts.BootID = "boot-2"
	startAgent(t, opts)
	waitFor(t, "firewall restored from the cached config", func() bool {
		_, err := ns.Run("nft", "list", "table", "inet", "appliance")
		return err == nil
	})
	if st, _ := app.store.Get("w1"); st.BootID != "boot-1" {
		t.Fatalf("the appliance is down but recorded %+v", st)
	}
	app.start(app.addr)
	waitFor(t, "boot-2 reports delivered", func() bool {
		st, _ := app.store.Get("w1")
		return st.BootID == "boot-2" && st.State == agentapi.StateReady
	})
	evs, _ = app.store.Events("w1")
	if got := strings.Join(steps(evs, "boot-2"), " "); got != want {
		t.Errorf("reports after the appliance came back:\n got %s\nwant %s", got, want)
	}
	if h, err := app.store.History("w1"); err != nil || len(h) != 2 || h[1].Kind != nodestate.Rebooted || h[1].BootID != "boot-2" {
		t.Errorf("history after the reboot: %+v %v", h, err)
	}
	if st, _ := app.store.Get("w1"); !strings.Contains(st.Steps["config"].Detail, "cached") {
		t.Errorf("config step detail %q does not say the cached config was used", st.Steps["config"].Detail)
	}
}

// TestAgentControlPlaneKeepalived: a control plane whose only VRRP peer is absent starts keepalived
// (in its namespace), takes the VIP, and restarts keepalived when it dies. Without Kubernetes nothing
// answers on the API port, so the track script fails and the plan has no kubeadm or api step.
func TestAgentControlPlaneKeepalived(t *testing.T) {
	labns.RequireRoot(t)
	labns.RequireTool(t, "keepalived")
	curl := labns.RequireTool(t, "curl")
	ns, ifc := nodeNS(t, "10.78.0.2/24", "10.78.0.9/24")
	nc := cpNodeConfig("10.78.0", 42)
	nc.Keepalived.AuthPass = "s3cret"
	vip := nc.APIServerVIP
	app := newAppliance(t, nc)
	root := startControlPlaneAgent(t, app, ns, []string{curl, "-sfk", "https://127.0.0.1:6443/readyz"})

	waitFor(t, "cp1 ready", func() bool { st, _ := app.store.Get("cp1"); return st.State == agentapi.StateReady })
	waitFor(t, "VIP on the node interface", func() bool { ok, _ := keepalived.Holds(ns.Path(), ifc, vip); return ok })
	conf := filepath.Join(root, KeepalivedDir, "keepalived.conf")
	if fi, err := os.Stat(conf); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("keepalived.conf: %v", err)
	}
	if b, _ := os.ReadFile(conf); !strings.Contains(string(b), "unicast_src_ip 10.78.0.2") || !strings.Contains(string(b), "10.78.0.100/24 dev "+ifc) {
		t.Errorf("keepalived.conf:\n%s", b)
	}
	evs, _ := app.store.Events("cp1")
	want := "config:running config:done firewall:running firewall:done containerd:running containerd:done keepalived:running keepalived:done ready:running ready:done"
	if got := strings.Join(steps(evs, "b1"), " "); got != want {
		t.Errorf("reports:\n got %s\nwant %s", got, want)
	}

	// keepalived dies: the agent starts a new one.
	pid := readPid(t, filepath.Join(root, KeepalivedDir, "keepalived.pid"))
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "keepalived restarted", func() bool {
		st, _ := app.store.Get("cp1")
		return strings.HasPrefix(st.Steps["keepalived"].Detail, "restarted keepalived")
	})
	waitFor(t, "VIP back on the node interface", func() bool { ok, _ := keepalived.Holds(ns.Path(), ifc, vip); return ok })
	if p := readPid(t, filepath.Join(root, KeepalivedDir, "keepalived.pid")); p == pid {
		t.Errorf("keepalived pid unchanged (%d) after the kill", p)
	}
}

// workerNodeConfig is worker w1's node config on the /24 network NET (e.g. "10.77.0"): both planes
// and the node networks NET.0/24, the appliance at NET.1, no mirrors, no Kubernetes.
func workerNodeConfig(network string) agentapi.NodeConfig {
	p := netip.MustParsePrefix(network + ".0/24")
	return agentapi.NodeConfig{
		Node: "w1", Roles: []string{"worker"}, ClusterName: "lab",
		ControlPlaneCIDRs: []netip.Prefix{p}, WorkloadPlaneCIDRs: []netip.Prefix{p}, NodeNetworks: []netip.Prefix{p},
		ApplianceAddress: netip.MustParseAddr(network + ".1"), APIServerPort: 6443,
	}
}

// nodeRoot is a node root (Options.Root) holding only /etc/containerd/config.toml with content;
// it returns the root and that file's path.
func nodeRoot(t *testing.T, content string) (root, cfgToml string) {
	t.Helper()
	root = t.TempDir()
	cfgToml = filepath.Join(root, "etc/containerd/config.toml")
	if err := os.MkdirAll(filepath.Dir(cfgToml), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgToml, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return root, cfgToml
}

// cpNodeConfig is control plane cp1's node config on the /24 network NET (e.g. "10.78.0"): control-plane
// and node network NET.0/24, the appliance (its only VRRP peer) at NET.9, the API VIP NET.100, VRRP
// router ID vrid, priority 100.
func cpNodeConfig(network string, vrid uint8) agentapi.NodeConfig {
	a := func(host string) netip.Addr { return netip.MustParseAddr(network + "." + host) }
	return agentapi.NodeConfig{
		Node: "cp1", Roles: []string{"control-plane"}, ClusterName: "lab",
		ControlPlaneCIDRs: []netip.Prefix{netip.MustParsePrefix(network + ".0/24")},
		NodeNetworks:      []netip.Prefix{netip.MustParsePrefix(network + ".0/24")},
		ApplianceAddress:  a("9"), APIServerVIP: a("100"), APIServerPort: 6443,
		Keepalived: &agentapi.KeepalivedConfig{VirtualRouterID: vrid, Priority: 100, Peers: []netip.Addr{a("9")}},
		Mirrors:    []agentapi.Mirror{},
	}
}

// startControlPlaneAgent runs cp1's agent in ns against app, with track as keepalived's API track
// script and quick retries, until the test ends; it returns the agent's root directory.
func startControlPlaneAgent(t *testing.T, app *appliance, ns *labns.NS, track []string) string {
	t.Helper()
	root := t.TempDir()
	cfg := app.config()
	cfg.Roles = []string{"control-plane"}
	startAgent(t, Options{Config: cfg, Root: root, NetNS: ns.Name, BootID: "b1",
		RetryInitial: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, Resync: time.Hour,
		TrackScript: track})
	return root
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	var pid int
	waitFor(t, "pid file "+path, func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		_, err = fmtSscan(strings.TrimSpace(string(b)), &pid)
		return err == nil && pid > 1
	})
	return pid
}

func fmtSscan(s string, p *int) (int, error) { return fmt.Sscan(s, p) }

// TestAgentRemovesVIPWhenKeepalivedDies: keepalived killed with SIGKILL leaves the VIP on the
// interface, and the kernel keeps answering ARP for it while a peer takes the VIP within a second. The
// agent must remove it as soon as it sees keepalived die, not when its keepalived step runs again after
// the next config fetch. Here the appliance hangs (a listener that accepts and never answers, as an
// appliance behind a dead route looks): the VIP must be gone while the agent's first connection after
// the kill is still open. Before, it stayed until that fetch timed out and the client gave up on it.
func TestAgentRemovesVIPWhenKeepalivedDies(t *testing.T) {
	labns.RequireRoot(t)
	labns.RequireTool(t, "keepalived")
	curl := labns.RequireTool(t, "curl")
	ns, ifc := nodeNS(t, "10.79.0.2/24", "10.79.0.9/24")
	nc := cpNodeConfig("10.79.0", 43)
	nc.Keepalived.AdvertIntervalMS = 250
	vip := nc.APIServerVIP
	app := newAppliance(t, nc)
	root := startControlPlaneAgent(t, app, ns, []string{curl, "-sfk", "https://127.0.0.1:6443/readyz"})
	waitFor(t, "cp1 ready", func() bool { st, _ := app.store.Get("cp1"); return st.State == agentapi.StateReady })
	waitFor(t, "VIP on the node interface", func() bool { ok, _ := keepalived.Holds(ns.Path(), ifc, vip); return ok })

	// The appliance hangs: accept, never answer; count the connections the agent gives up on.
	app.stop()
	var ln net.Listener
	var err error
	for range 50 {
		if ln, err = net.Listen("tcp", app.addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	var opened, closed atomic.Int32
	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() { // runs before the agent stops: end the hung connections here
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			opened.Add(1)
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
			go func() {
				_, _ = io.Copy(io.Discard, c) // returns when the agent closes its end
				closed.Add(1)
			}()
		}
	}()

	pid := readPid(t, filepath.Join(root, KeepalivedDir, "keepalived.pid"))
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the dead keepalived's VIP removed", func() bool { ok, _ := keepalived.Holds(ns.Path(), ifc, vip); return !ok })
	if n := closed.Load(); n > 0 {
		t.Errorf("the VIP left the interface only after the agent gave up on %d of %d connections to the hung appliance: it waited for the config fetch", n, opened.Load())
	}
}
