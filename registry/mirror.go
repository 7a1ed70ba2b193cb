package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/distribution/reference"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// Sentinel errors of Mirror. Every per-image failure is a *MirrorImageError whose cause wraps one of
// them when it falls into one of these classes (test with errors.Is), or ErrInvalidReference / ErrLayout.
var (
	// ErrUpstreamUnreachable: no endpoint of the image's registry answered: connection refused or
	// reset, DNS failure, TLS failure (unknown CA, wrong name), no answer within Timeout, plain HTTP
	// refused, or a 5xx/429 status that persisted through the retries.
	ErrUpstreamUnreachable = errors.New("registry unreachable")
	// ErrUpstreamAuth: the registry answered 401 or 403 (distribution-spec UNAUTHORIZED / DENIED): the
	// credentials the keychain gave for it are wrong, missing, or lack pull access. Not retried.
	ErrUpstreamAuth = errors.New("registry refused the credentials")
	// ErrUpstreamNotFound: the registry answered 404 (MANIFEST_UNKNOWN, NAME_UNKNOWN, BLOB_UNKNOWN): the
	// tag, digest, repository or blob does not exist there. Not retried.
	ErrUpstreamNotFound = errors.New("not found in the registry")
	// ErrDigestMismatch: bytes received for a manifest or blob do not hash to the digest (or do not
	// have the size) their descriptor names. Nothing is written under the blob's name.
	ErrDigestMismatch = errors.New("digest mismatch")
	// ErrDiskFull: writing to the layout failed with ENOSPC or EDQUOT. Mirror stops every image.
	ErrDiskFull = errors.New("disk full")
	// ErrNoPlatform: none of the manifests of an index (or the single image's config) matches
	// MirrorOptions.Platforms.
	ErrNoPlatform = errors.New("no manifest for the requested platforms")
	// ErrUnsupportedManifest: the registry returned a manifest the appliance cannot serve (Docker
	// schema 1, or an artifact that is neither an image nor an index at the top level).
	ErrUnsupportedManifest = errors.New("unsupported manifest")
	// ErrLayoutBusy: another Mirror (in this or another process) holds the layout directory's lock.
	ErrLayoutBusy = errors.New("layout in use by another Mirror")
)

// Defaults of MirrorOptions.
const (
	DefaultMirrorConcurrency = 4                // images mirrored at once
	DefaultMirrorTimeout     = 30 * time.Second // per request: connect, response headers, and each wait for body bytes
	DefaultMirrorRetries     = 4                // retries after the first attempt, per request, for transient errors
	mirrorBlobsPerImage      = 4                // blobs of one image downloaded at once
	mirrorProgressStep       = 1 << 20          // bytes between two EventBlobProgress of one blob
	mirrorMaxDepth           = 4                // index nesting accepted (as pkg/bundle's verifier)
	partialPrefix            = ".partial-"      // temporary blob files under blobs/sha256
)

// MirrorOptions configures Mirror. The zero value pulls linux/amd64 anonymously over HTTPS with the
// system's roots, 4 images at a time.
type MirrorOptions struct {
	// Platforms lists the platforms kept from multi-platform indexes, each "os/arch[/variant]" as in
	// the OCI image-spec image-index "platform" field, e.g. "linux/amd64", "linux/arm64/v8". A wanted
	// platform without a variant matches every variant. nil or empty means ["linux/amd64"]; ["all"]
	// keeps whole indexes unchanged.
	Platforms []string
	// Concurrency is how many images are mirrored at once (default DefaultMirrorConcurrency); within
	// one image up to 4 blobs download in parallel.
	Concurrency int
	// Upstreams holds per-registry settings keyed by the registry host as it appears in references,
	// lowercased, with its port if any: "docker.io", "registry.k8s.io", "myreg:5000".
	Upstreams map[string]Upstream
	// RootCAs verifies the TLS certificates of registries and mirrors; nil means the system's roots.
	// Certificate verification is never disabled.
	RootCAs *x509.CertPool
	// Keychain gives credentials per registry (or mirror) host, e.g. DockerConfigKeychain or
	// authn.DefaultKeychain; nil means anonymous pulls.
	Keychain authn.Keychain
	// Timeout bounds every HTTP request's connect, TLS handshake and wait for response headers, and
	// each wait for more body bytes (a stall), so a large blob that keeps flowing is never cut off
	// (default DefaultMirrorTimeout).
	Timeout time.Duration
	// Retries is how many times a request failing with a transient error (network error, timeout,
	// 408, 429, 5xx) is retried, with exponential backoff from 0.5 s up to 15 s between attempts
	// (0 means DefaultMirrorRetries; negative means none). 401, 403, 404, digest mismatches, TLS
	// failures and disk errors are never retried.
	Retries int
	// Progress, when set, receives every Event. Calls are serialized (never concurrent), so the
	// function needs no locking, but it must return quickly: it runs on the download path.
	Progress func(Event)
	// Log receives retry notices and repairs of damaged layout blobs; nil discards them.
	Log *slog.Logger
	// VerifiedStamp, when set, is a file outside the layout (created or rewritten by each call) that
	// remembers which blobs were verified and with which file identity (size, mtime, ctime, inode,
	// device): a blob whose identity is unchanged since is trusted without hashing it again, so a
	// rerun with nothing new reads no blob. Empty: every present blob is hashed.
	VerifiedStamp string
	// WrapTransport, when set, wraps the HTTP transport Mirror builds (TLS with RootCAs, timeouts),
	// e.g. to count or log requests. The returned RoundTripper must be safe for concurrent use.
	WrapTransport func(http.RoundTripper) http.RoundTripper
}

// Upstream configures how one source registry is reached.
type Upstream struct {
	// Mirrors are endpoints tried in order before the registry itself, each "[https://|http://]host[:port][/prefix]":
	// the image docker.io/library/busybox:1.36 is looked up at <host>/<prefix>/library/busybox:1.36
	// (the distribution-spec <name> under the mirror's prefix). Any failure at a mirror (including
	// 404 and 401) moves on to the next endpoint. An "http://" mirror allows plain HTTP to it.
	Mirrors []string
	// PlainHTTP allows plain HTTP to the registry itself (HTTPS is still tried first). Never set it
	// for a registry across an untrusted network.
	PlainHTTP bool
	// MirrorsOnly never contacts the registry itself: its images come from Mirrors or not at all
	// (a build host that may reach only the corporate mirror; tests that must not leave the machine).
	// Needs at least one mirror.
	MirrorsOnly bool
}

