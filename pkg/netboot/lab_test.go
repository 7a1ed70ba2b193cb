package netboot

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/mdlayher/packet"
	"github.com/pin/tftp/v3"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/airgap-appliance/appliance/test/labns"
)

// The lab tests run the service as a child process inside a lab namespace of their own
// (TestHelperNetbootServer, started with `ip netns exec`, so every socket it opens, also pin/tftp's
// per-transfer ones, is in that namespace) and real clients in a second namespace joined by a veth
// pair: insomniacslk's nclient4 (raw-socket DHCP client), pin/tftp's client and curl, net/http.

// serverEnv carries the helper's configuration (JSON helperConfig).
const serverEnv = "NETBOOT_TEST_SERVER"

// readyLine is what the helper prints on stderr once every listener is open.
const readyLine = "NETBOOT-TEST-READY"

type helperConfig struct {
	Mode       Mode
	Interface  string
	ServerIP   string
	HTTPPort   uint16
	Subnet     string
	RangeStart string
	RangeEnd   string
	Kernel     string
	Initrd     string
	KernelArgs []string
	Machines   map[string]string // MAC → name
	StateDir   string            // Config.StateDir (ModeServer keeps its leases there)
}

// TestHelperNetbootServer is not a test: started by the lab tests inside a lab namespace, it runs the
// service with the configuration in $NETBOOT_TEST_SERVER until SIGTERM.
func TestHelperNetbootServer(t *testing.T) {
	js := os.Getenv(serverEnv)
	if js == "" {
		t.Skip("helper process for the lab tests")
	}
	var hc helperConfig
	if err := json.Unmarshal([]byte(js), &hc); err != nil {
		t.Fatal(err)
	}
	c := Config{Mode: hc.Mode, Interface: hc.Interface, ServerIP: netip.MustParseAddr(hc.ServerIP), HTTPPort: hc.HTTPPort,
		Kernel: hc.Kernel, Initrd: hc.Initrd, KernelArgs: hc.KernelArgs, StateDir: hc.StateDir,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))} // debug: the reasons for silence
	if hc.Mode == ModeServer {
		c.Subnet = netip.MustParsePrefix(hc.Subnet)
		c.RangeStart, c.RangeEnd = netip.MustParseAddr(hc.RangeStart), netip.MustParseAddr(hc.RangeEnd)
	}
	for mac, name := range hc.Machines {
		c.Machines = append(c.Machines, Machine{Name: name, MAC: mustMAC(mac)})
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	s, err := New(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "netboot:", err)
		os.Exit(1)
	}
	if err := s.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "netboot:", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, readyLine)
	<-ctx.Done()
	_ = s.Close()
	os.Exit(0)
}

// helper is a running TestHelperNetbootServer.
type helper struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	log  bytes.Buffer
	stop func() // SIGTERM, then SIGKILL after 10 s; logs the server's log; once (t.Cleanup calls it too)
}

func (h *helper) Log() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.log.String()
}

// startHelper runs the service in ns and waits for its ready line; h.stop (or t.Cleanup) stops it by PID.
func startHelper(t *testing.T, ns *labns.NS, hc helperConfig) *helper {
	t.Helper()
	js, _ := json.Marshal(hc)
	cmd := ns.Command(os.Args[0], "-test.run=^TestHelperNetbootServer$")
	cmd.Env = append(os.Environ(), serverEnv+"="+string(js))
	out, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd}
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			h.mu.Lock()
			h.log.WriteString(sc.Text() + "\n")
			h.mu.Unlock()
			if sc.Text() == readyLine {
				once.Do(func() { close(ready) })
			}
		}
	}()
	var stopOnce sync.Once
	h.stop = func() {
		stopOnce.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
			t.Logf("netboot server log (pid %d):\n%s", cmd.Process.Pid, h.Log())
		})
	}
	t.Cleanup(h.stop)
	select {
	case <-ready:
	case <-done:
		t.Fatalf("netboot server exited before it was ready:\n%s", h.Log())
	case <-time.After(30 * time.Second):
		t.Fatalf("netboot server not ready after 30 s:\n%s", h.Log())
	}
	return h
}

