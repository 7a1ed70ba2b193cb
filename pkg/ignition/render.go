// Package ignition renders the per-node Ignition configs the appliance serves at /ignition/<node>.
//
// Render builds one config in the oldest supported spec (3.3.0, what Debian 12's ignition 2.14
// parses) as typed objects of github.com/coreos/ignition/v2/config/v3_3/types and validates it with
// Ignition's own validator. Marshal translates it up with Ignition's translators to the version
// Negotiate picked from the client's Accept header, merges the user's snippets (base as parent,
// snippet as child, Ignition's merge semantics), validates the result again and serialises it
// deterministically.
//
// The config makes a node trust the appliance CA (system trust stores of Debian and Fedora, and
// Ignition's own fetches), pull images through the appliance's registry mirror (containerd
// hosts.toml per source registry), and run the hostagent (binary verified by SHA-256, its config
// with the node token at mode 0600, a systemd unit).
//
// This is the only package that imports github.com/coreos/ignition/v2.
package ignition

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/agentapi"

	"github.com/coreos/go-semver/semver"
	"github.com/coreos/ignition/v2/config/util"
	"github.com/coreos/ignition/v2/config/v3_3/types"
	"github.com/coreos/ignition/v2/config/v3_5"
	"github.com/coreos/ignition/v2/config/validate"
	"github.com/vincent-petithory/dataurl"

	"github.com/airgap-appliance/appliance/pkg/containerd"
)

// Paths the rendered config writes on the node (Debian and Fedora layouts).
const (
	// CAPathFedora is the CA anchor read by update-ca-trust (Fedora, RHEL, CoreOS).
	CAPathFedora = "/etc/pki/ca-trust/source/anchors/appliance-ca.crt"
	// CAPathDebian is the CA read by update-ca-certificates (Debian, Ubuntu).
	CAPathDebian = "/usr/local/share/ca-certificates/appliance-ca.crt"
	// ContainerdCertsDir is containerd's hosts directory (CRI registry config_path).
	ContainerdCertsDir = containerd.CertsDir
	// ContainerdCAPath is the CA each hosts.toml names for the appliance mirror.
	ContainerdCAPath = containerd.CAPath
	// HostagentBinaryPath is where the hostagent binary is installed (mode 0755).
	HostagentBinaryPath = "/usr/local/bin/hostagent"
	// HostagentConfigDir holds the hostagent config (mode 0700).
	HostagentConfigDir = "/etc/hostagent"
	// HostagentConfigPath is the hostagent config with the node token (mode 0600).
	HostagentConfigPath = HostagentConfigDir + "/config.yaml"
	// HostagentUnit is the systemd unit that runs the hostagent.
	HostagentUnit = "hostagent.service"
)

// ErrInvalidParams is returned (wrapped, with every offending field) by Render for bad Params.
var ErrInvalidParams = errors.New("invalid ignition parameters")

// ErrInvalidSnippet is returned (wrapped, naming the snippet) when a user snippet does not parse or
// does not validate as an Ignition 3.x config.
var ErrInvalidSnippet = errors.New("invalid Ignition snippet")

// ErrInvalidConfig is returned (wrapped, with Ignition's validation report) when the rendered or
// merged config fails Ignition's validator.
var ErrInvalidConfig = errors.New("invalid Ignition config")

// Mirror routes one source registry to the appliance's registry mirror: the contract's type
// (agentapi.Mirror), so the node config and the Ignition config carry the same values. An empty
// Endpoint means ApplianceURL + "/v2/" + Registry here.
type Mirror = agentapi.Mirror

// Params is everything Render needs for one node. HostagentConfig holds the node's secret token:
// it is written with mode 0600 and never logged (LogValue redacts it).
type Params struct {
	Node         string // node name, for messages
	ApplianceURL string // https base URL of the appliance, e.g. "https://10.100.0.1:8443"
	CAPEM        []byte // the appliance CA certificate(s), PEM; no private keys
	Mirrors      []Mirror
	// HostagentURL is the https URL Ignition downloads the hostagent binary from.
	HostagentURL string
	// HostagentSHA256 is the binary's SHA-256 as 64 hex digits; Ignition refuses a mismatch.
	HostagentSHA256 string
	// HostagentConfig is the hostagent's config file content (contains the node token).
	HostagentConfig []byte
	// Snippets are user Ignition configs (any spec 3.0.0–3.5.0) merged over the rendered config in
	// order, e.g. role snippets first, then node snippets.
	Snippets []Snippet
}

// LogValue implements slog.LogValuer without the secret hostagent config or snippet contents.
func (p Params) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("node", p.Node),
		slog.String("applianceURL", p.ApplianceURL),
		slog.Int("mirrors", len(p.Mirrors)),
		slog.String("hostagentURL", p.HostagentURL),
		slog.Int("snippets", len(p.Snippets)),
	)
}