// EventKind names an Event.
type EventKind string

// Event kinds, in the order an image produces them.
const (
	EventImageStart    EventKind = "image-start"    // Ref
	EventImageResolved EventKind = "image-resolved" // Ref, Digest (pinned), Size and Blobs of the whole image
	EventBlobReused    EventKind = "blob-reused"    // Ref, Digest, MediaType, Size: already in the layout, verified
	EventBlobProgress  EventKind = "blob-progress"  // Ref, Digest, Done of Size bytes received (restarts at 0 on a retry)
	EventBlobFetched   EventKind = "blob-fetched"   // Ref, Digest, MediaType, Size, Endpoint: verified and in place
	EventRetry         EventKind = "retry"          // Ref, Digest (when a blob), Endpoint, Delay, Error
	EventImageDone     EventKind = "image-done"     // Ref, Digest, Size, Blobs; Error when it failed
)

// Event reports Mirror's progress so that a caller can render bytes, blobs, rate and ETA. Sizes are
// bytes. Ref is the reference as the caller gave it.
type Event struct {
	Kind      EventKind     `json:"kind"`
	Ref       string        `json:"ref"`
	Digest    string        `json:"digest,omitempty"`    // image digest (image events) or blob digest (blob events), "sha256:<hex>"
	MediaType string        `json:"mediaType,omitempty"` // of the blob
	Done      int64         `json:"done,omitempty"`      // EventBlobProgress: bytes of this blob received so far
	Size      int64         `json:"size,omitempty"`      // blob size, or the image's total (EventImageResolved, EventImageDone)
	Blobs     int           `json:"blobs,omitempty"`     // EventImageResolved, EventImageDone: distinct blobs of the image
	Endpoint  string        `json:"endpoint,omitempty"`  // host[:port][/prefix] the bytes came from
	Delay     time.Duration `json:"delay,omitempty"`     // EventRetry: wait before the next attempt
	Error     string        `json:"error,omitempty"`     // EventRetry, EventImageDone
}

// BlobCount counts blobs and their bytes.
type BlobCount struct {
	Blobs int
	Bytes int64
}

// MirroredImage describes one image Mirror placed in the layout.
type MirroredImage struct {
	// Ref is the reference written to images/index.json's org.opencontainers.image.ref.name
	// annotation: the caller's reference in distribution's canonical form, e.g.
	// "docker.io/library/busybox:1.36" for "docker.io/busybox:1.36"; ":latest" is added when a
	// reference has neither tag nor digest.
	Ref string
	// Digest is the pinned digest of index.json's descriptor ("sha256:<hex>"). It equals SourceDigest
	// unless platforms were filtered out of an index (see Mirror).
	Digest string
	// SourceDigest is the digest the registry served for the reference (the tag's resolution).
	SourceDigest string
	// MediaType is the descriptor's media type (OCI or Docker image manifest or index).
	MediaType string
	// Platforms are the platforms kept, "os/arch[/variant]", sorted; empty for a single image whose
	// config names none.
	Platforms []string
	// Size is the sum of the sizes of the image's distinct blobs (manifests, configs, layers), in
	// bytes; Blobs counts them.
	Size  int64
	Blobs int
	// Fetched counts blobs written by this call (downloaded, or for a filtered index, derived);
	// Reused counts blobs already in the layout whose content hashed to their name. A blob shared
	// with another image of the same call may count as fetched in one and reused in the other.
	Fetched BlobCount
	Reused  BlobCount
}

// MirrorResult summarises a Mirror call.
type MirrorResult struct {
	Images []MirroredImage // the images that completed, sorted by Ref
	// Blobs and Size count the distinct blobs of all images touched (completed or not); Fetched and
	// Reused split them, each blob counted once.
	Blobs   int
	Size    int64
	Fetched BlobCount
	Reused  BlobCount
}

// MirrorImageError is the error of one image: Error() is one line, "<ref as given>: <cause>".
type MirrorImageError struct {
	Ref string // as given to Mirror
	Err error  // wraps one of the sentinel errors when the cause is one of their classes
}

// Error implements error.
func (e *MirrorImageError) Error() string {
	return e.Ref + ": " + strings.Join(strings.Fields(e.Err.Error()), " ")
}

// Unwrap returns the cause.
func (e *MirrorImageError) Unwrap() error { return e.Err }

