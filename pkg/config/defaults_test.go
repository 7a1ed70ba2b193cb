package config

import (
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestSetDefaults: a minimal document gets every default, written out here in full.
func TestSetDefaults(t *testing.T) {
	c, err := Decode([]byte(header + `clusterName: lab
networks:
  controlPlane: {cidrs: [10.100.0.0/24, 10.101.0.0/24]}
apiServer: {vip: 10.100.0.100}
bundle: {path: /srv/bundle, publicKeys: ["ed25519:F5qGAfHQhD42ze3bnW9x++RWXOTgEedjaTZhyNyqR0U="]}
nodes:
- name: cp1
  roles: [control-plane]
  addresses: [10.100.0.11]
  mac: "52:54:00:AB:CD:EF"
  power: {kind: ssh, privateKeyFile: /k, knownHostsFile: /kh}
- name: cp2
  roles: [control-plane]
  power: {kind: ssh, address: "fd00::12", privateKeyFile: /k, knownHostsFile: /kh, username: core}
- name: w1
  roles: [worker]
  power: {kind: ipmi, address: bmc-w1.lab, username: admin, passwordFile: /p}
- name: w2
  roles: [worker]
  power: {kind: redfish, address: "https://bmc-w2.lab", username: admin, passwordFile: /p, caFile: /ca, bootDevice: cdrom}
`))
	if err != nil {
		t.Fatal(err)
	}
	SetDefaults(c)
	enabled := true
	want := &BootstrapConfiguration{
		APIVersion:        APIVersion,
		Kind:              Kind,
		ClusterName:       "lab",
		KubernetesVersion: "v1.37.2",
		Kubernetes:        Kubernetes{Enabled: &enabled},
		Networks: Networks{
			ControlPlane:  NetworkPlane{CIDRs: pfx("10.100.0.0/24", "10.101.0.0/24")},
			WorkloadPlane: NetworkPlane{CIDRs: pfx("10.100.0.0/24", "10.101.0.0/24")},
			Pods:          netip.MustParsePrefix("10.233.0.0/16"),
			Services:      netip.MustParsePrefix("10.96.0.0/12"),
			CNI:           CNIBridge,
		},
		APIServer: APIServer{
			VIP:          addr("10.100.0.100"),
			Port:         6443,
			Keepalived:   Keepalived{Enabled: &enabled, VirtualRouterID: DefaultVirtualRouterID("lab", addr("10.100.0.100")), AdvertInterval: 250 * time.Millisecond},
			LoadBalancer: APILoadBalancer{Enabled: &enabled},
		},
		Bundle:   Bundle{Path: "/srv/bundle", PublicKeys: []string{"ed25519:F5qGAfHQhD42ze3bnW9x++RWXOTgEedjaTZhyNyqR0U="}},
		Server:   Server{ListenAddress: addr("0.0.0.0"), Port: 8443},
		StateDir: "/var/lib/appliance",
		Nodes: []Node{
			{Name: "cp1", Roles: []Role{RoleControlPlane}, Addresses: []netip.Addr{addr("10.100.0.11")}, MAC: "52:54:00:ab:cd:ef",
				Power: Power{Kind: PowerSSH, Address: "10.100.0.11:22", Username: "root", PrivateKeyFile: "/k", KnownHostsFile: "/kh"}},
			{Name: "cp2", Roles: []Role{RoleControlPlane},
				Power: Power{Kind: PowerSSH, Address: "[fd00::12]:22", Username: "core", PrivateKeyFile: "/k", KnownHostsFile: "/kh"}},
			{Name: "w1", Roles: []Role{RoleWorker},
				Power: Power{Kind: PowerIPMI, Address: "bmc-w1.lab:623", Username: "admin", PasswordFile: "/p", BootDevice: BootPXE}},
			{Name: "w2", Roles: []Role{RoleWorker},
				Power: Power{Kind: PowerRedfish, Address: "https://bmc-w2.lab", Username: "admin", PasswordFile: "/p", CAFile: "/ca", BootDevice: BootCDROM}},
		},
		Boot: Boot{DHCP: BootDHCPOff, NodeISO: "/srv/bundle/netboot/node-amd64.iso",
			Enrolment: Enrolment{Approval: EnrolApprovalAutomatic, SourceAddress: EnrolSourceAny}}, // no node has both a mac and a pxe-booting BMC; the ISO path is defaulted whatever dhcp is
	}
	if diff := cmp.Diff(want, c, cmpConfig...); diff != "" {
		t.Errorf("SetDefaults (-want +got):\n%s", diff)
	}
	// The workloadPlane default is a copy, not an alias of controlPlane's slice.
	c.Networks.WorkloadPlane.CIDRs[0] = netip.MustParsePrefix("10.200.0.0/24")
	if c.Networks.ControlPlane.CIDRs[0].String() != "10.100.0.0/24" {
		t.Error("workloadPlane.cidrs aliases controlPlane.cidrs")
	}
}

// TestSetDefaultsIdempotentAndKeepsSetValues: running it again changes nothing, and set values
// (including malformed ones, which Validate must see as written) survive.
func TestSetDefaultsIdempotentAndKeepsSetValues(t *testing.T) {
	disabled := false
	c := &BootstrapConfiguration{
		KubernetesVersion: "v1.33.1",
		Networks:          Networks{Pods: netip.MustParsePrefix("192.168.0.0/16")},
		APIServer:         APIServer{Port: 7443, Keepalived: Keepalived{Enabled: &disabled, VirtualRouterID: 7}},
		Server:            Server{ListenAddress: addr("10.0.0.1"), Port: 9443},
		StateDir:          "/state",
		Nodes: []Node{
			{MAC: "not-a-mac", Power: Power{Kind: PowerIPMI, Address: "bad host", BootDevice: BootDisk}},
			{Power: Power{Kind: PowerSSH, Address: "[fd00::1]"}},
			{Power: Power{Kind: PowerSSH, Address: "a:b:c:d:e:f:g:h:i"}},
		},
	}
	SetDefaults(c)
	once := *c
	once.Nodes = append([]Node(nil), c.Nodes...)
	SetDefaults(c)
	if diff := cmp.Diff(&once, c, cmpConfig...); diff != "" {
		t.Errorf("second SetDefaults changed (-first +second):\n%s", diff)
	}
	checks := []struct{ name, got, want string }{
		{"kubernetesVersion", c.KubernetesVersion, "v1.33.1"},
		{"pods", c.Networks.Pods.String(), "192.168.0.0/16"},
		{"apiServer.port", itoa(c.APIServer.Port), "7443"},
		{"keepalived.enabled", boolStr(*c.APIServer.Keepalived.Enabled), "false"},
		{"virtualRouterID", itoa(uint16(c.APIServer.Keepalived.VirtualRouterID)), "7"},
		{"server.listenAddress", c.Server.ListenAddress.String(), "10.0.0.1"},
		{"server.port", itoa(c.Server.Port), "9443"},
		{"stateDir", c.StateDir, "/state"},
		{"malformed mac", c.Nodes[0].MAC, "not-a-mac"},
		{"malformed ipmi address", c.Nodes[0].Power.Address, "bad host"},
		{"bootDevice", string(c.Nodes[0].Power.BootDevice), "disk"},
		{"bracketed IPv6 ssh address", c.Nodes[1].Power.Address, "[fd00::1]:22"},
		{"malformed ssh address", c.Nodes[2].Power.Address, "a:b:c:d:e:f:g:h:i"},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %q, want %q", ch.name, ch.got, ch.want)
		}
	}
	SetDefaults(nil) // must not panic
}

