// Package clustermirror is the in-cluster registry mirror and package repository of the hand-off
// (`appliance cluster-mirror`, run as a kubelet static pod on every control plane): it copies what the
// appliance serves onto the control plane's disk once, then serves it over HTTPS under the appliance's
// own URL paths, so that nodes switch from the appliance to the control planes by changing only
// host:port, and the bootstrap host can be switched off.
//
// Run does, in order:
//
//  1. listen on Options.Listen at once (TLS 1.2+, pkg/server's AEAD suites), answering /healthz with
//     503 and what is still missing, and /v2/ and /repo/ with 503, until the copy is complete;
//  2. sync, unless Dir holds a complete one (the marker file, synced.json): every image the upstream
//     registry lists (GET /v2/_catalog, then /v2/<name>/tags/list, both paginated by their Link
//     header, as the OCI distribution spec's "Content discovery" describes) is copied with
//     registry.Mirror into Dir/oci (an OCI image layout; every blob verified against its digest while
//     streaming) and made servable with registry.Import into Dir/registry; then the signed apt
//     repository under Upstream/repo/debian/ is copied file by file into Dir/repo/debian/: the keyring,
//     InRelease (its signature checked against that keyring), Release and Release.gpg, every index the
//     Release lists (size and SHA-256 checked against it), and every .deb the Packages indexes list
//     (size and SHA-256 checked against them). The repository's own signed metadata is kept byte for
//     byte, so apt's signed-by keyring on the nodes still verifies it;
//  3. serve /v2/ (registry.NewHandler over Dir/registry, read-only), /repo/ (Dir/repo), /ca.crt (the
//     CA of CAFile) and /healthz (200 with Health) until ctx is done.
//
// Resume: every file lands under a temporary name and is renamed into place once verified, so a kill
// at any instant never leaves a partial file under a served name; a rerun keeps what is complete
// (hashing it again, not downloading it again) and fetches the rest. The marker is written last
// (pkg/atomicfile, after a syncfs barrier); once it exists, Run never contacts the upstream again: a
// restart of the pod after the bootstrap host is gone serves from disk. To copy again (the appliance
// gained content), delete Dir/synced.json.
//
// Errors: a configuration error names the flag to fix (all at once). During the first sync, an
// unreachable upstream (connection refused, timeout, TLS failure, 5xx) and any other failure not
// listed next is retried with exponential backoff (1 s to 30 s, without limit) and shown by /healthz;
// a digest or hash mismatch, a bad signature or a malformed index ends Run with an error naming the
// blob or file (ErrMismatch, ErrUpstreamContent), and so does a full disk (ENOSPC, EDQUOT). A
// repository without tags (images the bundle names by digest only) is copied only for the references
// Options.ImagesFile names (no listing shows them); otherwise it is skipped with a warning.
package clustermirror

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/connlimit"
	"github.com/airgap-appliance/appliance/pkg/server"
	"github.com/airgap-appliance/appliance/registry"
)

// Options configures Run. The flags of `appliance cluster-mirror` have the same names in kebab-case
// (--upstream, --ca-file, --dir, --listen, --cert-file, --key-file, --images-file).
type Options struct {
	// Upstream is the appliance's HTTPS base URL, e.g. https://10.100.0.2:8443 (no path).
	Upstream string
	// CAFile is the PEM file of the appliance CA: the only root trusted for Upstream, the CA that must
	// have signed CertFile, and what /ca.crt serves.
	CAFile string
	// Dir is the data directory on the control plane, e.g. /var/lib/appliance-mirror (created 0755).
	Dir string
	// Listen is the address:port to serve on, e.g. ":5443".
	Listen string
	// CertFile and KeyFile are the serving certificate (PEM, signed by the CA of CAFile, SANs = the
	// node's addresses) and its private key (PEM).
	CertFile, KeyFile string
	// ImagesFile, optional, is a JSON array of image references the mirror copies besides those the
	// upstream's tags list: the images a bundle names by digest only ("registry.k8s.io/etcd@sha256:…"),
	// which no registry listing shows. The hand-off writes it from the appliance's image list.
	ImagesFile string
	// Log receives progress (Info), retries (Warn) and failures; nil discards them.
	Log *slog.Logger
	// Listener, when set, is served instead of listening on Listen (tests, socket activation); Run
	// closes it.
	Listener net.Listener
}

// Sentinel errors of Run; test with errors.Is.
var (
	// ErrConfig: an option is missing or wrong; the message names every flag to fix.
	ErrConfig = errors.New("cluster-mirror configuration")
	// ErrMismatch: bytes from the upstream do not match the digest or SHA-256 that names them (an image
	// blob or manifest, a repository index or .deb). Nothing is written under the file's name.
	ErrMismatch = errors.New("content does not match its digest")
	// ErrUpstreamContent: the upstream served something unusable that retrying will not fix: a
	// repository whose InRelease does not verify against its keyring, a malformed Release or Packages
	// index, a manifest the registry cannot serve.
	ErrUpstreamContent = errors.New("unusable upstream content")
)

