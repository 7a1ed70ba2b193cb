package plan

import (
	"net"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/ingressrouter"
)

// NodeConfigFor derives node n's agentapi.NodeConfig from the configuration c (defaulted and
// validated): its roles and the cluster's networks; NodeNetworks = the control-plane and
// workload-plane CIDRs and the pod CIDR (pods reach host-network ports such as the kubelet), without
// duplicates; the appliance's control-plane address applianceAddr; the API VIP and port; mirrors and
// caPEM as given. Control-plane nodes get a keepalived instance when c enables keepalived: VRID,
// authentication and advertisement interval from v (VRRPFor: the same on every speaker), priority
// agentapi.VRRPControlPlaneBasePriority minus the node's index among the control planes, and as peers the other
// control planes' control-plane addresses (each one's first static address inside a control-plane
// CIDR; a control plane without one cannot be named and is left out) plus applianceAddr; with
// Kubernetes and c.APIServer.LoadBalancer enabled they also get the API load balancer
// (apiLoadBalancerFor) and its packages (APILoadBalancerPackages).
//
// The result holds secrets (VRRP auth): write it 0600 (STATE/rendered/<node>/nodeconfig.json).
//
// With c.Kubernetes enabled, cluster (the cluster CA and kubeadm join secrets) must be set and the
// node also gets its agentapi.KubernetesConfig (see kubernetesFor).
func NodeConfigFor(c *config.BootstrapConfiguration, n config.Node, applianceAddr netip.Addr, caPEM []byte, v VRRP, mirrors []agentapi.Mirror, cluster *ClusterSecrets) (agentapi.NodeConfig, error) {
	nc := agentapi.NodeConfig{
		Node:               n.Name,
		Roles:              Roles(n),
		ClusterName:        c.ClusterName,
		ControlPlaneCIDRs:  slices.Clone(c.Networks.ControlPlane.CIDRs),
		WorkloadPlaneCIDRs: slices.Clone(c.Networks.WorkloadPlane.CIDRs),
		NodeNetworks:       NodeFirewallSources(c),
		ApplianceAddress:   applianceAddr,
		APIServerVIP:       c.APIServer.VIP,
		APIServerPort:      c.APIServer.Port,
		Mirrors:            slices.Clone(mirrors),
		CAPEM:              string(caPEM),
	}
	if nc.Mirrors == nil {
		nc.Mirrors = []agentapi.Mirror{}
	}
	if c.Kubernetes.IsEnabled() {
		k, err := kubernetesFor(c, n, cluster)
		if err != nil {
			return nc, err
		}
		nc.Kubernetes = k
	}
	if nc.Kubernetes != nil {
		nc.Ingress = ingressFor(c)
	}
	if !n.HasRole(config.RoleControlPlane) || !c.APIServer.Keepalived.IsEnabled() {
		return nc, nil
	}
	prio := agentapi.VRRPControlPlaneBasePriority
	var peers []netip.Addr
	for i, cp := range c.ControlPlaneNodes() {
		if cp.Name == n.Name {
			prio = max(agentapi.VRRPControlPlaneBasePriority-i, 1)
			continue
		}
		if a, ok := ControlPlaneAddress(c, cp); ok && !slices.Contains(peers, a) {
			peers = append(peers, a)
		}
	}
	if applianceAddr.IsValid() && !slices.Contains(peers, applianceAddr) {
		peers = append(peers, applianceAddr)
	}
	nc.Keepalived = &agentapi.KeepalivedConfig{
		VirtualRouterID:  v.VirtualRouterID,
		AuthPass:         v.AuthPass,
		Priority:         uint8(prio),
		Peers:            peers,
		AdvertIntervalMS: uint32(v.AdvertInterval / time.Millisecond),
	}
	if nc.Kubernetes != nil && c.APIServer.LoadBalancer.IsEnabled() {
		nc.APILoadBalancer = apiLoadBalancerFor(c)
		nc.Kubernetes.Packages = append(nc.Kubernetes.Packages, APILoadBalancerPackages...)
	}
	return nc, nil
}

// IngressPorts are the ingress VIP's ports the control planes' HAProxy passes to the routers: HTTP
// and HTTPS (the routers terminate TLS with the Ingresses' certificates), each to the routers' own
// port (never 80 or 443, which HAProxy holds on the control planes, where routers may run too).
var IngressPorts = []agentapi.IngressPort{
	{Port: firewall.IngressHTTPPort, RouterPort: firewall.IngressRouterHTTPPort},
	{Port: firewall.IngressHTTPSPort, RouterPort: firewall.IngressRouterHTTPSPort},
}

