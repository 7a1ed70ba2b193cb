package debrepo

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// ErrUnresolvable: apt cannot install a requested package on an empty system: it does not exist, has
// no installation candidate, or has a dependency no source satisfies. *ResolveError wraps it.
var ErrUnresolvable = errors.New("cannot resolve packages")

// ErrApt: apt-get failed for another reason (configuration, network, signature); the error carries
// apt's E:/W: lines.
var ErrApt = errors.New("apt-get failed")

// Options configures Resolve.
type Options struct {
	// Sources are the signed repositories to use (at least one).
	Sources []Source
	// Arch is the node architecture, a Debian architecture name (e.g. "amd64"): APT::Architecture,
	// and the only one (no multi-arch).
	Arch string
	// Packages are the package names to install (Debian Policy §5.6.1 names, no version or
	// architecture qualifiers); their Depends and Pre-Depends are added by apt (Recommends and
	// Suggests are not).
	Packages []string
	// StateDir holds apt's private configuration and state (sources.list, copies of the keyrings,
	// lists/, the empty dpkg status, caches). Kept between runs: an unchanged repository then answers
	// apt-get update with 304s. Required; no whitespace in the path (sources.list cannot quote it).
	StateDir string
	// CacheDir is apt's Dir::Cache::archives: the downloaded .debs. Kept between runs: apt reuses a
	// .deb already there when its hash matches, so a rerun downloads nothing again. Required.
	CacheDir string
	// CAFile is a PEM file of extra CA certificates for https sources (Acquire::https::CaInfo for apt;
	// added to the system roots for FetchIndex when HTTPClient is nil). Optional.
	CAFile string
	// HTTPClient fetches the sources for the pre-flight check (FetchIndex). Nil: a client trusting the
	// system roots plus CAFile.
	HTTPClient *http.Client
	// AptGet is the apt-get binary. Default: "apt-get" from PATH.
	AptGet string
	// Now is the clock for signature and Valid-Until checks. Default time.Now.
	Now func() time.Time
	// Log receives progress (constant messages, data in attributes). Default: discard.
	Log *slog.Logger
}

// Result is what Resolve found and downloaded.
type Result struct {
	// Packages is the full closure apt chose for an empty system, sorted by name: each with Name,
	// Version, Architecture, Filename, Size, SHA256 (of the downloaded file, equal to the one in the
	// signed Packages index), Depends, PreDepends, Component, SourceURI, URL and Path (the .deb in
	// CacheDir).
	Packages []Package
	// Indexes are the verified indexes of Options.Sources, in order.
	Indexes []*Index
}

// Paths returns the downloaded .deb files, in Packages order.
func (r *Result) Paths() []string {
	out := make([]string, len(r.Packages))
	for i, p := range r.Packages {
		out[i] = p.Path
	}
	return out
}

// Problem is one package apt cannot install, with apt's reason.
type Problem struct {
	// Package is the package apt names (a requested package, or the one whose dependency fails).
	Package string
	// Reason is apt's words, e.g. "Depends: libfoo but it is not installable", "has no
	// installation candidate", "Unable to locate package".
	Reason string
}

// ResolveError lists the packages apt cannot install. It wraps ErrUnresolvable.
type ResolveError struct {
	Problems []Problem
}

// Error is one line, e.g. `cannot resolve packages: broken: Depends: missing but it is not
// installable`.
func (e *ResolveError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.Package + ": " + p.Reason
	}
	return ErrUnresolvable.Error() + ": " + strings.Join(parts, "; ")
}

// Unwrap returns ErrUnresolvable.
func (e *ResolveError) Unwrap() error { return ErrUnresolvable }