// Mirror pulls the images named by refs from their registries into the OCI image layout at layoutDir
// (OCI image-spec image-layout.md: oci-layout, index.json, blobs/sha256/<hex>), creating it if needed
// and keeping what it already holds.
//
// Each reference must be fully qualified (registry host first, see RepositoryFor) with a tag or a
// digest. A tag is resolved once, by one manifest GET (distribution-spec "Pulling manifests"), and
// everything after that is fetched by digest; images/index.json then holds one descriptor per image
// with that pinned digest and the reference in org.opencontainers.image.ref.name, which is what
// Import and pkg/bundle read. An entry with the same reference is replaced; others are kept. Each
// call resolves tags anew, so a rerun pins what the tag names then (and reuses every blob present).
//
// Platforms: an index is kept whole when Platforms is ["all"] or when the reference pins the
// index's digest (only the unchanged index has that digest, and a node pulling by digest needs it).
// Otherwise Mirror writes a filtered index: the registry's index with only the matching manifests,
// every other field unchanged, stored as a new blob, and that new digest is pinned (SourceDigest keeps
// the registry's). A filtered index is what both Import and pkg/bundle's verifier accept (every
// descriptor they can reach is present), and it still lets containerd on a node pick its platform,
// or fail clearly on another one. A single image whose config declares a non-matching os/architecture
// fails with ErrNoPlatform. Layers with foreign URLs are not mirrored.
//
// Verification and resume: every blob is streamed to blobs/sha256/.partial-* while its SHA-256 and
// size are checked against the descriptor, and renamed to its name only when both match, so a kill at
// any instant never leaves a wrong file under a blob's name; stale .partial-* files are removed by
// the next call. A blob already in the layout whose content hashes to its name is not fetched again
// (a damaged one is fetched again and replaced); an interrupted blob is fetched from its start.
// index.json is updated under a lock, after a syncfs(2) barrier, with pkg/atomicfile (temp file,
// fsync, rename), as each image completes. The layout directory is flock(2)ed for the call: a
// concurrent Mirror on it fails with ErrLayoutBusy.
//
// Errors: invalid options or references are all reported at once (errors.Join, each with its field
// path, e.g. "refs[2]: ...") before anything is fetched. Otherwise every image is attempted; the
// error joins one *MirrorImageError per failed image, sorted by reference, each one line naming the
// image and the cause (ErrUpstreamUnreachable, ErrUpstreamAuth, ErrUpstreamNotFound,
// ErrDigestMismatch, ErrDiskFull, ErrNoPlatform, ErrUnsupportedManifest). ErrDiskFull or a cancelled
// ctx stops every image. What was fetched stays in the layout for the rerun; the result lists the
// images that completed.
func Mirror(ctx context.Context, layoutDir string, refs []string, o MirrorOptions) (MirrorResult, error) {
	m, jobs, err := newMirrorer(layoutDir, refs, o)
	if err != nil {
		return MirrorResult{}, err
	}
	defer m.base.CloseIdleConnections()
	unlock, err := m.openLayout()
	if err != nil {
		return MirrorResult{}, err
	}
	defer unlock()

	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	m.stop = stop
	images := make([]*MirroredImage, len(jobs))
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, m.concurrency)
	var wg sync.WaitGroup
	for i, job := range jobs {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-runCtx.Done():
				errs[i] = &MirrorImageError{Ref: job.given, Err: fmt.Errorf("not started: %w", context.Cause(runCtx))}
				return
			}
			defer func() { <-sem }()
			img, err := m.mirrorImage(runCtx, job)
			if err != nil {
				if runCtx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
					err = fmt.Errorf("stopped: %w", context.Cause(runCtx)) // by ctx, or another image's ErrDiskFull
				}
				errs[i] = &MirrorImageError{Ref: job.given, Err: err}
				return
			}
			images[i] = img
		})
	}
	wg.Wait()

	var res MirrorResult
	for _, img := range images {
		if img != nil {
			res.Images = append(res.Images, *img)
		}
	}
	sort.Slice(res.Images, func(i, j int) bool { return res.Images[i].Ref < res.Images[j].Ref })
	m.seenMu.Lock()
	for _, s := range m.seen {
		res.Blobs++
		res.Size += s.size
		if s.fetched {
			res.Fetched.Blobs++
			res.Fetched.Bytes += s.size
		} else {
			res.Reused.Blobs++
			res.Reused.Bytes += s.size
		}
	}
	m.seenMu.Unlock()
	var failed []error
	for i, e := range errs {
		if e != nil {
			failed = append(failed, errs[i])
		}
	}
	sort.SliceStable(failed, func(i, j int) bool { return failed[i].Error() < failed[j].Error() })
	if err := m.stamp.save(m.dir); err != nil {
		m.log.Warn("could not write the verified-blob stamp; the next call hashes every blob", "path", m.stamp.path, "err", err)
	}
	return res, errors.Join(failed...)
}

// mirrorer is the state of one Mirror call.
type mirrorer struct {
	dir, blobDir string
	stamp        *blobStamp
	concurrency  int
	retries      int
	all          bool
	platforms    []v1.Platform
	wanted       []string
	upstreams    map[string]Upstream
	progress     func(Event)
	log          *slog.Logger
	base         *http.Transport
	puller       *remote.Puller
	stop         context.CancelCauseFunc

	emitMu sync.Mutex

	blobMu sync.Mutex
	blobs  map[v1.Hash]*blobState // blobs verified or fetched during this call, or being fetched

	seenMu sync.Mutex
	seen   map[v1.Hash]*seenBlob

	indexMu sync.Mutex
	index   *v1.IndexManifest
}

type blobState struct {
	done chan struct{}
	err  error
}

type seenBlob struct {
	size    int64
	fetched bool
}

// endpoint is one place an image can be pulled from.
type endpoint struct {
	label string          // "host[:port][/prefix]" for messages and events
	repo  name.Repository // the image's repository there
}

// imageJob is one reference being mirrored.
type imageJob struct {
	given     string // as given
	name      string // canonical, written to index.json
	tag       string
	digest    string
	pinned    bool // the reference carries a digest
	repoPath  string
	endpoints []endpoint

	mu        sync.Mutex
	closure   map[v1.Hash]int64
	fetched   BlobCount
	reused    BlobCount
	platforms map[string]bool
}

func newMirrorer(layoutDir string, refs []string, o MirrorOptions) (*mirrorer, []*imageJob, error) {
	var errs []error
	m := &mirrorer{
		concurrency: o.Concurrency,
		retries:     o.Retries,
		upstreams:   map[string]Upstream{},
		progress:    o.Progress,
		log:         o.Log,
		blobs:       map[v1.Hash]*blobState{},
		seen:        map[v1.Hash]*seenBlob{},
	}
	if m.concurrency <= 0 {
		m.concurrency = DefaultMirrorConcurrency
	}
	if m.retries == 0 {
		m.retries = DefaultMirrorRetries
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = DefaultMirrorTimeout
	}
	abs, err := filepath.Abs(layoutDir)
	if err != nil {
		errs = append(errs, fmt.Errorf("layoutDir: %w", err))
	}
	m.dir, m.blobDir = abs, filepath.Join(abs, "blobs", "sha256")
	m.stamp = loadBlobStamp(o.VerifiedStamp, abs)

	wanted := o.Platforms
	if len(wanted) == 0 {
		wanted = []string{"linux/amd64"}
	}
	for i, s := range wanted {
		if s == "all" {
			if len(wanted) != 1 {
				errs = append(errs, fmt.Errorf("platforms[%d]: \"all\" cannot be combined with other platforms", i))
			}
			m.all = true
			continue
		}
		p, err := v1.ParsePlatform(s)
		if err != nil || p.OS == "" || p.Architecture == "" || p.OSVersion != "" {
			errs = append(errs, fmt.Errorf("platforms[%d]: %q is not os/arch[/variant], e.g. linux/amd64", i, s))
			continue
		}
		m.platforms = append(m.platforms, *p)
		m.wanted = append(m.wanted, p.String())
	}

	plain := map[string]bool{}
	for host, u := range o.Upstreams {
		key := strings.ToLower(host)
		if key == "index.docker.io" || key == "registry-1.docker.io" {
			key = "docker.io"
		}
		for i, s := range u.Mirrors {
			ep, isPlain, err := parseMirrorEndpoint(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("upstreams[%s].mirrors[%d]: %w", host, i, err))
				continue
			}
			if isPlain {
				plain[ep.host] = true
			}
		}
		if u.PlainHTTP {
			plain[key] = true
		}
		if u.MirrorsOnly && len(u.Mirrors) == 0 {
			errs = append(errs, fmt.Errorf("upstreams[%s]: mirrorsOnly without mirrors would reach nothing: name a mirror", host))
		}
		m.upstreams[key] = u
	}

	var jobs []*imageJob
	seenNames := map[string]bool{}
	for i, ref := range refs {
		job, err := m.newJob(ref)
		if err != nil {
			errs = append(errs, fmt.Errorf("refs[%d]: %w", i, err))
			continue
		}
		if seenNames[job.name] {
			continue
		}
		seenNames[job.name] = true
		jobs = append(jobs, job)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}

	m.base = newMirrorBaseTransport(o.RootCAs, timeout)
	var rt http.RoundTripper = m.base
	if o.WrapTransport != nil {
		rt = o.WrapTransport(rt)
	}
	rt = &guardTransport{next: rt, plain: plain, timeout: timeout}
	opts := []remote.Option{
		remote.WithTransport(rt),
		remote.WithJobs(m.concurrency * mirrorBlobsPerImage),
		// Retries are Mirror's own (per operation, classified, reported): none inside ggcr.
		remote.WithRetryPredicate(func(error) bool { return false }),
		remote.WithRetryStatusCodes(),
	}
	if o.Keychain != nil {
		opts = append(opts, remote.WithAuthFromKeychain(o.Keychain))
	} else {
		opts = append(opts, remote.WithAuth(authn.Anonymous))
	}
	if m.puller, err = remote.NewPuller(opts...); err != nil {
		return nil, nil, err
	}
	return m, jobs, nil
}

