package kubeadmmanifests

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/coreos/go-semver/semver"
	"github.com/distribution/reference"
)

// ErrInvalid is wrapped by every input error InitConfig, JoinConfig and Images return
// (errors.Is(err, ErrInvalid)).
var ErrInvalid = errors.New("invalid kubeadm configuration input")

// FieldError is one invalid input field. Field is its Go path ("Cluster.APIServerCertSANs[2]");
// Problem says what is wrong and what is expected. Secret fields never quote their value.
type FieldError struct {
	Field   string
	Problem string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Problem }

// Unwrap makes every FieldError match ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func fieldErr(field, problem string) error { return &FieldError{Field: field, Problem: problem} }

// joinErrors joins field errors; the result lists them one per line, in input order.
func joinErrors(errs []error) error { return errors.Join(errs...) }

var (
	// Bootstrap token format, from k8s.io/cluster-bootstrap/token/api (BootstrapTokenPattern).
	tokenRE = regexp.MustCompile(`^[a-z0-9]{6}\.[a-z0-9]{16}$`)
	// RFC 1123 subdomain, as k8s.io/apimachinery's IsDNS1123Subdomain (plus the 253 length limit below).
	dns1123SubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	// Preflight check names are CamelCase identifiers, some with dashes or dots ("FileAvailable--etc-...").
	preflightRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
)

// validated holds the values derived from a valid Cluster and Node.
type validated struct {
	dnsDomain        string
	certSANs         []string
	apiServerArgs    []arg
	caCertHashes     []string
	localAPIEndpoint apiEndpoint
	nodeRegistration nodeRegistration
}

