package plan

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/pki"
)

func TestNodeConfigFor(t *testing.T) {
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	c := &config.BootstrapConfiguration{
		ClusterName: "lab",
		Kubernetes:  config.Kubernetes{Enabled: new(false)},
		Networks: config.Networks{
			ControlPlane:  config.NetworkPlane{CIDRs: []netip.Prefix{p("10.0.0.0/24")}},
			WorkloadPlane: config.NetworkPlane{CIDRs: []netip.Prefix{p("10.0.0.0/24"), p("10.1.0.0/24")}},
			Pods:          p("10.244.0.0/16"),
		},
		APIServer: config.APIServer{VIP: a("10.0.0.100"), Port: 6443, Keepalived: config.Keepalived{VirtualRouterID: 7}},
		Nodes: []config.Node{
			{Name: "cp1", Roles: []config.Role{config.RoleControlPlane}, Addresses: []netip.Addr{a("10.1.0.11"), a("10.0.0.11")}},
			{Name: "cp2", Roles: []config.Role{config.RoleControlPlane}, Addresses: []netip.Addr{a("10.0.0.12")}},
			{Name: "cp3", Roles: []config.Role{config.RoleControlPlane}},
			{Name: "w1", Roles: []config.Role{config.RoleWorker}},
		},
	}
	mirrors := []agentapi.Mirror{{Registry: "docker.io", Endpoint: "https://10.0.0.1:8443/v2/docker.io"}}
	app := a("10.0.0.1")
	v := VRRP{VirtualRouterID: 7, AuthPass: "pw", AdvertInterval: time.Second}
	cp2, err := NodeConfigFor(c, c.Nodes[1], app, []byte("PEM"), v, mirrors, nil)
	if err != nil || cp2.Kubernetes != nil {
		t.Fatalf("NodeConfigFor(cp2), kubernetes disabled: %v, kubernetes %+v", err, cp2.Kubernetes)
	}
	wantNets := []netip.Prefix{p("10.0.0.0/24"), p("10.1.0.0/24"), p("10.244.0.0/16")}
	if !slices.Equal(cp2.NodeNetworks, wantNets) || cp2.CAPEM != "PEM" || cp2.APIServerVIP != a("10.0.0.100") || len(cp2.Mirrors) != 1 {
		t.Errorf("cp2: %+v", cp2)
	}
	k := cp2.Keepalived
	if k == nil || k.Priority != agentapi.VRRPControlPlaneBasePriority-1 || k.VirtualRouterID != 7 || k.AuthPass != "pw" || k.AdvertIntervalMS != 1000 ||
		!slices.Equal(k.Peers, []netip.Addr{a("10.0.0.11"), app}) {
		t.Errorf("cp2 keepalived: %+v (want priority %d, peers cp1's control-plane address and the appliance)", k, agentapi.VRRPControlPlaneBasePriority-1)
	}
	if w, _ := NodeConfigFor(c, c.Nodes[3], app, nil, v, nil, nil); w.Keepalived != nil || w.Mirrors == nil {
		t.Errorf("worker: %+v", w)
	}
	off := false
	c.APIServer.Keepalived.Enabled = &off
	if cp, _ := NodeConfigFor(c, c.Nodes[0], app, nil, v, nil, nil); cp.Keepalived != nil {
		t.Errorf("keepalived disabled, yet cp1 got %+v", cp.Keepalived)
	}
}

