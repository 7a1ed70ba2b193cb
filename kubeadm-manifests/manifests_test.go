package kubeadmmanifests_test

import (
	"bytes"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	km "github.com/airgap-appliance/appliance/kubeadm-manifests"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// Fake but well-formed secrets: the golden files are public.
const (
	labToken  = "abcdef.0123456789abcdef"
	labKey    = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	labCAHash = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	// labWorkerToken is w1's own join token, which init creates beside labToken.
	labWorkerToken = "w1w1w1.0123456789abcdef"
)

// labCluster is the lab's cluster (/work/shared/LAB.md): VIP 10.100.0.100, control planes
// 10.100.0.11-13, worker 10.100.0.21.
func labCluster() km.Cluster {
	return km.Cluster{
		Name:                 "lab",
		KubernetesVersion:    "v1.37.2",
		ControlPlaneEndpoint: "10.100.0.100:6443",
		ImageRepository:      "registry.k8s.io",
		PodSubnet:            netip.MustParsePrefix("10.233.0.0/16"),
		ServiceSubnet:        netip.MustParsePrefix("10.96.0.0/16"),
		// Unsorted with a duplicate, to show the rendering sorts and deduplicates.
		APIServerCertSANs: []string{"10.100.0.13", "10.100.0.100", "10.100.0.11", "10.100.0.12", "10.100.0.11"},
		EtcdMembers:       []netip.Addr{netip.MustParseAddr("10.100.0.11"), netip.MustParseAddr("10.100.0.12"), netip.MustParseAddr("10.100.0.13")},
		BootstrapToken:    labToken,
		BootstrapTokenTTL: 2 * time.Hour,
		CertificateKey:    labKey,
		CACertHashes:      []string{labCAHash},
	}
}

func labNode(name, addr string, controlPlane bool) km.Node {
	return km.Node{Name: name, Address: netip.MustParseAddr(addr), ControlPlane: controlPlane}
}

// goldenCases are the lab's three kinds of node configuration, each with its golden file.
var goldenCases = []struct {
	file   string
	render func() ([]byte, error)
}{
	{"init-cp1.yaml", func() ([]byte, error) {
		n := labNode("cp1", "10.100.0.11", true)
		n.IgnorePreflightErrors = []string{"SystemVerification", "Swap"}
		c := labCluster()
		c.NodeBootstrapTokens = []km.NodeToken{{Node: "w1", Token: labWorkerToken}}
		return km.InitConfig(c, n)
	}},
	{"join-cp2.yaml", func() ([]byte, error) { return km.JoinConfig(labCluster(), labNode("cp2", "10.100.0.12", true)) }},
	{"join-w1.yaml", func() ([]byte, error) { return km.JoinConfig(labCluster(), labNode("w1", "10.100.0.21", false)) }},
}

func TestGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.file, func(t *testing.T) {
			got, err := tc.render()
			if err != nil {
				t.Fatal(err)
			}
			again, err := tc.render()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, again) {
				t.Fatalf("rendering twice gave different bytes:\n%s", cmp.Diff(string(got), string(again)))
			}
			path := filepath.Join("testdata", tc.file)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run `go test ./kubeadm-manifests/ -run TestGolden -update` to create it)", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("%s differs from the rendering (-golden +got); rerun with -update if intended:\n%s", path, diff)
			}
		})
	}
}

