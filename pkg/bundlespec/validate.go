package bundlespec

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/airgap-appliance/appliance/pkg/k8sversion"
	"github.com/airgap-appliance/appliance/pkg/strictyaml"
)

// ValidateOptions tunes Validate.
type ValidateOptions struct {
	// CheckFiles makes Validate open the files the specification names and check that each is a
	// readable regular file of the right kind: apt keyrings OpenPGP public keys, signing.repoKeyFile an
	// OpenPGP private key, signing.bundleKeyFile an ed25519 PKCS#8 PEM key, caFile PEM certificates,
	// dockerConfigFile a Docker config.json (a JSON object). Off for pure unit tests and for checking a
	// specification on another machine than the one that builds the bundle.
	CheckFiles bool
}

// MinPartSize is the smallest output.partSize other than 0.
const MinPartSize Size = 1 << 20

// maxReferencedFile bounds how much of a referenced file (keyring, key, CA bundle, Docker config) is
// read; Debian's archive keyring is about 100 KiB.
const maxReferencedFile = 4 << 20

// Validate checks s after SetDefaults and returns every problem at once (nil when there is none).
// Every FieldError has the field path, the source line when s came from Decode (the line of the field,
// or of its nearest ancestor present in the document), and says what to fix. Validate does not
// mutate s; run SetDefaults first, since unset fields that have defaults are reported as missing
// otherwise. A nil s is an error.
func Validate(s *BundleSpecification, opts ValidateOptions) ErrorList {
	if s == nil {
		return ErrorList{{Msg: "no bundle specification given"}}
	}
	v := &validator{s: s, opts: opts}
	v.typeMeta()
	v.kubernetes()
	v.images()
	v.platforms()
	v.registries()
	v.apt()
	v.packages()
	v.signing()
	v.output()
	return v.errs
}

type validator struct {
	s    *BundleSpecification
	opts ValidateOptions
	errs ErrorList
}

func (v *validator) errorf(path, format string, args ...any) {
	switch {
	case len(v.errs) < strictyaml.MaxErrors:
		v.errs = append(v.errs, &FieldError{Path: path, Line: v.line(path), Msg: fmt.Sprintf(format, args...)})
	case len(v.errs) == strictyaml.MaxErrors:
		v.errs = append(v.errs, &FieldError{Msg: fmt.Sprintf("too many errors (more than %d): fix these first", strictyaml.MaxErrors)})
	}
}

// line returns the source line of path, or of its nearest ancestor present in the document, or 0.
func (v *validator) line(path string) int { return v.s.lines.Line(path) }

func (v *validator) typeMeta() {
	if v.s.APIVersion != APIVersion {
		v.errorf("apiVersion", "%q is not supported: set apiVersion: %s", v.s.APIVersion, APIVersion)
	}
	if v.s.Kind != Kind {
		v.errorf("kind", "%q is not supported: set kind: %s", v.s.Kind, Kind)
	}
}

// versionRE is a Kubernetes release version as kubeadm names it, without pre-release or build suffix.
var versionRE = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

// exampleVersion is the version error messages suggest: the newest patch of the newest supported
// minor the table was read from (pkg/k8sversion).
var exampleVersion = k8sversion.Newest().Source

// kubernetes checks kubernetes.version: a release version whose minor the appliance deploys
// (pkg/k8sversion's table), e.g. `kubernetes.version: "v1.34.4" cannot be bundled: unsupported
// Kubernetes minor v1.34: the appliance deploys v1.35, v1.36 and v1.37; use e.g. v1.37.2`.
func (v *validator) kubernetes() {
	switch ver := v.s.Kubernetes.Version; {
	case ver == "":
		v.errorf("kubernetes.version", "is required: the Kubernetes release the bundle is for, vMAJOR.MINOR.PATCH, e.g. %s", exampleVersion)
	case !versionRE.MatchString(ver):
		hint := ""
		if versionRE.MatchString("v" + ver) {
			hint = fmt.Sprintf(" (did you mean v%s?)", ver)
		}
		v.errorf("kubernetes.version", "%q is not a Kubernetes release version%s: write vMAJOR.MINOR.PATCH, e.g. %s", ver, hint, exampleVersion)
	default:
		if _, err := k8sversion.Lookup(ver); err != nil {
			v.errorf("kubernetes.version", "%q cannot be bundled: %v", ver, err)
		}
	}
}

