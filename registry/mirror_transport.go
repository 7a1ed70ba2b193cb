package registry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// newMirrorBaseTransport is Mirror's connection layer: TLS 1.2+ verified against roots (nil: the
// system's), proxies from the environment, and timeout on connect, handshake and response headers.
func newMirrorBaseTransport(roots *x509.CertPool, timeout time.Duration) *http.Transport {
	d := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           d.DialContext,
		TLSClientConfig:       &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
	}
}

// guardTransport refuses plain HTTP to hosts not explicitly allowed (go-containerregistry falls back to
// HTTP by itself for loopback and RFC 1918 registries), and bounds each wait for response bytes.
type guardTransport struct {
	next    http.RoundTripper
	plain   map[string]bool // lowercased host[:port] allowed over plain HTTP
	timeout time.Duration
}

// plainHTTPError is returned for a plain-HTTP request to a host not allowed to use it.
type plainHTTPError struct{ host string }

func (e *plainHTTPError) Error() string {
	return fmt.Sprintf("plain HTTP to %s is not allowed (set Upstream.PlainHTTP, or name an http:// mirror)", e.host)
}

// timeoutError is a request that got no bytes for the Mirror timeout.
type timeoutError struct {
	host string
	d    time.Duration
}

func (e *timeoutError) Error() string   { return fmt.Sprintf("no answer from %s for %s", e.host, e.d) }
func (e *timeoutError) Timeout() bool   { return true }
func (e *timeoutError) Temporary() bool { return true }

func (g *guardTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !g.plain[strings.ToLower(req.URL.Host)] {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, &plainHTTPError{host: req.URL.Host}
	}
	ctx, cancel := context.WithCancel(req.Context())
	var fired atomic.Bool
	timer := time.AfterFunc(g.timeout, func() { fired.Store(true); cancel() })
	resp, err := g.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		timer.Stop()
		cancel()
		if fired.Load() {
			return nil, &timeoutError{host: req.URL.Host, d: g.timeout}
		}
		return nil, err
	}
	timer.Reset(g.timeout)
	resp.Body = &stallBody{rc: resp.Body, timer: timer, d: g.timeout, fired: &fired, cancel: cancel, host: req.URL.Host}
	return resp, nil
}

// stallBody re-arms the request's timer on every read that returns bytes.
type stallBody struct {
	rc     io.ReadCloser
	timer  *time.Timer
	d      time.Duration
	fired  *atomic.Bool
	cancel context.CancelFunc
	host   string
}

func (b *stallBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.timer.Reset(b.d)
	}
	if err != nil && err != io.EOF && b.fired.Load() {
		err = &timeoutError{host: b.host, d: b.d}
	}
	return n, err
}

func (b *stallBody) Close() error {
	b.timer.Stop()
	err := b.rc.Close()
	b.cancel()
	return err
}

// transient reports whether a failed request is worth retrying: network errors, timeouts, and the
// HTTP statuses 408, 429 and 5xx. Client errors (401, 403, 404…), TLS failures, refused plain HTTP,
// digest mismatches and local disk errors are not.
func transient(err error) bool {
	if errors.Is(err, ErrDiskFull) || errors.Is(err, ErrDigestMismatch) || errors.Is(err, ErrUnsupportedManifest) {
		return false
	}
	var te *transport.Error
	if errors.As(err, &te) {
		return te.StatusCode == http.StatusRequestTimeout || te.StatusCode == http.StatusTooManyRequests || te.StatusCode >= 500
	}
	if isTLSError(err) || speaksHTTP(err) {
		return false
	}
	// Dial and read errors first: go-containerregistry pings loopback and private registries over
	// HTTPS and plain HTTP at once, so a refused connection comes joined with our plain-HTTP refusal.
	var oe *net.OpError
	var de *net.DNSError
	var to *timeoutError
	if errors.As(err, &oe) || errors.As(err, &de) || errors.As(err, &to) {
		return true
	}
	var pe *plainHTTPError
	if errors.As(err, &pe) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE)
}

// speaksHTTP reports net/http's answer to an HTTPS request that got a plain-HTTP reply (a string
// error: net/http exports no type for it).
func speaksHTTP(err error) bool {
	return strings.Contains(err.Error(), "server gave HTTP response to HTTPS client")
}

