package config

import (
	"net/netip"
	"slices"

	"github.com/airgap-appliance/appliance/firewall"
)

// The pod network's plugins (networks.cni).
const (
	// CNIBridge is a node-local Linux bridge (containernetworking-plugins bridge + host-local, one
	// range of networks.pods per node) with a static route to every other node's range via that
	// node's workload-plane address, written by hostagent. It needs every node on one L2 segment
	// (the routes' next hops are on-link) and enforces no NetworkPolicy.
	CNIBridge = "bridge"
	// CNICalico is Calico (MetalK8s's CNI) in VXLAN mode on the Kubernetes datastore: calico-node
	// (felix, nftables dataplane, no BIRD and no BGP) on every node, calico-ipam handing out blocks
	// of networks.pods, VXLAN between nodes in different subnets (CrossSubnet), NetworkPolicy
	// enforced. The appliance renders its manifest (pkg/calico) and a control plane applies it; its
	// image must be in the bundle (calico.Image).
	CNICalico = "calico"
	// CNIFlannel is the bridge network of CNIBridge (cni0, host-local on the node's pod range) without
	// hostagent's static routes: flannel's VXLAN backend (github.com/flannel-io/flannel, embedded in
	// the appliance's own image as k3s embeds it: `appliance overlay`, pkg/overlay) runs on every node
	// as a DaemonSet and routes each other node's spec.podCIDR over the VXLAN device flannel.1
	// (VXLANVNI, UDP VXLANPort) to that node's first address inside networks.workloadPlane.cidrs, so
	// nodes may sit in different subnets joined by routers. Pods get networks.workloadPlane.mtu less
	// VXLANOverhead. It enforces no NetworkPolicy. It needs only the appliance image, which every
	// bundle carries.
	CNIFlannel = "flannel"
	// DefaultCNI is networks.cni when unset: CNIBridge, because the Calico image is not part of
	// every bundle yet (its fixture needs a Calico binary built outside this repository; see the
	// "Calico" section of docs/operator.md), and a default that the bundle cannot serve would leave
	// every pod without a network; and rather than CNIFlannel because on one L2 segment the bridge's direct
	// routes carry pod traffic without VXLAN's 50 bytes per packet and without waiting for a
	// DaemonSet. Choose flannel for nodes in several subnets, calico for NetworkPolicy too.
	DefaultCNI = CNIBridge
)

// VXLAN identity of the flannel CNI: VNI 1 (flannel's default, device flannel.1) on UDP port 4789, the
// port IANA assigned to VXLAN (RFC 7348 §5), rather than the Linux kernel's pre-IANA default 8472
// that flannel inherits: firewalls and packet tools know 4789 as VXLAN.
const (
	VXLANVNI  = 1
	VXLANPort = int(firewall.VXLANPort)
)

// DefaultPodMTU is the pods' MTU with the flannel CNI when networks.workloadPlane.mtu is not set:
// Ethernet's 1500 (RFC 894) less VXLANOverhead.
const DefaultPodMTU = 1500 - VXLANOverhead

// VXLANOverhead is the bytes VXLAN adds to every pod packet on the wire: outer IPv4 header 20, UDP 8,
// VXLAN header 8 and inner Ethernet header 14 (RFC 7348 §5; Calico's own figure for IPv4 VXLAN).
const VXLANOverhead = 50

// MinPodMTU is the smallest MTU left to pods that the calico and flannel CNIs accept: 576 bytes, the datagram
// size every IPv4 host must be able to receive (RFC 791, RFC 1122 §3.3.3).
const MinPodMTU = 576

// MaxMTU is the largest link MTU accepted: an IPv4 packet's total length is a 16-bit field (RFC 791).
const MaxMTU = 65535

// setCNIDefaults fills networks.cni.
func setCNIDefaults(n *Networks) {
	if n.CNI == "" {
		n.CNI = DefaultCNI
	}
}

// PodMTU is the MTU the calico and flannel CNIs give pods: networks.workloadPlane.mtu less
// VXLANOverhead, or 0 when the MTU is not set (Calico then detects it from the node's interface;
// flannel's pods get DefaultPodMTU).
func (n Networks) PodMTU() int {
	if n.WorkloadPlane.MTU == 0 {
		return 0
	}
	return int(n.WorkloadPlane.MTU) - VXLANOverhead
}

// cni validates networks.cni and the planes' MTUs.
func (v *validator) cni() {
	n := v.c.Networks
	switch n.CNI {
	case CNIBridge, CNICalico, CNIFlannel:
	case "":
		v.errorf("networks.cni", "is required: write %q, %q or %q (SetDefaults sets %q)", CNIBridge, CNIFlannel, CNICalico, DefaultCNI)
	default:
		v.errorf("networks.cni", "%q is not a CNI the appliance deploys: write %q (one L2 segment, no NetworkPolicy), %q (VXLAN across subnets, no NetworkPolicy) or %q (VXLAN across subnets, NetworkPolicy)", n.CNI, CNIBridge, CNIFlannel, CNICalico)
	}
	if n.ControlPlane.MTU != 0 {
		v.errorf("networks.controlPlane.mtu", "is not used: only networks.workloadPlane.mtu sets the pod network's MTU; remove it, or move it to networks.workloadPlane.mtu")
	}
	mtu := int(n.WorkloadPlane.MTU)
	switch {
	case mtu == 0:
	case mtu > MaxMTU:
		v.errorf("networks.workloadPlane.mtu", "%d is out of range: write the node interfaces' MTU in bytes (e.g. 1500, or 9000 for jumbo frames), at most %d, or omit it (Calico detects it; flannel assumes 1500)", mtu, MaxMTU)
	case mtu-VXLANOverhead < MinPodMTU:
		v.errorf("networks.workloadPlane.mtu", "%d leaves %d bytes for pods after the %d-byte VXLAN encapsulation; pods need at least %d (RFC 791): write the interfaces' real MTU (at least %d), or omit it", mtu, mtu-VXLANOverhead, VXLANOverhead, MinPodMTU, MinPodMTU+VXLANOverhead)
	case n.CNI == CNIBridge:
		v.warnf("networks.workloadPlane.mtu", "is set to %d but networks.cni is %q, which leaves the pods' MTU at the kernel's default: only the calico and flannel CNIs use it", mtu, CNIBridge)
	}
	if n.CNI == CNIFlannel && len(n.WorkloadPlane.CIDRs) > 0 && !slices.ContainsFunc(n.WorkloadPlane.CIDRs, func(p netip.Prefix) bool { return p.Addr().Is4() }) {
		v.errorf("networks.workloadPlane.cidrs", "has no IPv4 CIDR: the flannel CNI sends VXLAN between the nodes' IPv4 workload-plane addresses; add the IPv4 workload-plane network")
	}
	if (n.CNI == CNICalico || n.CNI == CNIFlannel) && !v.c.Kubernetes.IsEnabled() {
		v.warnf("networks.cni", "%q is set but kubernetes.enabled is false: no CNI is deployed", n.CNI)
	}
}
