package connlimit

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serve runs a plain-HTTP server on 127.0.0.1 behind a Listener with cfg; /block waits until
// release is closed.
func serve(t *testing.T, cfg Config, release chan struct{}) (*Listener, string) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, cfg)
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			<-release
		}
		fmt.Fprint(w, "ok")
	})}
	l.Install(hs)
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() { _ = hs.Close() })
	return l, inner.Addr().String()
}

// client is one keep-alive HTTP/1.1 connection.
type client struct {
	c  net.Conn
	br *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{c: c, br: bufio.NewReader(c)}
}

func (c *client) get(path string) (int, string, error) {
	_ = c.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c.c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// idleConns counts l's connections the server has marked idle (http.StateIdle).
func idleConns(l *Listener) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, conns := range l.bySource {
		for c := range conns {
			if !c.idleSince.IsZero() {
				n++
			}
		}
	}
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestIdleEvictedBeforeRefusing: at its source's cap, a new connection closes the source's
// longest-idle keep-alive connection to make room (its client reconnects at its next request);
// only when every connection of the source is busy is the new one answered 429, naming the cap,
// and closed.
func TestIdleEvictedBeforeRefusing(t *testing.T) {
	release := make(chan struct{})
	l, addr := serve(t, Config{MaxConnsPerSource: 2, MaxConns: 3}, release)
	a, b := dial(t, addr), dial(t, addr)
	// a becomes idle before b does: each waits for the server to mark its connection idle, as the
	// order of the server's idle transitions is not the order of the clients' requests under load
	// (make test beside a fixture build saw b marked first, and b evicted).
	for i, c := range []*client{a, b} {
		if code, _, err := c.get("/"); code != 200 || err != nil {
			t.Fatalf("GET: %d %v", code, err)
		}
		waitFor(t, fmt.Sprintf("%d idle", i+1), func() bool { return idleConns(l) == i+1 })
		time.Sleep(20 * time.Millisecond) // a coarse clock must still order the two idle times
	}
	c := dial(t, addr)
	if code, _, err := c.get("/"); code != 200 || err != nil {
		t.Fatalf("a third connection at the cap with two idle: %d %v", code, err)
	}
	if _, _, err := a.get("/"); err == nil {
		t.Error("the longest-idle connection was not closed to make room")
	}
	if st := l.Stats(); st.Evicted != 1 || st.Open != 2 || st.PeakPerSource != 2 {
		t.Errorf("stats %+v, want 1 evicted, 2 open", st)
	}
	// Both remaining connections busy: the next is refused.
	done := make(chan struct{})
	for _, cl := range []*client{b, c} {
		go func() {
			_, _, _ = cl.get("/block")
			done <- struct{}{}
		}()
	}
	waitFor(t, "both busy", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		busy := 0
		for _, conns := range l.bySource {
			for k := range conns {
				if k.idleSince.IsZero() {
					busy++
				}
			}
		}
		return busy == 2
	})
	d := dial(t, addr)
	code, body, err := d.get("/")
	if code != http.StatusTooManyRequests || !strings.Contains(body, "too many connections from 127.0.0.1 (at most 2 at once)") || err != nil {
		t.Errorf("a connection over the cap with none idle: %d %q %v, want 429 naming the cap", code, body, err)
	}
	if _, _, err := d.get("/"); err == nil {
		t.Error("the refused connection stayed open")
	}
	close(release)
	<-done
	<-done
	if st := l.Stats(); st.RefusedSource != 1 {
		t.Errorf("stats %+v, want 1 refused", st)
	}
}

// TestWriteStallCutsAStalledResponse: a response to a client that reads nothing is cut after the
// stall deadline: the write fails, the connection closes, Stalled counts it (that a response that
// keeps moving is never cut is pkg/server's TestSlowSteadyReaderNotCut).
func TestWriteStallCutsAStalledResponse(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, Config{WriteStall: 300 * time.Millisecond})
	wrote := make(chan error, 1)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := make([]byte, 64<<10)
		for range 1024 { // 64 MiB: more than any socket buffer holds
			if _, err := w.Write(chunk); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	})}
	l.Install(hs)
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() { _ = hs.Close() })
	c := dial(t, inner.Addr().String())
	if _, err := fmt.Fprint(c.c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("64 MiB written to a client that reads nothing")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the stalled write was not cut")
	}
	waitFor(t, "the stalled connection closed", func() bool { return l.Stats().Open == 0 })
	if st := l.Stats(); st.Stalled != 1 {
		t.Errorf("stats %+v, want 1 stalled", st)
	}
}