func isTLSError(err error) bool {
	var (
		cv *tls.CertificateVerificationError
		ua x509.UnknownAuthorityError
		hn x509.HostnameError
		ci x509.CertificateInvalidError
		rh tls.RecordHeaderError
		ae tls.AlertError
	)
	return errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci) ||
		errors.As(err, &rh) || errors.As(err, &ae)
}

// causeError is a cause with its own message that matches both a sentinel and the underlying error.
type causeError struct {
	msg      string
	sentinel error
	err      error
}

func (e *causeError) Error() string { return e.msg }
func (e *causeError) Unwrap() []error {
	if e.sentinel == nil {
		return []error{e.err}
	}
	return []error{e.sentinel, e.err}
}

// classify turns a failed request at ep into a one-line cause wrapping the matching sentinel. what
// names the object asked for: `tag "3.10"`, "blob sha256:…".
func (m *mirrorer) classify(err error, ep endpoint, job *imageJob, what string) error {
	if errors.Is(err, ErrDiskFull) || errors.Is(err, ErrDigestMismatch) || errors.Is(err, ErrUnsupportedManifest) {
		return err
	}
	var te *transport.Error
	if errors.As(err, &te) {
		status := statusLine(te)
		switch {
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden:
			return &causeError{sentinel: ErrUpstreamAuth, err: err, msg: fmt.Sprintf(
				"%s refused the credentials (%s) for %s; check the entry for %s in the Docker config",
				ep.label, status, ep.repo.RepositoryStr(), ep.repo.RegistryStr())}
		case te.StatusCode == http.StatusNotFound:
			if hasDiagnostic(te, transport.NameUnknownErrorCode) {
				return &causeError{sentinel: ErrUpstreamNotFound, err: err, msg: fmt.Sprintf(
					"repository %q not found on %s (%s)", ep.repo.RepositoryStr(), ep.label, status)}
			}
			return &causeError{sentinel: ErrUpstreamNotFound, err: err, msg: fmt.Sprintf(
				"%s not found on %s (%s)", what, ep.label, status)}
		case transient(err):
			return &causeError{sentinel: ErrUpstreamUnreachable, err: err, msg: fmt.Sprintf(
				"%s is unavailable (%s) for %s", ep.label, status, what)}
		default:
			return &causeError{err: err, msg: fmt.Sprintf("%s answered %s for %s", ep.label, status, what)}
		}
	}
	if speaksHTTP(err) {
		return &causeError{sentinel: ErrUpstreamUnreachable, err: err, msg: fmt.Sprintf(
			"%s speaks plain HTTP, not HTTPS; plain HTTP is used only when allowed (Upstream.PlainHTTP or an http:// mirror)", ep.label)}
	}
	if isTLSError(err) {
		return &causeError{sentinel: ErrUpstreamUnreachable, err: err, msg: fmt.Sprintf(
			"TLS with %s failed (is its CA in RootCAs?): %s", ep.label, withoutPingNoise(err))}
	}
	var pe *plainHTTPError
	var ne net.Error
	if errors.As(err, &pe) || errors.As(err, &ne) || transient(err) {
		return &causeError{sentinel: ErrUpstreamUnreachable, err: err, msg: fmt.Sprintf("cannot reach %s: %s", ep.label, withoutPingNoise(err))}
	}
	return fmt.Errorf("%s: %w", ep.label, err)
}

// pingNoise is the refusal of go-containerregistry's plain-HTTP ping, which it sends beside the HTTPS
// one for loopback and private registries; joined to the HTTPS error it only hides the real cause.
var pingNoise = regexp.MustCompile(`; Get "http://[^"]*": plain HTTP to \S+ is not allowed \([^)]*\)`)

// withoutPingNoise is err's text without pingNoise (unchanged when that would leave nothing).
func withoutPingNoise(err error) string {
	s := err.Error()
	if t := pingNoise.ReplaceAllString(s, ""); t != "" {
		return t
	}
	return s
}

// statusLine renders an HTTP error as "401 UNAUTHORIZED: authentication required".
func statusLine(te *transport.Error) string {
	s := fmt.Sprintf("%d", te.StatusCode)
	if len(te.Errors) > 0 {
		d := te.Errors[0]
		s += " " + string(d.Code)
		if d.Message != "" {
			s += ": " + d.Message
		}
		return s
	}
	return s + " " + http.StatusText(te.StatusCode)
}

func hasDiagnostic(te *transport.Error, code transport.ErrorCode) bool {
	for _, d := range te.Errors {
		if d.Code == code {
			return true
		}
	}
	return false
}
