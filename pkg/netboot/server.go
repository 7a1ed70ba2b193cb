package netboot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/pin/tftp/v3"

	"github.com/airgap-appliance/appliance/pkg/connlimit"
)

// Server is the running network-boot service: DHCP (per Config.Mode, on ports 67 and, in proxy mode,
// 4011), TFTP (port 69) and plain HTTP (Config.HTTPPort).
type Server struct {
	cfg  Config
	dhcp *dhcpResponder
	http *http.Server
	// kernel, initrd and rootFS are what KernelPath, InitrdPath and RootFSPath serve (rootFS.path
	// empty: no root filesystem).
	kernel, initrd, rootFS artefact
	// rootFSSHA256 is rootFS's SHA-256 (hex), taken once at New.
	rootFSSHA256 string

	mu      sync.Mutex
	closers []func()
	wg      sync.WaitGroup
}

// New checks cfg and returns a Server that is not yet listening. Errors match ErrConfig and name the
// field to fix.
func New(cfg Config) (*Server, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: c, dhcp: newDHCPResponder(c)}
	if s.kernel, s.initrd, s.rootFS, err = artefacts(c); err != nil {
		return nil, err
	}
	if s.rootFS.path != "" {
		sum, err := s.rootFS.sha256()
		if err != nil {
			return nil, configErr("RootFS %s: %v", s.rootFS, err)
		}
		s.rootFSSHA256 = sum
	}
	s.http = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	return s, nil
}

// Start opens every listener and serves in the background until Close. It fails (and closes what it
// opened) when a port cannot be bound, e.g. another DHCP or TFTP server on this host.
func (s *Server) Start() error {
	if err := s.start(); err != nil {
		s.Close()
		return err
	}
	s.cfg.Logger.Info("netboot: serving", "mode", string(s.cfg.Mode), "interface", s.cfg.Interface,
		"server", s.cfg.ServerIP.String(), "httpPort", s.cfg.HTTPPort, "machines", len(s.cfg.Machines))
	return nil
}

func (s *Server) start() error {
	c := s.cfg
	// HTTP.
	ln, err := net.Listen("tcp4", net.JoinHostPort(c.HTTPListen.String(), strconv.Itoa(int(c.HTTPPort))))
	if err != nil {
		return fmt.Errorf("netboot: http: %w", err)
	}
	// The connection limits of the HTTPS front (pkg/connlimit): the kernel, initrd and root
	// filesystem are downloads a stalled client must not hold for ever.
	limited := connlimit.New(ln, connlimit.Config{Logger: c.Logger})
	limited.Install(s.http)
	s.goServe(func() { _ = s.http.Serve(limited) }, func() { _ = s.http.Close() })

	// TFTP, read-only: a nil write handler makes pin/tftp refuse every write request.
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: c.ServerIP.AsSlice(), Port: c.TFTPPort})
	if err != nil {
		return fmt.Errorf("netboot: tftp: %w", err)
	}
	ts := tftp.NewServer(s.tftpRead, nil)
	ts.SetTimeout(5 * time.Second)
	s.goServe(func() { _ = ts.Serve(conn) }, ts.Shutdown)

	if c.Mode == ModeOff {
		return nil
	}
	ports := []int{c.DHCPPort}
	if c.Mode == ModeProxy {
		ports = append(ports, c.PXEPort)
	}
	for _, p := range ports {
		// Bound to the interface and to 0.0.0.0: DISCOVERs are broadcasts.
		ds, err := server4.NewServer(c.Interface, &net.UDPAddr{Port: p}, s.handleDHCP)
		if err != nil {
			return fmt.Errorf("netboot: dhcp on %s port %d: %w", c.Interface, p, err)
		}
		s.goServe(func() { _ = ds.Serve() }, func() { _ = ds.Close() })
	}
	return nil
}

func (s *Server) goServe(serve, stop func()) {
	s.mu.Lock()
	s.closers = append(s.closers, stop)
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		serve()
	}()
}

// Close stops every listener and waits for the serving goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	closers := s.closers
	s.closers = nil
	s.mu.Unlock()
	for i := len(closers) - 1; i >= 0; i-- {
		closers[i]()
	}
	s.wg.Wait()
	return nil
}

// Lease returns the IPv4 address the service leased to mac and acknowledged (ModeServer; a lease
// kept in StateDir/LeasesFile counts), and whether there is one. ok is false in ModeProxy and ModeOff
// (the appliance gives no addresses), for a MAC it leased nothing to, and for an address only offered
// so far. A lease does not expire here: a machine keeps its address until it releases it from that
// address (its binding is by MAC, and a REQUEST for another address is refused), so the answer is
// the address the machine has now, whatever the lease time. The enrolment endpoint asks it for the
// address a node's enrolment must come from (pkg/server.Enrollment.SetLeases).
func (s *Server) Lease(mac string) (netip.Addr, bool) {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 || s.cfg.Mode != ModeServer {
		return netip.Addr{}, false
	}
	return s.dhcp.acknowledged(hw.String())
}

// handleDHCP is the server4 handler: one request, at most one reply.
func (s *Server) handleDHCP(conn net.PacketConn, peer net.Addr, req *dhcpv4.DHCPv4) {
	var src netip.Addr
	if up, ok := peer.(*net.UDPAddr); ok {
		src, _ = netip.AddrFromSlice(up.IP.To4())
	}
	reply, why := s.dhcp.respond(req, src)
	log := s.cfg.Logger.With("mac", req.ClientHWAddr.String(), "type", req.MessageType().String())
	if reply == nil {
		if why != "unknown MAC" {
			log.Debug("netboot: no DHCP reply", "reason", why)
		}
		return
	}
	dst := peer
	if up, ok := peer.(*net.UDPAddr); ok && up.IP.Equal(net.IPv4bcast) && up.Port == 0 {
		dst = &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}
	}
	if _, err := conn.WriteTo(reply.ToBytes(), dst); err != nil {
		log.Warn("netboot: DHCP reply not sent", "to", dst.String(), "err", err)
		return
	}
	log.Info("netboot: DHCP", "reply", why)
	if s.cfg.Seen != nil {
		m, ok := s.dhcp.machines[req.ClientHWAddr.String()]
		if !ok {
			m, ok = s.dhcp.addrOnly[req.ClientHWAddr.String()]
		}
		if ok {
			s.cfg.Seen(m.Name, "DHCP "+why)
		}
	}
}

// tftpRead serves the allow-listed iPXE files; any other name is refused.
func (s *Server) tftpRead(name string, rf io.ReaderFrom) error {
	path, ok := s.cfg.bootFiles()[name]
	if !ok {
		s.cfg.Logger.Info("netboot: TFTP refused a file outside the boot files", "file", name)
		return fmt.Errorf("%q is not served: only %s, %s, %s", name, BootFileBIOS, BootFileUEFI, BootFileSNP)
	}
	f, err := os.Open(path)
	if err != nil {
		s.cfg.Logger.Warn("netboot: TFTP boot file missing: install Debian's ipxe package", "file", path, "err", err)
		return errors.New("boot file not available on the appliance")
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil {
		if ot, ok := rf.(tftp.OutgoingTransfer); ok {
			ot.SetSize(st.Size())
		}
	}
	_, err = rf.ReadFrom(f)
	return err
}

// Run starts s and serves until ctx ends, then closes it.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	return s.Close()
}