// Layout of Dir.
const (
	ociDir      = "oci"         // OCI image layout written by registry.Mirror
	ociStamp    = "oci.stamp"   // registry.MirrorOptions.VerifiedStamp
	registryDir = "registry"    // distribution tree written by registry.Import, served at /v2/
	repoDir     = "repo"        // copy of Upstream/repo/, served at /repo/
	markerFile  = "synced.json" // written last: the sync is complete
)

// config is Options checked and loaded.
type config struct {
	Options
	base  *url.URL
	caPEM []byte
	roots *x509.CertPool
	cert  tls.Certificate
	// extra are the references of ImagesFile.
	extra []string
}

// load checks o and reads its files; every problem is reported at once, each naming its flag.
func (o Options) load() (*config, error) {
	c := &config{Options: o}
	var errs []error
	bad := func(flag, format string, a ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, a...)))
	}
	if o.Upstream == "" {
		bad("upstream", "required: the appliance's HTTPS URL, e.g. https://10.100.0.2:8443")
	} else if u, err := url.Parse(o.Upstream); err != nil || u.Scheme != "https" || u.Host == "" || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.User != nil {
		bad("upstream", "%q is not https://HOST:PORT (no path, query or credentials)", o.Upstream)
	} else {
		u.Path = ""
		c.base = u
	}
	if o.Dir == "" {
		bad("dir", "required: the data directory, e.g. /var/lib/appliance-mirror")
	}
	if o.Listen == "" && o.Listener == nil {
		bad("listen", "required: address:port to serve on, e.g. :5443")
	} else if o.Listener == nil {
		if _, _, err := net.SplitHostPort(o.Listen); err != nil {
			bad("listen", "%q is not address:port: %v", o.Listen, err)
		}
	}
	if o.CAFile == "" {
		bad("ca-file", "required: the appliance CA certificate (PEM)")
	} else if pem, err := os.ReadFile(o.CAFile); err != nil {
		bad("ca-file", "%v", err)
	} else {
		c.caPEM, c.roots = pem, x509.NewCertPool()
		if !c.roots.AppendCertsFromPEM(pem) {
			bad("ca-file", "%s holds no PEM certificate", o.CAFile)
			c.roots = nil
		}
	}
	switch {
	case o.CertFile == "" || o.KeyFile == "":
		if o.CertFile == "" {
			bad("cert-file", "required: the serving certificate (PEM) signed by the appliance CA")
		}
		if o.KeyFile == "" {
			bad("key-file", "required: the serving certificate's private key (PEM)")
		}
	default:
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			bad("cert-file", "with --key-file: %v", err)
			break
		}
		c.cert = cert
		if c.roots != nil {
			inter := x509.NewCertPool()
			for _, der := range cert.Certificate[1:] {
				if ic, err := x509.ParseCertificate(der); err == nil {
					inter.AddCert(ic)
				}
			}
			if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: c.roots, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				bad("cert-file", "%s is not a serving certificate of the CA in --ca-file (nodes trust only that CA): %v", o.CertFile, err)
			}
		}
	}
	if o.ImagesFile != "" {
		if b, err := os.ReadFile(o.ImagesFile); err != nil {
			bad("images-file", "%v", err)
		} else if err := json.Unmarshal(b, &c.extra); err != nil {
			bad("images-file", "%s is not a JSON array of image references: %v", o.ImagesFile, err)
		} else {
			for i, ref := range c.extra {
				if _, _, err := registry.RepositoryFor(ref); err != nil {
					bad("images-file", "%s: entry %d, %q: %v", o.ImagesFile, i, ref, err)
				}
			}
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Run syncs (if Dir holds no complete sync) and serves until ctx is done; see the package
// documentation. It returns nil when ctx ends it, an error wrapping ErrConfig for bad options, the
// listener's error, or the sync's permanent error (ErrMismatch, ErrUpstreamContent, a disk error).
func Run(ctx context.Context, o Options) error {
	c, err := o.load()
	if err == nil {
		if err = os.MkdirAll(c.Dir, 0o755); err != nil {
			err = fmt.Errorf("--dir: %w", err)
		}
	}
	if err != nil {
		if o.Listener != nil {
			_ = o.Listener.Close()
		}
		return err
	}
	if _, err := atomicfile.CleanStale(c.Dir); err != nil {
		c.Log.Warn("could not remove temporary files of an earlier run", "err", err)
	}
	ln := c.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", c.Listen); err != nil {
			return fmt.Errorf("--listen: %w (is another cluster-mirror running on this port?)", err)
		}
	}

	st := newState()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	hs := &http.Server{
		Handler: st.handler(),
		TLSConfig: &tls.Config{
			MinVersion:   tls.VersionTLS12,
			CipherSuites: server.TLS12CipherSuites,
			Certificates: []tls.Certificate{c.cert},
			NextProtos:   []string{"h2", "http/1.1"},
		},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(c.Log.Handler(), slog.LevelDebug),
	}
	// The appliance front's connection limits (caps per source and in total, write-stall deadline).
	limited := connlimit.New(ln, connlimit.Config{Logger: c.Log})
	limited.Install(hs)
	ln = limited
	served := make(chan error, 1)
	go func() {
		err := hs.ServeTLS(ln, "", "")
		if !errors.Is(err, http.ErrServerClosed) {
			cancel(fmt.Errorf("serve on %s: %w", ln.Addr(), err))
		}
		served <- err
	}()
	c.Log.Info("cluster mirror listening", "address", ln.Addr().String(), "dir", c.Dir, "upstream", c.Upstream)

	content, closeContent, err := c.prepare(ctx, st)
	if err == nil {
		defer closeContent()
		st.ready(content)
		c.Log.Info("cluster mirror serving", "address", ln.Addr().String(), "images", st.health().Images,
			"blobs", st.health().Blobs, "debs", st.health().Debs, "bytes", st.health().Bytes)
		<-ctx.Done()
	}
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	_ = hs.Shutdown(sctx)
	<-served
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		return cause // the listener failed
	}
	if err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// prepare returns the content handler: from a complete sync on disk without contacting the