// Resolve computes and downloads the packages a node that starts empty needs to install
// opt.Packages, the way apt resolves them, by driving the real apt-get:
//
//  1. Pre-flight: every source is verified with FetchIndex (signature against its own keyring,
//     Valid-Until, Packages hash), so a bad source fails with a message naming it and the key IDs.
//  2. apt gets a private world in StateDir: an APT_CONFIG that replaces the host's apt.conf(.d),
//     sources.list(.d), preferences, trusted keys and auth.conf with its own, an empty dpkg status
//     (Dir::State::status), APT::Architecture(s) = Arch, no Recommends/Suggests, no insecure
//     repositories, and sources.list lines "deb [arch=Arch signed-by=COPY] URI SUITE COMPONENTS".
//  3. `apt-get update --error-on=any` (apt checks the Release signatures and index hashes itself).
//  4. `apt-get install --download-only --print-uris` into an empty archives directory lists the whole
//     closure (Depends, Pre-Depends; virtual packages resolved to the provider apt picks) with URLs;
//     an unknown package, one without candidate or an unsatisfiable dependency becomes a
//     *ResolveError naming it.
//  5. `apt-get install --download-only` with Dir::Cache::archives = CacheDir downloads what is not
//     there yet; apt checks every .deb against the signed Packages hashes.
//  6. Each .deb is hashed again and matched to its paragraph in the verified index (ErrHashMismatch
//     otherwise).
//
// apt-get runs with LC_ALL=C (its messages are parsed) and inherits the environment otherwise (so
// http_proxy/https_proxy apply). As root, apt's download sandbox user is root (Dir paths under a
// private 0700 directory are not readable by _apt). Proxy settings in the host's apt.conf.d are not
// read. apt locks StateDir and CacheDir: one Resolve per directory at a time.
func Resolve(ctx context.Context, opt Options) (*Result, error) {
	if err := opt.check(); err != nil {
		return nil, err
	}
	var err error
	if opt.StateDir, err = filepath.Abs(opt.StateDir); err != nil {
		return nil, err
	}
	if opt.CacheDir, err = filepath.Abs(opt.CacheDir); err != nil {
		return nil, err
	}
	log := opt.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := time.Now
	if opt.Now != nil {
		now = opt.Now
	}
	client := opt.HTTPClient
	if client == nil {
		c, err := clientWithCA(opt.CAFile)
		if err != nil {
			return nil, err
		}
		client = c
	}
	res := &Result{}
	for _, src := range opt.Sources {
		idx, err := FetchIndex(ctx, client, src, opt.Arch, now())
		if err != nil {
			return nil, err
		}
		log.Info("verified source", "uri", src.URI, "suite", src.Suite, "packages", len(idx.Packages), "signers", idx.SignerFingerprints)
		res.Indexes = append(res.Indexes, idx)
	}
	a, err := newAptEnv(opt)
	if err != nil {
		return nil, err
	}
	if _, err := a.run(ctx, "update", "--error-on=any"); err != nil {
		return nil, err
	}
	log.Info("apt-get update done", "state", opt.StateDir)
	planDir, err := os.MkdirTemp(opt.StateDir, "plan-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(planDir)
	if err := os.MkdirAll(filepath.Join(planDir, "partial"), 0o755); err != nil {
		return nil, err
	}
	install := append([]string{"install", "--download-only", "--no-install-recommends", "-y"}, opt.Packages...)
	out, err := a.run(ctx, append([]string{"-o", "Dir::Cache::archives=" + planDir, "--print-uris"}, install...)...)
	if err != nil {
		return nil, err
	}
	log.Debug("apt-get --print-uris", "output", out)
	uris, err := parsePrintURIs(out)
	if err != nil {
		return nil, err
	}
	if len(uris) == 0 {
		return nil, fmt.Errorf("%w: apt planned no download for %s", ErrApt, strings.Join(opt.Packages, " "))
	}
	log.Info("resolved", "requested", len(opt.Packages), "closure", len(uris))
	if _, err := a.run(ctx, install...); err != nil {
		return nil, err
	}
	files := indexFiles(res.Indexes)
	for _, u := range uris {
		p, err := matchDownload(u, res.Indexes, files, opt.CacheDir)
		if err != nil {
			return nil, err
		}
		res.Packages = append(res.Packages, p)
	}
	sortPackages(res.Packages)
	log.Info("downloaded", "packages", len(res.Packages), "cache", opt.CacheDir)
	return res, nil
}

func (opt *Options) check() error {
	var errs []error
	if len(opt.Sources) == 0 {
		errs = append(errs, errors.New("no sources"))
	}
	for _, s := range opt.Sources {
		if err := s.check(); err != nil {
			errs = append(errs, err)
		}
	}
	if opt.Arch == "" || !pkgNameRE.MatchString(opt.Arch) {
		errs = append(errs, fmt.Errorf("architecture %q is not a Debian architecture name", opt.Arch))
	}
	if len(opt.Packages) == 0 {
		errs = append(errs, errors.New("no packages to resolve"))
	}
	for _, p := range opt.Packages {
		if !pkgNameRE.MatchString(p) {
			errs = append(errs, fmt.Errorf("package %q is not a Debian package name", p))
		}
	}
	for _, f := range []struct{ name, dir string }{{"StateDir", opt.StateDir}, {"CacheDir", opt.CacheDir}, {"CAFile", opt.CAFile}} {
		name, d := f.name, f.dir
		if d == "" && name != "CAFile" {
			errs = append(errs, fmt.Errorf("%s is required", name))
		} else if strings.ContainsAny(d, " \t\n\"]") {
			errs = append(errs, fmt.Errorf("%s %q: whitespace, quotes or ']' cannot be written into apt's configuration", name, d))
		}
	}
	return errors.Join(errs...)
}

func clientWithCA(caFile string) (*http.Client, error) {
	if caFile == "" {
		return &http.Client{Timeout: 10 * time.Minute}, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s: no PEM certificate in it", caFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr, Timeout: 10 * time.Minute}, nil
}

// aptEnv is one private apt configuration.
type aptEnv struct {
	bin    string
	config string // the APT_CONFIG file
}

// newAptEnv writes opt.StateDir's apt configuration: apt.conf, sources.list, keyring copies, empty
// dpkg status and the directories apt expects.
func newAptEnv(opt Options) (*aptEnv, error) {
	state, err := filepath.Abs(opt.StateDir)
	if err != nil {
		return nil, err
	}
	cache, err := filepath.Abs(opt.CacheDir)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"etc/apt.conf.d", "etc/sources.list.d", "etc/preferences.d", "etc/trusted.gpg.d",
		"etc/auth.conf.d", "keyrings", "lists/partial", "cache", "log", "dpkg"} {
		if err := os.MkdirAll(filepath.Join(state, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Join(cache, "partial"), 0o755); err != nil {
		return nil, err
	}
	var sl bytes.Buffer
	fmt.Fprintf(&sl, "# written by appliance (pkg/debrepo); one line per source, sources.list(5)\n")
	for i, s := range opt.Sources {
		data, err := os.ReadFile(s.Keyring)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w: %w", s.URI, s.Suite, ErrKeyring, err)
		}
		// apt tells armored from binary keyrings by the extension (.asc / .gpg).
		ext := ".gpg"
		if isArmored(data) {
			ext = ".asc"
		}
		kr := filepath.Join(state, "keyrings", "source-"+strconv.Itoa(i)+ext)
		if err := writeFile(kr, data, 0o644); err != nil {
			return nil, err
		}
		fmt.Fprintf(&sl, "deb [arch=%s signed-by=%s] %s %s %s\n", opt.Arch, kr, s.URI, s.Suite, strings.Join(s.Components, " "))
	}
	if err := writeFile(filepath.Join(state, "etc", "sources.list"), sl.Bytes(), 0o644); err != nil {
		return nil, err
	}
	status := filepath.Join(state, "dpkg", "status")
	if err := writeFile(status, nil, 0o644); err != nil { // empty: a node with nothing installed
		return nil, err
	}
	q := strconv.Quote
	conf := []string{
		"// written by appliance (pkg/debrepo): a private apt that reads nothing of the host's configuration",
		"Dir::Etc::main " + q("/dev/null") + ";",
		"Dir::Etc::parts " + q(filepath.Join(state, "etc", "apt.conf.d")) + ";",
		"Dir::Etc::sourcelist " + q(filepath.Join(state, "etc", "sources.list")) + ";",
		"Dir::Etc::sourceparts " + q(filepath.Join(state, "etc", "sources.list.d")) + ";",
		"Dir::Etc::preferences " + q(filepath.Join(state, "etc", "preferences")) + ";",
		"Dir::Etc::preferencesparts " + q(filepath.Join(state, "etc", "preferences.d")) + ";",
		"Dir::Etc::trusted " + q(filepath.Join(state, "etc", "trusted.gpg")) + ";",
		"Dir::Etc::trustedparts " + q(filepath.Join(state, "etc", "trusted.gpg.d")) + ";",
		"Dir::Etc::netrc " + q(filepath.Join(state, "etc", "auth.conf")) + ";",
		"Dir::Etc::netrcparts " + q(filepath.Join(state, "etc", "auth.conf.d")) + ";",
		"Dir::State " + q(state) + ";",
		"Dir::State::lists " + q(filepath.Join(state, "lists")) + ";",
		"Dir::State::status " + q(status) + ";",
		"Dir::State::extended_states " + q(filepath.Join(state, "extended_states")) + ";",
		"Dir::Cache " + q(filepath.Join(state, "cache")) + ";",
		"Dir::Cache::archives " + q(cache) + ";",
		"Dir::Log " + q(filepath.Join(state, "log")) + ";",
		"APT::Architecture " + q(opt.Arch) + ";",
		"APT::Architectures { " + q(opt.Arch) + "; };",
		"APT::Install-Recommends \"false\";",
		"APT::Install-Suggests \"false\";",
		"APT::Get::AllowUnauthenticated \"false\";",
		"Acquire::AllowInsecureRepositories \"false\";",
		"Acquire::AllowWeakRepositories \"false\";",
		"Acquire::AllowDowngradeToInsecureRepositories \"false\";",
		"Acquire::Languages \"none\";",
		"Acquire::GzipIndexes \"false\";",
		"Acquire::AllowReleaseInfoChange::Suite \"true\";", // stable becomes oldstable at each Debian release
	}
	if opt.CAFile != "" {
		ca, err := filepath.Abs(opt.CAFile)
		if err != nil {
			return nil, err
		}
		conf = append(conf, "Acquire::https::CaInfo "+q(ca)+";")
	}
	if os.Geteuid() == 0 {
		conf = append(conf, "APT::Sandbox::User \"root\";")
	}
	cfg := filepath.Join(state, "etc", "apt.conf")
	if err := writeFile(cfg, []byte(strings.Join(conf, "\n")+"\n"), 0o644); err != nil {
		return nil, err
	}
	bin := opt.AptGet
	if bin == "" {
		bin = "apt-get"
	}
	return &aptEnv{bin: bin, config: cfg}, nil
}

// run runs apt-get with args (after -q) and returns its combined output. A non-zero exit becomes a
// *ResolveError when apt names packages it cannot install, ErrApt otherwise.
func (a *aptEnv) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, a.bin, append([]string{"-q"}, args...)...)
	cmd.Env = append(os.Environ(), "APT_CONFIG="+a.config, "LC_ALL=C", "LANGUAGE=", "DEBIAN_FRONTEND=noninteractive")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Stdin = nil
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	text := out.String()
	if err == nil {
		return text, nil
	}
	if ctx.Err() != nil {
		return text, fmt.Errorf("apt-get %s: %w", args[0], ctx.Err())
	}
	if probs := parseProblems(text); len(probs) > 0 {
		return text, &ResolveError{Problems: probs}
	}
	return text, fmt.Errorf("%w: apt-get %s: %v: %s", ErrApt, strings.Join(args, " "), err, aptMessages(text))
}

