package calico

import (
	"bytes"
	"errors"
	"flag"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/airgap-appliance/appliance/test/kubetest"
	"github.com/airgap-appliance/appliance/test/labns"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml from the current output")

// labParams are the lab's: networks.pods, two workload-plane CIDRs (the second as a two-subnet lab
// would list it), MTU 1500 less VXLAN's 50 bytes, the VIP.
func labParams() Params {
	return Params{
		PodCIDR:       netip.MustParsePrefix("10.233.0.0/16"),
		NodeCIDRs:     []netip.Prefix{netip.MustParsePrefix("10.200.0.0/24"), netip.MustParsePrefix("10.201.0.0/24")},
		PodMTU:        1450,
		APIServerHost: netip.MustParseAddr("10.100.0.100"),
		APIServerPort: 6443,
	}
}

// TestManifestGolden: the manifest for the lab's parameters, byte for byte, and the same bytes when
// rendered twice.
func TestManifestGolden(t *testing.T) {
	got, err := Manifest(labParams())
	if err != nil {
		t.Fatal(err)
	}
	again, err := Manifest(labParams())
	if err != nil || !bytes.Equal(got, again) {
		t.Fatalf("rendering twice gave different bytes (err %v)", err)
	}
	golden := filepath.Join("testdata", "manifest.golden.yaml")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("Manifest differs from %s: rerun with -update if intended", golden)
	}
}

// documents splits a rendered stream and decodes each document.
func documents(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, d := range strings.Split(string(b), "\n---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(d), &m); err != nil {
			t.Fatalf("document does not parse: %v\n%s", err, d)
		}
		out = append(out, m)
	}
	return out
}

