package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// tlsClient is an HTTPS client of the front on 127.0.0.1 whose connections come from the loopback
// address from ("" for any), so a test can be several sources.
func tlsClient(from string) *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext:     d.DialContext,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the limits are what is tested
		MaxConnsPerHost: 4,
	}}
}

// send does one request and returns its status, Retry-After and body.
func send(t *testing.T, hc *http.Client, req *http.Request) (int, string, string) {
	t.Helper()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
}

// TestReportFloodLimited is the attack of a node (or anyone holding its token) that reports without
// end over the real TLS listener, each report different so each would be recorded: past
// ReportBurst at once, the node gets 429 with a Retry-After and a text naming the limit, nothing of
// those is recorded, and after the Retry-After it reports again. Another node is not held up by it.
func TestReportFloodLimited(t *testing.T) {
	s, store, _ := newAgentServer(t)
	addr := serveTLSFront(t, s)
	hc := tlsClient("")
	defer hc.CloseIdleConnections()
	report := func(token string, i int) (int, string, string) {
		body, _ := json.Marshal(agentapi.Report{BootID: "b1", Step: agentapi.StepConfig, Status: agentapi.StatusRunning, Detail: fmt.Sprintf("flood %d %s", i, strings.Repeat("x", 4<<10)), Time: time.Now().UTC()})
		req, _ := http.NewRequest(http.MethodPost, "https://"+addr+agentapi.ReportPathV1, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		return send(t, hc, req)
	}
	const flood = 300
	start := time.Now()
	codes := map[int]int{}
	var retryAfter, msg string
	for i := range flood {
		code, ra, body := report("tok-cp1", i)
		codes[code]++
		if code == http.StatusTooManyRequests && retryAfter == "" {
			retryAfter, msg = ra, body
		}
	}
	elapsed := time.Since(start)
	maxOK := ReportBurst + int(elapsed.Seconds()*ReportRate) + 1
	if codes[http.StatusNoContent] > maxOK || codes[http.StatusNoContent] < ReportBurst || codes[http.StatusTooManyRequests] == 0 ||
		codes[http.StatusNoContent]+codes[http.StatusTooManyRequests] != flood {
		t.Fatalf("%d reports in %s: %v; want at most %d taken (burst %d, %d/s), the rest 429", flood, elapsed.Round(time.Millisecond), codes, maxOK, ReportBurst, ReportRate)
	}
	if n, err := strconv.Atoi(retryAfter); err != nil || n < 1 || !strings.Contains(msg, "too many reports from node cp1") {
		t.Errorf("429 with Retry-After %q and %q, want whole seconds and the limit named", retryAfter, msg)
	}
	evs, _ := store.Events("cp1")
	if len(evs) != codes[http.StatusNoContent] {
		t.Errorf("%d events for %d reports taken: a refused report was recorded", len(evs), codes[http.StatusNoContent])
	}
	// Another node reports meanwhile; cp1 again after the Retry-After.
	if code, _, body := report("tok-cp2", 0); code != http.StatusNoContent {
		t.Errorf("cp2 during cp1's flood: %d %s", code, body)
	}
	n, _ := strconv.Atoi(retryAfter)
	time.Sleep(time.Duration(n) * time.Second)
	if code, _, body := report("tok-cp1", flood); code != http.StatusNoContent {
		t.Errorf("cp1 after the Retry-After: %d %s", code, body)
	}
}

// TestWatchFloodLimited is the attack of a node opening config watches without end (each a
// goroutine polling its config for up to agentapi.ConfigWaitMax): over the real TLS listener,
// MaxWatchesPerNode of them are held and every one beyond answers 429 at once; another node's watch
// is still held, and once the node's watches end it may watch again.
func TestWatchFloodLimited(t *testing.T) {
	s, _, _ := newAgentServer(t)
	addr := serveTLSFront(t, s)
	hc := tlsClient("")
	hc.Transport.(*http.Transport).MaxConnsPerHost = 0
	defer hc.CloseIdleConnections()
	get := func(ctx context.Context, token, query string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+agentapi.ConfigPathV1+query, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("ETag")
	}
	_, etag := get(context.Background(), "tok-cp1", "")
	ctx, cancel := context.WithCancel(context.Background())
	const flood = 40
	var wg sync.WaitGroup
	var mu sync.Mutex
	refused := 0
	for range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, _ := get(ctx, "tok-cp1", "?wait="+etag); code == http.StatusTooManyRequests {
				mu.Lock()
				refused++
				mu.Unlock()
			}
		}()
	}
	deadline := time.Now().Add(20 * time.Second) // a hang guard: the refusals come at once
	for {
		mu.Lock()
		r := refused
		mu.Unlock()
		if r == flood-MaxWatchesPerNode {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			wg.Wait()
			t.Fatalf("%d of %d concurrent watches of one node refused, want %d (at most %d held)", r, flood, flood-MaxWatchesPerNode, MaxWatchesPerNode)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Another node still watches (its request is held: it has not answered within a second).
	other, stop := context.WithTimeout(context.Background(), time.Second)
	defer stop()
	_, etag2 := get(context.Background(), "tok-cp2", "")
	if code, _ := get(other, "tok-cp2", "?wait="+etag2); code == http.StatusTooManyRequests {
		t.Error("cp2's watch refused during cp1's flood")
	}
	cancel()
	wg.Wait()
	for time.Now().Before(deadline) { // the server sees the held watches' clients go
		s.opts.Agent.watchMu.Lock()
		n := s.opts.Agent.watching["cp1"]
		s.opts.Agent.watchMu.Unlock()
		if n == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	again, stop2 := context.WithTimeout(context.Background(), time.Second)
	defer stop2()
	if code, _ := get(again, "tok-cp1", "?wait="+etag); code == http.StatusTooManyRequests {
		t.Error("cp1 may not watch again after its watches ended")
	}
}

// TestEnrollFloodLimited is the attack of one source flooding the enrolment endpoint (for w2's MAC),
// then of many sources (loopback addresses 127.0.0.2-41) flooding it for w1's MAC: the first source
// gets 429 past EnrollSourceBurst at once, before its requests are read; the many sources together
// get 429 past EnrollNodeBurst for w1, and nothing of the refused requests reaches the node's
// events; another source is still answered.
func TestEnrollFloodLimited(t *testing.T) {
	f := newEnrollFixture(t)
	addr := serveTLSFront(t, f.srv)
	body := func(mac string) []byte {
		b, _ := json.Marshal(f.request(newKey(t), "", mac))
		return b
	}
	post := func(hc *http.Client, b []byte) (int, string, string) {
		req, _ := http.NewRequest(http.MethodPost, "https://"+addr+agentapi.EnrollPathV1, bytes.NewReader(b))
		return send(t, hc, req)
	}
	// One source, for w2. (Refused 403: not powered on; the fixture's clock stands still, so no
	// bucket refills during the test.)
	one := tlsClient("127.0.0.1")
	defer one.CloseIdleConnections()
	codes := map[int]int{}
	for range 3 * EnrollSourceBurst {
		code, ra, msg := post(one, body("52:54:00:02:64:00"))
		codes[code]++
		if code == http.StatusTooManyRequests && (ra == "" || !strings.Contains(msg, "too many enrolment requests from 127.0.0.1")) {
			t.Fatalf("429 with Retry-After %q: %s", ra, msg)
		}
	}
	if codes[http.StatusTooManyRequests] != 2*EnrollSourceBurst || codes[http.StatusForbidden] != EnrollSourceBurst {
		t.Fatalf("one source, %d requests: %v; want %d refused 403, then 429", 3*EnrollSourceBurst, codes, EnrollSourceBurst)
	}
	// Many sources, one node (w1): each source within its own limit, the node's limit holds.
	codes = map[int]int{}
	for i := range 40 {
		hc := tlsClient(fmt.Sprintf("127.0.0.%d", 2+i))
		code, _, msg := post(hc, body(w1MAC))
		hc.CloseIdleConnections()
		codes[code]++
		if code == http.StatusTooManyRequests && !strings.Contains(msg, "for node w1") {
			t.Fatalf("429 from another source: %s", msg)
		}
	}
	if codes[http.StatusForbidden] != EnrollNodeBurst || codes[http.StatusTooManyRequests] != 40-EnrollNodeBurst {
		t.Fatalf("40 sources, one node: %v; want %d refused 403, then 429", codes, EnrollNodeBurst)
	}
	evs, _ := f.store.Events("w1")
	if len(evs) > 2 {
		t.Errorf("%d events after the floods, want at most a note per refusal rule", len(evs))
	}
	// A request for another node from a fresh source is answered on its merits.
	hc := tlsClient("127.0.0.99")
	defer hc.CloseIdleConnections()
	if code, _, msg := post(hc, body("52:54:00:00:00:11")); code != http.StatusForbidden || !strings.Contains(msg, "node cp1 is not BMC-powered") {
		t.Errorf("cp1 from another source: %d %s", code, msg)
	}
}