// TestGoldenContent pins the facts the product depends on, independently of the golden bytes.
func TestGoldenContent(t *testing.T) {
	out, err := goldenCases[0].render()
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	for _, want := range []string{
		"kind: InitConfiguration", "kind: ClusterConfiguration", "kind: KubeletConfiguration", "kind: KubeProxyConfiguration",
		"token: " + labToken, "ttl: 2h0m0s", "certificateKey: " + labKey,
		"advertiseAddress: 10.100.0.11", "bindPort: 6443",
		"criSocket: unix:///run/containerd/containerd.sock",
		"- name: node-ip\n      value: 10.100.0.11",
		"- name: allocate-node-cidrs\n      value: \"false\"",
		// The balancer takes a stopping apiserver out before it stops accepting, and it keeps
		// reaching etcd when its own member stops with it (pkg/haproxy TestStoppingAPIServerLosesNoRequest).
		"apiServer:\n  certSANs:\n    - 10.100.0.100\n    - 10.100.0.11\n    - 10.100.0.12\n    - 10.100.0.13\n  extraArgs:\n    - name: shutdown-delay-duration\n      value: 5s\n" +
			"    - name: etcd-servers\n      value: https://10.100.0.11:2379,https://10.100.0.12:2379,https://10.100.0.13:2379\n",
		"certSANs:\n    - 10.100.0.100\n    - 10.100.0.11\n    - 10.100.0.12\n    - 10.100.0.13\n",
		"ignorePreflightErrors:\n    - swap\n    - systemverification\n",
		"dnsDomain: cluster.local", "podSubnet: 10.233.0.0/16", "serviceSubnet: 10.96.0.0/16",
		"failCgroupV1: false", "failSwapOn: false", "cgroupDriver: systemd", "serverTLSBootstrap: true",
		"mode: nftables", "clusterCIDR: 10.233.0.0/16", "maxPerCore: 0", "min: 0",
		"tcpEstablishedTimeout: 0s", "tcpCloseWaitTimeout: 0s",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("init configuration lacks %q", want)
		}
	}
	w, err := goldenCases[2].render()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(w), "controlPlane") || strings.Contains(string(w), labKey) {
		t.Errorf("worker join configuration carries controlPlane or the certificate key:\n%s", w)
	}
}

func TestDNSDomainAndIPv6(t *testing.T) {
	c := labCluster()
	c.DNSDomain = "corp.example"
	c.ControlPlaneEndpoint = "[fd00::100]:7443"
	c.PodSubnet = netip.MustParsePrefix("fd00:233::/56")
	c.ServiceSubnet = netip.MustParsePrefix("fd00:96::/112")
	c.APIServerCertSANs = []string{"fd00::100", "api.corp.example"}
	c.EtcdMembers = []netip.Addr{netip.MustParseAddr("fd00::11"), netip.MustParseAddr("fd00::12")}
	out, err := km.InitConfig(c, labNode("cp1", "fd00::11", true))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dnsDomain: corp.example", "controlPlaneEndpoint: '[fd00::100]:7443'", "bindPort: 7443", "advertiseAddress: fd00::11",
		"value: https://[fd00::11]:2379,https://[fd00::12]:2379"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("lacks %q:\n%s", want, out)
		}
	}
}

func TestImages(t *testing.T) {
	got, err := km.Images(labCluster())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"registry.k8s.io/kube-apiserver:v1.37.2",
		"registry.k8s.io/kube-controller-manager:v1.37.2",
		"registry.k8s.io/kube-scheduler:v1.37.2",
		"registry.k8s.io/kube-proxy:v1.37.2",
		"registry.k8s.io/coredns/coredns:v1.14.6",
		"registry.k8s.io/pause:3.10.2",
		"registry.k8s.io/etcd:3.7.0-0",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Images (-want +got):\n%s", diff)
	}
	// Another supported minor: kubeadm v1.35's CoreDNS, pause and etcd (pkg/k8sversion), under a
	// private repository too (CoreDNS not one level down there).
	c := labCluster()
	c.KubernetesVersion = "v1.35.4"
	got, err = km.Images(c)
	if err != nil {
		t.Fatal(err)
	}
	want = []string{
		"registry.k8s.io/kube-apiserver:v1.35.4",
		"registry.k8s.io/kube-controller-manager:v1.35.4",
		"registry.k8s.io/kube-scheduler:v1.35.4",
		"registry.k8s.io/kube-proxy:v1.35.4",
		"registry.k8s.io/coredns/coredns:v1.13.1",
		"registry.k8s.io/pause:3.10.1",
		"registry.k8s.io/etcd:3.6.6-0",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Images v1.35.4 (-want +got):\n%s", diff)
	}
	c.ImageRepository = "10.100.0.2:8443/k8s"
	if got, err := km.Images(c); err != nil || got[4] != "10.100.0.2:8443/k8s/coredns:v1.13.1" || got[6] != "10.100.0.2:8443/k8s/etcd:3.6.6-0" {
		t.Errorf("Images v1.35.4 from a private repository = %q, %v", got, err)
	}
	for _, v := range []string{"v1.33.2", "v1.38.0"} {
		c.KubernetesVersion = v
		if _, err := km.Images(c); !errors.Is(err, km.ErrInvalid) || !strings.Contains(err.Error(), "Cluster.KubernetesVersion: ") ||
			!strings.Contains(err.Error(), "the appliance deploys v1.35, v1.36 and v1.37") {
			t.Errorf("Images(%s) = %v, want an error naming Cluster.KubernetesVersion and the supported minors", v, err)
		}
	}
}

