// Package connlimit bounds what one client, or all of them, can hold of an HTTP server's
// connections: a cap per source address and a cap in total, and a write-stall deadline that cuts a
// connection whose client stops reading (issue 34, item 4).
//
// A Listener wraps the server's net.Listener; Install hooks it into the http.Server (ConnState,
// ConnContext, Handler). At accept, a connection over a cap first makes room by closing that
// source's (or, for the total, anyone's) longest-idle keep-alive connection, which its client
// re-opens at its next request; only when every connection counted is busy is the new one refused:
// it is kept just long enough to answer its requests 429 (its source's cap) or 503 (the total cap)
// with a text naming the cap, then closed, at most MaxRefusing of them at once; past that a
// connection is closed as soon as it is accepted. Refusals are logged once a minute per source.
//
// The write-stall deadline restarts at every write: a download of any size at any steady rate is
// never cut; a client that takes nothing for WriteStall is. (http.Server's WriteTimeout would cut
// a whole response, a 300 MB ISO included; x/net/netutil.LimitListener would stop accepting at the
// cap, with no answer and no way to make room.)
package connlimit

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airgap-appliance/appliance/pkg/nodestate"
)

// Defaults (Config's zero values).
const (
	// DefaultWriteStall is how long a write may wait for the client to take data before the
	// connection is cut. A client that reads, however slowly, is never cut: the deadline restarts at
	// every write, and a TLS record (at most 16 KiB) goes out at 13 ms on a 10 Mbit/s link. It must
	// also fit BMCs streaming virtual media: Redfish InsertMedia from an HTTPS URL (iDRAC, iLO,
	// OpenBMC's nbd-proxy) fetches the ISO with Range requests of a few MiB as the host reads its
	// virtual CD, or copies it whole at link speed; neither leaves a response untouched for a
	// minute, while the host waits on the CD it reads ahead. A minute is four times TCP's longest
	// retransmission backoff a healthy path shows, and holds a stalled client's goroutine and
	// buffers (about 50 KiB) no longer.
	DefaultWriteStall = time.Minute
	// DefaultMaxConnsPerSource is how many connections one source address holds at once. A node
	// uses a handful (hostagent's API connection and config watch, containerd's parallel layer
	// pulls, at most 3 per image by default, Ignition, apt); a BMC fetching virtual media a few
	// more. 64 is over ten times that, and lets no single address take more than 1/32 of
	// DefaultMaxConns.
	DefaultMaxConnsPerSource = 64
	// DefaultMaxConns is how many connections the server holds at once. One bootstrap host serves
	// a few hundred nodes (DESIGN.md), each a few connections; each connection costs a goroutine
	// and its TLS and bufio buffers (about 50 KiB), so 2048 bound them to about 100 MiB.
	DefaultMaxConns = 2048
	// MaxRefusing is how many connections over a cap are kept at once to be answered 429 or 503.
	// Each costs a TLS handshake; past this, connections over a cap are closed unanswered.
	MaxRefusing = 64
	// RefusingLifetime is how long a connection over a cap is kept to answer: enough for a TLS
	// handshake and a request, after which it is closed whatever it is doing.
	RefusingLifetime = 5 * time.Second
	// refusalLogEvery is how often one source's refusals are logged; maxLoggedSources bounds the
	// sources remembered for it.
	refusalLogEvery  = time.Minute
	maxLoggedSources = 4096
)

// Config sets the limits; a zero field is its default.
type Config struct {
	MaxConns          int
	MaxConnsPerSource int
	WriteStall        time.Duration
	// Logger receives refusals (once a minute per source) and stalled clients; nil discards.
	Logger *slog.Logger
}

// Stats are a Listener's counts since it was made.
type Stats struct {
	// Open is the connections counted now (not those kept only to be refused); Peak its highest,
	// PeakPerSource the highest one source held.
	Open, Peak, PeakPerSource int
	// Evicted are idle keep-alive connections closed to make room; RefusedSource and RefusedTotal
	// connections answered 429 and 503; Dropped connections closed at once (MaxRefusing reached);
	// Stalled connections cut because their client took nothing for WriteStall.
	Evicted, RefusedSource, RefusedTotal, Dropped, Stalled int64
}