// Snippet is one user-supplied Ignition config.
type Snippet struct {
	Name string // where it came from (file path), used in messages
	Data []byte // Ignition JSON, spec 3.0.0 to 3.5.0
}

// Config is a rendered node config: the base in spec 3.3.0 plus the parsed snippets. It is
// immutable; Marshal is safe for concurrent use.
type Config struct {
	node     string
	base     types.Config
	snippets []parsedSnippet
}

type parsedSnippet struct {
	name    string
	data    []byte
	version semver.Version
}

// String describes the config without its contents (which hold the node token).
func (c *Config) String() string {
	return fmt.Sprintf("ignition.Config{node: %q, snippets: %d}", c.node, len(c.snippets))
}

// GoString is String, so that %#v does not print the node token either.
func (c *Config) GoString() string { return c.String() }

// Render validates p, builds the node's base config in spec 3.3.0, validates it with Ignition's
// validator, and parses every snippet. Errors wrap ErrInvalidParams (listing every bad field),
// ErrInvalidSnippet (naming the snippet) or ErrInvalidConfig.
func Render(p Params) (*Config, error) {
	mirrors, err := checkParams(p)
	if err != nil {
		return nil, err
	}

	caSource := dataURL(p.CAPEM)
	file := func(path string, mode int, contents types.Resource) types.File {
		return types.File{
			Node:          types.Node{Path: path, Overwrite: util.BoolToPtr(true)},
			FileEmbedded1: types.FileEmbedded1{Mode: util.IntToPtr(mode), Contents: contents},
		}
	}
	inline := func(b []byte) types.Resource { return types.Resource{Source: util.StrToPtr(dataURL(b))} }

	cfg := types.Config{Ignition: types.Ignition{
		Version: types.MaxVersion.String(),
		Security: types.Security{TLS: types.TLS{CertificateAuthorities: []types.Resource{
			{Source: util.StrToPtr(caSource)},
		}}},
	}}
	files := []types.File{
		file(CAPathFedora, 0o644, inline(p.CAPEM)),
		file(CAPathDebian, 0o644, inline(p.CAPEM)),
		file(ContainerdCAPath, 0o644, inline(p.CAPEM)),
	}
	for _, m := range mirrors {
		files = append(files, file(ContainerdCertsDir+"/"+m.Registry+"/hosts.toml", 0o644, inline(hostsTOML(m))))
	}
	files = append(files,
		file(HostagentConfigPath, 0o600, inline(p.HostagentConfig)),
		file(HostagentBinaryPath, 0o755, types.Resource{
			Source:       util.StrToPtr(p.HostagentURL),
			Verification: types.Verification{Hash: util.StrToPtr("sha256-" + strings.ToLower(p.HostagentSHA256))},
		}),
	)
	cfg.Storage = types.Storage{
		Directories: []types.Directory{{
			Node:               types.Node{Path: HostagentConfigDir},
			DirectoryEmbedded1: types.DirectoryEmbedded1{Mode: util.IntToPtr(0o700)},
		}},
		Files: files,
	}
	cfg.Systemd = types.Systemd{Units: []types.Unit{{
		Name:     HostagentUnit,
		Enabled:  util.BoolToPtr(true),
		Contents: util.StrToPtr(agentapi.HostagentUnitContents),
	}}}

	if rpt := validate.ValidateWithContext(cfg, nil); rpt.IsFatal() {
		return nil, fmt.Errorf("%w: rendered config for node %q: %s", ErrInvalidConfig, p.Node, rpt)
	}

	c := &Config{node: p.Node, base: cfg}
	for i, s := range p.Snippets {
		ps, err := parseSnippet(s)
		if err != nil {
			return nil, fmt.Errorf("node %q, snippets[%d]: %w", p.Node, i, err)
		}
		c.snippets = append(c.snippets, ps)
	}
	return c, nil
}

// parseSnippet checks that s is a valid Ignition 3.x config of a supported version (parsing it with
// the newest supported spec's ParseCompatibleVersion) and records its declared version.
func parseSnippet(s Snippet) (parsedSnippet, error) {
	v, rpt, err := util.GetConfigVersion(s.Data)
	if err != nil {
		return parsedSnippet{}, fmt.Errorf("%w %q: %w %s: it must be an Ignition JSON config with ignition.version set",
			ErrInvalidSnippet, s.Name, err, strings.TrimSpace(rpt.String()))
	}
	newest := *semver.New(SupportedVersions[len(SupportedVersions)-1])
	if v.Major != 3 || newest.LessThan(v) {
		return parsedSnippet{}, fmt.Errorf("%w %q: it declares Ignition spec %s; supported are 3.0.0 to %s (convert it with butane)", ErrInvalidSnippet, s.Name, v, newest)
	}
	if _, rpt, err := v3_5.ParseCompatibleVersion(s.Data); err != nil {
		return parsedSnippet{}, fmt.Errorf("%w %q: %w: %s", ErrInvalidSnippet, s.Name, err, strings.TrimSpace(rpt.String()))
	}
	return parsedSnippet{name: s.Name, data: slices.Clone(s.Data), version: v}, nil
}