// kubernetesRelease is the table's entry for kubernetes.version, and whether it has one (the
// version is well-formed and its minor supported).
func (v *validator) kubernetesRelease() (k8sversion.Release, bool) {
	if !versionRE.MatchString(v.s.Kubernetes.Version) {
		return k8sversion.Release{}, false
	}
	rel, err := k8sversion.Lookup(v.s.Kubernetes.Version)
	return rel, err == nil
}

// kubernetesAptSource refuses a Kubernetes project repository (pkgs.k8s.io/core:/stable:/v1.NN/deb/,
// one per minor) of another minor than kubernetes.version's: apt would take kubelet, kubeadm and
// kubectl from it, and the nodes would run a kubelet the bundle's images do not match.
func (v *validator) kubernetesAptSource(path, uri string) {
	minor, ok := k8sversion.AptRepositoryMinor(uri)
	rel, known := v.kubernetesRelease()
	if !ok || !known || minor == rel.Minor {
		return
	}
	v.errorf(path, "%q serves the Kubernetes %s packages but kubernetes.version is %s: the nodes would get kubelet, kubeadm and kubectl of another minor than the bundle's images; use %s",
		uri, minor, v.s.Kubernetes.Version, rel.AptRepository())
}

func (v *validator) images() {
	seen := map[string]string{}
	for _, list := range []struct {
		path string
		refs []string
	}{{"images.install", v.s.Images.Install}, {"images.extra", v.s.Images.Extra}} {
		for i, ref := range list.refs {
			p := fmt.Sprintf("%s[%d]", list.path, i)
			if why := checkImageReference(ref); why != "" {
				v.errorf(p, "%q %s", ref, why)
				continue
			}
			if first, dup := seen[ref]; dup {
				v.errorf(p, "%q is also %s: list each image once", ref, first)
				continue
			}
			seen[ref] = p
		}
	}
}

func (v *validator) platforms() {
	ps := v.s.Platforms
	if len(ps) == 0 {
		v.errorf("platforms", "is required: list the platforms to keep, e.g. [linux/amd64], or [%s] to keep every image index whole", PlatformAll)
		return
	}
	seen := map[string]string{}
	for i, p := range ps {
		path := fmt.Sprintf("platforms[%d]", i)
		if p == PlatformAll {
			if len(ps) > 1 {
				v.errorf(path, "%q keeps every platform, so it must be the only entry: remove it or the others", PlatformAll)
			}
			continue
		}
		if _, err := ParsePlatform(p); err != nil {
			v.errorf(path, "%q is not a platform: %s", p, strings.TrimPrefix(err.Error(), ErrPlatform.Error()+": "))
			continue
		}
		if first, dup := seen[p]; dup {
			v.errorf(path, "%q is also %s: remove one", p, first)
			continue
		}
		seen[p] = path
	}
}

// dockerHubAliases are other host names of Docker Hub's registry.
var dockerHubAliases = []string{"index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"}

func (v *validator) registries() {
	r := v.s.Registries
	v.auth("registries.auth", r.Auth)
	hosts := make([]string, 0, len(r.Hosts))
	for h := range r.Hosts {
		hosts = append(hosts, h)
	}
	slices.Sort(hosts)
	for _, host := range hosts {
		reg := r.Hosts[host]
		path := strictyaml.KeyPath("registries.hosts", host)
		switch {
		case host == "":
			v.errorf(path, "the key is empty: the keys are registry hosts as image references write them, e.g. registry.k8s.io")
		case slices.Contains(dockerHubAliases, host):
			v.errorf(path, "image references name Docker Hub %s: use the key %s", dockerHub, dockerHub)
		default:
			if why := checkHostPort(host, false); why != "" {
				v.errorf(path, "%q %s; the keys are registry hosts as image references write them, e.g. registry.k8s.io or registry.corp:5000", host, why)
			}
		}
		seen := map[string]string{}
		for i, m := range reg.Mirrors {
			mp := fmt.Sprintf("%s.mirrors[%d]", path, i)
			if !v.mirrorURL(mp, m) {
				continue
			}
			key := strings.TrimSuffix(m, "/")
			if first, dup := seen[key]; dup {
				v.errorf(mp, "%q is also %s: remove one", m, first)
				continue
			}
			seen[key] = mp
		}
		if reg.MirrorsOnly && len(reg.Mirrors) == 0 {
			v.errorf(path+".mirrorsOnly", "is true but %s has no mirrors: its images could come from nowhere; name a mirror or drop mirrorsOnly", path)
		}
		v.caFile(path+".caFile", reg.CAFile)
		v.auth(path+".auth", reg.Auth)
	}
}