// aptMessages returns apt's E: and W: lines joined on one line, or the output's last line.
func aptMessages(out string) string {
	var msgs []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "E: ") || strings.HasPrefix(l, "W: ") || strings.HasPrefix(l, "Err:") {
			msgs = append(msgs, strings.TrimSpace(l))
		}
	}
	if len(msgs) == 0 {
		lines := strings.Split(strings.TrimSpace(out), "\n")
		return strings.TrimSpace(lines[len(lines)-1])
	}
	return strings.Join(msgs, " | ")
}

var (
	unableToLocateRE = regexp.MustCompile(`^E: Unable to locate package (\S+)`)
	noCandidateRE    = regexp.MustCompile(`^E: Package '([^']+)' has no installation candidate`)
	// " a : Depends: zzz but it is not installable" (the first line of a package's unmet list) and
	// "      PreDepends: ..." (further lines of the same package).
	unmetFirstRE = regexp.MustCompile(`^ (\S+) : (.+)$`)
	unmetMoreRE  = regexp.MustCompile(`^ {2,}(\S.*)$`)
)

// parseProblems finds apt's reasons for not installing packages (apt-get, LC_ALL=C): "Unable to locate
// package X", "Package 'X' has no installation candidate" and the "The following packages have unmet
// dependencies:" block.
func parseProblems(out string) []Problem {
	var probs []Problem
	inUnmet := false
	last := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		if m := unableToLocateRE.FindStringSubmatch(l); m != nil {
			probs = append(probs, Problem{Package: m[1], Reason: "Unable to locate package (no source lists it)"})
			continue
		}
		if m := noCandidateRE.FindStringSubmatch(l); m != nil {
			probs = append(probs, Problem{Package: m[1], Reason: "has no installation candidate"})
			continue
		}
		if strings.Contains(l, "have unmet dependencies:") {
			inUnmet = true
			continue
		}
		if !inUnmet {
			continue
		}
		if m := unmetFirstRE.FindStringSubmatch(l); m != nil {
			last = m[1]
			probs = append(probs, Problem{Package: m[1], Reason: strings.TrimSpace(m[2])})
			continue
		}
		if m := unmetMoreRE.FindStringSubmatch(l); m != nil && last != "" {
			probs[len(probs)-1].Reason += ", " + strings.TrimSpace(m[1])
			continue
		}
		inUnmet = false
	}
	return probs
}

