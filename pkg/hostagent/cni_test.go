package hostagent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/containerd"
	"github.com/airgap-appliance/appliance/test/labns"
)

func TestCNIConfigShape(t *testing.T) {
	for _, tc := range []struct {
		cidr, route string
	}{
		{"10.244.3.0/24", "0.0.0.0/0"},
		{"fd00:244:0:3::/64", "::/0"},
	} {
		t.Run(tc.cidr, func(t *testing.T) {
			p := netip.MustParsePrefix(tc.cidr)
			b, err := CNIConfig(p, 0)
			if err != nil {
				t.Fatal(err)
			}
			again, err := CNIConfig(p, 0)
			if err != nil || !bytes.Equal(b, again) {
				t.Errorf("two renders differ (err %v)", err)
			}
			if !bytes.HasSuffix(b, []byte("}\n")) {
				t.Errorf("does not end in a newline: %q", b[len(b)-5:])
			}
			// Decode generically, as the CNI library does, so the test sees the JSON keys themselves.
			var got struct {
				CNIVersion string           `json:"cniVersion"`
				Name       string           `json:"name"`
				Plugins    []map[string]any `json:"plugins"`
			}
			dec := json.NewDecoder(bytes.NewReader(b))
			if err := dec.Decode(&got); err != nil {
				t.Fatal(err)
			}
			if got.CNIVersion != "1.0.0" || got.Name != "appliance" || len(got.Plugins) != 2 {
				t.Fatalf("cniVersion %q name %q %d plugins:\n%s", got.CNIVersion, got.Name, len(got.Plugins), b)
			}
			br, pm := got.Plugins[0], got.Plugins[1]
			if br["type"] != "bridge" || br["bridge"] != "cni0" || br["isGateway"] != true || br["hairpinMode"] != true {
				t.Errorf("bridge plugin: %v", br)
			}
			if _, ok := br["mtu"]; ok {
				t.Errorf("bridge plugin has an MTU without one given: %v", br)
			}
			if _, ok := br["ipMasq"]; ok {
				t.Errorf("bridge plugin masquerades pod traffic (pods are routed, not NATed): %v", br)
			}
			ipam, _ := br["ipam"].(map[string]any)
			wantIPAM := map[string]any{
				"type":   "host-local",
				"ranges": []any{[]any{map[string]any{"subnet": tc.cidr}}},
				"routes": []any{map[string]any{"dst": tc.route}},
			}
			if gj, wj := mustJSON(t, ipam), mustJSON(t, wantIPAM); gj != wj {
				t.Errorf("ipam %s, want %s", gj, wj)
			}
			if gj, wj := mustJSON(t, pm), `{"capabilities":{"portMappings":true},"type":"portmap"}`; gj != wj {
				t.Errorf("portmap plugin %s, want %s", gj, wj)
			}
		})
	}
	if filepath.Dir(CNIConfigPath) != containerd.CNIConfDir || !strings.HasSuffix(CNIConfigPath, ".conflist") {
		t.Errorf("CNIConfigPath %s: containerd reads *.conflist from %s", CNIConfigPath, containerd.CNIConfDir)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// bridgePluginConfig turns the conflist into the network configuration the first plugin (bridge)
// receives, as libcni does for a conflist: the plugin's own object plus the list's "name" and
// "cniVersion". dataDir moves host-local's allocation state from /var/lib/cni into the test's
// temporary directory (the only change; nothing may be left on the host).
func bridgePluginConfig(t *testing.T, conflist []byte, dataDir string) []byte {
	t.Helper()
	var l struct {
		CNIVersion string           `json:"cniVersion"`
		Name       string           `json:"name"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(conflist, &l); err != nil {
		t.Fatal(err)
	}
	if len(l.Plugins) == 0 || l.Plugins[0]["type"] != "bridge" {
		t.Fatalf("first plugin is not bridge: %s", conflist)
	}
	p := l.Plugins[0]
	p["name"], p["cniVersion"] = l.Name, l.CNIVersion
	p["ipam"].(map[string]any)["dataDir"] = dataDir
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// cniExec runs a CNI plugin per the CNI spec (CNI_* environment, config on stdin, result on stdout)
// inside host, the namespace that plays the node.
func cniExec(t *testing.T, host *labns.NS, plugin, command, containerID, netnsPath string, conf []byte) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", host.Name, filepath.Join(containerd.CNIBinDir, plugin))
	cmd.Env = []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"CNI_COMMAND=" + command,
		"CNI_CONTAINERID=" + containerID,
		"CNI_NETNS=" + netnsPath,
		"CNI_IFNAME=eth0",
		"CNI_PATH=" + containerd.CNIBinDir,
	}
	cmd.Stdin = bytes.NewReader(conf)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Logf("%s %s stderr: %s", plugin, command, stderr.String())
	}
	return out, err
}

// requireCNIPlugins fails under CI (skips loudly elsewhere) unless Debian's containernetworking-plugins
// are in containerd.CNIBinDir.
func requireCNIPlugins(t *testing.T) {
	t.Helper()
	for _, p := range []string{"bridge", "host-local", "portmap"} {
		st, err := os.Stat(filepath.Join(containerd.CNIBinDir, p))
		if err == nil && st.Mode()&0o111 != 0 {
			continue
		}
		if labns.InCI() {
			t.Fatalf("REAL PEER MISSING: %s needs %s/%s (apt-get install containernetworking-plugins)", t.Name(), containerd.CNIBinDir, p)
		}
		t.Skipf("SKIPPED %s: real peer %s/%s not installed (apt-get install containernetworking-plugins)", t.Name(), containerd.CNIBinDir, p)
	}
}

// TestCNIConfigRealPlugins runs the real bridge and host-local plugins with CNIConfig's network: ADD
// gives a pod in a throwaway namespace an address in the pod range and a default route via the
// bridge, with cni0 (gateway .1 / ::1) in a second throwaway namespace playing the node; DEL undoes
// it. The root namespace is never touched.
func TestCNIConfigRealPlugins(t *testing.T) {
	labns.RequireRoot(t)
	labns.RequireTool(t, "ip")
	requireCNIPlugins(t)
	for _, tc := range []struct {
		name, cidr, gw string
		mtu            int
	}{
		{"ipv4", "10.244.7.0/24", "10.244.7.1", 0},
		{"ipv6", "fd00:244:0:7::/64", "fd00:244:0:7::1", 0},
		{"ipv4 flannel MTU", "10.244.8.0/24", "10.244.8.1", 1450},
	} {
		t.Run(tc.name, func(t *testing.T) {
			podCIDR := netip.MustParsePrefix(tc.cidr)
			gw := netip.MustParseAddr(tc.gw)
			host := labns.New(t, "cnih")
			pod := labns.New(t, "cnip")
			if podCIDR.Addr().Is6() {
				// No DAD delay on the bridge and veths made in these namespaces.
				host.MustRun("sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0", "net.ipv6.conf.all.accept_dad=0")
				pod.MustRun("sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0", "net.ipv6.conf.all.accept_dad=0")
			}
			conflist, err := CNIConfig(podCIDR, tc.mtu)
			if err != nil {
				t.Fatal(err)
			}
			dataDir := t.TempDir()
			conf := bridgePluginConfig(t, conflist, dataDir)
			const id = "0123456789abcdef"

			out, err := cniExec(t, host, "bridge", "ADD", id, pod.Path(), conf)
			if err != nil {
				t.Fatalf("bridge ADD: %v\n%s", err, out)
			}
			var res struct {
				CNIVersion string `json:"cniVersion"`
				Interfaces []struct {
					Name    string `json:"name"`
					Sandbox string `json:"sandbox"`
				} `json:"interfaces"`
				IPs []struct {
					Address   string `json:"address"`
					Gateway   string `json:"gateway"`
					Interface *int   `json:"interface"`
				} `json:"ips"`
				Routes []struct {
					Dst string `json:"dst"`
					GW  string `json:"gw"`
				} `json:"routes"`
			}
			if err := json.Unmarshal(out, &res); err != nil {
				t.Fatalf("ADD result is not JSON: %v\n%s", err, out)
			}
			if res.CNIVersion != "1.0.0" || len(res.IPs) != 1 {
				t.Fatalf("ADD result: %s", out)
			}
			addr, err := netip.ParsePrefix(res.IPs[0].Address)
			if err != nil {
				t.Fatal(err)
			}
			if !podCIDR.Contains(addr.Addr()) || addr.Bits() != podCIDR.Bits() || addr.Addr() == gw {
				t.Errorf("pod address %s, want a host in %s other than the gateway", addr, podCIDR)
			}
			if res.IPs[0].Gateway != gw.String() {
				t.Errorf("gateway %q, want %s", res.IPs[0].Gateway, gw)
			}
			if len(res.Routes) != 1 || (res.Routes[0].Dst != "0.0.0.0/0" && res.Routes[0].Dst != "::/0") {
				t.Errorf("routes %+v, want one default route", res.Routes)
			}

			// What the kernel says, in each namespace.
			if got := pod.MustRun("ip", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(got, " "+addr.String()+" ") {
				t.Errorf("pod eth0 lacks %s:\n%s", addr, got)
			}
			if tc.mtu != 0 {
				for _, l := range []struct {
					ns  *labns.NS
					dev string
				}{{pod, "eth0"}, {host, "cni0"}} {
					if got := l.ns.MustRun("ip", "-o", "link", "show", "dev", l.dev); !strings.Contains(got, fmt.Sprintf(" mtu %d ", tc.mtu)) {
						t.Errorf("%s has not MTU %d:\n%s", l.dev, tc.mtu, got)
					}
				}
			}
			if got := pod.MustRun("ip", "route", "show", "default"); !strings.Contains(got, "via "+gw.String()+" dev eth0") {
				if got6 := pod.MustRun("ip", "-6", "route", "show", "default"); !strings.Contains(got6, "via "+gw.String()+" dev eth0") {
					t.Errorf("pod default route, want via %s dev eth0:\n%s%s", gw, got, got6)
				}
			}
			gwPrefix := netip.PrefixFrom(gw, podCIDR.Bits()).String()
			if got := host.MustRun("ip", "-o", "addr", "show", "dev", "cni0"); !strings.Contains(got, " "+gwPrefix+" ") {
				t.Errorf("host cni0 lacks the gateway %s:\n%s", gwPrefix, got)
			}
			if got := host.MustRun("ip", "-o", "link", "show", "master", "cni0"); !strings.Contains(got, "veth") {
				t.Errorf("no veth enslaved to cni0 in the host namespace:\n%s", got)
			}
			if podCIDR.Addr().Is4() {
				// The pod reaches its gateway through the bridge (real packets).
				if out, err := pod.Run("ping", "-c", "1", "-W", "2", gw.String()); err != nil {
					t.Errorf("pod cannot ping its gateway %s: %v\n%s", gw, err, out)
				}
			}
			if _, err := os.Stat(filepath.Join(dataDir, "appliance", addr.Addr().String())); err != nil {
				t.Errorf("host-local did not record the allocation in its dataDir: %v", err)
			}

			if out, err := cniExec(t, host, "bridge", "DEL", id, pod.Path(), conf); err != nil {
				t.Fatalf("bridge DEL: %v\n%s", err, out)
			}
			if out, err := pod.Run("ip", "link", "show", "eth0"); err == nil {
				t.Errorf("eth0 still in the pod after DEL:\n%s", out)
			}
			if _, err := os.Stat(filepath.Join(dataDir, "appliance", addr.Addr().String())); !os.IsNotExist(err) {
				t.Errorf("host-local kept the allocation after DEL: %v", err)
			}
			// DEL is idempotent per the spec.
			if out, err := cniExec(t, host, "bridge", "DEL", id, pod.Path(), conf); err != nil {
				t.Errorf("second DEL: %v\n%s", err, out)
			}
		})
	}
}

// inNetNS runs fn on a goroutine whose OS thread has entered the namespace at path (never unlocked:
// the thread dies with the goroutine), leaving the test process's own threads where they are.
func inNetNS[T any](t *testing.T, path string, fn func() (T, error)) (T, error) {
	t.Helper()
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := setNS(path); err != nil {
			var zero T
			ch <- result{zero, err}
			return
		}
		v, err := fn()
		ch <- result{v, err}
	}()
	r := <-ch
	return r.v, r.err
}

func TestRoutePods(t *testing.T) {
	labns.RequireRoot(t)
	ns := labns.New(t, "rpod")
	// A workload-plane link with the peers' addresses on-link (a veth pair: this kernel has no dummy).
	ns.MustRun("ip", "link", "add", "wl0", "type", "veth", "peer", "name", "wl0p")
	ns.MustRun("ip", "link", "set", "wl0p", "up")
	ns.MustRun("sysctl", "-qw", "net.ipv6.conf.wl0.accept_dad=0")
	ns.MustRun("ip", "addr", "add", "192.0.2.10/24", "dev", "wl0")
	ns.MustRun("ip", "addr", "add", "fd00:2::10/64", "dev", "wl0")
	ns.MustRun("ip", "link", "set", "wl0", "up")
	rootBefore, err := exec.Command("ip", "route", "show", "table", "main").Output()
	if err != nil {
		t.Fatal(err)
	}

	routes := []agentapi.PodRoute{
		{Node: "n2", Prefix: netip.MustParsePrefix("10.244.2.0/24"), Via: netip.MustParseAddr("192.0.2.12")},
		{Node: "n3", Prefix: netip.MustParsePrefix("10.244.3.0/24"), Via: netip.MustParseAddr("192.0.2.13")},
		{Node: "n4", Prefix: netip.MustParsePrefix("fd00:244:0:4::/64"), Via: netip.MustParseAddr("fd00:2::14")},
	}
	run := func(rs []agentapi.PodRoute) (int, error) {
		return inNetNS(t, ns.Path(), func() (int, error) { return routePods(rs, netip.Prefix{}) })
	}
	n, err := run(routes)
	if err != nil || n != 3 {
		t.Fatalf("first call: %d changed, %v; want 3", n, err)
	}
	v4, v6 := ns.MustRun("ip", "-4", "route", "show"), ns.MustRun("ip", "-6", "route", "show")
	for _, want := range []string{"10.244.2.0/24 via 192.0.2.12 dev wl0", "10.244.3.0/24 via 192.0.2.13 dev wl0"} {
		if !strings.Contains(v4, want) {
			t.Errorf("missing %q:\n%s", want, v4)
		}
	}
	if !strings.Contains(v6, "fd00:244:0:4::/64 via fd00:2::14 dev wl0") {
		t.Errorf("missing the IPv6 pod route:\n%s", v6)
	}

	if n, err := run(routes); err != nil || n != 0 {
		t.Errorf("second call: %d changed, %v; want 0", n, err)
	}

	// A node moved to another address: only its route changes, in place.
	moved := append([]agentapi.PodRoute(nil), routes...)
	moved[1].Via = netip.MustParseAddr("192.0.2.33")
	if n, err := run(moved); err != nil || n != 1 {
		t.Errorf("after a move: %d changed, %v; want 1", n, err)
	}
	v4 = ns.MustRun("ip", "-4", "route", "show", "10.244.3.0/24")
	if strings.TrimSpace(v4) != "10.244.3.0/24 via 192.0.2.33 dev wl0" {
		t.Errorf("moved route:\n%s", v4)
	}

	// No routes: nothing to do.
	if n, err := run(nil); err != nil || n != 0 {
		t.Errorf("no routes: %d, %v", n, err)
	}

	// A node removed from the inventory (n3): with the cluster's pod subnet its route goes; the
	// others, routes outside the subnet (n4's IPv6 range, the link's own) and the kernel's stay.
	ns.MustRun("ip", "route", "add", "198.18.0.0/24", "via", "192.0.2.50")
	pods := netip.MustParsePrefix("10.244.0.0/16")
	prune := func(rs []agentapi.PodRoute) (int, error) {
		return inNetNS(t, ns.Path(), func() (int, error) { return routePods(rs, pods) })
	}
	if n, err := prune([]agentapi.PodRoute{moved[0], moved[2]}); err != nil || n != 1 {
		t.Errorf("after removing n3: %d changed, %v; want 1", n, err)
	}
	v4, v6 = ns.MustRun("ip", "-4", "route", "show"), ns.MustRun("ip", "-6", "route", "show")
	if strings.Contains(v4, "10.244.3.0/24") || !strings.Contains(v4, "10.244.2.0/24 via 192.0.2.12") ||
		!strings.Contains(v4, "198.18.0.0/24 via 192.0.2.50") || !strings.Contains(v4, "192.0.2.0/24 dev wl0") ||
		!strings.Contains(v6, "fd00:244:0:4::/64 via fd00:2::14") {
		t.Errorf("routes after removing n3:\n%s%s", v4, v6)
	}
	if n, err := prune([]agentapi.PodRoute{moved[0], moved[2]}); err != nil || n != 0 {
		t.Errorf("second prune: %d changed, %v; want 0", n, err)
	}

	// An unreachable gateway is an error naming the route and the node.
	_, err = run([]agentapi.PodRoute{{Node: "n9", Prefix: netip.MustParsePrefix("10.244.9.0/24"), Via: netip.MustParseAddr("198.51.100.9")}})
	if err == nil || !strings.Contains(err.Error(), "10.244.9.0/24") || !strings.Contains(err.Error(), "n9") || !strings.Contains(err.Error(), "198.51.100.9") {
		t.Errorf("unreachable gateway: err = %v", err)
	}

	rootAfter, err := exec.Command("ip", "route", "show", "table", "main").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rootBefore, rootAfter) {
		t.Errorf("the root namespace's routes changed:\nbefore\n%s\nafter\n%s", rootBefore, rootAfter)
	}
}
