// Package plan derives, from a validated bootstrap.yaml and what the earlier phases established
// (resolved addresses, PKI, the registries the bundle serves), everything the appliance hands out and
// applies: per node its hostagent configuration, its node config (agent API), its kernel command line
// (BMC-booted nodes) and its Ignition config in every supported spec version; and for the bootstrap
// host its own firewall spec and keepalived configuration.
//
// Build is pure: no disk, no network, no clock; it returns bytes, and the render phase writes exactly
// those (Plan.Files). Built twice from the same inputs it gives identical bytes (a test checks it), and
// the golden files under testdata/ pin them (`go test ./pkg/plan -update` rewrites them).
package plan

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path"
	"slices"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/ignition"
	"github.com/airgap-appliance/appliance/pkg/keepalived"
	"github.com/airgap-appliance/appliance/pkg/netresolve"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
	"github.com/airgap-appliance/appliance/registry"
)

// Inputs are what Build derives the plan from.
type Inputs struct {
	// Config is the defaulted, validated configuration.
	Config *config.BootstrapConfiguration
	// ControlPlane is the bootstrap host's own control-plane address (resolve phase): interface,
	// address/prefix and the configured CIDR it matched.
	ControlPlane netresolve.Address
	// ApplianceURL is https://<control-plane address>:<server.port>, what nodes are given.
	ApplianceURL string
	// CA is the appliance CA (pki phase); nodes pin its key (agentapi.PinOf).
	CA *pki.CA
	// Tokens maps node name → bearer token (secret).
	Tokens map[string]string
	// VRRPAuth is the keepalived PASS secret (secret), used only when the configuration selects VRRPv2
	// (apiServer.keepalived.authPasswordFile); "" is fine otherwise.
	VRRPAuth string
	// RecordedVRRP is the bootstrap host's VRRP instance as the previous render wrote it
	// (ReadRecorded), nil on a first run: a running cluster keeps its VRID and VRRP version unless
	// the document sets them (VRRPFor).
	RecordedVRRP *keepalived.Instance
	// Cluster is the Kubernetes cluster CA and kubeadm join secrets; nil without Kubernetes.
	Cluster *ClusterSecrets
	// Registries are the registry hosts the bundle's images come from (bundle phase), e.g.
	// "registry.k8s.io"; each gets a containerd mirror on the appliance.
	Registries []string
	// HostagentSHA256 is the hex SHA-256 of the hostagent binary served at /artifacts/hostagent.
	HostagentSHA256 string
	// Snippets are each node's user Ignition snippets in merge order (ReadSnippets reads them).
	Snippets map[string][]ignition.Snippet
	// ApplianceImage is the appliance's own executable as an image, by digest (bundle phase:
	// registry.ExecutableImage.Pinned), which the ingress routers run; "" deploys no router.
	ApplianceImage string
	// Handoff is the hand-off's state, nil before `appliance handoff`: it adds each node's
	// agentapi.HandoffConfig (handoffFor).
	Handoff *Handoff
}

// NodeArtefacts is what one node is given. Every byte slice is a file the render phase writes 0600
// under STATE/rendered/<node>/ (RelPaths in Plan.Files): several hold the node token.
type NodeArtefacts struct {
	Name string
	// AgentConfig is hostagent.yaml (agentapi.Configuration): who the node is, the appliance URL, CA
	// pin and token.
	AgentConfig []byte
	// NodeConfig is the agentapi.NodeConfig the agent API serves, and NodeConfigJSON its file.
	NodeConfig     agentapi.NodeConfig
	NodeConfigJSON []byte
	// KernelCmdline is the kernel command line of a BMC-booted node (ipmi, redfish), with a trailing
	// newline; nil for SSH nodes.
	KernelCmdline []byte
	// Ignition maps spec version → config; a version a user snippet rules out is absent (see Notes).
	Ignition map[string][]byte
	// Notes say which Ignition versions are left out and why; Warnings are Ignition's warnings on
	// user snippets.
	Notes, Warnings []string
}

// Plan is the outcome of Build.
type Plan struct {
	Nodes []NodeArtefacts
	// Firewall is the bootstrap host's own nftables spec (ApplianceFirewall).
	Firewall firewall.Spec
	// Keepalived is the bootstrap host's VRRP instance for the API VIP; nil when keepalived is
	// disabled or there is no VIP.
	Keepalived *keepalived.Config
	// VRRP is what every speaker of the VIP shares (VRRPFor), and VRRPNotes say what a rerun kept
	// from the cluster's bootstrap rather than deriving it anew.
	VRRP      VRRP
	VRRPNotes []string
}

// ApplianceDirectory is the first path element of the bootstrap host's own files in Plan.Files
// (they go to statedir.Appliance; node files to statedir.RenderedNode).
const ApplianceDirectory = "appliance"

