package config

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func pfx(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func boolPtr(b bool) *bool { return &b }

// TestValidateErrors mutates the valid lab configuration one way per case and asserts the exact set of
// error paths Validate returns, and that the first listed path's message says what it must.
func TestValidateErrors(t *testing.T) {
	hostKey, _ := testHostKey(t)
	redfish := func(c *BootstrapConfiguration) *Power {
		p := &c.Nodes[3].Power
		*p = Power{Kind: PowerRedfish, Address: "https://10.100.0.121", Username: "admin", PasswordFile: "/p", CAFile: "/ca.pem"}
		return p
	}
	tests := []struct {
		name   string
		mutate func(c *BootstrapConfiguration)
		paths  []string // every error path, any order; the first is checked for msg
		msg    string
	}{
		{"valid lab", func(c *BootstrapConfiguration) {}, nil, ""},
		{"valid host", func(c *BootstrapConfiguration) {
			c.Host = Host{Interfaces: []HostInterface{{Name: "ens3", Addresses: pfx("10.100.0.2/24")},
				{MACAddress: "52:54:00:12:34:56", Addresses: pfx("10.200.0.2/24"), Gateway: netip.MustParseAddr("10.200.0.1")}},
				StateDevice: "/dev/vdb", AutoBootstrap: true}
		}, nil, ""},
		{"host interface without selector", func(c *BootstrapConfiguration) {
			c.Host.Interfaces = []HostInterface{{Addresses: pfx("10.100.0.2/24")}}
		}, []string{"host.interfaces[0]"}, "set name (e.g. ens3) or macAddress"},
		{"host interface bad MAC and no address in the control plane", func(c *BootstrapConfiguration) {
			c.Host.Interfaces = []HostInterface{{MACAddress: "52:54:00", Addresses: pfx("10.200.0.2/24")}}
		}, []string{"host.interfaces[0].macAddress", "host.interfaces"}, "is not a MAC address"},
		{"host address is a network", func(c *BootstrapConfiguration) {
			c.Host.Interfaces = []HostInterface{{Name: "ens3", Addresses: pfx("10.100.0.0/24")}}
		}, []string{"host.interfaces[0].addresses[0]"}, "is a network, not a host address"},
		{"host stateDevice not under /dev", func(c *BootstrapConfiguration) { c.Host.StateDevice = "sdb" },
			[]string{"host.stateDevice"}, "absolute path under /dev"},
		{"host ssh key", func(c *BootstrapConfiguration) { c.Host.SSHAuthorizedKeys = []string{"ssh-ed25519 nope"} },
			[]string{"host.sshAuthorizedKeys[0]"}, "is not an OpenSSH public key line"},
		{"wrong apiVersion", func(c *BootstrapConfiguration) { c.APIVersion = "appliance.airgap.dev/v1" },
			[]string{"apiVersion"}, "set apiVersion: appliance.airgap.dev/v1alpha1"},
		{"wrong kind", func(c *BootstrapConfiguration) { c.Kind = "ClusterConfiguration" },
			[]string{"kind"}, "set kind: BootstrapConfiguration"},
		{"missing clusterName", func(c *BootstrapConfiguration) { c.ClusterName = "" },
			[]string{"clusterName"}, "is required"},
		{"clusterName not a label", func(c *BootstrapConfiguration) { c.ClusterName = "Lab.one" },
			[]string{"clusterName"}, "DNS-1123 label"},
		{"bad kubernetesVersion", func(c *BootstrapConfiguration) { c.KubernetesVersion = "1.37" },
			[]string{"kubernetesVersion"}, "vMAJOR.MINOR.PATCH"},
		{"no controlPlane CIDR", func(c *BootstrapConfiguration) {
			c.Networks.ControlPlane.CIDRs = nil
			for i := range c.Nodes {
				c.Nodes[i].Addresses = nil
				c.Nodes[i].Power.Address = "10.200.0.1:22"
			}
		}, []string{"networks.controlPlane.cidrs"}, "at least one CIDR is required"},
		{"host bits in controlPlane CIDR", func(c *BootstrapConfiguration) { c.Networks.ControlPlane.CIDRs = pfx("10.100.0.1/24") },
			[]string{"networks.controlPlane.cidrs[0]"}, `"10.100.0.1/24" has host bits set: use 10.100.0.0/24`},
		{"host bits in pods", func(c *BootstrapConfiguration) { c.Networks.Pods = netip.MustParsePrefix("10.233.1.0/16") },
			[]string{"networks.pods"}, "use 10.233.0.0/16"},
		{"duplicate workloadPlane CIDR", func(c *BootstrapConfiguration) {
			c.Networks.WorkloadPlane.CIDRs = pfx("10.200.0.0/24", "10.200.0.0/24")
		},
			[]string{"networks.workloadPlane.cidrs[1]"}, "listed twice"},
		{"controlPlane and workloadPlane may overlap", func(c *BootstrapConfiguration) {
			c.Networks.WorkloadPlane.CIDRs = pfx("10.100.0.0/16", "10.200.0.0/24")
		}, nil, ""},
		{"pods overlap services", func(c *BootstrapConfiguration) { c.Networks.Pods = netip.MustParsePrefix("10.96.0.0/14") },
			[]string{"networks.services"}, "overlaps networks.pods 10.96.0.0/14"},
		{"pods overlap controlPlane", func(c *BootstrapConfiguration) { c.Networks.Pods = netip.MustParsePrefix("10.100.0.0/16") },
			[]string{"networks.pods"}, "overlaps networks.controlPlane.cidrs[0] 10.100.0.0/24"},
		{"services overlap workloadPlane", func(c *BootstrapConfiguration) { c.Networks.Services = netip.MustParsePrefix("10.200.0.0/16") },
			[]string{"networks.services"}, "overlaps networks.workloadPlane.cidrs[0] 10.200.0.0/24"},
		{"default services overlap lab controlPlane", func(c *BootstrapConfiguration) { c.Networks.Services = netip.MustParsePrefix(DefaultServicesCIDR) },
			[]string{"networks.services"}, "overlaps networks.controlPlane.cidrs[0]"},
		{"services larger than /12", func(c *BootstrapConfiguration) { c.Networks.Services = netip.MustParsePrefix("100.0.0.0/8") },
			[]string{"networks.services"}, "at most a /12"},
		{"pods smaller than a node range", func(c *BootstrapConfiguration) { c.Networks.Pods = netip.MustParsePrefix("10.233.0.0/25") },
			[]string{"networks.pods"}, "each node gets a /24"},
		{"pods too small for the nodes", func(c *BootstrapConfiguration) { c.Networks.Pods = netip.MustParsePrefix("10.233.0.0/23") },
			[]string{"networks.pods"}, "holds 2 node ranges (/24 each) but there are 4 nodes"},
		{"mixed families", func(c *BootstrapConfiguration) { c.Networks.Services = netip.MustParsePrefix("fd00:96::/112") },
			[]string{"networks.services"}, "fd00:96::/112 is IPv6: the appliance supports IPv4 networks only"},
		{"VIP missing with keepalived", func(c *BootstrapConfiguration) { c.APIServer.VIP = netip.Addr{} },
			[]string{"apiServer.vip"}, "is required when apiServer.keepalived.enabled is true"},
		{"VIP outside controlPlane", func(c *BootstrapConfiguration) { c.APIServer.VIP = addr("10.200.0.100") },
			[]string{"apiServer.vip"}, "outside every networks.controlPlane.cidrs (10.100.0.0/24)"},
		{"VIP is network address", func(c *BootstrapConfiguration) { c.APIServer.VIP = addr("10.100.0.0") },
			[]string{"apiServer.vip"}, "network address of 10.100.0.0/24"},
		{"VIP is broadcast address", func(c *BootstrapConfiguration) { c.APIServer.VIP = addr("10.100.0.255") },
			[]string{"apiServer.vip"}, "broadcast address of 10.100.0.0/24"},
		{"VIP multicast", func(c *BootstrapConfiguration) { c.APIServer.VIP = addr("224.0.0.18") },
			[]string{"apiServer.vip"}, "not a unicast address"},
		{"VIP anywhere without keepalived", func(c *BootstrapConfiguration) {
			c.APIServer.Keepalived.Enabled = boolPtr(false)
			c.APIServer.VIP = addr("192.0.2.10")
		}, nil, ""},
		{"VIP equals a node address", func(c *BootstrapConfiguration) { c.APIServer.VIP = addr("10.100.0.12") },
			[]string{"nodes[1].addresses[0]"}, "is the API server VIP (apiServer.vip)"},
		{"control plane without a control-plane address", func(c *BootstrapConfiguration) {
			c.Nodes[1].Addresses = []netip.Addr{addr("10.200.0.12")}
		}, []string{"nodes[1].addresses"}, "keepalived's unicast peers and every firewall's VRRP rule list each control plane by that address"},
		{"virtualRouterID 0", func(c *BootstrapConfiguration) { c.APIServer.Keepalived.VirtualRouterID = 0 },
			[]string{"apiServer.keepalived.virtualRouterID"}, "out of range: use 1..255"},
		{"apiServer port unset", func(c *BootstrapConfiguration) { c.APIServer.Port = 0 },
			[]string{"apiServer.port"}, "is required"},
		{"server names", func(c *BootstrapConfiguration) { c.Server.Names = []string{"ok.lab", "Not_OK", "ok.lab"} },
			[]string{"server.names[1]", "server.names[2]"}, "is not a DNS name"},
		{"server listenAddress multicast", func(c *BootstrapConfiguration) { c.Server.ListenAddress = addr("239.1.1.1") },
			[]string{"server.listenAddress"}, "cannot be listened on"},
		{"relative stateDir", func(c *BootstrapConfiguration) { c.StateDir = "state" },
			[]string{"stateDir"}, "is not absolute"},
		{"missing bundle path", func(c *BootstrapConfiguration) { c.Bundle.Path = "" },
			[]string{"bundle.path"}, "is required"},
		{"no bundle key pinned", func(c *BootstrapConfiguration) { c.Bundle.PublicKeys, c.Bundle.PublicKeyFiles = nil, nil },
			[]string{"bundle.publicKeys"}, "is required: pin the public key"},
		{"bundle key not ed25519", func(c *BootstrapConfiguration) { c.Bundle.PublicKeys = []string{"ssh-ed25519 AAAA"} },
			[]string{"bundle.publicKeys[0]"}, `does not start with "ed25519:"`},
		{"bundle key too short", func(c *BootstrapConfiguration) { c.Bundle.PublicKeys = []string{"ed25519:AAAA"} },
			[]string{"bundle.publicKeys[0]"}, "is not the base64 of a 32-byte Ed25519 public key"},
		{"empty ignition entry", func(c *BootstrapConfiguration) { c.Ignition.Worker = []string{""}; c.Nodes[0].Ignition = []string{""} },
			[]string{"ignition.worker[0]", "nodes[0].ignition[0]"}, "is empty"},
		{"no nodes", func(c *BootstrapConfiguration) { c.Nodes = nil },
			[]string{"nodes"}, "at least one needs roles: [control-plane]"},
		{"no control plane", func(c *BootstrapConfiguration) {
			for i := range c.Nodes {
				c.Nodes[i].Roles = []Role{RoleWorker}
			}
		}, []string{"nodes"}, "no node has role control-plane"},
		{"duplicate node name", func(c *BootstrapConfiguration) { c.Nodes[3].Name = "cp1" },
			[]string{"nodes[3].name"}, `"cp1" is also nodes[0].name`},
		{"bad node name", func(c *BootstrapConfiguration) { c.Nodes[3].Name = "W_1" },
			[]string{"nodes[3].name"}, "DNS-1123 subdomain"},
		{"missing node name", func(c *BootstrapConfiguration) { c.Nodes[3].Name = "" },
			[]string{"nodes[3].name"}, "is required"},
		{"duplicate node address", func(c *BootstrapConfiguration) { c.Nodes[3].Addresses = []netip.Addr{addr("10.200.0.12")} },
			[]string{"nodes[3].addresses[0]"}, "is also nodes[1].addresses[1]"},
		{"node address outside node networks", func(c *BootstrapConfiguration) { c.Nodes[3].Addresses = []netip.Addr{addr("192.168.1.21")} },
			[]string{"nodes[3].addresses[0]"}, "outside every networks.controlPlane.cidrs and networks.workloadPlane.cidrs"},
		{"bad MAC", func(c *BootstrapConfiguration) { c.Nodes[0].MAC = "52:54:00:zz:00:11" },
			[]string{"nodes[0].mac"}, "is not a MAC address"},
		{"EUI-64 MAC", func(c *BootstrapConfiguration) { c.Nodes[0].MAC = "02:00:5e:10:00:00:00:01" },
			[]string{"nodes[0].mac"}, "six hex octets"},
		{"multicast MAC", func(c *BootstrapConfiguration) { c.Nodes[0].MAC = "01:00:5e:00:00:01" },
			[]string{"nodes[0].mac"}, "multicast"},
		{"duplicate MAC ignoring case", func(c *BootstrapConfiguration) {
			c.Nodes[0].MAC = "52:54:00:00:00:AA"
			c.Nodes[2].MAC = "52-54-00-00-00-aa"
		}, []string{"nodes[2].mac"}, "is also nodes[0].mac"},
		{"valid system UUID on a BMC node", func(c *BootstrapConfiguration) { c.Nodes[3].SystemUUID = "4C4C4544-0042-3510-8052-B2C04F4D3732" }, nil, ""},
		{"system UUID not a UUID", func(c *BootstrapConfiguration) { c.Nodes[3].SystemUUID = "4c4c4544-0042-3510-8052-b2c04f" },
			[]string{"nodes[3].systemUUID"}, "is not a UUID: write the SMBIOS system UUID as 8-4-4-4-12 hex digits"},
		{"system UUID in braces", func(c *BootstrapConfiguration) { c.Nodes[3].SystemUUID = "{4c4c4544-0042-3510-8052-b2c04f4d3732}" },
			[]string{"nodes[3].systemUUID"}, "is not a UUID"},
		{"system UUID on an ssh node", func(c *BootstrapConfiguration) { c.Nodes[0].SystemUUID = "4c4c4544-0042-3510-8052-b2c04f4d3732" },
			[]string{"nodes[0].systemUUID"}, `is set but power.kind is "ssh": only BMC-powered nodes`},
		{"duplicate system UUID ignoring case", func(c *BootstrapConfiguration) {
			c.Nodes[2].Power = c.Nodes[3].Power
			c.Nodes[2].Power.Address = "10.100.0.122"
			c.Nodes[2].SystemUUID = "4C4C4544-0042-3510-8052-B2C04F4D3732"
			c.Nodes[3].SystemUUID = "4c4c4544-0042-3510-8052-b2c04f4d3732"
		}, []string{"nodes[3].systemUUID"}, "is also nodes[2].systemUUID"},
		{"no roles", func(c *BootstrapConfiguration) { c.Nodes[3].Roles = nil },
			[]string{"nodes[3].roles"}, "is required"},
		{"unknown role", func(c *BootstrapConfiguration) { c.Nodes[3].Roles = []Role{"master"} },
			[]string{"nodes[3].roles[0]"}, `"master" is not a role`},
		{"duplicate role", func(c *BootstrapConfiguration) { c.Nodes[3].Roles = []Role{RoleWorker, RoleWorker} },
			[]string{"nodes[3].roles[1]"}, "listed twice"},
		{"no power", func(c *BootstrapConfiguration) { c.Nodes[3].Power = Power{} },
			[]string{"nodes[3].power"}, "is required"},
		{"power without kind", func(c *BootstrapConfiguration) { c.Nodes[3].Power.Kind = "" },
			[]string{"nodes[3].power.kind"}, "is required"},
		{"unknown power kind", func(c *BootstrapConfiguration) { c.Nodes[3].Power.Kind = "wol" },
			[]string{"nodes[3].power.kind"}, `"wol" is not a power kind`},
		{"ssh without private key", func(c *BootstrapConfiguration) { c.Nodes[0].Power.PrivateKeyFile = "" },
			[]string{"nodes[0].power.privateKeyFile"}, "is required for kind ssh"},
		{"ssh without pinned host key", func(c *BootstrapConfiguration) { c.Nodes[0].Power.KnownHostsFile = "" },
			[]string{"nodes[0].power.hostKey"}, "no trust on first use"},
		{"ssh with hostKey only", func(c *BootstrapConfiguration) {
			c.Nodes[0].Power.KnownHostsFile = ""
			c.Nodes[0].Power.HostKey = hostKey
		}, nil, ""},
		{"ssh with malformed hostKey", func(c *BootstrapConfiguration) { c.Nodes[0].Power.HostKey = "ssh-ed25519 AAAAnotbase64!" },
			[]string{"nodes[0].power.hostKey"}, "is not an SSH public key"},
		{"ssh hostKey with options", func(c *BootstrapConfiguration) { c.Nodes[0].Power.HostKey = `no-pty ` + hostKey },
			[]string{"nodes[0].power.hostKey"}, "options"},
		{"ssh hostKey with two keys", func(c *BootstrapConfiguration) { c.Nodes[0].Power.HostKey = hostKey + "\n" + hostKey },
			[]string{"nodes[0].power.hostKey"}, "more than one key"},
		{"ssh without address", func(c *BootstrapConfiguration) {
			c.Nodes[0].Power.Address = ""
			c.Nodes[0].Addresses = nil
			c.Kubernetes.Enabled = new(false)           // else the missing workload-plane address is refused too
			c.APIServer.Keepalived.Enabled = new(false) // else the missing control-plane address is refused too
		}, []string{"nodes[0].power.address"}, "or give the node an address in nodes[0].addresses"},
		{"ssh bad address", func(c *BootstrapConfiguration) { c.Nodes[0].Power.Address = "cp 1:22" },
			[]string{"nodes[0].power.address"}, "is not host or host:port"},
		{"ssh bad port", func(c *BootstrapConfiguration) { c.Nodes[0].Power.Address = "cp1.lab:99999" },
			[]string{"nodes[0].power.address"}, "invalid port"},
		{"ssh without username", func(c *BootstrapConfiguration) { c.Nodes[0].Power.Username = "" },
			[]string{"nodes[0].power.username"}, "is required for kind ssh"},
		{"ssh with BMC fields", func(c *BootstrapConfiguration) {
			p := &c.Nodes[0].Power
			p.BootDevice, p.PasswordFile, p.CAFile, p.InsecureSkipVerify = BootPXE, "/p", "/ca", true
		}, []string{"nodes[0].power.bootDevice", "nodes[0].power.caFile", "nodes[0].power.insecureSkipVerify", "nodes[0].power.passwordFile"}, "is not used by kind ssh: remove it"},
		{"ipmi missing fields", func(c *BootstrapConfiguration) { c.Nodes[3].Power = Power{Kind: PowerIPMI} },
			[]string{"nodes[3].power.address", "nodes[3].power.passwordFile", "nodes[3].power.username"}, "is required for kind ipmi"},
		{"ipmi bad bootDevice", func(c *BootstrapConfiguration) { c.Nodes[3].Power.BootDevice = "usb" },
			[]string{"nodes[3].power.bootDevice"}, `"usb" is not a boot device: use pxe, cdrom or disk`},
		{"ipmi with ssh fields", func(c *BootstrapConfiguration) {
			c.Nodes[3].Power.PrivateKeyFile = "/k"
			c.Nodes[3].Power.HostKey = hostKey
		},
			[]string{"nodes[3].power.hostKey", "nodes[3].power.privateKeyFile"}, "is not used by kind ipmi"},
		{"ipmi with TLS fields", func(c *BootstrapConfiguration) { c.Nodes[3].Power.CAFile = "/ca" },
			[]string{"nodes[3].power.caFile"}, "is not used by kind ipmi"},
		{"redfish valid", func(c *BootstrapConfiguration) { redfish(c) }, nil, ""},
		{"redfish http URL", func(c *BootstrapConfiguration) { redfish(c).Address = "http://10.100.0.121" },
			[]string{"nodes[3].power.address"}, "is not an https:// URL"},
		{"redfish bare host", func(c *BootstrapConfiguration) { redfish(c).Address = "10.100.0.121" },
			[]string{"nodes[3].power.address"}, "is not an https:// URL"},
		{"redfish URL with credentials", func(c *BootstrapConfiguration) { redfish(c).Address = "https://root:pw@bmc" },
			[]string{"nodes[3].power.address"}, "carries credentials"},
		{"redfish without CA", func(c *BootstrapConfiguration) { redfish(c).CAFile = "" },
			[]string{"nodes[3].power.caFile"}, "is required for kind redfish"},
		{"redfish CA and insecure", func(c *BootstrapConfiguration) { redfish(c).InsecureSkipVerify = true },
			[]string{"nodes[3].power.insecureSkipVerify"}, "contradicts caFile"},
		{"redfish missing credentials", func(c *BootstrapConfiguration) { p := redfish(c); p.Username, p.PasswordFile = "", "" },
			[]string{"nodes[3].power.passwordFile", "nodes[3].power.username"}, "is required for kind redfish"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := labConfig(t)
			tt.mutate(c)
			_, errs := Validate(c, ValidateOptions{})
			got := errPaths(errs)
			want := slices.Clone(tt.paths)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("error paths = %q, want %q; errors:\n%v", got, want, errs)
			}
			if len(tt.paths) > 0 {
				if e := findErr(errs, tt.paths[0]); !strings.Contains(e.Msg, tt.msg) {
					t.Errorf("%s: message %q does not contain %q", e.Path, e.Msg, tt.msg)
				}
			}
		})
	}
}