// TestInvalidInput checks that every invalid field yields an error naming that field (and only that
// one), from both renderers, and that secrets never appear in errors.
func TestInvalidInput(t *testing.T) {
	tests := []struct {
		name  string
		field string // the exact path every error must name
		edit  func(*km.Cluster, *km.Node)
		join  bool // only JoinConfig refuses it
		init  bool // only InitConfig refuses it
	}{
		{"cluster name empty", "Cluster.Name", func(c *km.Cluster, _ *km.Node) { c.Name = "" }, false, false},
		{"etcd member twice", "Cluster.EtcdMembers[3]", func(c *km.Cluster, _ *km.Node) { c.EtcdMembers = append(c.EtcdMembers, c.EtcdMembers[1]) }, false, false},
		{"etcd member invalid", "Cluster.EtcdMembers[0]", func(c *km.Cluster, _ *km.Node) { c.EtcdMembers[0] = netip.Addr{} }, false, false},
		{"etcd member with zone", "Cluster.EtcdMembers[0]", func(c *km.Cluster, _ *km.Node) { c.EtcdMembers[0] = netip.MustParseAddr("fe80::1%eth0") }, false, false},
		{"node token malformed", "Cluster.NodeBootstrapTokens[1].Token", func(c *km.Cluster, _ *km.Node) {
			c.NodeBootstrapTokens = []km.NodeToken{{Node: "w1", Token: labWorkerToken}, {Node: "w2", Token: "W2W2W2.0123456789abcdef"}}
		}, false, false},
		{"node token without node", "Cluster.NodeBootstrapTokens[0].Node", func(c *km.Cluster, _ *km.Node) {
			c.NodeBootstrapTokens = []km.NodeToken{{Token: labWorkerToken}}
		}, false, false},
		{"node token with the control planes' token ID", "Cluster.NodeBootstrapTokens[0].Token", func(c *km.Cluster, _ *km.Node) {
			c.NodeBootstrapTokens = []km.NodeToken{{Node: "w1", Token: "abcdef.fedcba9876543210"}}
		}, false, false},
		{"cluster name uppercase", "Cluster.Name", func(c *km.Cluster, _ *km.Node) { c.Name = "Lab" }, false, false},
		{"version empty", "Cluster.KubernetesVersion", func(c *km.Cluster, _ *km.Node) { c.KubernetesVersion = "" }, false, false},
		{"version without v", "Cluster.KubernetesVersion", func(c *km.Cluster, _ *km.Node) { c.KubernetesVersion = "1.37.2" }, false, false},
		{"version label", "Cluster.KubernetesVersion", func(c *km.Cluster, _ *km.Node) { c.KubernetesVersion = "stable" }, false, false},
		{"version partial", "Cluster.KubernetesVersion", func(c *km.Cluster, _ *km.Node) { c.KubernetesVersion = "v1.37" }, false, false},
		{"endpoint missing", "Cluster.ControlPlaneEndpoint", func(c *km.Cluster, _ *km.Node) { c.ControlPlaneEndpoint = "" }, false, false},
		{"endpoint without port", "Cluster.ControlPlaneEndpoint", func(c *km.Cluster, _ *km.Node) { c.ControlPlaneEndpoint = "10.100.0.100" }, false, false},
		{"endpoint port zero", "Cluster.ControlPlaneEndpoint", func(c *km.Cluster, _ *km.Node) { c.ControlPlaneEndpoint = "10.100.0.100:0" }, false, false},
		{"endpoint port too big", "Cluster.ControlPlaneEndpoint", func(c *km.Cluster, _ *km.Node) { c.ControlPlaneEndpoint = "10.100.0.100:70000" }, false, false},
		{"endpoint IPv6 unbracketed", "Cluster.ControlPlaneEndpoint", func(c *km.Cluster, _ *km.Node) { c.ControlPlaneEndpoint = "fd00::100:6443" }, false, false},
		{"endpoint no host", "Cluster.ControlPlaneEndpoint", func(c *km.Cluster, _ *km.Node) { c.ControlPlaneEndpoint = ":6443" }, false, false},
		{"endpoint bad host", "Cluster.ControlPlaneEndpoint", func(c *km.Cluster, _ *km.Node) { c.ControlPlaneEndpoint = "api_server:6443" }, false, false},
		{"image repository empty", "Cluster.ImageRepository", func(c *km.Cluster, _ *km.Node) { c.ImageRepository = "" }, false, false},
		{"image repository trailing slash", "Cluster.ImageRepository", func(c *km.Cluster, _ *km.Node) { c.ImageRepository = "registry.k8s.io/" }, false, false},
		{"image repository uppercase", "Cluster.ImageRepository", func(c *km.Cluster, _ *km.Node) { c.ImageRepository = "Registry.example/K8s" }, false, false},
		{"pod subnet missing", "Cluster.PodSubnet", func(c *km.Cluster, _ *km.Node) { c.PodSubnet = netip.Prefix{} }, false, false},
		{"pod subnet host bits", "Cluster.PodSubnet", func(c *km.Cluster, _ *km.Node) { c.PodSubnet = netip.MustParsePrefix("10.233.1.0/16") }, false, false},
		{"service subnet missing", "Cluster.ServiceSubnet", func(c *km.Cluster, _ *km.Node) { c.ServiceSubnet = netip.Prefix{} }, false, false},
		{"service subnet overlaps pods", "Cluster.ServiceSubnet", func(c *km.Cluster, _ *km.Node) { c.ServiceSubnet = netip.MustParsePrefix("10.233.128.0/20") }, false, false},
		{"service subnet other family", "Cluster.ServiceSubnet", func(c *km.Cluster, _ *km.Node) { c.ServiceSubnet = netip.MustParsePrefix("fd00:96::/112") }, false, false},
		{"dns domain bad", "Cluster.DNSDomain", func(c *km.Cluster, _ *km.Node) { c.DNSDomain = "cluster_local" }, false, false},
		{"cert SAN bad", "Cluster.APIServerCertSANs[1]", func(c *km.Cluster, _ *km.Node) { c.APIServerCertSANs = []string{"10.100.0.100", "not a name"} }, false, false},
		{"cert SAN zone", "Cluster.APIServerCertSANs[0]", func(c *km.Cluster, _ *km.Node) { c.APIServerCertSANs = []string{"fe80::1%eth0"} }, false, false},
		{"token empty", "Cluster.BootstrapToken", func(c *km.Cluster, _ *km.Node) { c.BootstrapToken = "" }, false, false},
		{"token uppercase", "Cluster.BootstrapToken", func(c *km.Cluster, _ *km.Node) { c.BootstrapToken = "ABCDEF.0123456789abcdef" }, false, false},
		{"token short secret", "Cluster.BootstrapToken", func(c *km.Cluster, _ *km.Node) { c.BootstrapToken = "abcdef.0123456789" }, false, false},
		{"token TTL zero", "Cluster.BootstrapTokenTTL", func(c *km.Cluster, _ *km.Node) { c.BootstrapTokenTTL = 0 }, false, false},
		{"token TTL negative", "Cluster.BootstrapTokenTTL", func(c *km.Cluster, _ *km.Node) { c.BootstrapTokenTTL = -time.Hour }, false, false},
		{"certificate key empty", "Cluster.CertificateKey", func(c *km.Cluster, _ *km.Node) { c.CertificateKey = "" }, false, false},
		{"certificate key short", "Cluster.CertificateKey", func(c *km.Cluster, _ *km.Node) { c.CertificateKey = labKey[:32] }, false, false},
		{"certificate key not hex", "Cluster.CertificateKey", func(c *km.Cluster, _ *km.Node) { c.CertificateKey = "zz" + labKey[2:] }, false, false},
		{"CA hashes missing", "Cluster.CACertHashes", func(c *km.Cluster, _ *km.Node) { c.CACertHashes = nil }, true, false},
		{"CA hash without sha256", "Cluster.CACertHashes[0]", func(c *km.Cluster, _ *km.Node) { c.CACertHashes = []string{strings.TrimPrefix(labCAHash, "sha256:")} }, false, false},
		{"CA hash short", "Cluster.CACertHashes[1]", func(c *km.Cluster, _ *km.Node) { c.CACertHashes = []string{labCAHash, "sha256:abcd"} }, false, false},
		{"node name empty", "Node.Name", func(_ *km.Cluster, n *km.Node) { n.Name = "" }, false, false},
		{"node name bad", "Node.Name", func(_ *km.Cluster, n *km.Node) { n.Name = "cp_1" }, false, false},
		{"node without address", "Node.Address", func(_ *km.Cluster, n *km.Node) { n.Address = netip.Addr{} }, false, false},
		{"node address unspecified", "Node.Address", func(_ *km.Cluster, n *km.Node) { n.Address = netip.IPv4Unspecified() }, false, false},
		{"node address other family", "Node.Address", func(_ *km.Cluster, n *km.Node) { n.Address = netip.MustParseAddr("fd00::11") }, false, false},
		{"preflight name bad", "Node.IgnorePreflightErrors[0]", func(_ *km.Cluster, n *km.Node) { n.IgnorePreflightErrors = []string{"no such check!"} }, false, false},
		{"preflight all with others", "Node.IgnorePreflightErrors", func(_ *km.Cluster, n *km.Node) { n.IgnorePreflightErrors = []string{"All", "Swap"} }, false, false},
		{"init on a worker", "Node.ControlPlane", func(_ *km.Cluster, n *km.Node) { n.ControlPlane = false }, false, true},
	}
	renderers := []struct {
		name string
		f    func(km.Cluster, km.Node) ([]byte, error)
	}{{"InitConfig", km.InitConfig}, {"JoinConfig", km.JoinConfig}}
	for _, tt := range tests {
		for _, r := range renderers {
			t.Run(r.name+"/"+tt.name, func(t *testing.T) {
				c, n := labCluster(), labNode("cp1", "10.100.0.11", true)
				tt.edit(&c, &n)
				out, err := r.f(c, n)
				wantErr := !(tt.join && r.name == "InitConfig") && !(tt.init && r.name == "JoinConfig")
				if !wantErr {
					if err != nil {
						t.Fatalf("unexpected error: %v", err)
					}
					return
				}
				if err == nil {
					t.Fatalf("no error; rendered:\n%s", out)
				}
				if out != nil {
					t.Errorf("output returned alongside the error")
				}
				if !errors.Is(err, km.ErrInvalid) {
					t.Errorf("error does not wrap ErrInvalid: %v", err)
				}
				var fe *km.FieldError
				if !errors.As(err, &fe) {
					t.Fatalf("error is not a *FieldError: %v", err)
				}
				lines := strings.Split(err.Error(), "\n")
				if len(lines) != 1 || !strings.HasPrefix(lines[0], tt.field+": ") {
					t.Errorf("error = %q, want exactly one error for field %s", err, tt.field)
				}
				for _, secret := range []string{c.BootstrapToken, c.CertificateKey} {
					if len(secret) > 8 && strings.Contains(err.Error(), secret) {
						t.Errorf("error leaks a secret: %q", err)
					}
				}
			})
		}
	}
}

