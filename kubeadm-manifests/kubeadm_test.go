package kubeadmmanifests_test

// Validation by the real Kubernetes binaries (kubeadm, kube-proxy of labns.KubernetesVersion, v1.37.2),
// built by test/fixtures/build-kubernetes.sh into /var/cache/appliance/kubernetes-v1.37.2/bin.

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	km "github.com/airgap-appliance/appliance/kubeadm-manifests"
	"github.com/airgap-appliance/appliance/test/labns"
)

// kubeBinary returns the path of a Kubernetes binary of labns.KubernetesVersion: $env if set, else
// the fixture cache.
// Missing, it fails the test under CI=true and skips it loudly elsewhere.
func kubeBinary(t *testing.T, env, name string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
			t.Fatalf("%s=%s is not an executable file", env, p)
		}
		return p
	}
	return labns.KubernetesBin(t, name)
}

// run runs a binary with a timeout (kubeadm waits minutes on some failures) and returns its
// combined output.
func run(t *testing.T, argv ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	return string(out), err
}

// TestKubeadmValidate feeds each golden file to `kubeadm config validate`, which decodes every
// document strictly (an unknown field is an error) and validates the kubeadm types. Any output but
// "ok" fails, so kubeadm warnings (deprecated fields, "The recommended value for ..." component
// config overrides) fail too.
func TestKubeadmValidate(t *testing.T) {
	kubeadm := kubeBinary(t, "KUBEADM", "kubeadm")
	for _, tc := range goldenCases {
		t.Run(tc.file, func(t *testing.T) {
			out, err := run(t, kubeadm, "config", "validate", "--config", filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatalf("kubeadm config validate: %v\n%s", err, out)
			}
			if out != "ok\n" {
				t.Errorf("kubeadm config validate printed more than \"ok\" (warnings?):\n%s", out)
			}
		})
	}
	// Beyond the lab: IPv6, a private registry with a path, a custom DNS domain, a wildcard SAN.
	t.Run("ipv6-private-registry", func(t *testing.T) {
		c := labCluster()
		c.ControlPlaneEndpoint, c.ImageRepository, c.DNSDomain = "[fd00::100]:7443", "10.100.0.1:5000/k8s", "corp.example"
		c.PodSubnet, c.ServiceSubnet = netip.MustParsePrefix("fd00:233::/56"), netip.MustParsePrefix("fd00:96::/112")
		c.APIServerCertSANs = []string{"fd00::100", "*.api.corp.example"}
		for name, render := range map[string]func(km.Cluster, km.Node) ([]byte, error){"init": km.InitConfig, "join": km.JoinConfig} {
			b, err := render(c, labNode("cp1", "fd00::11", true))
			if err != nil {
				t.Fatal(err)
			}
			f := filepath.Join(t.TempDir(), name+".yaml")
			if err := os.WriteFile(f, b, 0o600); err != nil {
				t.Fatal(err)
			}
			if out, err := run(t, kubeadm, "config", "validate", "--config", f); err != nil || out != "ok\n" {
				t.Errorf("kubeadm config validate %s: %v\n%s\n%s", name, err, out, b)
			}
			if name != "init" {
				continue
			}
			out, err := run(t, kubeadm, "config", "images", "list", "--config", f)
			want, ierr := km.Images(c)
			if err != nil || ierr != nil {
				t.Fatalf("images list: %v %v\n%s", err, ierr, out)
			}
			if diff := cmp.Diff(want, strings.Fields(out)); diff != "" {
				t.Errorf("Images vs kubeadm for a private registry (-Images +kubeadm):\n%s", diff)
			}
		}
	})
}

// TestKubeadmImagesList checks Images against `kubeadm config images list` for the init golden file.
func TestKubeadmImagesList(t *testing.T) {
	kubeadm := kubeBinary(t, "KUBEADM", "kubeadm")
	out, err := run(t, kubeadm, "config", "images", "list", "--config", filepath.Join("testdata", goldenCases[0].file))
	if err != nil {
		t.Fatalf("kubeadm config images list: %v\n%s", err, out)
	}
	got := strings.Fields(out)
	want, err := km.Images(labCluster())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Images vs kubeadm config images list (-Images +kubeadm):\n%s", diff)
	}
	if !slices.Contains(got, "registry.k8s.io/kube-apiserver:v1.37.2") {
		t.Errorf("kubeadm lists no registry.k8s.io/kube-apiserver:v1.37.2: %q", got)
	}
}

