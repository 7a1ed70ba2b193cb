package config

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airgap-appliance/appliance/firewall"
	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/k8sversion"
)

// The checks in this file refuse configurations that are well-formed but cannot work once deployed:
// ports two roles of one host both open, a Kubernetes version kubeadm cannot deploy from the bundle, a
// state directory that belongs to the system, IPv6 networks.

// kubernetesVersion checks that ver (vMAJOR.MINOR.PATCH) is a release the appliance can deploy: its
// minor is in pkg/k8sversion's table (v1.35-v1.37), which gives the nodes' image set (CoreDNS, pause
// and etcd as kubeadm of that minor deploys them) and which kubeadm-manifests renders for
// (TestSupportedKubernetesVersion checks that the two agree). Any other is refused with the supported
// minors, e.g. `kubernetesVersion: "v1.34.4" cannot be deployed: unsupported Kubernetes minor v1.34:
// the appliance deploys v1.35, v1.36 and v1.37; use e.g. v1.37.2`.
func (v *validator) kubernetesVersion(ver string) {
	if _, err := k8sversion.Lookup(ver); err != nil {
		v.errorf("kubernetesVersion", "%q cannot be deployed: %v", ver, err)
	}
}

// bundleVersion checks, when the bundle at dir is readable, that it carries the configured Kubernetes
// version: the nodes install the packages and images the bundle holds, and nothing else. A directory
// that is not (yet) a bundle is left to the bundle phase, which says why.
func (v *validator) bundleVersion(dir string) {
	b, err := bundle.Open(dir)
	ver := v.c.KubernetesVersion
	if err != nil || !versionRE.MatchString(ver) || b.Meta.KubernetesVersion == ver {
		return
	}
	v.errorf("kubernetesVersion", "%q differs from the bundle's Kubernetes %s (%s, %s): the nodes can install only what the bundle carries; set kubernetesVersion: %s, or point bundle.path at a bundle of %s",
		ver, b.Meta.KubernetesVersion, b.Meta.Name, filepath.Join(b.Dir, bundle.MetadataFile), b.Meta.KubernetesVersion, ver)
}

// ipv4Only is why IPv6 networks are refused.
const ipv4Only = "the appliance supports IPv4 networks only (the nodes' hostagent enables IPv4 forwarding and routes IPv4 pod ranges only, and clusters are tested on IPv4 only); use an IPv4 network"

// systemDirs are directories of the operating system that must not be the state directory (the
// appliance keeps its CA key, tokens and registry storage there, mode 0700, and cleans up after
// itself in it).
var systemDirs = []string{
	"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media", "/mnt",
	"/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var",
	"/usr/bin", "/usr/include", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/local",
	"/usr/local/bin", "/usr/local/lib", "/usr/local/sbin", "/usr/local/share", "/usr/sbin", "/usr/share", "/usr/src",
	"/var/backups", "/var/cache", "/var/lib", "/var/local", "/var/lock", "/var/log", "/var/mail", "/var/opt",
	"/var/run", "/var/spool", "/var/tmp", "/run/lock", "/run/user",
}

// systemTrees are directories nothing may be kept inside: virtual filesystems, device nodes, the boot
// partition.
var systemTrees = []string{"/proc", "/sys", "/dev", "/boot"}

// systemDir says why the clean absolute path d cannot hold the state ("" when it can).
func systemDir(d string) string {
	if slices.Contains(systemDirs, d) {
		return "a system directory"
	}
	for _, t := range systemTrees {
		if strings.HasPrefix(d, t+"/") {
			return "inside " + t + ", which belongs to the system"
		}
	}
	return ""
}

// CheckStateDir refuses a state directory given outside bootstrap.yaml (the --state-dir flag of
// bootstrap and serve) for the reasons validation refuses stateDir: not absolute, a system directory, or
// one through symbolic links. Errors name the flag and say what to use instead.
func CheckStateDir(d string) error {
	if !filepath.IsAbs(d) {
		return fmt.Errorf("--state-dir %q is not absolute: give an absolute path, e.g. %s", d, DefaultStateDir)
	}
	v := &validator{c: &BootstrapConfiguration{}, opts: ValidateOptions{CheckFiles: true}}
	v.stateDir(d)
	if len(v.errs) > 0 {
		return fmt.Errorf("--state-dir: %s", v.errs[0].Msg)
	}
	return nil
}

