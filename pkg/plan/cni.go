package plan

import (
	"fmt"
	"slices"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/calico"
	"github.com/airgap-appliance/appliance/pkg/config"
)

// cniFor sets k's CNI fields for node n. With networks.cni calico: CNI "calico" on every node, and on
// control planes CNIManifest, pkg/calico's manifest for the cluster (pool networks.pods, node
// addresses autodetected inside networks.workloadPlane.cidrs in their order, pod MTU from
// networks.workloadPlane.mtu, the API through apiServer.vip:port). The bridge CNI leaves CNI empty
// (what a hostagent that predates networks.cni reads as bridge). Errors: the manifest's (ErrParams),
// which Validate's refusals cover.
func cniFor(c *config.BootstrapConfiguration, n config.Node, k *agentapi.KubernetesConfig) error {
	if c.Networks.CNI != config.CNICalico {
		return nil
	}
	k.CNI = config.CNICalico
	if !slices.Contains(n.Roles, config.RoleControlPlane) {
		return nil
	}
	m, err := calico.Manifest(calico.Params{
		PodCIDR:       c.Networks.Pods,
		NodeCIDRs:     c.Networks.WorkloadPlane.CIDRs,
		PodMTU:        c.Networks.PodMTU(),
		APIServerHost: c.APIServer.VIP,
		APIServerPort: c.APIServer.Port,
	})
	if err != nil {
		return fmt.Errorf("networks.cni calico: %w", err)
	}
	k.CNIManifest = string(m)
	return nil
}