// TestKubeadmInitPhasesInChroot runs the file-writing phases of `kubeadm init` with the init golden
// file inside an empty --rootfs (kubeadm chroots into it: nothing on this host is touched, and no
// systemctl exists there, so kubelet-start only writes files). It then reads what kubeadm produced:
// the static pod manifests, the kubelet's flags and configuration, and the API server certificate.
func TestKubeadmInitPhasesInChroot(t *testing.T) {
	kubeadm := kubeBinary(t, "KUBEADM", "kubeadm")
	labns.RequireRoot(t) // chroot(2)
	root := t.TempDir()
	golden, err := os.ReadFile(filepath.Join("testdata", goldenCases[0].file))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "init.yaml"), golden, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, phase := range [][]string{{"certs", "all"}, {"control-plane", "all"}, {"etcd", "local"}, {"kubelet-start"}} {
		argv := append(append([]string{kubeadm, "init", "phase"}, phase...), "--config", "/init.yaml", "--rootfs", root)
		if out, err := run(t, argv...); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
		}
	}
	read := func(rel string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	expect := map[string][]string{
		"etc/kubernetes/manifests/kube-controller-manager.yaml": {"- --allocate-node-cidrs=false", "- --cluster-cidr=10.233.0.0/16", "- --service-cluster-ip-range=10.96.0.0/16", "- --cluster-name=lab"},
		"etc/kubernetes/manifests/kube-apiserver.yaml": {"- --advertise-address=10.100.0.11", "- --secure-port=6443", "- --service-cluster-ip-range=10.96.0.0/16",
			"- --shutdown-delay-duration=" + km.APIServerShutdownDelay.String()},
		"etc/kubernetes/manifests/etcd.yaml": {"- --data-dir=/var/lib/etcd", "- --advertise-client-urls=https://10.100.0.11:2379"},
		"var/lib/kubelet/kubeadm-flags.env":  {"--node-ip=10.100.0.11", "--hostname-override=cp1"},
		"var/lib/kubelet/config.yaml": {"cgroupDriver: systemd\n", "failCgroupV1: false\n", "failSwapOn: false\n", "serverTLSBootstrap: true\n",
			"containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n", "clusterDomain: cluster.local\n", "- 10.96.0.10\n"},
	}
	for file, wants := range expect {
		s := read(file)
		for _, w := range wants {
			if !strings.Contains(s, w) {
				t.Errorf("kubeadm wrote %s without %q", file, w)
			}
		}
	}
	// Every image kubeadm put in a static pod is one Images promises.
	images, err := km.Images(labCluster())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"} {
		s := read("etc/kubernetes/manifests/" + m + ".yaml")
		_, after, ok := strings.Cut(s, "image: ")
		img, _, _ := strings.Cut(after, "\n")
		if !ok || !slices.Contains(images, img) {
			t.Errorf("static pod %s uses image %q, not in Images() %q", m, img, images)
		}
	}
	block, _ := pem.Decode([]byte(read("etc/kubernetes/pki/apiserver.crt")))
	if block == nil {
		t.Fatal("apiserver.crt is not PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	var ips []string
	for _, ip := range cert.IPAddresses {
		ips = append(ips, ip.String())
	}
	for _, want := range []string{"10.100.0.100", "10.100.0.11", "10.100.0.12", "10.100.0.13", "10.96.0.1"} {
		if !slices.Contains(ips, want) {
			t.Errorf("API server certificate IP SANs %v lack %s", ips, want)
		}
	}
}

// TestKubeProxyAcceptsConfig runs the real kube-proxy on the KubeProxyConfiguration document:
// --write-config-to decodes, defaults and validates it (semantically, unlike kubeadm, which only
// decodes component configs) and writes the effective configuration. The effective conntrack values
// must be the zeros that keep kube-proxy off the host's nf_conntrack sysctls; the same document
// without the conntrack block must get kube-proxy's non-zero defaults, showing the explicit zeros matter.
func TestKubeProxyAcceptsConfig(t *testing.T) {
	kubeProxy := kubeBinary(t, "KUBE_PROXY", "kube-proxy")
	golden, err := os.ReadFile(filepath.Join("testdata", goldenCases[0].file))
	if err != nil {
		t.Fatal(err)
	}
	var doc []byte
	for d := range strings.SplitSeq(string(golden), "---\n") {
		if strings.Contains(d, "kind: KubeProxyConfiguration\n") {
			doc = []byte(d)
		}
	}
	if doc == nil {
		t.Fatal("no KubeProxyConfiguration document in the init golden file")
	}
	effective := func(t *testing.T, in []byte) map[string]any {
		t.Helper()
		dir := t.TempDir()
		cfg, out := filepath.Join(dir, "in.yaml"), filepath.Join(dir, "out.yaml")
		if err := os.WriteFile(cfg, in, 0o600); err != nil {
			t.Fatal(err)
		}
		if o, err := run(t, kubeProxy, "--config", cfg, "--write-config-to", out); err != nil {
			t.Fatalf("kube-proxy refused the configuration: %v\n%s", err, o)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := effective(t, doc)
	if m["mode"] != "nftables" || m["clusterCIDR"] != "10.233.0.0/16" {
		t.Errorf("effective mode/clusterCIDR = %v/%v, want nftables/10.233.0.0/16", m["mode"], m["clusterCIDR"])
	}
	wantCT := map[string]any{"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s",
		"tcpBeLiberal": false, "udpTimeout": "0s", "udpStreamTimeout": "0s"}
	if diff := cmp.Diff(wantCT, m["conntrack"]); diff != "" {
		t.Errorf("effective conntrack (-want +got):\n%s", diff)
	}

	without, _, _ := bytes.Cut(doc, []byte("conntrack:"))
	ct, _ := effective(t, without)["conntrack"].(map[string]any)
	if ct["maxPerCore"] == 0 || ct["tcpEstablishedTimeout"] == "0s" {
		t.Errorf("control: without the conntrack block kube-proxy still leaves conntrack alone (%v); the explicit zeros would be pointless", ct)
	}
}