// stateDir refuses a state directory that is, or (CheckFiles) resolves through symbolic links to, a
// system directory.
func (v *validator) stateDir(d string) {
	const fix = "the appliance needs a directory of its own for its CA key, tokens and registry storage; use e.g. " + DefaultStateDir
	clean := filepath.Clean(d)
	if why := systemDir(clean); why != "" {
		shown := ""
		if clean != d {
			shown = " (" + clean + ")"
		}
		v.errorf("stateDir", "%q is %s%s: "+fix, d, why, shown)
		return
	}
	if !v.opts.CheckFiles {
		return
	}
	if real, err := filepath.EvalSymlinks(clean); err == nil && real != clean {
		if why := systemDir(real); why != "" {
			v.errorf("stateDir", "%q resolves to %s, %s: "+fix, d, real, why)
		}
	}
}

// Names of the port-table entries whose ports the configuration sets (firewall.Ports).
const (
	portNameAppliance = "appliance-https" // server.port
	portNameAPI       = "kube-apiserver"  // apiServer.port
)

// portHost is a kind of host and the port-table roles it plays.
type portHost struct {
	where string
	roles []firewall.Role
}

// portHosts lists every kind of host of the configuration with its port-table roles: the appliance
// host (the bootstrap role, plus the roles of a node whose address it also carries) and the nodes by
// their set of roles.
func (v *validator) portHosts() []portHost {
	boot := portHost{where: "the appliance host", roles: []firewall.Role{firewall.RoleBootstrap}}
	var own []netip.Addr
	if a := v.c.Server.ListenAddress; a.IsValid() && !a.IsUnspecified() {
		own = append(own, a)
	}
	for _, in := range v.c.Host.Interfaces {
		for _, p := range in.Addresses {
			own = append(own, p.Addr())
		}
	}
	hosts := []portHost{}
	seen := map[string]bool{}
	for i, n := range v.c.Nodes {
		roles := make([]string, 0, len(n.Roles))
		for _, r := range n.Roles {
			roles = append(roles, string(r))
		}
		fw := firewall.NodeRoles(roles) // as the node's hostagent installs them
		if slices.ContainsFunc(n.Addresses, func(a netip.Addr) bool { return slices.Contains(own, a) }) {
			boot.where += fmt.Sprintf(", which is also nodes[%d] (%s)", i, n.Name)
			for _, r := range fw {
				if !slices.Contains(boot.roles, r) {
					boot.roles = append(boot.roles, r)
				}
			}
		}
		slices.Sort(roles)
		key := strings.Join(roles, ",")
		if len(fw) == 0 || seen[key] {
			continue
		}
		seen[key] = true
		where := roles[0] + " nodes"
		if len(roles) > 1 {
			where = fmt.Sprintf("nodes[%d] (%s, %s)", i, n.Name, strings.Join(roles, " and "))
		}
		hosts = append(hosts, portHost{where: where, roles: fw})
	}
	return append([]portHost{boot}, hosts...)
}

// ports refuses server.port and apiServer.port when one host would have to open the same TCP port for
// two entries of the port table (firewall.Ports: SSH, the API server and VIP, etcd, the kubelet, the
// NodePort range, …), given the roles that host plays.
func (v *validator) ports() {
	s, a := v.c.Server.Port, v.c.APIServer.Port
	if s == 0 || a == 0 {
		return
	}
	fields := map[string]string{portNameAppliance: "server.port", portNameAPI: "apiServer.port"}
	defaults := map[string]uint16{portNameAppliance: DefaultServerPort, portNameAPI: DefaultAPIServerPort}
	table := firewall.Ports(s, a)
	reported := map[string]bool{}
	for _, h := range v.portHosts() {
		var open []firewall.Port
		for _, p := range table {
			if strings.HasPrefix(p.Name, "ingress-") && !v.c.Ingress.VIP.IsValid() {
				continue // opened only with an ingress VIP (firewall.Spec.Ingress)
			}
			if p.Protocol == firewall.ProtoTCP && slices.Contains(h.roles, p.Role) &&
				!slices.ContainsFunc(open, func(q firewall.Port) bool { return q.Name == p.Name }) {
				open = append(open, p)
			}
		}
		for _, p := range open {
			field, ok := fields[p.Name]
			if !ok {
				continue
			}
			for _, q := range open {
				if q.Name == p.Name || q.From > p.To || p.From > q.To {
					continue
				}
				if p.Name == portNameAPI && q.Name == portNameAppliance {
					continue // reported once, on server.port
				}
				if key := field + " " + q.Name; !reported[key] {
					reported[key] = true
					v.errorf(field, "%d is also the port of %s (%s %s) on %s: that host must open both; choose another port (default %d)",
						p.From, q.Name, q.Protocol, q.PortRange(), h.where, defaults[p.Name])
				}
			}
		}
	}
}
