package plan

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/dnsrecords"
	"github.com/airgap-appliance/appliance/pkg/k8sversion"
)

// CoreDNSImage is the image of the control planes' CoreDNS static pods: the CoreDNS kubeadm of
// kubernetesVersion's minor deploys as the cluster DNS (pkg/k8sversion's table, kubeadm
// constants.CoreDNSVersion, under registry.k8s.io's coredns/ path), so the bundle already holds it:
// "registry.k8s.io/coredns/coredns:v1.13.1" for v1.35.4, "registry.k8s.io/coredns/coredns:v1.14.6"
// for v1.37.2. The error (a minor outside the table, which config validation refuses) wraps
// k8sversion.ErrUnsupported or ErrNotAVersion.
func CoreDNSImage(kubernetesVersion string) (string, error) {
	rel, err := k8sversion.Lookup(kubernetesVersion)
	if err != nil {
		return "", fmt.Errorf("kubernetesVersion: %w", err)
	}
	return rel.CoreDNSImage(ImageRepository), nil
}

// dnsFor sets nc.DNS for node n when the cluster has a DNS zone (baseDomain) and runs Kubernetes
// (the CoreDNS servers are kubelet static pods): every node's resolver asks the control planes'
// control-plane addresses first (a control plane itself first, then the others in document order);
// a control plane also gets its CoreDNS static pod, listening on its control-plane and workload-plane
// addresses, serving dnsrecords.ForCoreDNS's zone.
func dnsFor(c *config.BootstrapConfiguration, n config.Node, nc *agentapi.NodeConfig) error {
	if c.BaseDomain == "" || !c.Kubernetes.IsEnabled() {
		return nil
	}
	z, err := dnsrecords.ForCoreDNS(c)
	if errors.Is(err, dnsrecords.ErrNoNameServer) {
		return nil // no control plane with a static address: nobody to serve the zone
	} else if err != nil {
		return err
	}
	d := &agentapi.DNSConfig{Zone: c.DNSZone()}
	own, isCP := ControlPlaneAddress(c, n)
	isCP = isCP && n.HasRole(config.RoleControlPlane)
	if isCP {
		d.Nameservers = append(d.Nameservers, own)
	}
	for _, a := range ControlPlaneAddresses(c) {
		if !slices.Contains(d.Nameservers, a) {
			d.Nameservers = append(d.Nameservers, a)
		}
	}
	if isCP {
		addrs := []netip.Addr{own}
		if wp, ok := WorkloadPlaneAddress(c, n); ok && wp != own {
			addrs = append(addrs, wp)
		}
		corefile, err := dnsrecords.Corefile(z, addrs)
		if err != nil {
			return err
		}
		image, err := CoreDNSImage(c.KubernetesVersion)
		if err != nil {
			return err
		}
		d.Server = &agentapi.DNSServer{Image: image, Corefile: string(corefile), ZoneFile: string(dnsrecords.ZoneFile(z)),
			Listen: addrs, HealthPort: dnsrecords.CoreDNSHealthPort}
	}
	nc.DNS = d
	return nil
}