// newJob parses one reference and lists its endpoints: mirrors in order, then the registry.
func (m *mirrorer) newJob(ref string) (*imageJob, error) {
	pr, err := parseRef(ref)
	if err != nil {
		return nil, err
	}
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrInvalidReference, ref, err)
	}
	named = reference.TagNameOnly(named)
	job := &imageJob{
		given:     ref,
		name:      named.String(),
		tag:       pr.tag,
		digest:    pr.digest,
		pinned:    pr.digest != "",
		repoPath:  reference.Path(named),
		closure:   map[v1.Hash]int64{},
		platforms: map[string]bool{},
	}
	if job.pinned {
		if _, err := v1.NewHash(pr.digest); err != nil || !strings.HasPrefix(pr.digest, "sha256:") {
			return nil, fmt.Errorf("%w: %q: only sha256 digests are supported", ErrInvalidReference, ref)
		}
	}
	up := m.upstreams[pr.host]
	for _, s := range up.Mirrors {
		ep, isPlain, _ := parseMirrorEndpoint(s) // validated in newMirrorer
		path := job.repoPath
		if ep.prefix != "" {
			path = ep.prefix + "/" + path
		}
		var nopts []name.Option
		if isPlain {
			nopts = append(nopts, name.Insecure)
		}
		repo, err := name.NewRepository(ep.host+"/"+path, nopts...)
		if err != nil {
			return nil, fmt.Errorf("%w: %q at mirror %s: %w", ErrInvalidReference, ref, s, err)
		}
		job.endpoints = append(job.endpoints, endpoint{label: strings.TrimSuffix(ep.host+"/"+ep.prefix, "/"), repo: repo})
	}
	if up.MirrorsOnly {
		return job, nil
	}
	var nopts []name.Option
	if up.PlainHTTP {
		nopts = append(nopts, name.Insecure)
	}
	repo, err := name.NewRepository(reference.Domain(named)+"/"+job.repoPath, nopts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrInvalidReference, ref, err)
	}
	job.endpoints = append(job.endpoints, endpoint{label: pr.host, repo: repo})
	return job, nil
}

type mirrorEndpoint struct {
	host   string // lowercased host[:port]
	prefix string // path prefix without slashes at either end, or ""
}

// parseMirrorEndpoint parses "[https://|http://]host[:port][/prefix]".
func parseMirrorEndpoint(s string) (mirrorEndpoint, bool, error) {
	rest, plain := strings.CutPrefix(s, "http://")
	if !plain {
		rest = strings.TrimPrefix(rest, "https://")
	}
	host, prefix, _ := strings.Cut(rest, "/")
	host = strings.ToLower(host)
	prefix = strings.Trim(prefix, "/")
	if host == "" || strings.Contains(rest, "://") {
		return mirrorEndpoint{}, false, fmt.Errorf("%q is not [https://|http://]host[:port][/prefix]", s)
	}
	if _, err := name.NewRegistry(host, name.StrictValidation); err != nil {
		return mirrorEndpoint{}, false, fmt.Errorf("%q: %w", s, err)
	}
	return mirrorEndpoint{host: host, prefix: prefix}, plain, nil
}

// openLayout creates the layout if needed, locks it, removes stale partial files and reads index.json.
func (m *mirrorer) openLayout() (func(), error) {
	if err := os.MkdirAll(m.blobDir, 0o755); err != nil {
		return nil, storageErr("create layout", err)
	}
	d, err := os.Open(m.dir)
	if err != nil {
		return nil, fmt.Errorf("open layout: %w", err)
	}
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = d.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLayoutBusy, m.dir)
		}
		return nil, fmt.Errorf("lock layout %s: %w", m.dir, err)
	}
	unlock := func() { _ = d.Close() } // closing the descriptor releases the flock
	fail := func(err error) (func(), error) { unlock(); return nil, err }

	stale, _ := filepath.Glob(filepath.Join(m.blobDir, partialPrefix+"*"))
	for _, p := range stale {
		_ = os.Remove(p)
	}
	olPath := filepath.Join(m.dir, "oci-layout")
	if b, err := os.ReadFile(olPath); err == nil {
		var hdr struct {
			Version string `json:"imageLayoutVersion"`
		}
		if err := json.Unmarshal(b, &hdr); err != nil || hdr.Version != "1.0.0" {
			return fail(fmt.Errorf("%w: %s: want imageLayoutVersion 1.0.0, got %q", ErrLayout, olPath, b))
		}
	} else if errors.Is(err, fs.ErrNotExist) {
		if _, err := atomicfile.Write(olPath, []byte(`{"imageLayoutVersion":"1.0.0"}`+"\n"), 0o644); err != nil {
			return fail(storageErr("write oci-layout", err))
		}
	} else {
		return fail(fmt.Errorf("read %s: %w", olPath, err))
	}
	idxPath := filepath.Join(m.dir, "index.json")
	raw, err := os.ReadFile(idxPath)
	switch {
	case err == nil:
		idx, err := v1.ParseIndexManifest(bytes.NewReader(raw))
		if err != nil {
			return fail(fmt.Errorf("%w: %s: %w", ErrLayout, idxPath, err))
		}
		m.index = idx
	case errors.Is(err, fs.ErrNotExist):
		m.index = &v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{}}
		if err := m.writeIndex(m.index); err != nil {
			return fail(err)
		}
	default:
		return fail(fmt.Errorf("read %s: %w", idxPath, err))
	}
	return unlock, nil
}