// Listener is a net.Listener with the limits. Use it through Install.
type Listener struct {
	net.Listener
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	bySource map[string]map[*conn]struct{}
	stats    Stats
	refusing int
	logged   nodestate.NoteThrottle // source → when its last refusal was logged
}

// New wraps inner with the limits of cfg.
func New(inner net.Listener, cfg Config) *Listener {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxConnsPerSource <= 0 {
		cfg.MaxConnsPerSource = DefaultMaxConnsPerSource
	}
	if cfg.WriteStall <= 0 {
		cfg.WriteStall = DefaultWriteStall
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Listener{Listener: inner, cfg: cfg, log: log, bySource: map[string]map[*conn]struct{}{},
		logged: nodestate.NoteThrottle{Every: refusalLogEvery, MaxKeys: maxLoggedSources}}
}

// Stats returns the counts.
func (l *Listener) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

// Install makes hs keep l's accounting (ConnState, chained with hs's own), hand each request its
// connection (ConnContext) and answer the requests of a connection over a cap 429 or 503 (Handler,
// wrapping hs's). Serve hs on l afterwards.
func (l *Listener) Install(hs *http.Server) {
	prevState := hs.ConnState
	hs.ConnState = func(c net.Conn, st http.ConnState) {
		if lc := asConn(c); lc != nil {
			l.setState(lc, st)
		}
		if prevState != nil {
			prevState(c, st)
		}
	}
	prevCtx := hs.ConnContext
	hs.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if prevCtx != nil {
			ctx = prevCtx(ctx, c)
		}
		if lc := asConn(c); lc != nil {
			ctx = context.WithValue(ctx, connKey{}, lc)
		}
		return ctx
	}
	next := hs.Handler
	if next == nil {
		next = http.DefaultServeMux
	}
	hs.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lc, _ := r.Context().Value(connKey{}).(*conn)
		if lc == nil || lc.refusal == 0 {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		w.Header().Set("Retry-After", "5")
		if lc.refusal == http.StatusTooManyRequests {
			http.Error(w, fmt.Sprintf("too many connections from %s (at most %d at once): close idle ones, or retry", lc.source, l.cfg.MaxConnsPerSource), lc.refusal)
			return
		}
		http.Error(w, fmt.Sprintf("the appliance holds as many connections as it serves at once (%d): retry in a few seconds", l.cfg.MaxConns), lc.refusal)
	})
}

type connKey struct{}

// asConn finds the *conn under c (a *tls.Conn for an HTTPS server).
func asConn(c net.Conn) *conn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, _ := c.(*conn)
	return lc
}

// Accept returns the next connection, admitted or to be refused (see the package documentation).
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := &conn{Conn: c, l: l, source: sourceOf(c)}
		evict, refusal := l.admit(lc)
		for _, e := range evict {
			_ = e.Conn.Close() // its server goroutine sees the close and ends
		}
		if refusal == 0 {
			lc.stall = l.cfg.WriteStall
			return lc, nil
		}
		l.mu.Lock()
		drop := l.refusing >= MaxRefusing
		if drop {
			l.stats.Dropped++
		} else {
			l.refusing++
			lc.refusal = refusal
			if refusal == http.StatusTooManyRequests {
				l.stats.RefusedSource++
			} else {
				l.stats.RefusedTotal++
			}
		}
		l.mu.Unlock()
		l.logRefusal(lc.source, refusal, drop)
		if drop {
			_ = c.Close()
			continue
		}
		lc.timer = time.AfterFunc(RefusingLifetime, func() { _ = lc.Close() })
		return lc, nil
	}
}

