package labns

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Holder is a TCP server inside a lab namespace that keeps every connection it accepts open until its
// client closes it (then closes its own end), for tests that count a source's open connections (the
// firewall's per-source caps). It counts what it accepted: a connection the kernel refused never gets
// here, so it never reached a server's accept, let alone a TLS handshake.
type Holder struct {
	mu       sync.Mutex
	accepted int
	lns      []net.Listener
	conns    map[net.Conn]struct{}
	done     bool
}

// StartHolder listens on addrs (e.g. ":8443", dual-stack) inside ns. Its listeners and connections are
// closed when the test ends.
func StartHolder(t testing.TB, ns *NS, addrs ...string) *Holder {
	t.Helper()
	h := &Holder{conns: map[net.Conn]struct{}{}}
	t.Cleanup(h.close)
	for _, a := range addrs {
		var ln net.Listener
		if err := InNamespace(ns.Path(), func() (err error) { ln, err = net.Listen("tcp", a); return err }); err != nil {
			t.Fatalf("listen on %s in %s: %v", a, ns.Name, err)
		}
		h.mu.Lock()
		h.lns = append(h.lns, ln)
		h.mu.Unlock()
		go h.serve(ln)
	}
	return h
}

func (h *Holder) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		h.mu.Lock()
		if h.done {
			h.mu.Unlock()
			_ = c.Close()
			return
		}
		h.accepted++
		h.conns[c] = struct{}{}
		h.mu.Unlock()
		go func() {
			_, _ = io.Copy(io.Discard, c) // until the client closes
			_ = c.Close()
			h.mu.Lock()
			delete(h.conns, c)
			h.mu.Unlock()
		}()
	}
}

func (h *Holder) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.done = true
	for _, ln := range h.lns {
		_ = ln.Close()
	}
	for c := range h.conns {
		_ = c.Close()
	}
}

// Accepted is how many connections the holder has accepted so far.
func (h *Holder) Accepted() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.accepted
}

// WaitAccepted waits until the holder has accepted n connections (a connect returns before the server's
// accept) and fails the test past a bound; more than n fails it at once.
func (h *Holder) WaitAccepted(t testing.TB, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second) // a bound on a hang, not a speed expectation
	for {
		got := h.Accepted()
		switch {
		case got == n:
			return
		case got > n:
			t.Fatalf("the server accepted %d connections, want %d", got, n)
		case time.Now().After(deadline):
			t.Fatalf("the server accepted %d connections within 5 s, want %d", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Dialed is the outcome of one connection attempt of DialN: Conn when it connected, else Err.
type Dialed struct {
	Conn net.Conn
	Err  error
}

// Refused reports whether the attempt was answered with a TCP reset (ECONNREFUSED): a firewall's
// `reject with tcp reset`, or no listener. A dropped SYN is a timeout instead.
func (d Dialed) Refused() bool { return errors.Is(d.Err, syscall.ECONNREFUSED) }

// DialN makes n TCP connections one after another from src (an address of ns) to dst (host:port), each
// bounded by ProbeTimeout, and returns every outcome in order. The connections stay open until the caller
// closes them or the test ends.
func DialN(t testing.TB, ns *NS, src, dst string, n int) []Dialed {
	t.Helper()
	out := make([]Dialed, n)
	err := InNamespace(ns.Path(), func() error {
		d := net.Dialer{Timeout: ProbeTimeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		for i := range out {
			out[i].Conn, out[i].Err = d.Dial("tcp", dst)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("enter %s: %v", ns.Name, err)
	}
	t.Cleanup(func() {
		for _, d := range out {
			if d.Conn != nil {
				_ = d.Conn.Close()
			}
		}
	})
	return out
}