func TestValidateWarnings(t *testing.T) {
	cpNode := func(name, ip string) Node {
		n := labConfig(t).Nodes[0]
		n.Name, n.Addresses, n.Power.Address = name, []netip.Addr{addr(ip), addr(strings.Replace(ip, "10.100.", "10.200.", 1))}, ip+":22"
		return n
	}
	tests := []struct {
		name   string
		mutate func(c *BootstrapConfiguration)
		path   string // "" for no warning
		msg    string
	}{
		{"three control planes", func(c *BootstrapConfiguration) {}, "", ""},
		{"one control plane", func(c *BootstrapConfiguration) { c.Nodes = c.Nodes[:1] }, "", ""},
		{"two control planes", func(c *BootstrapConfiguration) { c.Nodes = c.Nodes[:2] }, "nodes", "2 control-plane nodes: etcd needs a majority (2 of 2) to keep quorum"},
		{"four control planes", func(c *BootstrapConfiguration) { c.Nodes = append(c.Nodes, cpNode("cp4", "10.100.0.14")) },
			"nodes", "use an odd number (3 or 5)"},
		{"redfish insecureSkipVerify", func(c *BootstrapConfiguration) {
			c.Nodes[3].Power = Power{Kind: PowerRedfish, Address: "https://bmc.lab", Username: "admin", PasswordFile: "/p", InsecureSkipVerify: true}
		}, "nodes[3].power.insecureSkipVerify", "TLS verification of the BMC is off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := labConfig(t)
			tt.mutate(c)
			warns, errs := Validate(c, ValidateOptions{})
			if len(errs) > 0 {
				t.Fatalf("unexpected errors:\n%v", errs)
			}
			if tt.path == "" {
				if len(warns) > 0 {
					t.Fatalf("unexpected warnings: %v", ErrorList(warns))
				}
				return
			}
			if len(warns) != 1 || warns[0].Path != tt.path || !strings.Contains(warns[0].Msg, tt.msg) {
				t.Fatalf("warnings = %v, want one at %s containing %q", ErrorList(warns), tt.path, tt.msg)
			}
		})
	}
}

