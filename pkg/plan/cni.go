package plan

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/calico"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/overlay"
)

// cniFor sets k's CNI fields for node n. With networks.cni calico: CNI "calico" on every node, and on
// control planes CNIManifest, pkg/calico's manifest for the cluster (pool networks.pods, node
// addresses autodetected inside networks.workloadPlane.cidrs in their order, pod MTU from
// networks.workloadPlane.mtu, the API through apiServer.vip:port). With networks.cni flannel: CNI
// "flannel" and PodMTU (networks.workloadPlane.mtu less VXLAN's 50 bytes, else
// config.DefaultPodMTU) on every node; the control planes' manifest needs the appliance image
// (overlayFor). The bridge CNI leaves CNI empty (what a hostagent that predates networks.cni reads
// as bridge). Errors: the manifest's (ErrParams), which Validate's refusals cover.
func cniFor(c *config.BootstrapConfiguration, n config.Node, k *agentapi.KubernetesConfig) error {
	switch c.Networks.CNI {
	case config.CNIFlannel:
		k.CNI = config.CNIFlannel
		if k.PodMTU = c.Networks.PodMTU(); k.PodMTU == 0 {
			k.PodMTU = config.DefaultPodMTU
		}
		return nil
	case config.CNICalico:
	default:
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

// overlayFor gives a control plane of a cluster with networks.cni flannel the overlay's manifest
// (pkg/overlay, the appliance image by digest) as its CNIManifest, applied in the api step: the
// DaemonSet on every node with the pod network networks.pods, the VXLAN endpoints inside
// networks.workloadPlane.cidrs in their order, VNI config.VXLANVNI on UDP config.VXLANPort, the
// link MTU networks.workloadPlane.mtu (0: each node's interface's), the API through
// apiServer.vip:port, and the pod ranges of every node (cluster.PodRanges, else the first
// allocation, as kubernetesFor assigns PodCIDR) from which each node's spec.podCIDR is set, and
// every node's workload-plane address (WorkloadPlaneAddress), its VXLAN endpoint. Nothing
// for another CNI, without Kubernetes, on workers, or before the bundle phase made the appliance
// image.
func overlayFor(c *config.BootstrapConfiguration, n config.Node, nc *agentapi.NodeConfig, image string, cluster *ClusterSecrets) error {
	if c.Networks.CNI != config.CNIFlannel || nc.Kubernetes == nil || image == "" || !n.HasRole(config.RoleControlPlane) {
		return nil
	}
	var ranges PodRanges
	if cluster != nil {
		ranges = cluster.PodRanges
	}
	if ranges == nil {
		var err error
		if ranges, err = AllocatePodRanges(c.Networks.Pods, nodeNames(c), nil); err != nil {
			return err
		}
	}
	addrs := map[string]netip.Addr{}
	for _, node := range c.Nodes {
		if a, ok := WorkloadPlaneAddress(c, node); ok && a.Is4() {
			addrs[node.Name] = a
		}
	}
	m, err := overlay.Manifest(overlay.ManifestOptions{
		Image:       image,
		Network:     c.Networks.Pods,
		PublicCIDRs: c.Networks.WorkloadPlane.CIDRs,
		VNI:         config.VXLANVNI,
		Port:        config.VXLANPort,
		MTU:         int(c.Networks.WorkloadPlane.MTU),
		APIServer:   net.JoinHostPort(c.APIServer.VIP.String(), strconv.Itoa(int(c.APIServer.Port))),
		PodRanges:   ranges,
		// The nodes' workload-plane addresses as the appliance knows them (the bridge's next hops):
		// each node's VXLAN endpoint, whatever else its interfaces carry.
		PublicAddresses: addrs,
	})
	if err != nil {
		return fmt.Errorf("networks.cni flannel: %w", err)
	}
	nc.Kubernetes.CNIManifest = string(m)
	return nil
}