// validate checks c and n and derives the rendered values. forJoin makes CACertHashes required.
func validate(c Cluster, n Node, forJoin bool) (validated, error) {
	var errs []error
	add := func(field, format string, a ...any) { errs = append(errs, fieldErr(field, fmt.Sprintf(format, a...))) }
	var v validated

	if c.Name == "" {
		add("Cluster.Name", "is empty; set the cluster name (an RFC 1123 subdomain, e.g. \"lab\")")
	} else if !isDNS1123Subdomain(c.Name) {
		add("Cluster.Name", "%q is not an RFC 1123 subdomain (lowercase letters, digits, '-' and '.')", c.Name)
	}
	checkVersion(c.KubernetesVersion, &errs)
	var port int32
	if c.ControlPlaneEndpoint == "" {
		add("Cluster.ControlPlaneEndpoint", "is empty; set the API server VIP as host:port (e.g. \"10.100.0.100:6443\")")
	} else if host, p, err := endpointPort(c.ControlPlaneEndpoint); err != nil {
		add("Cluster.ControlPlaneEndpoint", "%q is not host:port (IPv6 in brackets): %v", c.ControlPlaneEndpoint, err)
	} else if host == "" {
		add("Cluster.ControlPlaneEndpoint", "%q has no host", c.ControlPlaneEndpoint)
	} else if a, err := netip.ParseAddr(host); err == nil && a.Zone() != "" {
		add("Cluster.ControlPlaneEndpoint", "%q: an IPv6 zone is not allowed", c.ControlPlaneEndpoint)
	} else if err != nil && !isDNS1123Subdomain(host) {
		add("Cluster.ControlPlaneEndpoint", "host %q is neither an IP address nor a DNS name", host)
	} else {
		port = p
	}
	checkImageRepository(c.ImageRepository, &errs)

	podOK := checkPrefix("Cluster.PodSubnet", c.PodSubnet, &errs)
	svcOK := checkPrefix("Cluster.ServiceSubnet", c.ServiceSubnet, &errs)
	if podOK && svcOK {
		if c.PodSubnet.Addr().Is4() != c.ServiceSubnet.Addr().Is4() {
			add("Cluster.ServiceSubnet", "%s is not in the address family of Cluster.PodSubnet %s (dual stack is not supported)", c.ServiceSubnet, c.PodSubnet)
		} else if c.PodSubnet.Overlaps(c.ServiceSubnet) {
			add("Cluster.ServiceSubnet", "%s overlaps Cluster.PodSubnet %s", c.ServiceSubnet, c.PodSubnet)
		}
	}

	v.dnsDomain = c.DNSDomain
	if v.dnsDomain == "" {
		v.dnsDomain = DefaultDNSDomain
	} else if !isDNS1123Subdomain(v.dnsDomain) {
		add("Cluster.DNSDomain", "%q is not an RFC 1123 subdomain (e.g. \"cluster.local\")", c.DNSDomain)
	}

	for i, san := range c.APIServerCertSANs {
		f := fmt.Sprintf("Cluster.APIServerCertSANs[%d]", i)
		if a, err := netip.ParseAddr(san); err == nil {
			if a.Zone() != "" {
				add(f, "%q: an IPv6 zone is not allowed", san)
			}
			continue
		}
		if !isDNS1123Subdomain(strings.TrimPrefix(san, "*.")) {
			add(f, "%q is neither an IP address nor a DNS name (wildcard \"*.\" allowed)", san)
		}
	}
	v.certSANs = sortedUnique(c.APIServerCertSANs)

	v.apiServerArgs = []arg{{Name: "shutdown-delay-duration", Value: APIServerShutdownDelay.String()}}
	var etcdServers []string
	for i, a := range c.EtcdMembers {
		f := fmt.Sprintf("Cluster.EtcdMembers[%d]", i)
		switch {
		case !a.IsValid():
			add(f, "is not an IP address")
		case a.Zone() != "":
			add(f, "%s: an IPv6 zone is not allowed", a)
		case slices.Contains(c.EtcdMembers[:i], a):
			add(f, "%s is listed twice", a)
		default:
			etcdServers = append(etcdServers, "https://"+netip.AddrPortFrom(a, EtcdClientPort).String())
		}
	}
	if len(etcdServers) > 0 {
		v.apiServerArgs = append(v.apiServerArgs, arg{Name: "etcd-servers", Value: strings.Join(etcdServers, ",")})
	}

	// Secrets: never quote the value.
	if c.BootstrapToken == "" {
		add("Cluster.BootstrapToken", "is empty; set a token of the form [a-z0-9]{6}.[a-z0-9]{16}")
	} else if !tokenRE.MatchString(c.BootstrapToken) {
		add("Cluster.BootstrapToken", "does not match [a-z0-9]{6}.[a-z0-9]{16} (value not shown: secret)")
	}
	ids := map[string]string{}
	if id, _, ok := strings.Cut(c.BootstrapToken, "."); ok {
		ids[id] = "Cluster.BootstrapToken"
	}
	for i, nt := range c.NodeBootstrapTokens {
		f := fmt.Sprintf("Cluster.NodeBootstrapTokens[%d]", i)
		if nt.Node == "" {
			add(f+".Node", "is empty; name the node the token is for")
		}
		if !tokenRE.MatchString(nt.Token) {
			add(f+".Token", "does not match [a-z0-9]{6}.[a-z0-9]{16} (value not shown: secret)")
			continue
		}
		id, _, _ := strings.Cut(nt.Token, ".")
		if other, dup := ids[id]; dup {
			add(f+".Token", "has the token ID of %s: every token needs an ID of its own", other)
		}
		ids[id] = f
	}
	if c.BootstrapTokenTTL <= 0 {
		add("Cluster.BootstrapTokenTTL", "%v must be positive (kubeadm reads 0 as a token that never expires)", c.BootstrapTokenTTL)
	}
	switch {
	case c.CertificateKey == "" && n.ControlPlane:
		add("Cluster.CertificateKey", "is empty; set 64 hex characters (a 32-byte AES-256 key)")
	case c.CertificateKey == "":
		// A worker never sees the control-plane certificates: no key needed.
	case !isAESKey(c.CertificateKey):
		add("Cluster.CertificateKey", "is not 64 hex characters (a 32-byte AES-256 key; value not shown: secret)")
	}

	if forJoin && len(c.CACertHashes) == 0 {
		add("Cluster.CACertHashes", "is empty; JoinConfig needs at least one \"sha256:<64 hex>\" pin of the cluster CA")
	}
	for i, h := range c.CACertHashes {
		hexPart, ok := strings.CutPrefix(h, "sha256:")
		if b, err := hex.DecodeString(hexPart); !ok || err != nil || len(b) != 32 {
			add(fmt.Sprintf("Cluster.CACertHashes[%d]", i), "%q is not \"sha256:\" followed by 64 hex characters", h)
		}
	}
	v.caCertHashes = sortedUnique(c.CACertHashes)

	if n.Name == "" {
		add("Node.Name", "is empty; set the node name (an RFC 1123 subdomain)")
	} else if !isDNS1123Subdomain(n.Name) {
		add("Node.Name", "%q is not an RFC 1123 subdomain (lowercase letters, digits, '-' and '.')", n.Name)
	}
	if !n.Address.IsValid() {
		add("Node.Address", "is not set; set the node's cluster IP address")
	} else if n.Address.IsUnspecified() || n.Address.Zone() != "" {
		add("Node.Address", "%s must be a concrete address without a zone", n.Address)
	} else if podOK && n.Address.Unmap().Is4() != c.PodSubnet.Addr().Is4() {
		add("Node.Address", "%s is not in the address family of Cluster.PodSubnet %s", n.Address, c.PodSubnet)
	}
	ignore := make([]string, 0, len(n.IgnorePreflightErrors))
	for i, e := range n.IgnorePreflightErrors {
		if !preflightRE.MatchString(e) {
			add(fmt.Sprintf("Node.IgnorePreflightErrors[%d]", i), "%q is not a preflight check name (e.g. \"Swap\", or \"all\")", e)
		}
		ignore = append(ignore, strings.ToLower(e))
	}
	ignore = sortedUnique(ignore)
	if slices.Contains(ignore, "all") && len(ignore) > 1 {
		add("Node.IgnorePreflightErrors", "\"all\" must stand alone (kubeadm refuses it next to individual checks)")
	}

	if len(errs) > 0 {
		return validated{}, joinErrors(errs)
	}
	addr := n.Address.Unmap().String()
	v.localAPIEndpoint = apiEndpoint{AdvertiseAddress: addr, BindPort: port}
	v.nodeRegistration = nodeRegistration{
		Name:                  n.Name,
		CRISocket:             CRISocket,
		KubeletExtraArgs:      []arg{{Name: "node-ip", Value: addr}},
		IgnorePreflightErrors: ignore,
		ImagePullPolicy:       "IfNotPresent",
	}
	return v, nil
}

