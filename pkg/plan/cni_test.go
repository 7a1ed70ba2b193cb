package plan

import (
	"fmt"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/calico"
	"github.com/airgap-appliance/appliance/pkg/config"
)

// TestBuildCalico: with networks.cni calico every node's Kubernetes config says calico and has no
// pod routes (calico-node routes the pods), and only control planes carry the manifest, rendered from
// the configuration (workload-plane CIDRs in their order, pods, MTU, VIP).
func TestBuildCalico(t *testing.T) {
	c := kubeNodes(t, "cp1", "cp2", "cp3", "w1")
	c.Networks.CNI = config.CNICalico
	c.Networks.WorkloadPlane.CIDRs = append(c.Networks.WorkloadPlane.CIDRs, pfx("10.201.0.0/24"))
	c.Networks.WorkloadPlane.MTU = 9000
	ks, _ := kubeConfigs(t, c, nil, nil)
	want, err := calico.Manifest(calico.Params{PodCIDR: pfx("10.233.0.0/16"), NodeCIDRs: c.Networks.WorkloadPlane.CIDRs,
		PodMTU: 8950, APIServerHost: c.APIServer.VIP, APIServerPort: c.APIServer.Port})
	if err != nil {
		t.Fatal(err)
	}
	for name, k := range ks {
		if k.CNI != config.CNICalico || len(k.PodRoutes) != 0 {
			t.Errorf("%s: CNI %q, %d pod routes; want calico, none", name, k.CNI, len(k.PodRoutes))
		}
		cp := strings.HasPrefix(name, "cp")
		if got := k.CNIManifest; cp && got != string(want) || !cp && got != "" {
			t.Errorf("%s: manifest of %d bytes, want %d", name, len(got), map[bool]int{true: len(want)}[cp])
		}
	}
	if m := ks["cp1"].CNIManifest; !strings.Contains(m, "cidr=10.200.0.0/24,10.201.0.0/24") || !strings.Contains(m, `veth_mtu: "8950"`) {
		t.Errorf("cp1's manifest lacks the autodetection CIDRs or the MTU")
	}
}

// TestBuildBridgeHasNoCNIFields: the bridge CNI (the default) leaves the fields empty, so node
// configs are what they were before networks.cni, and keeps the pod routes.
func TestBuildBridgeHasNoCNIFields(t *testing.T) {
	c := kubeNodes(t, "cp1", "w1")
	c.Networks.CNI = config.CNIBridge
	ks, _ := kubeConfigs(t, c, nil, nil)
	for name, k := range ks {
		if k.CNI != "" || k.CNIManifest != "" || len(k.PodRoutes) != 1 {
			t.Errorf("%s: CNI %q, manifest %d bytes, %d pod routes; want none, none, 1", name, k.CNI, len(k.CNIManifest), len(k.PodRoutes))
		}
	}
}

// TestBuildFlannel: with networks.cni flannel every node's Kubernetes config says flannel with the
// pods' MTU and has no pod routes (the overlay routes the pods over VXLAN), keeps its PodCIDR for
// the bridge network, and only control planes carry the overlay's manifest, once the appliance
// image exists: the appliance image, the workload-plane CIDRs in their order, the link MTU, the API
// through the VIP, VXLAN port 4789 and every node's pod range (the same ranges as PodCIDR).
func TestBuildFlannel(t *testing.T) {
	c := kubeNodes(t, "cp1", "cp2", "w1")
	c.Networks.CNI = config.CNIFlannel
	c.Networks.WorkloadPlane.CIDRs = append(c.Networks.WorkloadPlane.CIDRs, pfx("10.201.0.0/24"))
	c.Networks.WorkloadPlane.MTU = 9000
	in := labInputs(t)
	in.Config = c
	if p, err := Build(in); err != nil {
		t.Fatal(err)
	} else if m := p.Nodes[0].NodeConfig.Kubernetes.CNIManifest; m != "" {
		t.Errorf("a manifest before the appliance image exists:\n%s", m)
	}
	image := "appliance.local/airgap-appliance/appliance@sha256:" + strings.Repeat("ab", 32)
	in.ApplianceImage = image
	p, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	ranges, wl := map[string]string{}, map[string]string{}
	for _, n := range c.Nodes {
		a, _ := WorkloadPlaneAddress(c, n)
		wl[n.Name] = a.String()
	}
	for _, a := range p.Nodes {
		k := a.NodeConfig.Kubernetes
		ranges[a.Name] = k.PodCIDR.String()
		if k.CNI != config.CNIFlannel || k.PodMTU != 8950 || len(k.PodRoutes) != 0 || !k.PodCIDR.IsValid() {
			t.Errorf("%s: CNI %q, pod MTU %d, %d pod routes, pod CIDR %s; want flannel, 8950, none, a range", a.Name, k.CNI, k.PodMTU, len(k.PodRoutes), k.PodCIDR)
		}
	}
	for _, a := range p.Nodes {
		m := a.NodeConfig.Kubernetes.CNIManifest
		if !strings.HasPrefix(a.Name, "cp") {
			if m != "" {
				t.Errorf("worker %s got the overlay manifest", a.Name)
			}
			continue
		}
		for _, want := range []string{"image: " + image, "kind: DaemonSet", "--public-cidrs=10.200.0.0/24,10.201.0.0/24", "--mtu=9000",
			"--port=4789", "--vni=1", "--network=10.233.0.0/16", "value: " + c.APIServer.VIP.String(),
			fmt.Sprintf(`{"cp1":"%s","cp2":"%s","w1":"%s"}`, ranges["cp1"], ranges["cp2"], ranges["w1"]),
			fmt.Sprintf(`{"cp1":"%s","cp2":"%s","w1":"%s"}`, wl["cp1"], wl["cp2"], wl["w1"])} {
			if !strings.Contains(m, want) {
				t.Errorf("%s: overlay manifest lacks %q:\n%s", a.Name, want, m)
			}
		}
	}
	// Without networks.workloadPlane.mtu the pods get 1450 (1500 less VXLAN) and flannel the interface's MTU.
	c.Networks.WorkloadPlane.MTU = 0
	if p, err = Build(in); err != nil {
		t.Fatal(err)
	}
	if k := p.Nodes[0].NodeConfig.Kubernetes; k.PodMTU != config.DefaultPodMTU || strings.Contains(k.CNIManifest, "--mtu") {
		t.Errorf("no MTU configured: pod MTU %d (want %d), manifest has --mtu: %v", k.PodMTU, config.DefaultPodMTU, strings.Contains(k.CNIManifest, "--mtu"))
	}
}
