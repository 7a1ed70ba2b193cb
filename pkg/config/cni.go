package config

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
	// DefaultCNI is networks.cni when unset: CNIBridge, because the Calico image is not part of
	// every bundle yet (its fixture needs a Calico binary built outside this repository; see the
	// README's "Calico" section), and a default that the bundle cannot serve would leave every pod
	// without a network. Choose calico for nodes in several subnets or for NetworkPolicy.
	DefaultCNI = CNIBridge
)

// VXLANOverhead is the bytes VXLAN adds to every pod packet on the wire: outer IPv4 header 20, UDP 8,
// VXLAN header 8 and inner Ethernet header 14 (RFC 7348 §5; Calico's own figure for IPv4 VXLAN).
const VXLANOverhead = 50

// MinPodMTU is the smallest MTU left to pods that the calico CNI accepts: 576 bytes, the datagram
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

// PodMTU is the MTU the calico CNI gives pods: networks.workloadPlane.mtu less VXLANOverhead, or 0
// when the MTU is not set (Calico then detects it from the node's interface).
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
	case CNIBridge, CNICalico:
	case "":
		v.errorf("networks.cni", "is required: write %q or %q (SetDefaults sets %q)", CNIBridge, CNICalico, DefaultCNI)
	default:
		v.errorf("networks.cni", "%q is not a CNI the appliance deploys: write %q (one L2 segment, no NetworkPolicy) or %q (VXLAN across subnets, NetworkPolicy)", n.CNI, CNIBridge, CNICalico)
	}
	if n.ControlPlane.MTU != 0 {
		v.errorf("networks.controlPlane.mtu", "is not used: only networks.workloadPlane.mtu sets the pod network's MTU; remove it, or move it to networks.workloadPlane.mtu")
	}
	mtu := int(n.WorkloadPlane.MTU)
	switch {
	case mtu == 0:
	case mtu > MaxMTU:
		v.errorf("networks.workloadPlane.mtu", "%d is out of range: write the node interfaces' MTU in bytes (e.g. 1500, or 9000 for jumbo frames), at most %d, or omit it to let Calico detect it", mtu, MaxMTU)
	case mtu-VXLANOverhead < MinPodMTU:
		v.errorf("networks.workloadPlane.mtu", "%d leaves %d bytes for pods after the %d-byte VXLAN encapsulation; pods need at least %d (RFC 791): write the interfaces' real MTU (at least %d), or omit it", mtu, mtu-VXLANOverhead, VXLANOverhead, MinPodMTU, MinPodMTU+VXLANOverhead)
	case n.CNI == CNIBridge:
		v.warnf("networks.workloadPlane.mtu", "is set to %d but networks.cni is %q, which leaves the pods' MTU at the kernel's default: only the calico CNI uses it", mtu, CNIBridge)
	}
	if n.CNI == CNICalico && !v.c.Kubernetes.IsEnabled() {
		v.warnf("networks.cni", "%q is set but kubernetes.enabled is false: no CNI is deployed", CNICalico)
	}
}