// Build derives the plan. Errors name the node or the input that is missing; nothing is half-built.
func Build(in Inputs) (*Plan, error) {
	c := in.Config
	if c == nil || in.CA == nil {
		return nil, errors.New("plan: configuration and CA are required")
	}
	pin := agentapi.PinOf(in.CA.Cert)
	mirrors := make([]agentapi.Mirror, 0, len(in.Registries))
	for _, host := range in.Registries {
		component, err := registry.HostComponent(host)
		if err != nil {
			return nil, err
		}
		mirrors = append(mirrors, agentapi.Mirror{Registry: host, Endpoint: in.ApplianceURL + "/v2/" + component})
	}
	vrrp, notes := VRRPFor(c, in.VRRPAuth, in.RecordedVRRP)
	p := &Plan{Firewall: ApplianceFirewall(c), VRRP: vrrp, VRRPNotes: notes}
	for _, n := range c.Nodes {
		a := NodeArtefacts{Name: n.Name, Ignition: map[string][]byte{}}
		var err error
		a.AgentConfig, err = agentapi.Configuration{
			Node: n.Name, Roles: Roles(n), ApplianceURL: in.ApplianceURL, CAPin: pin, Token: in.Tokens[n.Name],
		}.Marshal()
		if err != nil {
			return nil, err
		}
		a.NodeConfig, err = NodeConfigFor(c, n, in.ControlPlane.Prefix.Addr(), in.CA.CertPEM, vrrp, mirrors, in.Cluster)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := handoffFor(c, n, &a.NodeConfig, in.Handoff, in.ApplianceURL); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := dnsFor(c, n, &a.NodeConfig); err != nil {
			return nil, fmt.Errorf("node %s: DNS: %w", n.Name, err)
		}
		if err := ingressRouterFor(c, n, &a.NodeConfig, in.ApplianceImage); err != nil {
			return nil, fmt.Errorf("node %s: ingress router: %w", n.Name, err)
		}
		if err := overlayFor(c, n, &a.NodeConfig, in.ApplianceImage, in.Cluster); err != nil {
			return nil, fmt.Errorf("node %s: overlay: %w", n.Name, err)
		}
		nc, err := json.MarshalIndent(a.NodeConfig, "", "  ")
		if err != nil {
			return nil, err
		}
		a.NodeConfigJSON = append(nc, '\n')
		if n.Power.Kind == config.PowerIPMI || n.Power.Kind == config.PowerRedfish {
			a.KernelCmdline = []byte(KernelCmdline(in.ApplianceURL, pin) + "\n")
		}
		doc, err := ignition.Render(ignition.Params{
			Node: n.Name, ApplianceURL: in.ApplianceURL, CAPEM: in.CA.CertPEM, Mirrors: mirrors,
			HostagentURL: in.ApplianceURL + "/artifacts/hostagent", HostagentSHA256: in.HostagentSHA256,
			HostagentConfig: a.AgentConfig, Snippets: in.Snippets[n.Name],
		})
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		for _, v := range ignition.SupportedVersions {
			data, warnings, err := doc.Marshal(v)
			if errors.Is(err, ignition.ErrNotAcceptable) {
				// A snippet needs a newer spec: clients that only speak v get 406 from the server.
				a.Notes = append(a.Notes, fmt.Sprintf("%s: no spec %s (%v)", n.Name, v, err))
				continue
			} else if err != nil {
				return nil, fmt.Errorf("node %s, Ignition spec %s: %w", n.Name, v, err)
			}
			for _, w := range warnings {
				a.Warnings = append(a.Warnings, fmt.Sprintf("%s: Ignition %s: %s", n.Name, v, w))
			}
			a.Ignition[v] = data
		}
		p.Nodes = append(p.Nodes, a)
	}
	kc, err := ApplianceKeepalived(c, in.ControlPlane, vrrp)
	if err != nil {
		return nil, err
	}
	p.Keepalived = kc
	return p, nil
}

// Files lists every file of the plan as path (relative to the state directory's rendered root for
// nodes, "appliance/…" for the bootstrap host's own) → contents, in a stable order of keys when
// sorted. The appliance's keepalived file holds the VRRP secret: like every file here, write it 0600.
func (p *Plan) Files() (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, n := range p.Nodes {
		out[path.Join(n.Name, statedir.AgentConfigFile)] = n.AgentConfig
		out[path.Join(n.Name, statedir.NodeConfigFile)] = n.NodeConfigJSON
		if n.KernelCmdline != nil {
			out[path.Join(n.Name, statedir.KernelCmdlineFile)] = n.KernelCmdline
		}
		for v, data := range n.Ignition {
			out[path.Join(n.Name, statedir.IgnitionDir, v+".json")] = data
		}
	}
	fw, err := json.MarshalIndent(p.Firewall, "", "  ")
	if err != nil {
		return nil, err
	}
	out[path.Join(ApplianceDirectory, statedir.FirewallFile)] = append(fw, '\n')
	if p.Keepalived != nil {
		kc, err := json.MarshalIndent(p.Keepalived, "", "  ")
		if err != nil {
			return nil, err
		}
		out[path.Join(ApplianceDirectory, statedir.KeepalivedFile)] = append(kc, '\n')
	}
	return out, nil
}