func (m *mirrorer) writeIndex(idx *v1.IndexManifest) error {
	data, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	if err := syncFS(m.dir); err != nil {
		return storageErr("sync layout", err)
	}
	if _, err := atomicfile.Write(filepath.Join(m.dir, "index.json"), append(data, '\n'), 0o644); err != nil {
		return storageErr("write index.json", err)
	}
	return nil
}

// pin records d as the image job.name in index.json, replacing an entry with the same reference.
func (m *mirrorer) pin(job *imageJob, d v1.Descriptor) error {
	m.indexMu.Lock()
	defer m.indexMu.Unlock()
	next := *m.index
	next.Manifests = make([]v1.Descriptor, 0, len(m.index.Manifests)+1)
	for _, e := range m.index.Manifests {
		if canonicalRef(e.Annotations[refNameAnnotation]) != job.name {
			next.Manifests = append(next.Manifests, e)
		}
	}
	next.Manifests = append(next.Manifests, v1.Descriptor{
		MediaType:   d.MediaType,
		Size:        d.Size,
		Digest:      d.Digest,
		Annotations: map[string]string{refNameAnnotation: job.name},
	})
	sort.SliceStable(next.Manifests, func(i, j int) bool {
		a, b := next.Manifests[i], next.Manifests[j]
		if ra, rb := a.Annotations[refNameAnnotation], b.Annotations[refNameAnnotation]; ra != rb {
			return ra < rb
		}
		return a.Digest.String() < b.Digest.String()
	})
	if err := m.writeIndex(&next); err != nil {
		return err
	}
	m.index = &next
	return nil
}

func canonicalRef(s string) string {
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return s
	}
	return reference.TagNameOnly(named).String()
}

// mirrorImage resolves, fetches and pins one image.
func (m *mirrorer) mirrorImage(ctx context.Context, job *imageJob) (img *MirroredImage, err error) {
	m.emit(Event{Kind: EventImageStart, Ref: job.given})
	var entry v1.Descriptor // what index.json will reference
	defer func() {
		e := Event{Kind: EventImageDone, Ref: job.given}
		if img != nil {
			e.Digest, e.Size, e.Blobs = img.Digest, img.Size, img.Blobs
		}
		if err != nil {
			e.Error = err.Error()
		}
		m.emit(e)
	}()

	var top v1.Descriptor
	var raw []byte
	if job.pinned {
		h, _ := v1.NewHash(job.digest)
		top = v1.Descriptor{Digest: h, Size: -1}
		if raw, err = m.manifest(ctx, job, top); err != nil {
			return nil, err
		}
		top.Size = int64(len(raw))
	} else if raw, top, err = m.resolveTag(ctx, job); err != nil {
		return nil, err
	}
	if top.MediaType, err = manifestKind(raw, top.MediaType); err != nil {
		return nil, err
	}
	if !top.MediaType.IsIndex() && !top.MediaType.IsImage() {
		return nil, fmt.Errorf("%w: media type %q is neither an image nor an index", ErrUnsupportedManifest, top.MediaType)
	}

	var tasks []v1.Descriptor
	filter := !m.all && !job.pinned
	entry, err = m.walk(ctx, job, top, raw, filter, 0, &tasks)
	if err != nil {
		return nil, err
	}
	if entry.Digest == top.Digest && !job.pinned {
		if err := m.putBytes(ctx, job, top, raw); err != nil {
			return nil, err
		}
	}
	// A single image: check its declared platform before downloading its layers.
	tasks = uniqueDescriptors(tasks)
	pending := tasks
	if top.MediaType.IsImage() {
		cfg := tasks[0]
		if err := m.ensureBlob(ctx, job, cfg); err != nil {
			return nil, err
		}
		pending = tasks[1:]
		p, err := m.configPlatform(cfg)
		if err != nil {
			return nil, err
		}
		if p != nil && filter && !m.match(p) {
			return nil, fmt.Errorf("%w: the image is %s, not %s", ErrNoPlatform, p, strings.Join(m.wanted, " or "))
		}
		if p != nil {
			job.mu.Lock()
			job.platforms[p.String()] = true
			job.mu.Unlock()
		}
	}
	job.mu.Lock()
	size, count := int64(0), len(job.closure)
	for _, s := range job.closure {
		size += s
	}
	for _, d := range pending {
		if _, ok := job.closure[d.Digest]; !ok {
			size += d.Size
			count++
		}
	}
	job.mu.Unlock()
	m.emit(Event{Kind: EventImageResolved, Ref: job.given, Digest: entry.Digest.String(), Size: size, Blobs: count})

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(mirrorBlobsPerImage)
	for _, d := range pending {
		g.Go(func() error { return m.ensureBlob(gctx, job, d) })
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	job.mu.Lock()
	size, count = int64(0), len(job.closure)
	for _, s := range job.closure {
		size += s
	}
	job.mu.Unlock()
	if err := m.pin(job, entry); err != nil {
		m.abortOnDiskFull(err)
		return nil, err
	}
	img = &MirroredImage{
		Ref:          job.name,
		Digest:       entry.Digest.String(),
		SourceDigest: top.Digest.String(),
		MediaType:    string(entry.MediaType),
		Platforms:    []string{},
		Size:         size,
		Blobs:        count,
		Fetched:      job.fetched,
		Reused:       job.reused,
	}
	for p := range job.platforms {
		img.Platforms = append(img.Platforms, p)
	}
	sort.Strings(img.Platforms)
	return img, nil
}

// walk records the manifest or index d (whose bytes are raw and already in the layout) in the job's
// closure, fetches the manifests it references, appends the configs and layers to download to tasks
// (config first), and returns the descriptor to reference it by: d itself, or for an index that
// filter changed, the descriptor of the filtered index written to the layout.
func (m *mirrorer) walk(ctx context.Context, job *imageJob, d v1.Descriptor, raw []byte, filter bool, depth int, tasks *[]v1.Descriptor) (v1.Descriptor, error) {
	if depth > mirrorMaxDepth {
		return d, fmt.Errorf("%w: indexes nested deeper than %d levels", ErrUnsupportedManifest, mirrorMaxDepth)
	}
	mt, err := manifestKind(raw, d.MediaType)
	if err != nil {
		return d, fmt.Errorf("manifest %s: %w", d.Digest, err)
	}
	switch {
	case mt.IsImage():
		mf, err := v1.ParseManifest(bytes.NewReader(raw))
		if err != nil {
			return d, fmt.Errorf("%w: manifest %s: %w", ErrUnsupportedManifest, d.Digest, err)
		}
		*tasks = append(*tasks, mf.Config)
		for _, l := range mf.Layers {
			if len(l.URLs) == 0 {
				*tasks = append(*tasks, l)
			}
		}
		if d.Platform != nil {
			job.mu.Lock()
			job.platforms[d.Platform.String()] = true
			job.mu.Unlock()
		}
		return d, nil
	case mt.IsIndex():
	default:
		return d, nil // content of another kind than its descriptor said: stored, not walked
	}

	idx, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return d, fmt.Errorf("%w: index %s: %w", ErrUnsupportedManifest, d.Digest, err)
	}
	var fields map[string]json.RawMessage
	var children struct {
		Manifests []json.RawMessage `json:"manifests"`
	}
	if err := json.Unmarshal(raw, &fields); err != nil {
		return d, fmt.Errorf("%w: index %s: %w", ErrUnsupportedManifest, d.Digest, err)
	}
	if err := json.Unmarshal(raw, &children); err != nil || len(children.Manifests) != len(idx.Manifests) {
		return d, fmt.Errorf("%w: index %s: malformed manifests list", ErrUnsupportedManifest, d.Digest)
	}
	kept := make([]json.RawMessage, 0, len(idx.Manifests))
	changed := false
	var offered []string
	for i, c := range idx.Manifests {
		if c.Platform != nil {
			offered = append(offered, c.Platform.String())
		}
		if filter && (!c.MediaType.IsIndex() && !c.MediaType.IsImage() || c.MediaType.IsImage() && (c.Platform == nil || !m.match(c.Platform))) {
			changed = true
			continue
		}
		craw, err := m.manifest(ctx, job, c)
		if err != nil {
			return d, err
		}
		if !c.MediaType.IsIndex() && !c.MediaType.IsImage() {
			kept = append(kept, children.Manifests[i]) // an artifact manifest of a kept index: stored, not walked
			continue
		}
		nd, err := m.walk(ctx, job, c, craw, filter, depth+1, tasks)
		if errors.Is(err, ErrNoPlatform) && filter && c.MediaType.IsIndex() {
			changed = true // a nested index with nothing for us
			continue
		}
		if err != nil {
			return d, err
		}
		if nd.Digest != c.Digest {
			b, err := json.Marshal(nd)
			if err != nil {
				return d, err
			}
			kept = append(kept, b)
			changed = true
			continue
		}
		kept = append(kept, children.Manifests[i])
	}
	if filter && len(kept) == 0 {
		slices.Sort(offered)
		offered = slices.Compact(offered)
		return d, fmt.Errorf("%w: the index offers %s, not %s", ErrNoPlatform, orNone(offered), strings.Join(m.wanted, " or "))
	}
	if !changed {
		return d, nil
	}
	list, err := marshalRaw(kept)
	if err != nil {
		return d, err
	}
	fields["manifests"] = list
	out, err := marshalRaw(fields)
	if err != nil {
		return d, err
	}
	sum := sha256.Sum256(out)
	nd := d
	nd.MediaType = mt
	nd.Digest = v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
	nd.Size = int64(len(out))
	if err := m.putBytes(ctx, job, nd, out); err != nil {
		return d, err
	}
	return nd, nil
}

