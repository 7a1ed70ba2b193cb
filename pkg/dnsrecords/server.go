package dnsrecords

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// Port is the DNS port the server listens on in production, UDP and TCP (RFC 1035 §4.2).
const Port = agentapi.DNSPort

// maxUDPSize caps the EDNS(0) payload size the server answers with: 1232 bytes avoids IP
// fragmentation on every common path (DNS Flag Day 2020).
const maxUDPSize = 1232

// Server answers DNS queries for one Zone over UDP and TCP on one address, authoritatively (the AA
// bit) and only for that zone: names outside it are REFUSED (no recursion, so it is no open
// resolver), opcodes other than QUERY get NOTIMP, zone transfers are REFUSED.
type Server struct {
	zone     *Zone
	log      *slog.Logger
	udp, tcp *dns.Server
	addr     netip.AddrPort
	done     chan error

	stopOnce sync.Once
	stopErr  error
}

// Start listens on addr with UDP and TCP (port 0 picks a free port that both use) and answers from
// z until Shutdown. It returns once both listeners accept queries. log receives failures to write
// an answer (debug level); nil discards them.
func Start(z *Zone, addr netip.AddrPort, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pc, ln, err := listen(addr)
	if err != nil {
		return nil, err
	}
	s := &Server{zone: z, log: log, addr: netip.AddrPortFrom(addr.Addr(), uint16(pc.LocalAddr().(*net.UDPAddr).Port)), done: make(chan error, 2)}
	started := make(chan struct{}, 2)
	notify := func() { started <- struct{}{} }
	s.udp = &dns.Server{PacketConn: pc, Handler: s, NotifyStartedFunc: notify}
	s.tcp = &dns.Server{Listener: ln, Handler: s, NotifyStartedFunc: notify, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
	for _, srv := range []*dns.Server{s.udp, s.tcp} {
		go func() { s.done <- srv.ActivateAndServe() }()
	}
	for range 2 {
		select {
		case <-started:
		case err := <-s.done:
			_ = pc.Close()
			_ = ln.Close()
			return nil, fmt.Errorf("serve DNS on %s: %w", s.addr, err)
		}
	}
	return s, nil
}

// listen binds UDP and TCP on addr; with port 0 it retries until one free port serves both.
func listen(addr netip.AddrPort) (net.PacketConn, net.Listener, error) {
	for try := 0; ; try++ {
		pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		if err != nil {
			return nil, nil, fmt.Errorf("listen for DNS (udp %s): %w", addr, err)
		}
		port := uint16(pc.LocalAddr().(*net.UDPAddr).Port)
		ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(addr.Addr(), port)))
		if err == nil {
			return pc, ln, nil
		}
		_ = pc.Close()
		if addr.Port() != 0 || try == 10 {
			return nil, nil, fmt.Errorf("listen for DNS (tcp %s): %w", netip.AddrPortFrom(addr.Addr(), port), err)
		}
	}
}

// Addr is the address the server listens on (with the chosen port when Start got port 0).
func (s *Server) Addr() netip.AddrPort { return s.addr }

// Shutdown stops both listeners and waits, at most until ctx ends, for queries in flight. Later
// calls return the first one's result; a nil Server has nothing to stop.
func (s *Server) Shutdown(ctx context.Context) error {
	if s == nil {
		return nil
	}
	s.stopOnce.Do(func() {
		s.stopErr = errors.Join(s.udp.ShutdownContext(ctx), s.tcp.ShutdownContext(ctx))
		for range 2 {
			select {
			case <-s.done:
			case <-ctx.Done():
				s.stopErr = errors.Join(s.stopErr, ctx.Err())
				return
			}
		}
	})
	return s.stopErr
}

// ServeDNS answers one query (dns.Handler).
func (s *Server) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := s.answer(r, w.LocalAddr().Network() == "tcp")
	if err := w.WriteMsg(m); err != nil {
		s.log.Debug("write DNS answer", "remote", w.RemoteAddr().String(), "error", err)
	}
}

// answer builds the reply to r; tcp says whether it travels over TCP (no truncation).
func (s *Server) answer(r *dns.Msg, tcp bool) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = false
	size := dns.MinMsgSize
	if opt := r.IsEdns0(); opt != nil {
		if opt.Version() != 0 { // RFC 6891 §6.1.3
			m.SetEdns0(maxUDPSize, false)
			m.Rcode = dns.RcodeBadVers
			return m
		}
		size = max(dns.MinMsgSize, min(int(opt.UDPSize()), maxUDPSize))
		m.SetEdns0(uint16(size), false)
	}
	q := r.Question[0] // the default MsgAcceptFunc lets only one-question messages through
	switch {
	case r.Opcode != dns.OpcodeQuery:
		m.Rcode = dns.RcodeNotImplemented
		return m
	case q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY,
		q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR:
		m.Rcode = dns.RcodeRefused
		return m
	}
	a := s.zone.Lookup(q.Name, q.Qtype)
	m.Rcode, m.Authoritative = a.Rcode, a.Authoritative
	m.Answer, m.Ns, m.Extra = a.Answer, a.Ns, append(a.Extra, m.Extra...)
	if tcp {
		size = dns.MaxMsgSize
	}
	m.Truncate(size)
	return m
}
