// Package server is the appliance's HTTPS front: one TLS listener (TLS >= 1.2, AEAD suites only) that serves
//
//	/v2/                the embedded OCI registry mirror (read-only; registry package)
//	/repo/              the bundle's package repository, its own metadata served as-is
//	/ignition/<node>    per-node Ignition configs, bearer-token authenticated (header only)
//	/artifacts/<name>   binaries nodes install (hostagent), verified by hash in their Ignition config
//	/agent/v1/          the hostagent API (AgentAPI), bearer-token authenticated
//	/agent/v1/enroll    enrolment of BMC-booted machines (Enrollment): no token, a signed request
//	/ca.crt             the appliance CA certificate (public; nodes check it against their pin)
//	/healthz            liveness plus the served generation (JSON)
//	/metrics            Prometheus metrics (own registry, never the global one)
//
// Secrets (tokens) never reach the access log: it records paths without query strings.
package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/connlimit"
	"github.com/airgap-appliance/appliance/pkg/nodeiso"
)

// Options configures a Server. Listen, Certificate and at least one of the content sources are
// required; a nil Registry leaves /v2/ answering 404.
type Options struct {
	// Listen is host:port, e.g. "0.0.0.0:8443".
	Listen string
	// Certificate is the serving certificate issued by the appliance CA (pkg/pki).
	Certificate tls.Certificate
	// Registry serves /v2/ (registry.Handler).
	Registry http.Handler
	// RepoDir is served under /repo/ as static files (the bundle's repo/ directory).
	RepoDir string
	// Ignition serves /ignition/<node>.
	Ignition *IgnitionStore
	// Agent serves /agent/v1/ (hostagent config and reports).
	Agent *AgentAPI
	// Enroll serves agentapi.EnrollPathV1 (BMC-booted machines enrol for their credential).
	Enroll *Enrollment
	// CAPEM is served at /ca.crt when not empty.
	CAPEM []byte
	// NodeISO, when not nil, serves the node image ISO at nodeiso.Path (no token: public data, the
	// image a BMC inserts as virtual media).
	NodeISO *nodeiso.Image
	// Artifacts maps a name under /artifacts/ to a file path.
	Artifacts map[string]string
	// Generation identifies the configuration this process serves; /healthz reports it so that
	// `appliance bootstrap` can tell a stale server from a current one.
	Generation string
	// Logger receives the access log at debug level and errors at error level.
	Logger *slog.Logger
	// MaxConns, MaxConnsPerSource and WriteStall limit the listener's connections (pkg/connlimit:
	// a cap in total, a cap per source address, a write-stall deadline); zero: connlimit's
	// defaults (2048, 64, one minute).
	MaxConns, MaxConnsPerSource int
	WriteStall                  time.Duration
}

// Server is a running or runnable HTTPS front.
type Server struct {
	opts    Options
	handler http.Handler
	metrics *metrics
	reg     *prometheus.Registry
	conns   atomic.Pointer[connlimit.Listener] // the serving listener's limits, once serving
}

// ConnStats are the serving listener's connection counts (zero before ServeListener).
func (s *Server) ConnStats() connlimit.Stats {
	if l := s.conns.Load(); l != nil {
		return l.Stats()
	}
	return connlimit.Stats{}
}