func itoa(v uint16) string { return strconv.Itoa(int(v)) }

func boolStr(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

func TestNodeRoleHelpers(t *testing.T) {
	c := &BootstrapConfiguration{Nodes: []Node{
		{Name: "a", Roles: []Role{RoleControlPlane}},
		{Name: "b", Roles: []Role{RoleWorker}},
		{Name: "c", Roles: []Role{RoleControlPlane, RoleWorker}},
	}}
	names := func(ns []Node) (out []string) {
		for _, n := range ns {
			out = append(out, n.Name)
		}
		return out
	}
	if got := names(c.ControlPlaneNodes()); !cmp.Equal(got, []string{"a", "c"}) {
		t.Errorf("ControlPlaneNodes = %v", got)
	}
	if got := names(c.WorkerNodes()); !cmp.Equal(got, []string{"b", "c"}) {
		t.Errorf("WorkerNodes = %v", got)
	}
	f, tr := false, true
	for _, tt := range []struct {
		k    Keepalived
		want bool
	}{{Keepalived{}, true}, {Keepalived{Enabled: &tr}, true}, {Keepalived{Enabled: &f}, false}} {
		if got := tt.k.IsEnabled(); got != tt.want {
			t.Errorf("IsEnabled(%v) = %v", tt.k.Enabled, got)
		}
	}
}