// upstream, else after syncing (with retries).
func (c *config) prepare(ctx context.Context, st *state) (http.Handler, func(), error) {
	m, err := readMarker(c.Dir)
	if err == nil {
		if err = c.checkLocal(ctx, m); err == nil {
			c.Log.Info("serving a complete sync from disk; the upstream is not contacted", "completed", m.Completed, "upstream", m.Upstream)
		} else {
			c.Log.Warn("the complete sync on disk is damaged; syncing again", "err", err)
			if rerr := os.Remove(filepath.Join(c.Dir, markerFile)); rerr != nil {
				return nil, nil, rerr
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		c.Log.Warn("unreadable sync marker; syncing again", "err", err)
	}
	if err != nil {
		if m, err = c.syncWithRetry(ctx, st); err != nil {
			return nil, nil, err
		}
	}
	st.setCounts(m)
	return c.contentHandler(ctx)
}

// syncWithRetry runs sync until it succeeds, retrying every error but the permanent ones with
// exponential backoff, each failure shown by /healthz.
func (c *config) syncWithRetry(ctx context.Context, st *state) (*marker, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = time.Second
	b.MaxInterval = 30 * time.Second
	attempt := 0
	m, err := backoff.Retry(ctx, func() (*marker, error) {
		attempt++
		st.attempt(attempt)
		m, err := c.sync(ctx, st)
		if err != nil && permanent(err) {
			return nil, backoff.Permanent(err)
		}
		return m, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0), backoff.WithNotify(func(err error, d time.Duration) {
		st.failed(err, d)
		c.Log.Warn("sync failed; retrying", "attempt", attempt, "delay", d, "err", err)
	}))
	var perm *backoff.PermanentError
	if errors.As(err, &perm) {
		err = perm.Unwrap()
	}
	if err != nil {
		st.failed(err, 0)
		if ctx.Err() == nil {
			c.Log.Error("sync failed; not retrying", "err", err)
		}
	}
	return m, err
}

// permanent reports whether retrying err cannot help.
func permanent(err error) bool {
	return errors.Is(err, ErrMismatch) || errors.Is(err, ErrUpstreamContent) || errors.Is(err, registry.ErrDiskFull) ||
		errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, ErrConfig)
}

// contentHandler serves Dir as the appliance serves the bundle, through pkg/server's own handler
// tree: /v2/ (registry.NewHandler), /repo/ (regular files only, no dot-files, no symlinks leaving
// the tree), /ca.crt, /metrics.
func (c *config) contentHandler(ctx context.Context) (http.Handler, func(), error) {
	reg, err := registry.NewHandler(ctx, filepath.Join(c.Dir, registryDir), c.Log)
	if err != nil {
		return nil, nil, err
	}
	srv, err := server.New(server.Options{
		Listen:      "cluster-mirror", // not used: Run listens itself
		Certificate: c.cert,
		Registry:    reg,
		RepoDir:     filepath.Join(c.Dir, repoDir),
		CAPEM:       c.caPEM,
		Logger:      c.Log,
	})
	if err != nil {
		_ = reg.Close()
		return nil, nil, err
	}
	return srv.Handler(), func() { _ = reg.Close() }, nil
}

// tlsClientConfig trusts the appliance CA only, TLS 1.2+.
func (c *config) tlsClientConfig() *tls.Config {
	return &tls.Config{RootCAs: c.roots, MinVersion: tls.VersionTLS12}
}
