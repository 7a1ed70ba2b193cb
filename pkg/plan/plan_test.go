package plan

import (
	"bytes"
	"flag"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/ignition"
	"github.com/airgap-appliance/appliance/pkg/netresolve"
	"github.com/airgap-appliance/appliance/pkg/pki"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// labInputs are the lab's configuration (pkg/config/testdata/lab.yaml: three SSH control planes, one
// IPMI worker) with fixed secrets: a throwaway test CA kept in testdata/pki (made by pki.EnsureCA on
// the first -update, reused after), fixed tokens, VRRP secret and kubeadm secrets.
func labInputs(t *testing.T) Inputs {
	t.Helper()
	c, _, err := config.Load(filepath.Join("..", "config", "testdata", "lab.yaml"), config.ValidateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	ca, _, err := pki.EnsureCA(filepath.Join("testdata", "pki"), "plan test CA (throwaway, test only)", created)
	if err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{}
	for _, n := range c.Nodes {
		tokens[n.Name] = "token-of-" + n.Name
	}
	return Inputs{
		Config: c,
		ControlPlane: netresolve.Address{Interface: "eth0", Prefix: netip.MustParsePrefix("10.100.0.2/24"),
			CIDR: netip.MustParsePrefix("10.100.0.0/24")},
		ApplianceURL: "https://10.100.0.2:8443",
		CA:           ca,
		Tokens:       tokens,
		VRRPAuth:     "vrrppass",
		Cluster: &ClusterSecrets{CA: ca, Kubeadm: pki.KubeadmSecrets{
			BootstrapToken: "abcdef.0123456789abcdef", CertificateKey: strings.Repeat("ab", 32), Created: created}},
		Registries:      []string{"registry.k8s.io", "docker.io"},
		HostagentSHA256: strings.Repeat("0", 64),
		Snippets:        map[string][]ignition.Snippet{},
	}
}

// buildTwice builds in's plan twice and returns its files, failing t unless both builds give
// identical bytes.
func buildTwice(t *testing.T, in Inputs) map[string][]byte {
	t.Helper()
	p1, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	f1, err := p1.Files()
	if err != nil {
		t.Fatal(err)
	}
	f2, _ := p2.Files()
	if !maps.EqualFunc(f1, f2, bytes.Equal) {
		t.Fatal("two builds from the same inputs differ")
	}
	return f1
}

// TestBuildGolden pins every file of the lab's plan (testdata/golden/<path>), and that two builds
// from the same inputs give identical bytes.
func TestBuildGolden(t *testing.T) {
	in := labInputs(t)
	f1 := buildTwice(t, in)
	for _, want := range []string{"cp1/hostagent.yaml", "cp1/nodeconfig.json", "w1/kernel-cmdline", "w1/ignition/3.5.0.json",
		"appliance/firewall.json", "appliance/keepalived.json"} {
		if _, ok := f1[want]; !ok {
			t.Errorf("plan lacks %s; it has %v", want, slices.Sorted(maps.Keys(f1)))
		}
	}
	if _, ok := f1["cp1/kernel-cmdline"]; ok {
		t.Error("an SSH node got a kernel command line")
	}
	golden := filepath.Join("testdata", "golden")
	if *update {
		if err := os.RemoveAll(golden); err != nil {
			t.Fatal(err)
		}
		for rel, data := range f1 {
			path := filepath.Join(golden, filepath.FromSlash(rel))
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	seen := map[string]bool{}
	err := filepath.WalkDir(golden, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(golden, path)
		rel = filepath.ToSlash(rel)
		seen[rel] = true
		want, _ := os.ReadFile(path)
		got, ok := f1[rel]
		switch {
		case !ok:
			t.Errorf("%s: golden file exists but the plan no longer has it (go test ./pkg/plan -update)", rel)
		case !bytes.Equal(got, want):
			t.Errorf("%s differs from its golden file (go test ./pkg/plan -update, then review the diff):\n%s", rel, got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for rel := range f1 {
		if !seen[rel] {
			t.Errorf("%s: no golden file (go test ./pkg/plan -update)", rel)
		}
	}
}

// TestBuildGoldenOtherMinor: the lab's plan for Kubernetes v1.35.4 is the golden v1.37.2 plan
// (testdata/golden) with exactly the version and kubeadm v1.35's pause image in every node config
// (pkg/k8sversion: pause 3.10.1 instead of 3.10.2), and nothing else changed; two builds are
// identical. A minor outside the table fails the build naming kubernetesVersion.
func TestBuildGoldenOtherMinor(t *testing.T) {
	in := labInputs(t)
	if in.Config.KubernetesVersion != "v1.37.2" {
		t.Fatalf("the golden plan is for %s, this test for v1.37.2", in.Config.KubernetesVersion)
	}
	in.Config.KubernetesVersion = "v1.35.4"
	f1 := buildTwice(t, in)
	golden := filepath.Join("testdata", "golden")
	var seen, changed int
	err := filepath.WalkDir(golden, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(golden, path)
		rel = filepath.ToSlash(rel)
		seen++
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		want := bytes.ReplaceAll(data, []byte(`"version": "v1.37.2"`), []byte(`"version": "v1.35.4"`))
		want = bytes.ReplaceAll(want, []byte(`"sandboxImage": "registry.k8s.io/pause:3.10.2"`), []byte(`"sandboxImage": "registry.k8s.io/pause:3.10.1"`))
		if !bytes.Equal(want, data) {
			changed++
		}
		if got, ok := f1[rel]; !ok || !bytes.Equal(got, want) {
			t.Errorf("%s for v1.35.4 is not the golden file with v1.35.4's version and pause image:\n%s", rel, got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen != len(f1) || changed != 4 {
		t.Errorf("%d golden files for %d plan files, %d changed (want one node config per node, 4)", seen, len(f1), changed)
	}

	for _, v := range []string{"v1.33.5", "v1.38.0"} {
		in.Config.KubernetesVersion = v
		if _, err := Build(in); err == nil || !strings.Contains(err.Error(), "kubernetesVersion: unsupported Kubernetes minor "+v[:5]) {
			t.Errorf("Build(%s) = %v, want an error naming kubernetesVersion", v, err)
		}
	}
}

// TestBuildFacts checks the facts derived in one place against the lab: the appliance's firewall
// takes node networks without the pod CIDR, node firewalls add it; every VRRP speaker list uses the
// same control-plane addresses.
func TestBuildFacts(t *testing.T) {
	in := labInputs(t)
	p, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	wantNets := []netip.Prefix{netip.MustParsePrefix("10.100.0.0/24"), netip.MustParsePrefix("10.200.0.0/24")}
	if !slices.Equal(p.Firewall.NodeNetworks, wantNets) {
		t.Errorf("appliance firewall node networks %v, want %v", p.Firewall.NodeNetworks, wantNets)
	}
	cp1, _ := p.Node("cp1")
	if want := append(slices.Clone(wantNets), in.Config.Networks.Pods); !slices.Equal(cp1.NodeConfig.NodeNetworks, want) {
		t.Errorf("node firewall sources %v, want %v", cp1.NodeConfig.NodeNetworks, want)
	}
	cps := []netip.Addr{netip.MustParseAddr("10.100.0.11"), netip.MustParseAddr("10.100.0.12"), netip.MustParseAddr("10.100.0.13")}
	if !slices.Equal(p.Firewall.VRRPPeers, cps) || p.Keepalived == nil || !slices.Equal(p.Keepalived.Instances[0].Peers, cps) {
		t.Errorf("VRRP peers: firewall %v, keepalived %+v; want %v in both", p.Firewall.VRRPPeers, p.Keepalived, cps)
	}
	if k := cp1.NodeConfig.Keepalived; k == nil || !slices.Contains(k.Peers, netip.MustParseAddr("10.100.0.2")) ||
		!slices.Contains(k.Peers, cps[1]) || slices.Contains(k.Peers, cps[0]) {
		t.Errorf("cp1 keepalived peers %+v: want the other control planes and the appliance", k)
	}
	// Without keepalived the bootstrap host holds no VIP and has no keepalived file.
	in.Config.APIServer.Keepalived.Enabled = new(false)
	if p, err := Build(in); err != nil || p.Keepalived != nil {
		t.Errorf("keepalived disabled: %+v, %v; want no instance", p.Keepalived, err)
	}
}