// plannedURI is one line of `apt-get --print-uris`: 'URL' FILE SIZE HASHTYPE:HEX.
type plannedURI struct {
	URL, File string
	Size      int64
	Hash      string // as apt prints it ("MD5Sum:…" or empty); informational only
}

// The hash column is apt's MD5Sum when the index has one, else empty (apt 2.6).
var printURIRE = regexp.MustCompile(`^'([^']+)' (\S+) (\d+)(?: (\S+))?$`)

func parsePrintURIs(out string) ([]plannedURI, error) {
	var res []plannedURI
	for _, l := range strings.Split(out, "\n") {
		m := printURIRE.FindStringSubmatch(strings.TrimSpace(l))
		if m == nil || !strings.HasSuffix(m[2], ".deb") {
			continue
		}
		size, err := strconv.ParseInt(m[3], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: --print-uris line %q: bad size", ErrApt, l)
		}
		res = append(res, plannedURI{URL: m[1], File: m[2], Size: size, Hash: m[4]})
	}
	return res, nil
}

// indexFiles maps, per index, each Filename to its paragraph.
func indexFiles(idxs []*Index) []map[string]*Package {
	out := make([]map[string]*Package, len(idxs))
	for i, idx := range idxs {
		out[i] = make(map[string]*Package, len(idx.Packages))
		for j := range idx.Packages {
			out[i][idx.Packages[j].Filename] = &idx.Packages[j]
		}
	}
	return out
}