// TestNodeConfigForKubernetes: kubeadm actions and their order, secrets only where kubeadm needs them,
// one pod range per node and routes to the others via their workload-plane addresses.
func TestNodeConfigForKubernetes(t *testing.T) {
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	ca, _, err := pki.EnsureCA(dir, "kubernetes", now)
	if err != nil {
		t.Fatal(err)
	}
	secrets, _, err := pki.EnsureKubeadmSecrets(dir, pki.BootstrapTokenTTL, now)
	if err != nil {
		t.Fatal(err)
	}
	c := &config.BootstrapConfiguration{
		ClusterName:       "lab",
		KubernetesVersion: "v1.37.2",
		Kubernetes:        config.Kubernetes{IgnorePreflightErrors: []string{"SystemVerification"}},
		Networks: config.Networks{
			ControlPlane:  config.NetworkPlane{CIDRs: []netip.Prefix{p("10.100.0.0/24")}},
			WorkloadPlane: config.NetworkPlane{CIDRs: []netip.Prefix{p("10.200.0.0/24")}},
			Pods:          p("10.233.0.0/16"),
			Services:      p("10.96.0.0/16"),
		},
		APIServer: config.APIServer{VIP: a("10.100.0.100"), Port: 6443},
	}
	for i, name := range []string{"cp1", "cp2", "cp3", "w1"} {
		role := config.RoleControlPlane
		if name == "w1" {
			role = config.RoleWorker
		}
		c.Nodes = append(c.Nodes, config.Node{Name: name, Roles: []config.Role{role},
			Addresses: []netip.Addr{a(fmt.Sprintf("10.100.0.%d", 11+i)), a(fmt.Sprintf("10.200.0.%d", 11+i))}})
	}
	cluster := &ClusterSecrets{CA: ca, Kubeadm: secrets}
	want := []struct{ action, after, podCIDR string }{
		{agentapi.ActionInit, "", "10.233.0.0/24"},
		{agentapi.ActionJoinControlPlane, "cp1", "10.233.1.0/24"},
		{agentapi.ActionJoinControlPlane, "cp2", "10.233.2.0/24"},
		{agentapi.ActionJoin, "cp1", "10.233.3.0/24"},
	}
	for i, n := range c.Nodes {
		nc, err := NodeConfigFor(c, n, a("10.100.0.2"), ca.CertPEM, VRRP{VirtualRouterID: 7, AuthPass: "pw", AdvertInterval: time.Second}, nil, cluster)
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		k := nc.Kubernetes
		if k == nil {
			t.Fatalf("%s: no kubernetes config", n.Name)
		}
		if k.Action != want[i].action || k.After != want[i].after || k.PodCIDR != p(want[i].podCIDR) {
			t.Errorf("%s: action %q after %q pod CIDR %s, want %+v", n.Name, k.Action, k.After, k.PodCIDR, want[i])
		}
		wantToken := secrets.BootstrapToken // the control planes' join token
		if n.Name == "w1" {
			wantToken = secrets.NodeBootstrapToken("w1") // a worker's own
		}
		if k.ControlPlaneEndpoint != "10.100.0.100:6443" || k.BootstrapToken != wantToken ||
			!k.BootstrapTokenExpires.Equal(now.Add(pki.BootstrapTokenTTL)) || len(k.CACertHashes) != 1 || k.CACertHashes[0] != agentapi.PinOf(ca.Cert) {
			t.Errorf("%s: endpoint %q token/expiry/hashes wrong: %+v", n.Name, k.ControlPlaneEndpoint, k)
		}
		if (k.CAKeyPEM != "") != (i == 0) {
			t.Errorf("%s: CA key handed out = %v, want only to the first control plane", n.Name, k.CAKeyPEM != "")
		}
		if (k.CertificateKey != "") != (i < 3) {
			t.Errorf("%s: certificate key handed out = %v, want control planes only", n.Name, k.CertificateKey != "")
		}
		// The workers' tokens go to the leader (cp1), which creates them in the cluster, and to no
		// one else.
		wantWorkers := []agentapi.NodeBootstrapToken(nil)
		if i == 0 {
			wantWorkers = []agentapi.NodeBootstrapToken{{Node: "w1", Token: secrets.NodeBootstrapToken("w1")}}
		}
		if !slices.Equal(k.NodeBootstrapTokens, wantWorkers) {
			t.Errorf("%s: worker tokens %v, want %v", n.Name, k.NodeBootstrapTokens, wantWorkers)
		}
		if len(k.PodRoutes) != 3 || slices.ContainsFunc(k.PodRoutes, func(r agentapi.PodRoute) bool { return r.Node == n.Name }) {
			t.Errorf("%s: pod routes %+v, want the 3 other nodes", n.Name, k.PodRoutes)
		}
		for _, r := range k.PodRoutes {
			if !p("10.200.0.0/24").Contains(r.Via) {
				t.Errorf("%s: route %+v not via a workload-plane address", n.Name, r)
			}
		}
		if !slices.Equal(k.APIServerCertSANs, []string{"10.100.0.100", "10.100.0.11", "10.200.0.11", "10.100.0.12", "10.200.0.12", "10.100.0.13", "10.200.0.13"}) {
			t.Errorf("%s: SANs %v", n.Name, k.APIServerCertSANs)
		}
	}
	// With a DNS zone the API's DNS names join the SANs (the records pkg/dnsrecords serves).
	c.BaseDomain = "example.test"
	nc, err := NodeConfigFor(c, c.Nodes[0], a("10.100.0.2"), ca.CertPEM, VRRP{VirtualRouterID: 7, AuthPass: "pw", AdvertInterval: time.Second}, nil, cluster)
	if err != nil {
		t.Fatal(err)
	}
	zone := c.ClusterName + ".example.test"
	if sans := nc.Kubernetes.APIServerCertSANs; !slices.Contains(sans, "api."+zone) || !slices.Contains(sans, "api-int."+zone) {
		t.Errorf("with baseDomain: SANs %v, want api.%s and api-int.%s among them", sans, zone, zone)
	}
	if _, err := NodeConfigFor(c, c.Nodes[0], a("10.100.0.2"), ca.CertPEM, VRRP{VirtualRouterID: 7, AuthPass: "pw", AdvertInterval: time.Second}, nil, nil); err == nil {
		t.Error("kubernetes enabled without cluster secrets: no error")
	}
}

