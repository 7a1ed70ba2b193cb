package plan

import (
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