// matchDownload finds the verified index paragraph apt's planned URL names (apt percent-encodes
// characters such as '+' in it) and checks the downloaded file against it.
func matchDownload(u plannedURI, idxs []*Index, files []map[string]*Package, cache string) (Package, error) {
	var cand *Package
	for i, idx := range idxs {
		rel, ok := strings.CutPrefix(u.URL, idx.Source.baseURL())
		if !ok {
			continue
		}
		if r, err := url.PathUnescape(rel); err == nil {
			rel = r
		}
		if cand = files[i][rel]; cand != nil {
			break
		}
	}
	if cand == nil {
		return Package{}, fmt.Errorf("%w: apt chose %s, which no verified Packages index lists", ErrApt, u.URL)
	}
	p := *cand
	p.Path = filepath.Join(cache, u.File)
	if p.Size != u.Size {
		return Package{}, fmt.Errorf("%s: %w: index says %d bytes, apt planned %d", p.Filename, ErrHashMismatch, p.Size, u.Size)
	}
	sum, n, err := hashFile(p.Path)
	if err != nil {
		return Package{}, fmt.Errorf("%w: apt did not leave %s: %w", ErrApt, u.File, err)
	}
	if n != p.Size || sum != p.SHA256 {
		return Package{}, fmt.Errorf("%s: %w: the signed index lists %d bytes SHA256 %s, the cache holds %d bytes SHA256 %s",
			p.Path, ErrHashMismatch, p.Size, p.SHA256, n, sum)
	}
	return p, nil
}

// writeFile writes data to path atomically with perm (pkg/atomicfile).
func writeFile(path string, data []byte, perm os.FileMode) error {
	_, err := atomicfile.Write(path, data, perm)
	return err
}