// mirrorURL checks a registry mirror endpoint: an https:// URL, optionally with a path.
func (v *validator) mirrorURL(path, s string) bool {
	u, err := url.Parse(s)
	switch {
	case s == "":
		v.errorf(path, "is empty: write the mirror's https:// URL, or remove the entry")
	case err != nil || u.Scheme == "" || u.Opaque != "" || u.Host == "":
		v.errorf(path, "%q is not a URL: write the mirror's https:// URL, e.g. https://mirror.corp.example", s)
	case u.Scheme == "http":
		v.errorf(path, "%q is plain HTTP: registries are reached over TLS only; use https:// (and caFile for a private CA)", s)
	case u.Scheme != "https":
		v.errorf(path, "%q is not an https:// URL: write the mirror's https:// URL, e.g. https://mirror.corp.example", s)
	case u.User != nil:
		v.errorf(path, "%q carries credentials: remove them and use auth.dockerConfigFile", s)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(s, "#"):
		v.errorf(path, "%q has a query or fragment: write the mirror's base URL only", s)
	default:
		if why := checkHostPort(u.Host, true); why != "" {
			v.errorf(path, "%q: the host %q %s", s, u.Host, why)
			return false
		}
		return true
	}
	return false
}

// caFile checks an optional PEM CA bundle file: a usable path and, with CheckFiles, at least one
// certificate in it.
func (v *validator) caFile(path, f string) {
	if f == "" || !v.filePath(path, f) || !v.opts.CheckFiles {
		return
	}
	if data, ok := v.readFile(path, f); ok && !x509.NewCertPool().AppendCertsFromPEM(data) {
		v.errorf(path, "%s holds no PEM certificate: name the CA bundle (-----BEGIN CERTIFICATE-----)", f)
	}
}

