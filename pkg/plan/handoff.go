package plan

import (
	"fmt"
	"net"
	"slices"
	"strconv"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/registry"
)

// DefaultClusterMirrorPort is the HTTPS port of the in-cluster mirror on each control plane after the
// hand-off (firewall row "cluster-mirror").
const DefaultClusterMirrorPort = firewall.ClusterMirrorPort

// Handoff is the hand-off's state as the render phase needs it (pkg/bootstrap's hand-off record).
type Handoff struct {
	// Image is the appliance image the control planes' mirrors run, by digest.
	Image string
	// Port is the mirrors' HTTPS port.
	Port uint16
	// Certs maps each control plane to its mirror's serving certificate and key (PEM; the key is
	// secret). A control plane without one gets no mirror.
	Certs map[string]CertPair
	// DigestOnlyImages are the images the appliance serves under no tag (the bundle names them by
	// digest only), which the mirrors must be told to copy (ClusterMirror.Images).
	DigestOnlyImages []string
	// Switched: every digest was pulled from at least two mirrors, so every node's containerd mirrors
	// and apt source now point at the control planes' mirrors instead of the appliance.
	Switched bool
}

// CertPair is a certificate and its key, PEM.
type CertPair struct{ CertPEM, KeyPEM []byte }

// ClusterMirrorURLs are the base URLs (https://ADDR:PORT) of the in-cluster mirrors, in inventory
// order of the control planes that have a certificate and a control-plane address.
func ClusterMirrorURLs(c *config.BootstrapConfiguration, h *Handoff) []string {
	var out []string
	for _, cp := range c.ControlPlaneNodes() {
		if _, ok := h.Certs[cp.Name]; !ok {
			continue
		}
		if a, ok := ControlPlaneAddress(c, cp); ok {
			out = append(out, "https://"+net.JoinHostPort(a.String(), strconv.Itoa(int(h.Port))))
		}
	}
	return out
}

// handoffFor sets nc.Handoff (and, once switched, every mirror's Endpoints) for node n.
func handoffFor(c *config.BootstrapConfiguration, n config.Node, nc *agentapi.NodeConfig, h *Handoff, applianceURL string) error {
	if h == nil {
		return nil
	}
	hc := &agentapi.HandoffConfig{}
	if cert, ok := h.Certs[n.Name]; ok && n.HasRole(config.RoleControlPlane) {
		hc.Mirror = &agentapi.ClusterMirror{Image: h.Image, Port: h.Port, Upstream: applianceURL,
			CertPEM: string(cert.CertPEM), KeyPEM: string(cert.KeyPEM), Images: slices.Clone(h.DigestOnlyImages)}
		for _, o := range c.Nodes {
			hc.Mirror.Inventory = append(hc.Mirror.Inventory, agentapi.InventoryNode{Name: o.Name, Addresses: slices.Clone(o.Addresses)})
		}
	}
	if h.Switched {
		urls := ClusterMirrorURLs(c, h)
		if len(urls) == 0 {
			return fmt.Errorf("hand-off: no control plane has an in-cluster mirror")
		}
		for i := range nc.Mirrors {
			component, err := registry.HostComponent(nc.Mirrors[i].Registry)
			if err != nil {
				return err
			}
			nc.Mirrors[i].Endpoints = nil
			for _, u := range urls {
				nc.Mirrors[i].Endpoints = append(nc.Mirrors[i].Endpoints, u+"/v2/"+component)
			}
			nc.Mirrors[i].Endpoint = nc.Mirrors[i].Endpoints[0]
		}
		for _, u := range urls {
			hc.RepoURLs = append(hc.RepoURLs, u+"/repo")
		}
	}
	nc.Handoff = hc
	return nil
}