// lab is a server namespace and a client namespace joined by a veth pair: server 10.77.0.1/24 on
// srvIf, clients 10.77.0.2/24 on cliIf.
type lab struct {
	srv, cli     *labns.NS
	srvIf, cliIf string
	kernel       string
	initrd       string
	state        string // the service's StateDir
}

const labServerIP = "10.77.0.1"

func newLab(t *testing.T) *lab {
	t.Helper()
	labns.RequireRoot(t)
	labns.RequireTool(t, "curl")
	if _, err := os.Stat(filepath.Join(DefaultIPXEDir, BootFileBIOS)); err != nil {
		t.Fatalf("Debian's ipxe package is missing (%v): make deps", err)
	}
	l := &lab{srv: labns.New(t, "nb"), cli: labns.New(t, "nb")}
	l.srvIf, l.cliIf = labns.Link(t, l.srv, labServerIP+"/24", l.cli, "10.77.0.2/24")
	l.kernel, l.initrd = testKit(t)
	l.state = filepath.Join(t.TempDir(), "netboot")
	return l
}

func (l *lab) config(mode Mode, machines map[string]string) helperConfig {
	return helperConfig{Mode: mode, Interface: l.srvIf, ServerIP: labServerIP, HTTPPort: 8080,
		Subnet: "10.77.0.0/24", RangeStart: "10.77.0.100", RangeEnd: "10.77.0.199",
		Kernel: l.kernel, Initrd: l.initrd, KernelArgs: []string{"console=ttyS0", "appliance.url=https://10.77.0.1:8443"},
		Machines: machines, StateDir: l.state}
}

// dhcpFilter is a BPF program for a datagram packet socket (no link header) that accepts only DHCP
// replies to mac: IPv4, UDP, not a fragment, destination port 68, chaddr mac (RFC 2131 §2: chaddr at
// offset 28 of the BOOTP message). Each simulated machine's socket then queues its own replies only,
// as a real machine's NIC does; without the chaddr test, 50 sockets each queued all 50 machines'
// broadcast replies and overflowed in bursts, dropping some (the machine then retransmitted).
func dhcpFilter(mac net.HardwareAddr) []bpf.RawInstruction {
	hi := uint32(mac[0])<<24 | uint32(mac[1])<<16 | uint32(mac[2])<<8 | uint32(mac[3])
	lo := uint32(mac[4])<<8 | uint32(mac[5])
	raw, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 9, Size: 1}, // IP protocol
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 17, SkipFalse: 9},
		bpf.LoadAbsolute{Off: 6, Size: 2}, // flags + fragment offset
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: 7},
		bpf.LoadMemShift{Off: 0},          // X = IP header length
		bpf.LoadIndirect{Off: 2, Size: 2}, // UDP destination port
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 68, SkipFalse: 4},
		bpf.LoadIndirect{Off: 8 + 28, Size: 4}, // chaddr[0:4]
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: hi, SkipFalse: 2},
		bpf.LoadIndirect{Off: 8 + 32, Size: 2}, // chaddr[4:6]
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: lo, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
		bpf.RetConstant{Val: 0xffff},
	})
	if err != nil {
		panic(err)
	}
	return raw
}