// TestManifestParams: what each parameter becomes in calico-node's environment and the CNI config.
func TestManifestParams(t *testing.T) {
	p := labParams()
	p.NodeCIDRs = []netip.Prefix{netip.MustParsePrefix("192.168.7.0/24"), netip.MustParsePrefix("10.200.0.0/24")}
	p.PodMTU = 0
	p.Image = "registry.example/calico/node:x"
	b, err := Manifest(p)
	if err != nil {
		t.Fatal(err)
	}
	var ds, cm map[string]any
	kinds := map[string]int{}
	for _, d := range documents(t, b) {
		kinds[d["kind"].(string)]++
		switch d["kind"] {
		case "DaemonSet":
			ds = d
		case "ConfigMap":
			cm = d
		}
		if _, ok := d["status"]; ok {
			t.Errorf("%s has a status", d["kind"])
		}
	}
	if kinds["CustomResourceDefinition"] != len(crds) || kinds["DaemonSet"] != 1 || kinds["ConfigMap"] != 1 || kinds["ClusterRole"] != 2 {
		t.Errorf("kinds %v", kinds)
	}
	spec := ds["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	env := map[string]string{}
	for _, c := range spec["containers"].([]any) {
		c := c.(map[string]any)
		if c["image"] != p.Image {
			t.Errorf("container %s image %v", c["name"], c["image"])
		}
		for _, e := range c["env"].([]any) {
			e := e.(map[string]any)
			if v, ok := e["value"].(string); ok {
				env[e["name"].(string)] = v
			}
		}
	}
	for k, want := range map[string]string{
		"IP_AUTODETECTION_METHOD": "cidr=192.168.7.0/24,10.200.0.0/24", // the configuration's order
		"CALICO_IPV4POOL_CIDR":    "10.233.0.0/16",
		"CALICO_IPV4POOL_VXLAN":   "CrossSubnet",
		"CALICO_IPV4POOL_IPIP":    "Never",
		"CLUSTER_TYPE":            "k8s",
		"KUBERNETES_SERVICE_HOST": "10.100.0.100",
		"KUBERNETES_SERVICE_PORT": "6443",
		"FELIX_NFTABLESMODE":      "Enabled",
	} {
		if env[k] != want {
			t.Errorf("calico-node %s = %q, want %q", k, env[k], want)
		}
	}
	hostPaths := map[string]string{}
	for _, v := range spec["volumes"].([]any) {
		v := v.(map[string]any)
		hostPaths[v["name"].(string)] = v["hostPath"].(map[string]any)["path"].(string)
	}
	// Where the node's containerd looks (pkg/containerd's CRI config), not upstream's /opt/cni/bin.
	if hostPaths["cni-bin-dir"] != "/usr/lib/cni" || hostPaths["cni-net-dir"] != "/etc/cni/net.d" {
		t.Errorf("CNI directories %v", hostPaths)
	}
	data := cm["data"].(map[string]any)
	if data["veth_mtu"] != "0" || data["calico_backend"] != "vxlan" {
		t.Errorf("calico-config %v", data)
	}
	// install-cni replaces the placeholders; with a number for __CNI_MTU__ the result is JSON.
	conf := strings.NewReplacer("__KUBERNETES_NODE_NAME__", "cp1", "__CNI_MTU__", "1450", "__KUBECONFIG_FILEPATH__", "/etc/cni/net.d/calico-kubeconfig").
		Replace(data["cni_network_config"].(string))
	var net struct {
		Plugins []struct {
			Type string `json:"type"`
			MTU  int    `json:"mtu"`
		} `json:"plugins"`
	}
	if err := yaml.Unmarshal([]byte(conf), &net); err != nil || len(net.Plugins) != 2 || net.Plugins[0].Type != "calico" || net.Plugins[0].MTU != 1450 {
		t.Errorf("CNI network after install-cni's substitutions: %+v, %v\n%s", net, err, conf)
	}
}

func TestManifestErrors(t *testing.T) {
	for name, edit := range map[string]func(*Params){
		"no pod CIDR":    func(p *Params) { p.PodCIDR = netip.Prefix{} },
		"IPv6 pod CIDR":  func(p *Params) { p.PodCIDR = netip.MustParsePrefix("fd00::/56") },
		"no node CIDR":   func(p *Params) { p.NodeCIDRs = nil },
		"IPv6 node CIDR": func(p *Params) { p.NodeCIDRs = append(p.NodeCIDRs, netip.MustParsePrefix("fd00::/64")) },
		"negative MTU":   func(p *Params) { p.PodMTU = -1 },
		"no API server":  func(p *Params) { p.APIServerHost = netip.Addr{} },
		"no API port":    func(p *Params) { p.APIServerPort = 0 },
	} {
		t.Run(name, func(t *testing.T) {
			p := labParams()
			edit(&p)
			if _, err := Manifest(p); !errors.Is(err, ErrParams) {
				t.Errorf("Manifest = %v, want ErrParams", err)
			}
		})
	}
}

// TestManifestAppliesToRealAPIServer applies the manifest to a real kube-apiserver (the Kubernetes
// fixture's, test/kubetest) with the fixture's kubectl, server-side as the control plane's hostagent
// does: every object is accepted, a second apply changes nothing, and the CRDs take Calico's own
// objects (an IPPool as calico-node creates it, a namespaced Calico NetworkPolicy).
func TestManifestAppliesToRealAPIServer(t *testing.T) {
	labns.NotInShort(t, "runs kube-apiserver and etcd")
	labns.RequireRoot(t)
	s := kubetest.StartAPIServer(t, kubetest.Options{})
	kubectl := labns.KubernetesBin(t, "kubectl")
	manifest, err := Manifest(labParams())
	if err != nil {
		t.Fatal(err)
	}
	apply := func(doc []byte, args ...string) string {
		t.Helper()
		cmd := exec.Command(kubectl, append([]string{"--kubeconfig", s.AdminKubeconfig, "apply", "--server-side", "--field-manager", "appliance", "-f", "-"}, args...)...)
		cmd.Stdin = bytes.NewReader(doc)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl apply: %v\n%s", err, out)
		}
		return string(out)
	}
	first := apply(manifest)
	if n := strings.Count(first, "serverside-applied"); n != len(documents(t, manifest)) {
		t.Errorf("first apply: %d objects applied, want %d:\n%s", n, len(documents(t, manifest)), first)
	}
	if second := apply(manifest); strings.Count(second, "serverside-applied") != strings.Count(first, "serverside-applied") {
		t.Errorf("second apply:\n%s", second)
	}
	// The CRDs must be Established before their kinds are served.
	wait := exec.Command(kubectl, "--kubeconfig", s.AdminKubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
	if out, err := wait.CombinedOutput(); err != nil {
		t.Fatalf("kubectl wait crd: %v\n%s", err, out)
	}
	apply([]byte(`apiVersion: crd.projectcalico.org/v1
kind: IPPool
metadata:
  name: default-ipv4-ippool
spec:
  cidr: 10.233.0.0/16
  blockSize: 26
  vxlanMode: CrossSubnet
  ipipMode: Never
  natOutgoing: true
  nodeSelector: all()
---
apiVersion: crd.projectcalico.org/v1
kind: NetworkPolicy
metadata:
  name: default.deny-all
  namespace: default
spec:
  tier: default
  selector: all()
  types: [Ingress]
`))
	out, err := exec.Command(kubectl, "--kubeconfig", s.AdminKubeconfig, "get", "ippools.crd.projectcalico.org", "default-ipv4-ippool", "-o", "jsonpath={.spec.vxlanMode}").CombinedOutput()
	if err != nil || string(out) != "CrossSubnet" {
		t.Errorf("IPPool read back: %v %q", err, out)
	}
}
