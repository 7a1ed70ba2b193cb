package ingressrouter

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"sync/atomic"
	"time"
)

// Proxy is the router's HTTP handler: it looks the request up in the current Table and forwards it
// with net/http/httputil.ReverseProxy to one ready endpoint of the backend, round robin. A refused
// connection (any dial error) is retried on the next endpoint, each endpoint at most once; the
// request body, never read before the connection is up, is forwarded whole. The request keeps its
// Host header; X-Forwarded-For, X-Forwarded-Host and X-Forwarded-Proto are set
// (ProxyRequest.SetXForwarded). Answers of its own, with a short text body:
//   - 503 before the first table (the router has not synced with the API server yet);
//   - 404 when no rule and no defaultBackend matches the host and path (the client asked for
//     something the cluster does not serve);
//   - 503 when the backend's Service has no ready endpoint (or none could be dialled): RFC 9110
//     §15.6.4, the standard answer of every ingress controller (ingress-nginx, HAProxy, OpenShift's
//     router) for a route without a live backend. It is a statement about the backend, not a fault of
//     the router's on the client's input, and it is retryable;
//   - 502 when an endpoint accepted the connection and then failed (RFC 9110 §15.6.3).
type Proxy struct {
	table atomic.Pointer[Table]
	rp    *httputil.ReverseProxy
	log   *slog.Logger
}

type ctxKey struct{}

// NewProxy returns a Proxy without a table (every request 503 until SetTable). log receives
// one debug line per failed dial and one warning per failed upstream exchange; nil discards them.
func NewProxy(log *slog.Logger) *Proxy {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{log: log}
	base := &http.Transport{
		Proxy:                 nil, // endpoints are pod addresses: never through an HTTP proxy
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // long polls and slow backends are the backend's business
		ExpectContinueTimeout: time.Second,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "backend" // replaced per attempt by retryTransport
			pr.SetXForwarded()
		},
		Transport: &retryTransport{base: base, log: log},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var de *dialError
			if errors.As(err, &de) {
				http.Error(w, "503 no backend endpoint accepted the connection", http.StatusServiceUnavailable)
				return
			}
			if !errors.Is(err, context.Canceled) {
				p.log.Warn("upstream exchange failed", "host", r.Host, "path", r.URL.Path, "error", err)
			}
			http.Error(w, "502 bad gateway", http.StatusBadGateway)
		},
	}
	return p
}

// SetTable makes t the table of the requests that follow.
func (p *Proxy) SetTable(t *Table) { p.table.Store(t) }

// Table returns the current table (nil before the first SetTable).
func (p *Proxy) Table() *Table { return p.table.Load() }

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t := p.table.Load()
	if t == nil {
		w.Header().Set("Retry-After", "5")
		http.Error(w, "503 the router has not synced with the API server yet", http.StatusServiceUnavailable)
		return
	}
	b := t.Lookup(r.Host, r.URL.Path)
	switch {
	case b == nil:
		http.Error(w, "404 no ingress rule for this host and path", http.StatusNotFound)
		return
	case len(b.Endpoints) == 0:
		w.Header().Set("Retry-After", "5")
		http.Error(w, "503 service "+b.Namespace+"/"+b.Service+" has no ready endpoint", http.StatusServiceUnavailable)
		return
	}
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, b)))
}

// dialError is a connection that could not be made to any endpoint of a backend.
type dialError struct{ err error }

func (e *dialError) Error() string { return "no endpoint accepted the connection: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// retryTransport sends the request to the backend's endpoints in round-robin order until one
// accepts the connection.
type retryTransport struct {
	base *http.Transport
	log  *slog.Logger
}

// keepBody hides Close from the Transport, which closes a request's body even when it failed to
// dial: the body is then still unread and goes to the next endpoint.
type keepBody struct{ io.Reader }

func (keepBody) Close() error { return nil }

func (t *retryTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	b, _ := req.Context().Value(ctxKey{}).(*Backend)
	if b == nil || len(b.Endpoints) == 0 {
		return nil, &dialError{errors.New("no endpoint")}
	}
	body := req.Body
	if body != nil && body != http.NoBody {
		defer body.Close()
	}
	first := b.start()
	var lastErr error
	for i := range b.Endpoints {
		ep := b.Endpoints[(first+i)%len(b.Endpoints)]
		out := req.Clone(req.Context())
		out.URL.Host = ep
		if body != nil && body != http.NoBody {
			out.Body = keepBody{body}
		}
		resp, err := t.base.RoundTrip(out)
		if err == nil {
			return resp, nil
		}
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "dial" {
			return nil, err // the endpoint took the request: not safe to send it again
		}
		t.log.Debug("endpoint refused the connection", "endpoint", ep, "service", b.Namespace+"/"+b.Service, "error", err)
		lastErr = err
	}
	return nil, &dialError{lastErr}
}