// dhcpClient is an nclient4 client for one machine (nclient4 accepts only replies whose chaddr is
// its own hardware address) on the client namespace's veth.
func (l *lab) dhcpClient(t *testing.T, mac net.HardwareAddr, opts ...nclient4.ClientOpt) *nclient4.Client {
	t.Helper()
	var c *nclient4.Client
	err := labns.InNamespace(l.cli.Path(), func() error {
		ifi, err := net.InterfaceByName(l.cliIf)
		if err != nil {
			return err
		}
		raw, err := packet.Listen(ifi, packet.Datagram, unix.ETH_P_IP, &packet.Config{Filter: dhcpFilter(mac)})
		if err != nil {
			return err
		}
		conn := nclient4.NewBroadcastUDPConn(raw, &net.UDPAddr{Port: dhcpv4.ClientPort})
		c, err = nclient4.NewWithConn(conn, mac, append([]nclient4.ClientOpt{nclient4.WithTimeout(2 * time.Second), nclient4.WithRetry(2)}, opts...)...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// httpClient dials from the client namespace.
func (l *lab) httpClient() *http.Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := labns.InNamespace(l.cli.Path(), func() (err error) {
			c, err = (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}, MaxIdleConnsPerHost: 64}
	return &http.Client{Transport: tr, Timeout: 60 * time.Second}
}

// tftpGet fetches name with pin/tftp's client from the client namespace.
func (l *lab) tftpGet(name string) ([]byte, error) {
	cl, err := tftp.NewClient(labServerIP + ":69")
	if err != nil {
		return nil, err
	}
	cl.SetTimeout(5 * time.Second)
	var wt io.WriterTo
	if err := labns.InNamespace(l.cli.Path(), func() (err error) { wt, err = cl.Receive(name, "octet"); return err }); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	_, err = wt.WriteTo(&buf)
	return buf.Bytes(), err
}

func TestLabProxyDHCP(t *testing.T) {
	l := newLab(t)
	h := startHelper(t, l.srv, l.config(ModeProxy, map[string]string{macW1.String(): "w1", macW2.String(): "w2"}))
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		mac  net.HardwareAddr
		mods []dhcpv4.Modifier
		file string
	}{
		{"BIOS", macW1, pxeOptions(iana.INTEL_X86PC), BootFileBIOS},
		{"UEFI x86-64", macW2, pxeOptions(iana.EFI_X86_64), BootFileUEFI},
		{"UEFI BC", macW1, pxeOptions(iana.EFI_BC), BootFileUEFI},
		{"iPXE", macW2, pxeOptions(iana.INTEL_X86PC, ipxeUserClass), "http://10.77.0.1:8080/ipxe/52:54:00:00:00:22"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lease, err := l.dhcpClient(t, tt.mac).Request(ctx, tt.mods...)
			if err != nil {
				t.Fatalf("DISCOVER/REQUEST: %v", err)
			}
			for _, m := range []*dhcpv4.DHCPv4{lease.Offer, lease.ACK} {
				if !m.YourIPAddr.IsUnspecified() {
					t.Errorf("%s offers address %s: proxy mode must give none", m.MessageType(), m.YourIPAddr)
				}
				if m.BootFileName != tt.file || m.ServerIPAddr.String() != labServerIP {
					t.Errorf("%s: boot file %q next-server %s, want %q from %s", m.MessageType(), m.BootFileName, m.ServerIPAddr, tt.file, labServerIP)
				}
			}
		})
	}
	// The PXE boot-server port (4011): a client with an address asks by unicast.
	req, err := dhcpv4.NewDiscovery(macW1, pxeOptions(iana.EFI_X86_64)...)
	if err != nil {
		t.Fatal(err)
	}
	req.UpdateOption(dhcpv4.OptMessageType(dhcpv4.MessageTypeRequest))
	req.ClientIPAddr = net.ParseIP("10.77.0.2")
	var reply *dhcpv4.DHCPv4
	err = labns.InNamespace(l.cli.Path(), func() error {
		conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("10.77.0.2")})
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.WriteTo(req.ToBytes(), &net.UDPAddr{IP: net.ParseIP(labServerIP), Port: PXEPort}); err != nil {
			return err
		}
		buf := make([]byte, 1500)
		n, _, err := conn.ReadFrom(buf)
		if err != nil {
			return err
		}
		reply, err = dhcpv4.FromBytes(buf[:n])
		return err
	})
	if err != nil {
		t.Fatalf("REQUEST to port 4011: %v", err)
	}
	if reply.MessageType() != dhcpv4.MessageTypeAck || reply.BootFileName != BootFileUEFI {
		t.Errorf("port 4011 reply %s", reply.Summary())
	}
	// Silence for a MAC outside the inventory (twice: logged once) and for a plain DHCP client.
	short := nclient4.WithTimeout(time.Second)
	unknown := l.dhcpClient(t, macUnknown, short, nclient4.WithRetry(2))
	if o, err := unknown.DiscoverOffer(ctx, pxeOptions(iana.INTEL_X86PC)...); err == nil {
		t.Errorf("unknown MAC got %s", o.Summary())
	}
	if o, err := l.dhcpClient(t, macW1, short, nclient4.WithRetry(1)).DiscoverOffer(ctx); err == nil {
		t.Errorf("proxy mode answered a non-PXE client: %s", o.Summary())
	}
	if n := strings.Count(h.Log(), "mac="+macUnknown.String()); n != 1 {
		t.Errorf("unknown MAC logged %d times, want once:\n%s", n, h.Log())
	}
}

