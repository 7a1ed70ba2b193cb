package plan

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// TestBuildDNS: with baseDomain every node's resolver asks the control planes (a control plane
// itself first), only control planes get the CoreDNS server (the bundle's CoreDNS image, a Corefile
// binding exactly their two node addresses, the zone with ns.<zone> at every control plane), the
// hostagent plan puts the dns step after kubeadm (and api) and before ready; without baseDomain, or
// without Kubernetes (no kubelet for the static pod), no node gets a DNS config.
func TestBuildDNS(t *testing.T) {
	in := labInputs(t)
	in.Config.BaseDomain = "example.com"
	p, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr
	want := map[string][]netip.Addr{
		"cp1": {a("10.100.0.11"), a("10.100.0.12"), a("10.100.0.13")},
		"cp2": {a("10.100.0.12"), a("10.100.0.11"), a("10.100.0.13")},
		"cp3": {a("10.100.0.13"), a("10.100.0.11"), a("10.100.0.12")},
		"w1":  {a("10.100.0.11"), a("10.100.0.12"), a("10.100.0.13")},
	}
	for _, n := range p.Nodes {
		d := n.NodeConfig.DNS
		if d == nil {
			t.Fatalf("%s: no DNS config", n.Name)
		}
		if d.Zone != "lab.example.com" {
			t.Errorf("%s: zone %q", n.Name, d.Zone)
		}
		if diff := cmp.Diff(want[n.Name], d.Nameservers, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
			t.Errorf("%s: nameservers (-want +got):\n%s", n.Name, diff)
		}
		steps := agentapi.Plan(n.NodeConfig)
		if i := slices.Index(steps, agentapi.StepDNS); i < 0 || i < slices.Index(steps, agentapi.StepKubeadm) || steps[i+1] != agentapi.StepReady {
			t.Errorf("%s: steps %v, want dns after kubeadm and right before ready", n.Name, steps)
		}
		s := d.Server
		if n.Name == "w1" {
			if s != nil {
				t.Errorf("worker w1 runs a CoreDNS server: %+v", s)
			}
			continue
		}
		if s == nil {
			t.Fatalf("%s: no CoreDNS server", n.Name)
		}
		i := n.Name[2:]
		if s.Image != "registry.k8s.io/coredns/coredns:v1.14.6" || s.HealthPort != 18080 ||
			!strings.Contains(s.Corefile, "    bind 10.100.0."+"1"+i+" 10.200.0.1"+i+"\n") ||
			!strings.Contains(s.ZoneFile, "ns.lab.example.com.\t300\tIN\tA\t10.100.0.13\n") ||
			!strings.Contains(s.ZoneFile, "etcd-0.lab.example.com.\t300\tIN\tA\t10.100.0.11\n") {
			t.Errorf("%s: server %+v", n.Name, s)
		}
	}

	// Another minor: the CoreDNS kubeadm v1.35 deploys (pkg/k8sversion).
	in.Config.KubernetesVersion = "v1.35.4"
	if p, err = Build(in); err != nil {
		t.Fatal(err)
	}
	for _, n := range p.Nodes {
		if s := n.NodeConfig.DNS.Server; s != nil && s.Image != "registry.k8s.io/coredns/coredns:v1.13.1" {
			t.Errorf("v1.35.4: %s runs CoreDNS %q", n.Name, s.Image)
		}
	}

	for name, edit := range map[string]func(*Inputs){
		"no baseDomain": func(in *Inputs) { in.Config.BaseDomain = "" },
		"no Kubernetes": func(in *Inputs) { f := false; in.Config.Kubernetes.Enabled = &f; in.Cluster = nil },
	} {
		in := labInputs(t)
		in.Config.BaseDomain = "example.com"
		edit(&in)
		p, err := Build(in)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, n := range p.Nodes {
			if n.NodeConfig.DNS != nil || slices.Contains(agentapi.Plan(n.NodeConfig), agentapi.StepDNS) {
				t.Errorf("%s: %s has a DNS config %+v", name, n.Name, n.NodeConfig.DNS)
			}
		}
	}
}
