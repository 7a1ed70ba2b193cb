package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/connlimit"
)

// slowFront serves a repo with one file of size bytes (/repo/big) over the real TLS listener with
// the given limits, and returns it and its address.
func slowFront(t *testing.T, size int, o Options) (*Server, string) {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "big"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	o.Listen, o.Certificate, o.RepoDir = "127.0.0.1:0", selfSigned(t), dir
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return s, serveTLSFront(t, s)
}

// dialSmall opens a TLS connection to addr from the loopback address from, with a 4 KiB receive
// buffer and an Ethernet-sized MSS (1400 bytes), both set before the connect: the loopback's 64 KiB
// segments would let the kernel buffer megabytes of each stalled download on both sides, which is
// neither what a real network does nor harmless with a thousand readers.
func dialSmall(ctx context.Context, addr, from string) (*tls.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)},
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = errors.Join(syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096),
					syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 1400))
			})
			return errors.Join(err, serr)
		}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}) //nolint:gosec // the limits are what is tested
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// TestSlowReadersCut is the attack of 1,000 clients that ask for a 4 MiB download and then read
// nothing: 200 from one loopback address (127.0.0.10), then 800 from nine others (127.0.0.11-19),
// against the real TLS front with a total cap of 256 (the default is connlimit.DefaultMaxConns), the
// default cap per source (64) and a write-stall deadline of 2 s (the default is a minute; the
// mechanism is the same). No source holds more than 64 connections and the server no more than 256;
// those over a cap are answered 429 (the source's) or 503 (the total) while refusing slots last,
// else closed; every download that started is cut once its reader has taken nothing for the stall
// deadline: the server holds none of them after it, and reading on yields what the kernel had
// buffered, then an early end, never the rest of the file; then a newcomer is served. Bounded:
// 1,000 connections on 127.0.0.0/8, 4 KiB windows, about 30 s under -race.
func TestSlowReadersCut(t *testing.T) {
	const (
		readers = 1000
		sources = 10
		size    = 4 << 20
		stall   = 2 * time.Second
		total   = 256
	)
	s, addr := slowFront(t, size, Options{MaxConns: total, WriteStall: stall})
	type result struct {
		code     int   // 0: closed before an answer
		rest     int64 // bytes read after the stall wait
		complete bool  // the whole file arrived
	}
	results := make([]result, readers)
	conns := make([]*tls.Conn, readers)
	bodies := make([]*bufio.Reader, readers)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	source := func(i int) string {
		if i < 200 {
			return "127.0.0.10"
		}
		return fmt.Sprintf("127.0.0.%d", 11+i%(sources-1))
	}
	var wg sync.WaitGroup
	for i := range readers {
		if i == 200 {
			time.Sleep(time.Second) // the one source's flood first
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dialSmall(ctx, addr, source(i))
			if err != nil {
				return // closed at accept: over a cap with no refusing slot left
			}
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.WriteString(c, "GET /repo/big HTTP/1.1\r\nHost: appliance\r\n\r\n"); err != nil {
				c.Close()
				return
			}
			br := bufio.NewReaderSize(c, 4096)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				c.Close()
				return
			}
			results[i].code = resp.StatusCode
			if resp.StatusCode != http.StatusOK {
				_, _ = io.Copy(io.Discard, resp.Body)
				c.Close()
				return
			}
			conns[i], bodies[i] = c, bufio.NewReader(resp.Body) // and read nothing more
		}()
	}
	wg.Wait()
	st := s.ConnStats()
	if st.Peak > total || st.PeakPerSource > connlimit.DefaultMaxConnsPerSource {
		t.Errorf("peak %d connections, %d from one source; caps %d and %d", st.Peak, st.PeakPerSource, total, connlimit.DefaultMaxConnsPerSource)
	}
	// Readers that read nothing for longer than the stall deadline: the server holds none of them.
	deadline := time.Now().Add(2*stall + 5*time.Second)
	for s.ConnStats().Open > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if st := s.ConnStats(); st.Open != 0 {
		t.Errorf("%d connections still held %s after the readers stopped reading (stall deadline %s): %+v", st.Open, 2*stall+5*time.Second, stall, st)
	}
	// Reading on gets what the kernel had buffered, then the end.
	for i, c := range conns {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			n, err := io.Copy(io.Discard, bodies[i])
			results[i].rest, results[i].complete = n, err == nil
		}()
	}
	wg.Wait()
	count := map[int]int{}
	for i, r := range results {
		count[r.code]++
		if r.code == http.StatusOK && r.complete {
			t.Errorf("reader %d (%s) read the rest of the file (%d bytes) after not reading for the stall deadline: its download was not cut", i, source(i), r.rest)
		}
	}
	t.Logf("answers %v (0: closed before an answer); server: %+v", count, s.ConnStats())
	if count[http.StatusOK] == 0 || count[http.StatusTooManyRequests]+count[http.StatusServiceUnavailable] == 0 ||
		count[http.StatusOK]+count[http.StatusTooManyRequests]+count[http.StatusServiceUnavailable]+count[0] != readers {
		t.Errorf("answers %v: want some 200, some 429 or 503, and nothing else but a close", count)
	}
	if st := s.ConnStats(); st.RefusedSource == 0 || st.RefusedTotal == 0 {
		t.Errorf("server %+v: want connections refused over both caps", st)
	}
	if st := s.ConnStats(); st.Stalled < int64(count[http.StatusOK]) {
		t.Errorf("%d connections cut as stalled, %d downloads started", st.Stalled, count[http.StatusOK])
	}
	// A newcomer is served.
	hc := tlsClient("127.0.0.200")
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + addr + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a newcomer after the attack: %v %v", resp, err)
	}
	resp.Body.Close()
}

// TestSlowSteadyReaderNotCut: a client that reads a download slowly but steadily (a BMC streaming
// virtual media over a slow management link: 128 KiB every half second through a 4 KiB window) takes
// much longer than the write-stall deadline over the whole file and gets all of it: the deadline
// is a stall deadline, not a response deadline.
func TestSlowSteadyReaderNotCut(t *testing.T) {
	const size, stall = 3 << 20, 2 * time.Second
	_, addr := slowFront(t, size, Options{WriteStall: stall})
	c, err := dialSmall(t.Context(), addr, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /repo/big HTTP/1.1\r\nHost: appliance\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 4096), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET: %v %v", resp, err)
	}
	start := time.Now()
	var got int64
	for {
		n, err := io.CopyN(io.Discard, resp.Body, 128<<10)
		got += n
		if err != nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if got != size {
		t.Fatalf("a steady reader got %d of %d bytes in %s (stall deadline %s)", got, size, time.Since(start).Round(time.Millisecond), stall)
	}
	if d := time.Since(start); d < 2*stall {
		t.Fatalf("the download took %s, not over the stall deadline: the test proves nothing", d)
	}
}