// TestEveryErrorAtOnce checks that validation reports all invalid fields together, not the first one
// (a control plane: a worker needs no certificate key).
func TestEveryErrorAtOnce(t *testing.T) {
	_, err := km.JoinConfig(km.Cluster{}, km.Node{ControlPlane: true})
	if err == nil {
		t.Fatal("empty input accepted")
	}
	for _, f := range []string{"Cluster.Name", "Cluster.KubernetesVersion", "Cluster.ControlPlaneEndpoint", "Cluster.ImageRepository",
		"Cluster.PodSubnet", "Cluster.ServiceSubnet", "Cluster.BootstrapToken", "Cluster.BootstrapTokenTTL",
		"Cluster.CertificateKey", "Cluster.CACertHashes", "Node.Name", "Node.Address"} {
		if !strings.Contains(err.Error(), f+": ") {
			t.Errorf("error lacks %s:\n%v", f, err)
		}
	}
}

// FuzzJoinConfig feeds arbitrary strings into the string fields: validation must never panic, and
// whatever it accepts must render to YAML that decodes back to the same values.
func FuzzJoinConfig(f *testing.F) {
	f.Add("lab", "10.100.0.100:6443", "registry.k8s.io", labToken, labKey, labCAHash, "cp2", "10.100.0.100", "Swap")
	f.Add("", "[fd00::1]:6443", "10.0.0.1:5000/k8s", "a.b", "zz", "sha256:", "Cp", "*.example", "all")
	f.Fuzz(func(t *testing.T, name, endpoint, repo, token, key, hash, node, san, ignore string) {
		c := labCluster()
		c.Name, c.ControlPlaneEndpoint, c.ImageRepository = name, endpoint, repo
		c.BootstrapToken, c.CertificateKey, c.CACertHashes, c.APIServerCertSANs = token, key, []string{hash}, []string{san}
		n := labNode(node, "10.100.0.12", true)
		n.IgnorePreflightErrors = []string{ignore}
		out, err := km.JoinConfig(c, n)
		if err != nil {
			if !errors.Is(err, km.ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		var got struct {
			NodeRegistration struct{ Name string } `yaml:"nodeRegistration"`
			Discovery        struct {
				BootstrapToken struct {
					Token             string
					APIServerEndpoint string `yaml:"apiServerEndpoint"`
				} `yaml:"bootstrapToken"`
			}
		}
		if err := yaml.Unmarshal(out, &got); err != nil {
			t.Fatalf("rendered YAML does not decode: %v\n%s", err, out)
		}
		if got.NodeRegistration.Name != node || got.Discovery.BootstrapToken.Token != token || got.Discovery.BootstrapToken.APIServerEndpoint != endpoint {
			t.Fatalf("round trip changed values: %+v\n%s", got, out)
		}
	})
}

// TestWorkerNeedsNoCertificateKey: a worker's JoinConfiguration is rendered without the control-plane
// certificate key, which only joining control planes get.
func TestWorkerNeedsNoCertificateKey(t *testing.T) {
	c := labCluster()
	c.CertificateKey = ""
	out, err := km.JoinConfig(c, km.Node{Name: "w1", Address: netip.MustParseAddr("10.100.0.21")})
	if err != nil {
		t.Fatalf("worker without certificate key: %v", err)
	}
	if strings.Contains(string(out), "certificateKey") {
		t.Errorf("worker config mentions certificateKey:\n%s", out)
	}
	if _, err := km.JoinConfig(c, km.Node{Name: "cp2", Address: netip.MustParseAddr("10.100.0.12"), ControlPlane: true}); err == nil {
		t.Error("control plane without certificate key accepted")
	}
}