// New builds the handler tree. It does not listen yet.
func New(opts Options) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Listen == "" {
		return nil, errors.New("server: listen address is empty")
	}
	if len(opts.Certificate.Certificate) == 0 {
		return nil, errors.New("server: no serving certificate")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s := &Server{opts: opts, reg: reg, metrics: newMetrics(reg)}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "appliance_http_connections",
			Help: "HTTPS connections open and counted against the caps (pkg/connlimit)."},
			func() float64 { return float64(s.ConnStats().Open) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "appliance_http_connections_refused_total",
			Help: "HTTPS connections refused over a connection cap (answered 429 or 503, or closed unanswered)."},
			func() float64 { st := s.ConnStats(); return float64(st.RefusedSource + st.RefusedTotal + st.Dropped) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "appliance_http_connections_stalled_total",
			Help: "HTTPS connections cut because the client took nothing for the write-stall deadline."},
			func() float64 { return float64(s.ConnStats().Stalled) }),
	)

	mux := http.NewServeMux()
	if opts.Registry != nil {
		mux.Handle("/v2/", s.instrument("registry", opts.Registry))
	}
	if opts.RepoDir != "" {
		mux.Handle("/repo/", s.instrument("repo", http.StripPrefix("/repo/", staticFiles(opts.RepoDir))))
	}
	if opts.Ignition != nil {
		mux.Handle("/ignition/", s.instrument("ignition", opts.Ignition))
	}
	if opts.Agent != nil {
		mux.Handle("/agent/", s.instrument("agent", opts.Agent))
	}
	if opts.Enroll != nil {
		mux.Handle(agentapi.EnrollPathV1, s.instrument("enroll", opts.Enroll))
	}
	if len(opts.CAPEM) > 0 {
		mux.Handle("/ca.crt", s.instrument("ca", caHandler(opts.CAPEM)))
	}
	if opts.NodeISO != nil {
		mux.Handle(nodeiso.Path, s.instrument("nodeiso", opts.NodeISO))
	}
	for name, path := range opts.Artifacts {
		mux.Handle("/artifacts/"+name, s.instrument("artifacts", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.ServeFile(w, r, path)
		})))
	}
	mux.Handle("/healthz", s.instrument("healthz", http.HandlerFunc(s.healthz)))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	s.handler = mux
	return s, nil
}

// Handler returns the root handler (for tests and for embedding in another server).
func (s *Server) Handler() http.Handler { return s.handler }

// TLS12CipherSuites are the suites the front accepts over TLS 1.2: Mozilla's "intermediate" server
// profile (https://wiki.mozilla.org/Security/Server_Side_TLS, version 5.7) as Go implements it, ECDHE
// key exchange with an AEAD cipher (AES-GCM, ChaCha20-Poly1305; RFC 5289, RFC 7905) for ECDSA and
// RSA certificates. No CBC suite (Lucky13-class padding oracles, SHA-1 MACs), no RSA key exchange
// (no forward secrecy). TLS 1.3 suites are fixed by crypto/tls and not listed.
var TLS12CipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// TLSConfig is the listener's TLS configuration: TLS 1.2 minimum with TLS12CipherSuites only, TLS 1.3
// as crypto/tls has it, HTTP/2 and HTTP/1.1.
func (s *Server) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		CipherSuites: TLS12CipherSuites,
		Certificates: []tls.Certificate{s.opts.Certificate},
		NextProtos:   []string{"h2", "http/1.1"},
	}
}

// Health is the /healthz document.
type Health struct {
	Status     string `json:"status"`
	Generation string `json:"generation"`
	PID        int    `json:"pid"`
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(Health{Status: "ok", Generation: s.opts.Generation, PID: os.Getpid()})
}

// Serve listens on Options.Listen and serves until ctx is cancelled, then shuts down gracefully
// (in-flight requests get up to 10 s). ready, if not nil, is closed once the listener is bound.
func (s *Server) Serve(ctx context.Context, ready chan<- struct{}) error {
	ln, err := net.Listen("tcp", s.opts.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (is another appliance serving? change server.port or server.listenAddress)", s.opts.Listen, err)
	}
	return s.ServeListener(ctx, ln, ready)
}

// ServeListener is Serve on an existing listener (which it closes), with the connection limits of
// pkg/connlimit (Options.MaxConns, MaxConnsPerSource, WriteStall): a connection over a cap is
// answered 429 (its source's) or 503 (the total), a client that takes nothing of a response for the
// write-stall deadline is cut. A request's headers must come within 10 s of the connection (or of
// the previous request), an idle keep-alive connection is closed after 120 s.
func (s *Server) ServeListener(ctx context.Context, ln net.Listener, ready chan<- struct{}) error {
	hs := &http.Server{
		Handler:           s.handler,
		TLSConfig:         s.TLSConfig(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.opts.Logger.Handler(), slog.LevelDebug),
	}
	limited := connlimit.New(ln, connlimit.Config{MaxConns: s.opts.MaxConns, MaxConnsPerSource: s.opts.MaxConnsPerSource,
		WriteStall: s.opts.WriteStall, Logger: s.opts.Logger})
	limited.Install(hs)
	s.conns.Store(limited)
	ln = limited
	if s.opts.Agent != nil {
		hs.RegisterOnShutdown(s.opts.Agent.EndWatches) // config watches answer now, not after their wait
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.ServeTLS(ln, "", "") }()
	if ready != nil {
		close(ready)
	}
	s.opts.Logger.Info("serving", "address", ln.Addr().String(), "generation", s.opts.Generation)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		return nil
	}
}