func (v *validator) auth(path string, a RegistryAuth) {
	p := path + ".dockerConfigFile"
	if a.DockerConfigFile == "" || !v.filePath(p, a.DockerConfigFile) || !v.opts.CheckFiles {
		return
	}
	data, ok := v.readFile(p, a.DockerConfigFile)
	if !ok {
		return
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(data, &cfg); err != nil || cfg == nil {
		v.errorf(p, "%s is not a Docker config.json (a JSON object such as {\"auths\": {...}}): name the file `docker login` writes, e.g. /root/.docker/config.json", a.DockerConfigFile)
		return
	}
	if raw, ok := cfg["auths"]; ok {
		var auths map[string]json.RawMessage
		if err := json.Unmarshal(raw, &auths); err != nil {
			v.errorf(p, "%s: \"auths\" is not a JSON object of registry → credentials", a.DockerConfigFile)
		}
	}
}

// componentRE is an archive area of a Debian repository: "main", "non-free-firmware",
// "updates/main".
var componentRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.+_-]*(?:/[A-Za-z0-9][A-Za-z0-9.+_-]*)*$`)

func (v *validator) apt() {
	srcs := v.s.Apt.Sources
	if len(srcs) == 0 {
		v.errorf("apt.sources", "at least one source is required: list the Debian repositories the packages come from, e.g. {uri: https://deb.debian.org/debian, suite: trixie, components: [main], signedBy: /usr/share/keyrings/debian-archive-keyring.gpg}")
		return
	}
	v.caFile("apt.caFile", v.s.Apt.CAFile)
	seen := map[[2]string]string{}
	for i, src := range srcs {
		path := fmt.Sprintf("apt.sources[%d]", i)
		uriOK := v.aptURI(path+".uri", src.URI)
		if uriOK {
			v.kubernetesAptSource(path+".uri", src.URI)
		}
		suiteOK := v.suite(path+".suite", src.Suite)
		v.components(path, src)
		switch {
		case src.SignedBy == "":
			v.errorf(path+".signedBy", "is required: the OpenPGP keyring that signs this repository (apt's Signed-By), e.g. /usr/share/keyrings/debian-archive-keyring.gpg; unsigned sources are refused")
		case v.filePath(path+".signedBy", src.SignedBy) && v.opts.CheckFiles:
			v.openPGPKey(path+".signedBy", src.SignedBy, false)
		}
		if uriOK && suiteOK {
			key := [2]string{strings.TrimSuffix(src.URI, "/"), src.Suite}
			if first, dup := seen[key]; dup {
				v.errorf(path, "is the same repository (uri and suite) as %s: merge their components into one entry", first)
				continue
			}
			seen[key] = path
		}
	}
}

func (v *validator) aptURI(path, s string) bool {
	u, err := url.Parse(s)
	switch {
	case s == "":
		v.errorf(path, "is required: the repository's base URL, e.g. https://deb.debian.org/debian")
	case err != nil || u.Opaque != "" || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https"):
		v.errorf(path, "%q is not an http:// or https:// URL: write the repository's base URL, e.g. https://deb.debian.org/debian", s)
	case u.User != nil:
		v.errorf(path, "%q carries credentials: remove them (authenticated repositories are not supported)", s)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(s, "#"):
		v.errorf(path, "%q has a query or fragment: write the repository's base URL only", s)
	default:
		if why := checkHostPort(u.Host, true); why != "" {
			v.errorf(path, "%q: the host %q %s", s, u.Host, why)
			return false
		}
		return true
	}
	return false
}

// hasSpace reports whether s holds whitespace, control or non-ASCII characters.
func hasSpace(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r >= 0x7f })
}

// hasDotDot reports whether the slash-separated path s has a ".." element.
func hasDotDot(s string) bool { return slices.Contains(strings.Split(s, "/"), "..") }

func (v *validator) suite(path, s string) bool {
	switch {
	case s == "":
		v.errorf(path, "is required: the distribution, e.g. trixie, or an exact path ending in / for a flat repository, e.g. /")
	case hasSpace(s):
		v.errorf(path, "%q contains whitespace or non-ASCII characters: write one distribution, e.g. trixie (one source per suite)", s)
	case hasDotDot(s):
		v.errorf(path, "%q contains \"..\": name a directory of the repository", s)
	case strings.HasPrefix(s, "/") && s != "/" && !strings.HasSuffix(s, "/"):
		v.errorf(path, "%q starts with '/': write the distribution, e.g. trixie, or an exact path ending in / for a flat repository", s)
	default:
		return true
	}
	return false
}

func (v *validator) components(path string, src AptSource) {
	path += ".components"
	if src.IsFlat() {
		if len(src.Components) > 0 {
			v.errorf(path, "must be empty: suite %q ends in / and so names a flat repository, which has no components (sources.list(5)); remove them, or name a distribution in suite", src.Suite)
		}
		return
	}
	if len(src.Components) == 0 {
		v.errorf(path, "at least one component is required, e.g. [main]; a flat repository has none but its suite ends in /, e.g. /")
		return
	}
	seen := map[string]string{}
	for i, c := range src.Components {
		cp := fmt.Sprintf("%s[%d]", path, i)
		switch {
		case c == "":
			v.errorf(cp, "is empty: name an archive area such as main, or remove the entry")
		case !componentRE.MatchString(c) || hasDotDot(c):
			v.errorf(cp, "%q is not a component: write one archive area such as main or non-free-firmware (one per entry)", c)
		default:
			if first, dup := seen[c]; dup {
				v.errorf(cp, "%q is also %s: remove one", c, first)
				continue
			}
			seen[c] = cp
		}
	}
}

// debianPackageRE is a Debian package name (Debian Policy §5.6.7).
var debianPackageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)

func (v *validator) packages() {
	if len(v.s.Packages) == 0 {
		v.errorf("packages", "is required: the node packages the install needs; leave it out to get the default (%s)", strings.Join(DefaultPackages(), ", "))
	}
	seen := map[string]string{}
	for _, list := range []struct {
		path string
		pkgs []string
	}{{"packages", v.s.Packages}, {"extraPackages", v.s.ExtraPackages}} {
		for i, pkg := range list.pkgs {
			p := fmt.Sprintf("%s[%d]", list.path, i)
			if why := checkPackageName(pkg); why != "" {
				v.errorf(p, "%q %s", pkg, why)
				continue
			}
			if first, dup := seen[pkg]; dup {
				v.errorf(p, "%q is also %s: list each package once", pkg, first)
				continue
			}
			seen[pkg] = p
		}
	}
}

// checkPackageName returns "" when s is a Debian package name, else why not, as a fragment that
// follows `"s" `.
func checkPackageName(s string) string {
	const rule = "lower-case letters, digits, '+', '-' and '.', at least two characters, starting with a letter or digit (Debian Policy §5.6.7)"
	switch {
	case s == "":
		return "is empty: name a Debian package, or remove the entry"
	case debianPackageRE.MatchString(s):
		return ""
	case strings.ContainsAny(s, "=<>"):
		return "is not a package name: version pins are not supported here, write the name only"
	case strings.Contains(s, ":"):
		return "is not a package name: architecture qualifiers are not supported here, write the name only"
	case debianPackageRE.MatchString(strings.ToLower(s)):
		return "is not a package name: package names are lower case, write " + strings.ToLower(s)
	}
	return "is not a Debian package name: use " + rule
}

func (v *validator) signing() {
	sg := v.s.Signing
	if sg.RepoKeyFile != "" && v.filePath("signing.repoKeyFile", sg.RepoKeyFile) && v.opts.CheckFiles {
		v.openPGPKey("signing.repoKeyFile", sg.RepoKeyFile, true)
	}
	if sg.BundleKeyFile != "" && v.filePath("signing.bundleKeyFile", sg.BundleKeyFile) {
		if sg.BundleKeyFile == sg.RepoKeyFile {
			v.errorf("signing.bundleKeyFile", "is the same file as signing.repoKeyFile: the repository is signed with an OpenPGP key and the manifest with an ed25519 key, so they are two files")
		} else if v.opts.CheckFiles {
			v.ed25519Key("signing.bundleKeyFile", sg.BundleKeyFile)
		}
	}
}

func (v *validator) output() {
	switch ps := v.s.Output.PartSize; {
	case ps == 0:
	case ps < MinPartSize:
		v.errorf("output.partSize", "%s is too small: parts hold at least %s; use 0 (or leave it out) for one part", ps, MinPartSize)
	case ps > MaxSize:
		v.errorf("output.partSize", "%d bytes is too large: at most %d", uint64(ps), uint64(MaxSize))
	}
}

// filePath checks the spelling of a file path: no "~" (it is not expanded), no control characters.
func (v *validator) filePath(path, name string) bool {
	switch {
	case strings.HasPrefix(name, "~"):
		v.errorf(path, "%q starts with ~, which is not expanded: write the path in full", name)
	case strings.ContainsFunc(name, func(r rune) bool { return r < ' ' || r == 0x7f }):
		v.errorf(path, "%q contains control characters: name a file", name)
	default:
		return true
	}
	return false
}

// readFile reads a referenced file: it must exist, be a regular file, be readable and be at most
// maxReferencedFile bytes.
func (v *validator) readFile(path, name string) ([]byte, bool) {
	st, err := os.Stat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		v.errorf(path, "%s does not exist: create it or fix the path", name)
		return nil, false
	case err != nil:
		v.errorf(path, "%s cannot be read: %v", name, err)
		return nil, false
	case !st.Mode().IsRegular():
		v.errorf(path, "%s is not a regular file: name a file", name)
		return nil, false
	}
	f, err := os.Open(name)
	if err != nil {
		v.errorf(path, "%s cannot be read: %v", name, err)
		return nil, false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxReferencedFile+1))
	switch {
	case err != nil:
		v.errorf(path, "%s cannot be read: %v", name, err)
		return nil, false
	case len(data) > maxReferencedFile:
		v.errorf(path, "%s is larger than %d bytes: name the right file", name, maxReferencedFile)
		return nil, false
	case len(data) == 0:
		v.errorf(path, "%s is empty: name the right file", name)
		return nil, false
	}
	return data, true
}

// OpenPGP packet tags (RFC 9580 §5) of the first packet of a key file.
const (
	pgpTagSecretKey = 5
	pgpTagPublicKey = 6
)

// openPGPKind returns the OpenPGP packet tag of the first packet of data, looking through ASCII
// armor by its header line; -1 when data is neither an OpenPGP packet stream nor armored key.
func openPGPKind(data []byte) int {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	switch {
	case bytes.HasPrefix(trimmed, []byte("-----BEGIN PGP PUBLIC KEY BLOCK-----")):
		return pgpTagPublicKey
	case bytes.HasPrefix(trimmed, []byte("-----BEGIN PGP PRIVATE KEY BLOCK-----")):
		return pgpTagSecretKey
	}
	b := data[0]
	switch {
	case b&0x80 == 0:
		return -1
	case b&0x40 != 0: // new packet format: the tag is the low 6 bits
		return int(b & 0x3f)
	default: // legacy format: bits 5-2
		return int(b>>2) & 0x0f
	}
}

// openPGPKey checks that a file is an OpenPGP key: a private key (secret) or a public keyring.
func (v *validator) openPGPKey(path, name string, secret bool) {
	data, ok := v.readFile(path, name)
	if !ok {
		return
	}
	kind := openPGPKind(data)
	switch {
	case secret && kind == pgpTagSecretKey, !secret && kind == pgpTagPublicKey:
	case secret && kind == pgpTagPublicKey:
		v.errorf(path, "%s holds an OpenPGP public key: name the private key that signs (gpg --export-secret-keys)", name)
	case !secret && kind == pgpTagSecretKey:
		v.errorf(path, "%s holds an OpenPGP private key: name the public keyring (gpg --export), the private key has no place in apt's configuration", name)
	case len(data) >= 12 && bytes.Equal(data[8:12], []byte("KBXf")):
		v.errorf(path, "%s is a GnuPG keybox, which apt cannot read: export the key(s) with gpg --export > FILE.gpg", name)
	case secret:
		v.errorf(path, "%s is not an OpenPGP private key (binary, or ASCII armor \"-----BEGIN PGP PRIVATE KEY BLOCK-----\")", name)
	default:
		v.errorf(path, "%s is not an OpenPGP keyring (binary .gpg, or ASCII armor \"-----BEGIN PGP PUBLIC KEY BLOCK-----\")", name)
	}
}

// ed25519Key checks that a file is an unencrypted ed25519 private key in PKCS#8 PEM.
func (v *validator) ed25519Key(path, name string) {
	data, ok := v.readFile(path, name)
	if !ok {
		return
	}
	const hint = "write one with: openssl genpkey -algorithm ed25519 -out FILE"
	block, _ := pem.Decode(data)
	switch {
	case block == nil:
		v.errorf(path, "%s is not a PEM file: name an ed25519 private key in PKCS#8 PEM (-----BEGIN PRIVATE KEY-----); %s", name, hint)
		return
	case block.Type == "ENCRYPTED PRIVATE KEY":
		v.errorf(path, "%s is encrypted: bundle create needs an unencrypted key (keep it mode 0600)", name)
		return
	case block.Type != "PRIVATE KEY":
		v.errorf(path, "%s holds a %q PEM block: name an ed25519 private key in PKCS#8 PEM (-----BEGIN PRIVATE KEY-----); %s", name, block.Type, hint)
		return
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		v.errorf(path, "%s is not a PKCS#8 private key: %v", name, err)
		return
	}
	if _, ok := key.(ed25519.PrivateKey); !ok {
		v.errorf(path, "%s holds a %T, not an ed25519 key: %s", name, key, hint)
	}
}