// ingressFor is the cluster's ingress as every Kubernetes node gets it (config.Ingress), nil without
// ingress.vip or keepalived: routers on the workers (by control-plane address, else first address),
// or on the control planes when there is no worker (kcli's rule).
func ingressFor(c *config.BootstrapConfiguration) *agentapi.IngressConfig {
	if !c.Ingress.VIP.IsValid() || !c.APIServer.Keepalived.IsEnabled() {
		return nil
	}
	in := &agentapi.IngressConfig{VIP: c.Ingress.VIP, VirtualRouterID: c.Ingress.VirtualRouterID,
		Ports: slices.Clone(IngressPorts), Routers: []agentapi.RouterEndpoint{},
		RouterHealthPort: firewall.IngressRouterHealthPort, RouterHealthPath: ingressrouter.HealthPath}
	add := func(workers bool) {
		for _, n := range c.Nodes {
			if workers == n.HasRole(config.RoleControlPlane) || (workers && !n.HasRole(config.RoleWorker)) {
				continue
			}
			a, ok := ControlPlaneAddress(c, n)
			if !ok && len(n.Addresses) > 0 {
				a, ok = n.Addresses[0], true
			}
			if ok {
				in.Routers = append(in.Routers, agentapi.RouterEndpoint{Node: n.Name, Address: a})
			}
		}
	}
	if add(true); len(in.Routers) == 0 {
		add(false)
	}
	return in
}

// ingressRouterFor gives a control plane of a cluster with an ingress VIP the ingress routers'
// manifest (pkg/ingressrouter, the appliance image by digest): the routers run on the workers, or,
// with none, on the control planes (kcli's rule), serve the cluster's default IngressClass, write the
// ingress VIP into the Ingresses' status and reach the API through the VIP. Nothing without ingress,
// on workers, or before the bundle phase made the appliance image.
func ingressRouterFor(c *config.BootstrapConfiguration, n config.Node, nc *agentapi.NodeConfig, image string) error {
	if nc.Ingress == nil || nc.Kubernetes == nil || image == "" || !n.HasRole(config.RoleControlPlane) {
		return nil
	}
	o := ingressrouter.ManifestOptions{Image: image, StatusAddress: nc.Ingress.VIP,
		ListenPort: firewall.IngressRouterHTTPPort, TLSPort: firewall.IngressRouterHTTPSPort, HealthPort: firewall.IngressRouterHealthPort,
		APIServer: net.JoinHostPort(c.APIServer.VIP.String(), strconv.Itoa(int(c.APIServer.Port)))}
	if slices.ContainsFunc(c.Nodes, func(w config.Node) bool {
		return w.HasRole(config.RoleWorker) && !w.HasRole(config.RoleControlPlane)
	}) {
		o.WorkersOnly = true
	} else {
		// No worker: on the control planes (the label and the taint kubeadm gives them share a name).
		o.NodeSelector = map[string]string{ingressrouter.ControlPlaneTaint: ""}
		o.TolerateControlPlane = true
	}

	m, err := ingressrouter.Manifest(o)
	if err != nil {
		return err
	}
	nc.Kubernetes.IngressRouterManifest = string(m)
	return nil
}

// APILoadBalancerPackages are the packages a control plane installs for its API load balancer (beyond
// KubernetesPackages): Debian's HAProxy. Bundles carry them (bundlespec.DefaultPackages).
var APILoadBalancerPackages = []string{"haproxy"}

// apiLoadBalancerFor is the control planes' API load balancer (config.APILoadBalancer): HAProxy on
// firewall.APILoadBalancerPort in front of every control plane's kube-apiserver at its control-plane
// address and the API port, in nodes[] order (a control plane without a control-plane address cannot
// be named and is left out, as for the keepalived peers).
func apiLoadBalancerFor(c *config.BootstrapConfiguration) *agentapi.APILoadBalancerConfig {
	lb := &agentapi.APILoadBalancerConfig{Port: firewall.APILoadBalancerPort, Servers: []agentapi.APIServerEndpoint{}}
	for _, cp := range c.ControlPlaneNodes() {
		if a, ok := ControlPlaneAddress(c, cp); ok {
			lb.Servers = append(lb.Servers, agentapi.APIServerEndpoint{Node: cp.Name, Address: netip.AddrPortFrom(a, c.APIServer.Port)})
		}
	}
	return lb
}