// marshalRaw is compact json.Marshal without HTML escaping, so annotation values keep their bytes.
func marshalRaw(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func uniqueDescriptors(ds []v1.Descriptor) []v1.Descriptor {
	seen := map[v1.Hash]bool{}
	out := ds[:0:0]
	for _, d := range ds {
		if !seen[d.Digest] {
			seen[d.Digest] = true
			out = append(out, d)
		}
	}
	return out
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "no platform"
	}
	return strings.Join(s, ", ")
}

// match reports whether p is one of the wanted platforms (a wanted platform without a variant matches
// every variant; arm64 without a variant is arm64/v8).
func (m *mirrorer) match(p *v1.Platform) bool {
	if m.all {
		return true
	}
	norm := func(q v1.Platform) string {
		if q.Architecture == "arm64" && q.Variant == "" {
			return "v8"
		}
		return q.Variant
	}
	for _, w := range m.platforms {
		if p.OS == w.OS && p.Architecture == w.Architecture && (w.Variant == "" || norm(*p) == norm(w)) {
			return true
		}
	}
	return false
}

// configPlatform reads the os/architecture/variant an image config (already in the layout) declares;
// nil when it declares none.
func (m *mirrorer) configPlatform(cfg v1.Descriptor) (*v1.Platform, error) {
	b, err := os.ReadFile(m.blobPath(cfg.Digest))
	if err != nil {
		return nil, fmt.Errorf("read config %s: %w", cfg.Digest, err)
	}
	var c struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Variant      string `json:"variant"`
	}
	if json.Unmarshal(b, &c) != nil || c.OS == "" || c.Architecture == "" {
		return nil, nil
	}
	return &v1.Platform{OS: c.OS, Architecture: c.Architecture, Variant: c.Variant}, nil
}