// TestValidateDoesNotMutate: Validate is a pure check.
func TestValidateDoesNotMutate(t *testing.T) {
	c := labConfig(t)
	c.Nodes[0].MAC = "52:54:00:00:00:AA"
	before := *c
	before.Nodes = slices.Clone(c.Nodes)
	Validate(c, ValidateOptions{CheckFiles: true})
	if c.Nodes[0].MAC != before.Nodes[0].MAC || c.StateDir != before.StateDir {
		t.Fatal("Validate changed the configuration")
	}
}

func TestValidateNil(t *testing.T) {
	_, errs := Validate(nil, ValidateOptions{})
	if len(errs) != 1 || !errors.Is(errs, ErrInvalid) {
		t.Fatalf("Validate(nil) = %v, want one error matching ErrInvalid", errs)
	}
}

func TestValidateLinesFromDocument(t *testing.T) {
	c := labConfig(t)
	c.Nodes[2].Name = "cp1" // lab.yaml line 33: "- name: cp3"
	c.Nodes[3].Power.Username = ""
	c.Nodes[3].Power.BootDevice = "usb"
	_, errs := Validate(c, ValidateOptions{})
	requireErr(t, errs, "nodes[2].name", `"cp1" is also nodes[0].name`, 33)
	requireErr(t, errs, "nodes[3].power.username", "is required for kind ipmi", 46)
	// bootDevice is absent from the document: the line is its nearest present ancestor, "power:".
	requireErr(t, errs, "nodes[3].power.bootDevice", "is not a boot device", 43)
}