func TestLabServerDHCP(t *testing.T) {
	l := newLab(t)
	hc := l.config(ModeServer, map[string]string{macW1.String(): "w1", macW2.String(): "w2"})
	h := startHelper(t, l.srv, hc)
	ctx := context.Background()
	seen := map[string]string{}
	for _, tt := range []struct {
		mac  net.HardwareAddr
		mods []dhcpv4.Modifier
		file string
	}{
		{macW1, pxeOptions(iana.INTEL_X86PC), BootFileBIOS},
		{macW2, pxeOptions(iana.EFI_X86_64), BootFileUEFI},
		{macW1, pxeOptions(iana.INTEL_X86PC, ipxeUserClass), "http://10.77.0.1:8080/ipxe/52:54:00:00:00:21"},
	} {
		lease, err := l.dhcpClient(t, tt.mac).Request(ctx, tt.mods...)
		if err != nil {
			t.Fatalf("%s: DISCOVER/REQUEST: %v", tt.mac, err)
		}
		ack := lease.ACK
		addr, ok := netip.AddrFromSlice(ack.YourIPAddr.To4())
		if !ok || addr.Less(netip.MustParseAddr("10.77.0.100")) || netip.MustParseAddr("10.77.0.199").Less(addr) {
			t.Errorf("%s: leased %s, want inside 10.77.0.100-10.77.0.199", tt.mac, ack.YourIPAddr)
		}
		if ack.SubnetMask().String() != "ffffff00" || ack.BootFileName != tt.file || ack.IPAddressLeaseTime(0) != DefaultLeaseTime {
			t.Errorf("%s: ACK %s", tt.mac, ack.Summary())
		}
		if prev, ok := seen[tt.mac.String()]; ok && prev != addr.String() {
			t.Errorf("%s: leased %s, before %s: a machine keeps its address", tt.mac, addr, prev)
		}
		for mac, a := range seen {
			if a == addr.String() && mac != tt.mac.String() {
				t.Errorf("%s and %s both leased %s", mac, tt.mac, a)
			}
		}
		seen[tt.mac.String()] = addr.String()
	}
	if o, err := l.dhcpClient(t, macUnknown, nclient4.WithTimeout(time.Second), nclient4.WithRetry(1)).DiscoverOffer(ctx, pxeOptions(iana.INTEL_X86PC)...); err == nil {
		t.Errorf("unknown MAC got %s", o.Summary())
	}
	// The service restarted (the appliance's serve restarted): w2 asks first, with a fresh DISCOVER
	// (no address requested), and still gets its own address, not the lowest free one, w1's.
	h.stop()
	startHelper(t, l.srv, hc)
	for _, mac := range []net.HardwareAddr{macW2, macW1} {
		lease, err := l.dhcpClient(t, mac).Request(ctx, pxeOptions(iana.INTEL_X86PC)...)
		if err != nil {
			t.Fatalf("%s after the restart: %v", mac, err)
		}
		if got := lease.ACK.YourIPAddr.String(); got != seen[mac.String()] {
			t.Errorf("%s after the restart: leased %s, before %s", mac, got, seen[mac.String()])
		}
	}
}