// manifestKind returns the media type of a manifest or index: its mediaType field, else the
// registry's Content-Type (hint), else what its fields say (OCI allows omitting mediaType).
func manifestKind(raw []byte, hint types.MediaType) (types.MediaType, error) {
	var head struct {
		SchemaVersion int             `json:"schemaVersion"`
		MediaType     types.MediaType `json:"mediaType"`
		Manifests     json.RawMessage `json:"manifests"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return "", fmt.Errorf("%w: not a JSON manifest: %w", ErrUnsupportedManifest, err)
	}
	if head.SchemaVersion != 2 {
		return "", fmt.Errorf("%w: schemaVersion %d (Docker schema 1 is not served; push the image with a schema 2 client)", ErrUnsupportedManifest, head.SchemaVersion)
	}
	if head.MediaType != "" {
		return head.MediaType, nil
	}
	if h, _, _ := strings.Cut(string(hint), ";"); h != "" {
		if mt := types.MediaType(strings.TrimSpace(h)); mt.IsIndex() || mt.IsImage() {
			return mt, nil
		}
	}
	if head.Manifests != nil {
		return types.OCIImageIndex, nil
	}
	return types.OCIManifestSchema1, nil
}

// resolveTag fetches the manifest the tag points at (one GET, trying each endpoint in order) and
// returns it with its descriptor (digest computed from the bytes). mirrorImage stores it unless it is
// an index that platform filtering replaces.
func (m *mirrorer) resolveTag(ctx context.Context, job *imageJob) ([]byte, v1.Descriptor, error) {
	var raw []byte
	var desc v1.Descriptor
	err := m.each(ctx, job, "", fmt.Sprintf("tag %q", job.tag), func(ep endpoint) error {
		rd, err := m.puller.Get(ctx, ep.repo.Tag(job.tag))
		if err != nil {
			return err
		}
		raw, desc = rd.Manifest, rd.Descriptor
		return nil
	})
	if err != nil {
		return nil, desc, err
	}
	sum := sha256.Sum256(raw)
	desc = v1.Descriptor{MediaType: desc.MediaType, Size: int64(len(raw)), Digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}}
	return raw, desc, nil
}

// manifest returns the bytes of the manifest or index d: from the layout when present and intact,
// else fetched by digest (verified) and stored. d.Size < 0 means unknown.
func (m *mirrorer) manifest(ctx context.Context, job *imageJob, d v1.Descriptor) ([]byte, error) {
	if b, err := os.ReadFile(m.blobPath(d.Digest)); err == nil && (d.Size < 0 || int64(len(b)) == d.Size) && sha256Hex(b) == d.Digest.Hex {
		d.Size = int64(len(b))
		m.reused(job, d)
		return b, nil
	}
	var raw []byte
	err := m.each(ctx, job, d.Digest.String(), "manifest "+d.Digest.String(), func(ep endpoint) error {
		rd, err := m.puller.Get(ctx, ep.repo.Digest(d.Digest.String()))
		if err != nil {
			if strings.Contains(err.Error(), "does not match requested digest") {
				return fmt.Errorf("%w: %s served other content for manifest %s", ErrDigestMismatch, ep.label, d.Digest)
			}
			return err
		}
		if d.Size >= 0 && int64(len(rd.Manifest)) != d.Size {
			return fmt.Errorf("%w: manifest %s from %s is %d bytes, its descriptor says %d", ErrDigestMismatch, d.Digest, ep.label, len(rd.Manifest), d.Size)
		}
		raw = rd.Manifest
		return nil
	})
	if err != nil {
		return nil, err
	}
	d.Size = int64(len(raw))
	return raw, m.putBytes(ctx, job, d, raw)
}

// putBytes stores data (already verified against d) as a blob unless an intact copy is there.
func (m *mirrorer) putBytes(ctx context.Context, job *imageJob, d v1.Descriptor, data []byte) error {
	p := m.blobPath(d.Digest)
	if b, err := os.ReadFile(p); err == nil && bytes.Equal(b, data) {
		m.reused(job, d)
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(m.blobDir, partialPrefix+d.Digest.Hex[:12]+"-*")
	if err != nil {
		return m.abortOnDiskFull(storageErr("write manifest "+d.Digest.String(), err))
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return m.abortOnDiskFull(storageErr("write manifest "+d.Digest.String(), err))
	}
	m.count(job, d, true)
	m.emit(Event{Kind: EventBlobFetched, Ref: job.given, Digest: d.Digest.String(), MediaType: string(d.MediaType), Size: d.Size})
	return nil
}

// ensureBlob makes the config or layer d present and intact in the layout, downloading it unless it
// already is. Concurrent calls for one digest share one download.
func (m *mirrorer) ensureBlob(ctx context.Context, job *imageJob, d v1.Descriptor) error {
	if d.Digest.Algorithm != "sha256" || len(d.Digest.Hex) != 64 {
		return fmt.Errorf("%w: blob digest %q: only sha256 is supported", ErrUnsupportedManifest, d.Digest)
	}
	m.blobMu.Lock()
	st, busy := m.blobs[d.Digest]
	if !busy {
		st = &blobState{done: make(chan struct{})}
		m.blobs[d.Digest] = st
	}
	m.blobMu.Unlock()
	if busy {
		select {
		case <-st.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if st.err != nil {
			return st.err
		}
		m.reused(job, d)
		return nil
	}
	st.err = m.fetchBlob(ctx, job, d)
	if st.err != nil {
		m.blobMu.Lock()
		delete(m.blobs, d.Digest) // a later image may try again
		m.blobMu.Unlock()
	}
	close(st.done)
	return st.err
}

func (m *mirrorer) fetchBlob(ctx context.Context, job *imageJob, d v1.Descriptor) error {
	ok, err := m.intact(d)
	if err != nil {
		return err
	}
	if ok {
		m.reused(job, d)
		return nil
	}
	var from string
	err = m.each(ctx, job, d.Digest.String(), "blob "+d.Digest.String(), func(ep endpoint) error {
		from = ep.label
		return m.download(ctx, job, ep, d)
	})
	if err != nil {
		return err
	}
	m.count(job, d, true)
	m.emit(Event{Kind: EventBlobFetched, Ref: job.given, Digest: d.Digest.String(), MediaType: string(d.MediaType), Size: d.Size, Endpoint: from})
	return nil
}

// intact reports whether the layout holds d with its size and digest. A damaged file is left for the
// download to replace (by rename).
func (m *mirrorer) intact(d v1.Descriptor) (bool, error) {
	f, err := os.Open(m.blobPath(d.Digest))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read layout blob %s: %w", d.Digest, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Size() != d.Size {
		m.log.Warn("layout blob has the wrong size; fetching it again", "digest", d.Digest.String(), "want", d.Size)
		return false, nil
	}
	if m.stamp.known(d.Digest.String(), st) {
		return true, nil
	}
	h := sha256.New()
	if _, err := io.CopyBuffer(h, f, make([]byte, 1<<20)); err != nil {
		return false, fmt.Errorf("read layout blob %s: %w", d.Digest, err)
	}
	if hex.EncodeToString(h.Sum(nil)) != d.Digest.Hex {
		m.log.Warn("layout blob does not match its digest; fetching it again", "digest", d.Digest.String())
		return false, nil
	}
	m.stamp.verified(d.Digest.String(), m.blobPath(d.Digest))
	return true, nil
}

// download streams blob d from ep into a temporary file, verifying size and SHA-256, and renames it
// to its name.
func (m *mirrorer) download(ctx context.Context, job *imageJob, ep endpoint, d v1.Descriptor) error {
	l, err := m.puller.Layer(ctx, ep.repo.Digest(d.Digest.String()))
	if err != nil {
		return err
	}
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	tmp, err := os.CreateTemp(m.blobDir, partialPrefix+d.Digest.Hex[:12]+"-*")
	if err != nil {
		return m.abortOnDiskFull(storageErr("write blob "+d.Digest.String(), err))
	}
	renamed := false
	defer func() {
		if !renamed {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	w := &writeErrRecorder{w: io.MultiWriter(tmp, h)}
	pr := &progressReader{r: io.LimitReader(rc, d.Size+1), m: m,
		ev: Event{Kind: EventBlobProgress, Ref: job.given, Digest: d.Digest.String(), MediaType: string(d.MediaType), Size: d.Size, Endpoint: ep.label}}
	n, cerr := io.CopyBuffer(w, pr, make([]byte, 1<<20))
	switch {
	case w.err != nil:
		return m.abortOnDiskFull(storageErr("write blob "+d.Digest.String(), w.err))
	case n > d.Size:
		return fmt.Errorf("%w: blob %s from %s is larger than the %d bytes its descriptor says", ErrDigestMismatch, d.Digest, ep.label, d.Size)
	case n == d.Size && hex.EncodeToString(h.Sum(nil)) != d.Digest.Hex:
		return fmt.Errorf("%w: blob %s from %s hashes to sha256:%s", ErrDigestMismatch, d.Digest, ep.label, hex.EncodeToString(h.Sum(nil)))
	case cerr != nil:
		return cerr
	case n < d.Size:
		return fmt.Errorf("blob %s from %s: connection ended after %d of %d bytes: %w", d.Digest, ep.label, n, d.Size, io.ErrUnexpectedEOF)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return storageErr("write blob "+d.Digest.String(), err)
	}
	if err := tmp.Close(); err != nil {
		return m.abortOnDiskFull(storageErr("write blob "+d.Digest.String(), err))
	}
	if err := os.Rename(tmp.Name(), m.blobPath(d.Digest)); err != nil {
		return storageErr("write blob "+d.Digest.String(), err)
	}
	m.stamp.verified(d.Digest.String(), m.blobPath(d.Digest)) // size and SHA-256 checked while streaming
	renamed = true
	return nil
}

type writeErrRecorder struct {
	w   io.Writer
	err error
}

func (w *writeErrRecorder) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	if err != nil {
		w.err = err
	}
	return n, err
}

type progressReader struct {
	r          io.Reader
	m          *mirrorer
	ev         Event
	done, last int64
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.done += int64(n)
	if p.done-p.last >= mirrorProgressStep || (err == io.EOF && p.done != p.last) {
		p.last = p.done
		e := p.ev
		e.Done = p.done
		p.m.emit(e)
	}
	return n, err
}

// each runs op against the job's endpoints in order, each with retries for transient errors, until
// one succeeds. The error names the cause at the registry itself, and what the mirrors said.
func (m *mirrorer) each(ctx context.Context, job *imageJob, blob, what string, op func(endpoint) error) error {
	var mirrorErrs []string
	for i, ep := range job.endpoints {
		err := m.retry(ctx, job, blob, ep, func() error { return op(ep) })
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		err = m.classify(err, ep, job, what)
		if errors.Is(err, ErrDiskFull) {
			return err
		}
		if i < len(job.endpoints)-1 {
			mirrorErrs = append(mirrorErrs, fmt.Sprintf("mirror %s: %v", ep.label, err))
			m.log.Info("mirror endpoint failed; trying the next", "ref", job.given, "endpoint", ep.label, "error", err.Error())
			continue
		}
		if len(mirrorErrs) > 0 {
			return fmt.Errorf("%w (after %s)", err, strings.Join(mirrorErrs, "; "))
		}
		return err
	}
	return errors.New("no endpoint")
}

// retry runs op, retrying transient failures with exponential backoff (cenkalti/backoff).
func (m *mirrorer) retry(ctx context.Context, job *imageJob, blob string, ep endpoint, op func() error) error {
	if m.retries < 0 {
		return op()
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 500 * time.Millisecond
	b.MaxInterval = 15 * time.Second
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		err := op()
		if err != nil && !transient(err) {
			return struct{}{}, backoff.Permanent(err)
		}
		return struct{}{}, err
	},
		backoff.WithBackOff(b),
		backoff.WithMaxTries(uint(m.retries)+1),
		backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, delay time.Duration) {
			m.log.Info("retrying", "ref", job.given, "blob", blob, "endpoint", ep.label, "delay", delay, "error", err.Error())
			m.emit(Event{Kind: EventRetry, Ref: job.given, Digest: blob, Endpoint: ep.label, Delay: delay, Error: err.Error()})
		}))
	var perm *backoff.PermanentError
	if errors.As(err, &perm) {
		return perm.Unwrap()
	}
	return err
}

func (m *mirrorer) blobPath(h v1.Hash) string { return filepath.Join(m.blobDir, h.Hex) }

// count records blob d in the job's closure and the call's totals.
func (m *mirrorer) count(job *imageJob, d v1.Descriptor, fetched bool) {
	job.mu.Lock()
	if _, ok := job.closure[d.Digest]; !ok {
		job.closure[d.Digest] = d.Size
		c := &job.reused
		if fetched {
			c = &job.fetched
		}
		c.Blobs++
		c.Bytes += d.Size
	}
	job.mu.Unlock()
	m.seenMu.Lock()
	s := m.seen[d.Digest]
	if s == nil {
		s = &seenBlob{size: d.Size}
		m.seen[d.Digest] = s
	}
	s.fetched = s.fetched || fetched
	m.seenMu.Unlock()
}

// reused counts d as found in the layout and reports it.
func (m *mirrorer) reused(job *imageJob, d v1.Descriptor) {
	m.count(job, d, false)
	m.emit(Event{Kind: EventBlobReused, Ref: job.given, Digest: d.Digest.String(), MediaType: string(d.MediaType), Size: d.Size})
}

func (m *mirrorer) emit(e Event) {
	if m.progress == nil {
		return
	}
	m.emitMu.Lock()
	defer m.emitMu.Unlock()
	m.progress(e)
}

// abortOnDiskFull stops the whole call when err is ErrDiskFull, and returns err.
func (m *mirrorer) abortOnDiskFull(err error) error {
	if errors.Is(err, ErrDiskFull) && m.stop != nil {
		m.stop(err)
	}
	return err
}

func storageErr(op string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: %s: %w", ErrDiskFull, op, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