func checkVersion(version string, errs *[]error) {
	if version == "" {
		*errs = append(*errs, fieldErr("Cluster.KubernetesVersion", "is empty; set an exact version such as \"v1.37.2\""))
		return
	}
	rest, ok := strings.CutPrefix(version, "v")
	if !ok {
		*errs = append(*errs, fieldErr("Cluster.KubernetesVersion", fmt.Sprintf("%q must start with \"v\" (e.g. \"v1.37.2\"; labels such as \"stable\" need the internet)", version)))
		return
	}
	if _, err := semver.NewVersion(rest); err != nil {
		*errs = append(*errs, fieldErr("Cluster.KubernetesVersion", fmt.Sprintf("%q is not an exact version such as \"v1.37.2\": %v", version, err)))
	}
}

func checkImageRepository(repo string, errs *[]error) {
	if repo == "" {
		*errs = append(*errs, fieldErr("Cluster.ImageRepository", "is empty; set the registry the node pulls from (e.g. \"registry.k8s.io\" or \"10.100.0.1:5000/k8s\")"))
		return
	}
	// The repository is a prefix: an image reference built on it must be a fully qualified name
	// (ParseNamed refuses anything Docker would rewrite, such as a missing registry host).
	if strings.HasSuffix(repo, "/") {
		*errs = append(*errs, fieldErr("Cluster.ImageRepository", fmt.Sprintf("%q must not end in \"/\"", repo)))
	} else if _, err := reference.ParseNamed(repo + "/pause:3.10.1"); err != nil {
		*errs = append(*errs, fieldErr("Cluster.ImageRepository", fmt.Sprintf("%q is not a registry host[:port][/path] prefix: %v", repo, err)))
	}
}

func checkPrefix(field string, p netip.Prefix, errs *[]error) bool {
	switch {
	case !p.IsValid():
		*errs = append(*errs, fieldErr(field, "is not set; set a CIDR such as 10.96.0.0/16"))
	case p.Addr().Zone() != "" || p.Addr().Is4In6():
		*errs = append(*errs, fieldErr(field, fmt.Sprintf("%s must be a plain IPv4 or IPv6 CIDR", p)))
	case p != p.Masked():
		*errs = append(*errs, fieldErr(field, fmt.Sprintf("%s has host bits set; did you mean %s?", p, p.Masked())))
	default:
		return true
	}
	return false
}

func isDNS1123Subdomain(s string) bool { return len(s) <= 253 && dns1123SubdomainRE.MatchString(s) }

// sortedUnique returns a sorted copy of s without duplicates; nil for an empty s.
func sortedUnique(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}

// isAESKey: 64 hex characters, a 32-byte AES-256 key.
func isAESKey(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == 32
}