// dataURL embeds b as an RFC 2397 data URL with URL-escaped (RFC 2396) contents, "data:,...", the
// encoding Butane uses for inline files, made by the library Ignition decodes it with.
func dataURL(b []byte) string { return "data:," + dataurl.Escape(b) }

// checkParams validates p and returns the mirrors sorted by registry with endpoints filled in.
// Every problem is reported with its field path.
func checkParams(p Params) ([]Mirror, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if strings.TrimSpace(p.Node) == "" {
		bad("node", "must not be empty")
	}
	appliance, err := httpsURL(p.ApplianceURL)
	if err != nil {
		bad("applianceURL", "%v", err)
	}
	if err := checkCA(p.CAPEM); err != nil {
		bad("caPEM", "%v", err)
	}
	if _, err := httpsURL(p.HostagentURL); err != nil {
		bad("hostagentURL", "%v", err)
	}
	if b, err := hex.DecodeString(p.HostagentSHA256); err != nil || len(b) != sha256.Size {
		bad("hostagentSHA256", "%q is not a SHA-256 digest (want 64 hex digits)", p.HostagentSHA256)
	}
	if len(p.HostagentConfig) == 0 {
		bad("hostagentConfig", "must not be empty")
	}

	mirrors := make([]Mirror, 0, len(p.Mirrors))
	seen := map[string]int{}
	for i, m := range p.Mirrors {
		field := fmt.Sprintf("mirrors[%d]", i)
		if err := checkRegistryHost(m.Registry); err != nil {
			bad(field+".registry", "%v", err)
			continue
		}
		if j, dup := seen[strings.ToLower(m.Registry)]; dup {
			bad(field+".registry", "%q is already mirrored by mirrors[%d]", m.Registry, j)
			continue
		}
		seen[strings.ToLower(m.Registry)] = i
		if m.Endpoint == "" && appliance != nil {
			m.Endpoint = strings.TrimSuffix(appliance.String(), "/") + "/v2/" + m.Registry
		}
		if _, err := httpsURL(m.Endpoint); err != nil {
			bad(field+".endpoint", "%v", err)
			continue
		}
		mirrors = append(mirrors, m)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w for node %q:\n%w", ErrInvalidParams, p.Node, errors.Join(errs...))
	}
	slices.SortFunc(mirrors, func(a, b Mirror) int { return strings.Compare(a.Registry, b.Registry) })
	return mirrors, nil
}

// httpsURL parses an absolute https URL with a host and without user info, query or fragment.
func httpsURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	switch {
	case s == "":
		return nil, errors.New("must not be empty")
	case err != nil:
		return nil, fmt.Errorf("%q is not a URL: %w", s, err)
	case u.Scheme != "https" || u.Host == "":
		return nil, fmt.Errorf("%q is not an https URL (want https://host[:port]/...)", s)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return nil, fmt.Errorf("%q must not carry user info, a query or a fragment", s)
	}
	return u, nil
}

// checkCA accepts PEM holding only CA certificates (at least one); a private key is refused so
// that a CA key never reaches every node by mistake.
func checkCA(b []byte) error {
	n := 0
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			if len(strings.TrimSpace(string(rest))) > 0 && n == 0 {
				return errors.New("no PEM certificate found")
			}
			break
		}
		if blk.Type != "CERTIFICATE" {
			return fmt.Errorf("PEM block %d is a %q, want only CERTIFICATE blocks (never ship the CA key)", n+1, blk.Type)
		}
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return fmt.Errorf("certificate %d: %w", n+1, err)
		}
		if !cert.IsCA {
			return fmt.Errorf("certificate %d (%s) is not a CA certificate", n+1, cert.Subject)
		}
		n++
	}
	if n == 0 {
		return errors.New("no PEM certificate found")
	}
	return nil
}

// checkRegistryHost accepts host[:port] as in an image reference's domain (distribution/reference):
// a DNS name or IP address (IPv6 in brackets), optional port 1-65535.
func checkRegistryHost(s string) error {
	host := s
	if h, port, err := net.SplitHostPort(s); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%q has a bad port (want host[:port])", s)
		}
		host = h
		if _, err := netip.ParseAddr(host); err == nil {
			return nil
		}
	}
	if _, err := netip.ParseAddr(host); err == nil && !strings.Contains(host, ":") {
		return nil
	}
	if host == "" || len(host) > 253 {
		return fmt.Errorf("%q is not a registry host (want host[:port], e.g. registry.k8s.io)", s)
	}
	for _, label := range strings.Split(host, ".") {
		if !validLabel(label) {
			return fmt.Errorf("%q is not a registry host (want host[:port], e.g. registry.k8s.io)", s)
		}
	}
	return nil
}

func validLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