// staticFiles serves the regular files under root: no directory listings (a directory, the root
// included, is 404 like a missing file: apt reads the files its indexes name and never lists a
// directory, and a listing would show anyone the bundle's layout), no dot-files, and no symlinks
// leaving the tree.
func staticFiles(root string) http.Handler {
	fs := http.FileServer(http.Dir(root))
	realRoot, err := filepath.EvalSymlinks(root) // once: the bundle does not move while serving
	if err != nil {
		realRoot = root
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, part := range strings.Split(r.URL.Path, "/") {
			if strings.HasPrefix(part, ".") {
				http.NotFound(w, r)
				return
			}
		}
		full := filepath.Join(root, filepath.FromSlash(r.URL.Path))
		if real, err := filepath.EvalSymlinks(full); err == nil && real != realRoot &&
			!strings.HasPrefix(real, realRoot+string(filepath.Separator)) {
			http.NotFound(w, r)
			return
		}
		if st, err := os.Stat(full); err != nil || !st.Mode().IsRegular() {
			http.Error(w, "404 page not found: /repo/ serves the package repository's files, not directory listings", http.StatusNotFound)
			return
		}
		fs.ServeHTTP(w, r)
	})
}

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	bytes    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appliance_http_requests_total", Help: "HTTP requests served, by service and status code.",
		}, []string{"service", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "appliance_http_request_duration_seconds", Help: "HTTP request latency in seconds, by service.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}, []string{"service"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "appliance_http_response_bytes_total", Help: "Response body bytes written, by service.",
		}, []string{"service"}),
	}
	reg.MustRegister(m.requests, m.duration, m.bytes)
	return m
}

type recorder struct {
	http.ResponseWriter
	code  int
	bytes int64
}

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	n, err := r.ResponseWriter.Write(b)
	r.bytes += int64(n)
	return n, err
}

// ReadFrom serves io.Copy (http.ServeContent, the registry's blob fast path) with a pooled 256 KiB
// buffer: larger TLS writes than net/http's own 32 KiB copy, which test/bench/registry-blobs.sh
// measures against nginx. (Over TLS there is no sendfile path to keep.)
func (r *recorder) ReadFrom(src io.Reader) (int64, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	n, err := copyBuffer(r.ResponseWriter, src)
	r.bytes += n
	return n, err
}

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (s *Server) instrument(service string, h http.Handler) http.Handler {
	hist := s.metrics.duration.WithLabelValues(service)
	bytes := s.metrics.bytes.WithLabelValues(service)
	log := s.opts.Logger
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &recorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if rec.code == 0 {
			rec.code = http.StatusOK
		}
		d := time.Since(start)
		// A config watch (agentapi.ConfigWaitParam) lasts as long as the config stays the same, up to
		// agentapi.ConfigWaitMax: its duration says nothing about the server's latency.
		if service != "agent" || !r.URL.Query().Has(agentapi.ConfigWaitParam) {
			hist.Observe(d.Seconds())
		}
		bytes.Add(float64(rec.bytes))
		s.metrics.requests.WithLabelValues(service, strconv.Itoa(rec.code)).Inc()
		if log.Enabled(r.Context(), slog.LevelDebug) {
			// r.URL.Path only: query strings may carry node tokens.
			log.Debug("request", "service", service, "method", r.Method, "path", r.URL.Path,
				"status", rec.code, "bytes", rec.bytes, "seconds", d.Seconds(), "remote", r.RemoteAddr)
		}
	})
}