// admit counts lc in when it fits the caps, first choosing idle connections to close to make
// room; otherwise it returns the refusal's status. The caller closes the evicted connections.
func (l *Listener) admit(lc *conn) (evict []*conn, refusal int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	mine := l.bySource[lc.source]
	if len(mine) >= l.cfg.MaxConnsPerSource {
		e := oldestIdle(mine)
		if e == nil {
			return nil, http.StatusTooManyRequests
		}
		l.uncount(e)
		evict = append(evict, e)
	}
	if l.stats.Open >= l.cfg.MaxConns {
		var e *conn
		for _, conns := range l.bySource {
			if c := oldestIdle(conns); c != nil && (e == nil || c.idleSince.Before(e.idleSince)) {
				e = c
			}
		}
		if e == nil {
			return evict, http.StatusServiceUnavailable
		}
		l.uncount(e)
		evict = append(evict, e)
	}
	if mine == nil {
		mine = map[*conn]struct{}{}
		l.bySource[lc.source] = mine
	}
	mine[lc] = struct{}{}
	lc.counted = true
	l.stats.Open++
	l.stats.Peak = max(l.stats.Peak, l.stats.Open)
	l.stats.PeakPerSource = max(l.stats.PeakPerSource, len(mine))
	l.stats.Evicted += int64(len(evict))
	return evict, 0
}

// oldestIdle is the connection of conns idle the longest, or nil when none is idle (l.mu held).
func oldestIdle(conns map[*conn]struct{}) *conn {
	var e *conn
	for c := range conns {
		if !c.idleSince.IsZero() && (e == nil || c.idleSince.Before(e.idleSince)) {
			e = c
		}
	}
	return e
}

// uncount takes c out of the counts (l.mu held); once only.
func (l *Listener) uncount(c *conn) {
	if !c.counted {
		return
	}
	c.counted = false
	mine := l.bySource[c.source]
	delete(mine, c)
	if len(mine) == 0 {
		delete(l.bySource, c.source)
	}
	l.stats.Open--
}

func (l *Listener) setState(c *conn, st http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if st == http.StateIdle {
		c.idleSince = time.Now()
	} else {
		c.idleSince = time.Time{}
	}
}

func (l *Listener) logRefusal(source string, code int, dropped bool) {
	if !l.logged.Allow(source, time.Now()) {
		return
	}
	which, limit := "the source's", l.cfg.MaxConnsPerSource
	if code == http.StatusServiceUnavailable {
		which, limit = "the total", l.cfg.MaxConns
	}
	l.log.Warn("connection refused: over "+which+" connection cap (logged once a minute per source)",
		"source", source, "limit", limit, "answered", map[bool]string{false: fmt.Sprint(code), true: "closed unanswered"}[dropped])
}

// sourceOf is the host of c's remote address.
func sourceOf(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// conn is an accepted connection: counted in its source's set, or kept to be refused.
type conn struct {
	net.Conn
	l      *Listener
	source string
	// refusal is 0 for a counted connection, else the status its requests are answered.
	refusal int
	// stall is the write-stall deadline (0 for a connection being refused: its timer ends it).
	stall time.Duration
	timer *time.Timer

	// Guarded by l.mu.
	idleSince time.Time // when it last became idle (http.StateIdle); zero: not idle
	counted   bool

	stalled   atomic.Pointer[error] // the write that timed out
	closeOnce sync.Once
}

// Write writes with a deadline of now + the stall allowance, so a client that takes nothing for
// that long fails the write and the server drops the connection. After such a failure every write
// fails at once (the server's last flush and TLS's closing alert must not wait a stall each).
func (c *conn) Write(b []byte) (int, error) {
	if c.stall <= 0 {
		return c.Conn.Write(b)
	}
	if err := c.stalled.Load(); err != nil {
		return 0, *err
	}
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.stall))
	n, err := c.Conn.Write(b)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && c.stalled.CompareAndSwap(nil, &err) {
		c.l.mu.Lock()
		c.l.stats.Stalled++
		c.l.mu.Unlock()
		c.l.log.Debug("connection cut: the client took nothing for the write-stall deadline", "source", c.source, "stall", c.stall.String())
	}
	return n, err
}

// Close closes the connection and takes it out of the counts.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		c.l.mu.Lock()
		if c.refusal != 0 {
			c.l.refusing--
		}
		c.l.uncount(c)
		c.l.mu.Unlock()
		if c.timer != nil {
			c.timer.Stop()
		}
	})
	return c.Conn.Close()
}