// Node returns the artefacts of the named node.
func (p *Plan) Node(name string) (NodeArtefacts, bool) {
	i := slices.IndexFunc(p.Nodes, func(n NodeArtefacts) bool { return n.Name == name })
	if i < 0 {
		return NodeArtefacts{}, false
	}
	return p.Nodes[i], true
}

// KernelCmdline is the kernel command line of a node booted by its BMC, public data only (issue 12
// item 5): appliance.url=<the appliance front> and appliance.ca_pin=<sha256 pin of its CA> (the node
// fetches the CA and accepts it only if its SubjectPublicKeyInfo hashes to the pin). No node token
// and no Ignition URL: the booted machine runs `hostagent enroll` (agentapi.EnrollPathV1), which
// proves it is the machine the appliance powered on and receives the node's credential, then fetches
// its Ignition config with the token in the Authorization header. The same arguments as the
// network-boot script's (pkg/netboot KernelArgs): agentapi.BootArgs, formatted.
func KernelCmdline(applianceURL, caPin string) string {
	return agentapi.BootArgs{ApplianceURL: applianceURL, CAPin: caPin}.Format()
}

// ApplianceKeepalived is the bootstrap host's VRRP instance for the API VIP: unicast from its
// control-plane address cp (interface cp.Interface) to every control plane's ControlPlaneAddress, the
// cluster's VRID, authentication and advertisement interval from v (VRRPFor), priority
// agentapi.VRRPAppliancePriority, the VIP with the prefix length of cp's CIDR. nil (no error) when
// keepalived is disabled or there is no VIP.
func ApplianceKeepalived(c *config.BootstrapConfiguration, cp netresolve.Address, v VRRP) (*keepalived.Config, error) {
	vip := c.APIServer.VIP
	if !c.APIServer.Keepalived.IsEnabled() || !vip.IsValid() {
		return nil, nil
	}
	if !cp.Prefix.IsValid() || cp.Interface == "" {
		return nil, errors.New("keepalived: the bootstrap host's control-plane address is not resolved (resolve phase)")
	}
	return &keepalived.Config{
		RouterID: "appliance",
		Instances: []keepalived.Instance{{
			Name:            agentapi.VRRPInstanceName,
			Interface:       cp.Interface,
			SourceIP:        cp.Prefix.Addr(),
			Peers:           ControlPlaneAddresses(c),
			VIP:             vipPrefix(vip, cp),
			VirtualRouterID: v.VirtualRouterID,
			Priority:        agentapi.VRRPAppliancePriority,
			AuthPass:        v.AuthPass,
			AdvertInterval:  v.AdvertInterval,
		}},
	}, nil
}

// ApplianceIngressCheck is the ingress VIP's VRRP instance as the bootstrap host's pre-flight checks
// it (issue 13): the bootstrap host does not speak for the ingress VIP (the control planes do), but
// it sits on their segment, so before the first bootstrap it listens for another VRRP group on
// ingress.virtualRouterID and ARP-probes ingress.vip there, as it does for the API VIP. Interface
// and source are the bootstrap host's control-plane address cp; the peers are the control planes
// (their advertisements and ARP answers are the cluster's own, so a rerun passes); the advertisement
// interval is the cluster's (v). nil when there is no ingress VIP (or keepalived is off).
func ApplianceIngressCheck(c *config.BootstrapConfiguration, cp netresolve.Address, v VRRP) *keepalived.Instance {
	in := ingressFor(c)
	if in == nil || !cp.Prefix.IsValid() || cp.Interface == "" {
		return nil
	}
	return &keepalived.Instance{
		Name:            agentapi.VRRPIngressInstanceName,
		Interface:       cp.Interface,
		SourceIP:        cp.Prefix.Addr(),
		Peers:           ControlPlaneAddresses(c),
		VIP:             vipPrefix(in.VIP, cp),
		VirtualRouterID: in.VirtualRouterID,
		AdvertInterval:  v.AdvertInterval,
	}
}

func vipPrefix(vip netip.Addr, cp netresolve.Address) netip.Prefix {
	bits := cp.Prefix.Bits()
	if cp.CIDR.IsValid() {
		bits = cp.CIDR.Bits()
	}
	return netip.PrefixFrom(vip, bits)
}
