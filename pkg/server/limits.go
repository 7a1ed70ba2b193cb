package server

import (
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"

	"github.com/airgap-appliance/appliance/pkg/nodestate"
)

// Rate limits against one misbehaving client or node (issue 34, item 4). A request over a limit is
// answered 429 Too Many Requests with a Retry-After and a text naming the limit; hostagent retries
// it with backoff like a 5xx. Each refusal is logged once a minute per node or source, not per
// request.
const (
	// ReportRate (reports a second) and ReportBurst bound the reports one node (its token) may
	// send. hostagent reports each step's start and end, about 20 reports for a whole plan, most
	// of them seconds apart, and resends only what was not acknowledged; the fleet bench's
	// simulated nodes, which compress a step to a second, send 2 a second. A node's whole plan fits
	// in the burst, and 5 a second sustained is over twice the fastest honest node, while a node
	// (or anyone holding its token) sending without end costs at most 5 recorded reports a second
	// (each two fsyncs and a line of at most MaxReportBytes in its events, which nodestate caps).
	ReportRate  = 5
	ReportBurst = 50

	// MaxWatchesPerNode bounds the config watches (agentapi.ConfigWaitParam) one node holds at
	// once. hostagent holds one; a second lives on for a while when its connection died without a
	// FIN and the agent started a new one. Each watch holds a goroutine and polls the node's config
	// every configWatchPoll for up to agentapi.ConfigWaitMax, so a node opening watches without end
	// must not multiply that. Over the limit: 429 (hostagent waits 5 s and falls back to its
	// resync meanwhile).
	MaxWatchesPerNode = 4

	// EnrollSourceRate (requests a second) and EnrollSourceBurst bound the enrolment requests of
	// one source address, before anything of the request is read: a machine enrols once per
	// power-on, with a few retries (exponential backoff from 0.5 s, one immediate resend after a
	// clock correction); twenty at once and two a second after cover that many times over, while a
	// flood from one address costs at most two signature checks a second.
	EnrollSourceRate  = 2
	EnrollSourceBurst = 20

	// EnrollNodeRate and EnrollNodeBurst bound the enrolment requests matched to one node (by its
	// MAC), whatever their source: each reads the node's events and enrolment record, so requests
	// from many addresses naming one node cost at most five such reads a second. The node's own
	// machine, retrying with backoff, gets through as soon as a flood pauses.
	EnrollNodeRate  = 5
	EnrollNodeBurst = 20

	// maxLimiterKeys bounds the keys (source addresses) a keyedLimiter remembers, least recently
	// used forgotten first (about 200 bytes each). Forgetting a source gives it a full burst again,
	// which a few thousand addresses in turn could exploit only at the cost of a connection each.
	maxLimiterKeys = 4096

	// refusalLogEvery is how often one refusal (a node or source and what was refused) is logged.
	refusalLogEvery = nodestate.DefaultNoteEvery
)

// keyedLimiter is a token bucket per key (a node, a source address). Safe for concurrent use.
type keyedLimiter struct {
	limit rate.Limit
	burst int

	mu   sync.Mutex
	lims *lru.Cache[string, *rate.Limiter]
}

func newKeyedLimiter(perSecond float64, burst int) *keyedLimiter {
	lims, _ := lru.New[string, *rate.Limiter](maxLimiterKeys) // errors only for a size <= 0
	return &keyedLimiter{limit: rate.Limit(perSecond), burst: burst, lims: lims}
}

// allow takes a token of key's bucket at now; when there is none it returns false and how long
// until there is one.
func (k *keyedLimiter) allow(key string, now time.Time) (bool, time.Duration) {
	k.mu.Lock()
	lim, ok := k.lims.Get(key)
	if !ok {
		lim = rate.NewLimiter(k.limit, k.burst)
		k.lims.Add(key, lim)
	}
	k.mu.Unlock()
	r := lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// tooManyRequests answers 429 with Retry-After (whole seconds, at least 1) and msg.
func tooManyRequests(w http.ResponseWriter, retryAfter time.Duration, msg string) {
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Max(1, math.Ceil(retryAfter.Seconds())))))
	http.Error(w, msg, http.StatusTooManyRequests)
}

// refusalLog logs a refusal once per refusalLogEvery per key (who was refused, and what). The zero
// value is ready to use.
type refusalLog struct {
	noted nodestate.NoteThrottle // its default Every is refusalLogEvery
}

func (l *refusalLog) log(log *slog.Logger, key, msg string, attrs ...any) {
	if l.noted.Allow(key, time.Now()) {
		log.Warn(msg+" (logged once a minute)", attrs...)
	}
}

// sourceHost is the host of a request's RemoteAddr (the source address a limit is kept for).
func sourceHost(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return remote
	}
	return host
}

func rateText(perSecond float64, burst int) string {
	return fmt.Sprintf("%g a second after a burst of %d", perSecond, burst)
}