func TestNthSubnet(t *testing.T) {
	for _, tc := range []struct {
		pods string
		i    int
		want string
	}{
		{"10.233.0.0/16", 0, "10.233.0.0/24"},
		{"10.233.0.0/16", 255, "10.233.255.0/24"},
		{"10.232.0.0/14", 256, "10.233.0.0/24"},
		{"fd00:10::/48", 3, "fd00:10:0:3::/64"},
	} {
		got, err := nthSubnet(netip.MustParsePrefix(tc.pods), tc.i)
		if err != nil || got != netip.MustParsePrefix(tc.want) {
			t.Errorf("nthSubnet(%s, %d) = %s, %v; want %s", tc.pods, tc.i, got, err, tc.want)
		}
	}
	if _, err := nthSubnet(netip.MustParsePrefix("10.233.0.0/16"), 256); err == nil {
		t.Error("nthSubnet past the end: no error")
	}
}

// TestApplianceFirewallDNS: the bootstrap host opens the DNS port only when it answers the zone.
func TestApplianceFirewallDNS(t *testing.T) {
	c := &config.BootstrapConfiguration{}
	if ApplianceFirewall(c).DNS {
		t.Error("without dns.listenAddress the appliance firewall opens the DNS port")
	}
	c.DNS.ListenAddress = netip.MustParseAddr("10.100.0.2")
	if !ApplianceFirewall(c).DNS {
		t.Error("with dns.listenAddress the appliance firewall does not open the DNS port")
	}
}

// TestApplianceFirewallBoot: the bootstrap host opens the network-boot ports only with boot.dhcp
// proxy or server, the proxyDHCP port only with proxy, and boot.httpPort as the boot HTTP port.
func TestApplianceFirewallBoot(t *testing.T) {
	for _, c := range []struct {
		dhcp        config.BootDHCP
		boot, proxy bool
		port        uint16
	}{
		{config.BootDHCPOff, false, false, 0},
		{config.BootDHCPServer, true, false, 8081},
		{config.BootDHCPProxy, true, true, 8081},
	} {
		cfg := &config.BootstrapConfiguration{Boot: config.Boot{DHCP: c.dhcp, HTTPPort: 8081}}
		s := ApplianceFirewall(cfg)
		if s.Boot != c.boot || s.BootProxy != c.proxy || s.BootHTTPPort != c.port {
			t.Errorf("boot.dhcp %s: Boot %t BootProxy %t BootHTTPPort %d, want %t %t %d", c.dhcp, s.Boot, s.BootProxy, s.BootHTTPPort, c.boot, c.proxy, c.port)
		}
	}
}