func TestLabTFTP(t *testing.T) {
	l := newLab(t)
	startHelper(t, l.srv, l.config(ModeOff, nil))
	want, err := os.ReadFile(filepath.Join(DefaultIPXEDir, BootFileBIOS))
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.tftpGet(BootFileBIOS)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("pin/tftp across namespaces: %d bytes, %v; want the %d bytes on disk", len(got), err, len(want))
	}
	out := filepath.Join(t.TempDir(), "f")
	if b, err := l.cli.Command("curl", "-sS", "--max-time", "20", "-o", out, "tftp://"+labServerIP+"/"+BootFileBIOS).CombinedOutput(); err != nil {
		t.Fatalf("curl tftp: %v: %s", err, b)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, want) {
		t.Errorf("curl tftp: %d bytes differ from the %d on disk", len(got), len(want))
	}
	if _, err := l.tftpGet("../../../etc/passwd"); err == nil {
		t.Error("a path outside the boot files was served")
	}
	if b, err := l.cli.Command("curl", "-sS", "--max-time", "20", "-T", out, "tftp://"+labServerIP+"/"+BootFileBIOS).CombinedOutput(); err == nil {
		t.Errorf("TFTP write accepted: %s", b)
	}
}

// TestLabBoot50 simulates 50 machines network-booting at once against a server-mode service: each
// does DHCP as a PXE ROM (DISCOVER→OFFER→REQUEST→ACK), fetches undionly.kpxe by TFTP, DHCPs again
// as iPXE to get its script URL, fetches the script over HTTP and then the kernel and initrd it
// names. Every boot must succeed; the figures are printed (no timed assertion: speed is a figure).
func TestLabBoot50(t *testing.T) {
	const n = 50
	l := newLab(t)
	// Stand-ins of realistic size for the artefacts (the vmkit's kernel is ~14 MB, initrd ~9 MB).
	for _, f := range []struct {
		path string
		size int
	}{{l.kernel, 8 << 20}, {l.initrd, 8 << 20}} {
		if err := os.WriteFile(f.path, bytes.Repeat([]byte{0x5a}, f.size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	machines := map[string]string{}
	macs := make([]net.HardwareAddr, n)
	for i := range macs {
		macs[i] = net.HardwareAddr{0x52, 0x54, 0x00, 0x42, 0x00, byte(i)}
		machines[macs[i].String()] = fmt.Sprintf("m%02d", i)
	}
	h := startHelper(t, l.srv, l.config(ModeServer, machines))
	// Retransmit as a PXE ROM does (PXE 2.1 §2.2.1); the figures count the replies, so any
	// retransmission shows there.
	dhcpOpts := []nclient4.ClientOpt{nclient4.WithTimeout(3 * time.Second), nclient4.WithRetry(10)}
	clients := make([]*nclient4.Client, n)
	for i := range clients {
		clients[i] = l.dhcpClient(t, macs[i], dhcpOpts...)
	}
	hc := l.httpClient()
	bios, _ := os.ReadFile(filepath.Join(DefaultIPXEDir, BootFileBIOS))

	type result struct {
		dhcp1, tftp, dhcp2, http time.Duration
		total                    time.Duration
		bytes                    int64
		err                      error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[i]
			t0 := time.Now()
			ctx := context.Background()
			lease, err := clients[i].Request(ctx, pxeOptions(iana.INTEL_X86PC)...)
			if err != nil {
				r.err = fmt.Errorf("PXE DHCP: %w", err)
				return
			}
			if lease.ACK.BootFileName != BootFileBIOS || lease.ACK.YourIPAddr.IsUnspecified() {
				r.err = fmt.Errorf("PXE ACK %s", lease.ACK.Summary())
				return
			}
			t1 := time.Now()
			b, err := l.tftpGet(lease.ACK.BootFileName)
			if err != nil || !bytes.Equal(b, bios) {
				r.err = fmt.Errorf("TFTP: %d bytes, %v", len(b), err)
				return
			}
			r.bytes += int64(len(b))
			t2 := time.Now()
			lease2, err := clients[i].Request(ctx, pxeOptions(iana.INTEL_X86PC, ipxeUserClass)...)
			if err != nil {
				r.err = fmt.Errorf("iPXE DHCP: %w", err)
				return
			}
			if !lease2.ACK.YourIPAddr.Equal(lease.ACK.YourIPAddr) {
				r.err = fmt.Errorf("iPXE lease %s, PXE lease %s", lease2.ACK.YourIPAddr, lease.ACK.YourIPAddr)
				return
			}
			t3 := time.Now()
			script, err := fetch(hc, lease2.ACK.BootFileName)
			if err != nil {
				r.err = err
				return
			}
			if !strings.Contains(string(script), "appliance.node="+machines[macs[i].String()]) {
				r.err = fmt.Errorf("script of another machine:\n%s", script)
				return
			}
			for _, line := range strings.Split(string(script), "\n") {
				f := strings.Fields(line)
				if len(f) >= 2 && (f[0] == "kernel" || f[0] == "initrd") {
					body, err := fetch(hc, f[1])
					if err != nil {
						r.err = err
						return
					}
					r.bytes += int64(len(body))
					if len(body) != 8<<20 {
						r.err = fmt.Errorf("%s: %d bytes", f[1], len(body))
						return
					}
				}
			}
			t4 := time.Now()
			r.dhcp1, r.tftp, r.dhcp2, r.http, r.total = t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), t4.Sub(t3), t4.Sub(t0)
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	var errs []error
	var total int64
	var sum result
	var worst time.Duration
	for i, r := range results {
		if r.err != nil {
			errs = append(errs, fmt.Errorf("machine %d: %w", i, r.err))
			continue
		}
		total += r.bytes
		sum.dhcp1 += r.dhcp1
		sum.tftp += r.tftp
		sum.dhcp2 += r.dhcp2
		sum.http += r.http
		worst = max(worst, r.total)
	}
	if len(errs) > 0 {
		t.Fatalf("%d of %d boots failed:\n%v", len(errs), n, errors.Join(errs...))
	}
	// Every lease is in the lease file (each written as it was given), one address per machine.
	b, err := os.ReadFile(filepath.Join(l.state, LeasesFile))
	if err != nil {
		t.Fatal(err)
	}
	var leases []leaseRecord
	if err := json.Unmarshal(b, &leases); err != nil {
		t.Fatalf("%s: %v", LeasesFile, err)
	}
	addrs := map[netip.Addr]bool{}
	for _, le := range leases {
		addrs[le.Address] = true
	}
	if len(leases) != n || len(addrs) != n {
		t.Fatalf("%s holds %d leases of %d addresses, want %d of %d", LeasesFile, len(leases), len(addrs), n, n)
	}
	avg := func(d time.Duration) time.Duration { return (d / n).Round(time.Millisecond) }
	replies := strings.Count(h.Log(), `msg="netboot: DHCP"`)
	t.Logf("FIGURES: %d simultaneous network boots, 0 failures, wall %s, slowest boot %s, %.0f MB served (%.0f MB/s); mean per boot: PXE DHCP %s, TFTP %s, iPXE DHCP %s, HTTP script+kernel+initrd %s; %d DHCP replies sent for %d exchanges (the rest answer retransmissions)",
		n, wall.Round(time.Millisecond), worst.Round(time.Millisecond), float64(total)/1e6, float64(total)/1e6/wall.Seconds(),
		avg(sum.dhcp1), avg(sum.tftp), avg(sum.dhcp2), avg(sum.http), replies, 4*n)
}

func fetch(c *http.Client, url string) ([]byte, error) {
	resp, err := c.Get(url)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d, %v", url, resp.StatusCode, err)
	}
	return b, nil
}
