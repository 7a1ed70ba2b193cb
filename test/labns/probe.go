package labns

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The probe is a small peer program that firewall tests run inside lab namespaces to send and receive
// real packets: the test binary itself, started as `ip netns exec NS <test binary> MODE ARGS...` (ip
// execs it, so the PID the test holds is the probe's own) with ProbeEnv set. A test package that uses
// it calls ProbeMain first thing in its TestMain.

// ProbeEnv is the environment variable (value "1") that makes the test binary a probe; a test that runs
// its binary elsewhere (inside a container) sets it itself.
const ProbeEnv = "LABNS_PROBE"

// ProbeTimeout bounds how long a blocked connection attempt or a dropped packet is waited for (a bound
// for "blocked" and "dropped", not a speed assertion).
const ProbeTimeout = time.Second

// IPProtoVRRP is VRRP's IP protocol number (RFC 5798 §5.1.1.4).
const IPProtoVRRP = 112

// ProbeMain runs the probe and exits when the test binary was started as one (StartProbe, ProbeOnce);
// otherwise it returns at once. extra adds modes of the calling package (name → function of the mode's
// arguments, returning the exit status), for what only that package can do.
//
// Modes:
//
//	listen ADDR...       TCP listeners answering "hello\n"; prints "ready", then serves until stdin closes
//	dial SRC DST         one TCP connect from SRC (IP) to DST (ip:port); prints "open" or "blocked: ERR"
//	vrrp-recv            raw IP-protocol-112 socket; prints "ready", then "got SRC" per packet until stdin closes
//	vrrp-send SRC DST    sends one VRRPv3 advertisement (VRRPAdvert) from SRC to DST; prints "sent"
func ProbeMain(extra map[string]func(args []string) int) {
	if os.Getenv(ProbeEnv) != "1" {
		return
	}
	args := os.Args[1:]
	if len(args) > 0 {
		if f, ok := extra[args[0]]; ok {
			os.Exit(f(args))
		}
	}
	os.Exit(runProbe(args))
}

func runProbe(args []string) int {
	fail := func(err error) int { fmt.Println("error:", err); return 1 }
	if len(args) == 0 {
		return fail(fmt.Errorf("no mode"))
	}
	switch args[0] {
	case "listen":
		for _, a := range args[1:] {
			l, err := net.Listen("tcp", a)
			if err != nil {
				return fail(err)
			}
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					_, _ = c.Write([]byte("hello\n"))
					_ = c.Close()
				}
			}()
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0
	case "dial":
		if len(args) != 3 {
			return fail(fmt.Errorf("dial SRC DST"))
		}
		d := net.Dialer{Timeout: ProbeTimeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(args[1])}}
		c, err := d.Dial("tcp", args[2])
		if err != nil {
			fmt.Println("blocked:", err)
			return 0
		}
		defer func() { _ = c.Close() }()
		_ = c.SetDeadline(time.Now().Add(ProbeTimeout))
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "hello\n" {
			fmt.Printf("blocked: connected but read %q, %v\n", line, err)
			return 0
		}
		fmt.Println("open")
		return 0
	case "vrrp-recv":
		pc, err := net.ListenPacket(fmt.Sprintf("ip4:%d", IPProtoVRRP), "0.0.0.0")
		if err != nil {
			return fail(err)
		}
		go func() {
			buf := make([]byte, 1500)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				fmt.Println("got", from)
			}
		}()
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0
	case "vrrp-send":
		if len(args) != 3 {
			return fail(fmt.Errorf("vrrp-send SRC DST"))
		}
		src, dst := netip.MustParseAddr(args[1]), netip.MustParseAddr(args[2])
		pc, err := net.ListenPacket(fmt.Sprintf("ip4:%d", IPProtoVRRP), src.String())
		if err != nil {
			return fail(err)
		}
		defer func() { _ = pc.Close() }()
		if _, err := pc.WriteTo(VRRPAdvert(src, dst), &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			return fail(err)
		}
		fmt.Println("sent")
		return 0
	}
	return fail(fmt.Errorf("unknown mode %q", args[0]))
}

// VRRPAdvert builds a VRRPv3 advertisement (RFC 5798 §5.1) from src to dst: version 3, type 1, VRID 51,
// priority 100, one IPv4 address (10.77.0.100), max advert interval 100 cs, checksum over the IPv4
// pseudo-header (§5.2.8).
func VRRPAdvert(src, dst netip.Addr) []byte {
	b := []byte{0x31, 51, 100, 1, 0x00, 100, 0, 0, 10, 77, 0, 100}
	pseudo := append(append(append(src.AsSlice(), dst.AsSlice()...), 0, IPProtoVRRP), 0, byte(len(b)))
	var sum uint32
	for _, part := range [][]byte{pseudo, b} {
		for i := 0; i+1 < len(part); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(part[i:]))
		}
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(b[6:], ^uint16(sum))
	return b
}

// Probe is a long-lived probe (listen, vrrp-recv) started by StartProbe; its output lines arrive on
// Lines.
type Probe struct {
	Lines chan string
}

// ProbeCommand is the test binary as a probe in MODE inside ns, not started (for callers that run many
// at once); under -race the race runtime's 1 s exit sleep is dropped.
func ProbeCommand(t testing.TB, ns *NS, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := ns.Command(append([]string{exe}, args...)...)
	cmd.Env = append(os.Environ(), ProbeEnv+"=1", "GORACE=atexit_sleep_ms=0")
	return cmd
}

// StartProbe runs a long-lived probe mode in ns and waits for its "ready" line. It is stopped by its
// PID (stdin closed, then killed) when the test ends.
func StartProbe(t testing.TB, ns *NS, args ...string) *Probe {
	t.Helper()
	cmd := ProbeCommand(t, ns, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start probe %v: %v", args, err)
	}
	p := &Probe{Lines: make(chan string, 64)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.Lines <- sc.Text()
		}
		close(p.Lines)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill() // by PID: the probe we started
		_ = cmd.Wait()
	})
	if l, ok := <-p.Lines; !ok || l != "ready" {
		t.Fatalf("probe %v in %s did not start: %q", args, ns.Name, l)
	}
	return p
}

// Received reports whether a vrrp-recv probe printed "got FROM" within ProbeTimeout.
func (p *Probe) Received(from string) bool {
	deadline := time.After(ProbeTimeout)
	for {
		select {
		case l, ok := <-p.Lines:
			if !ok {
				return false
			}
			if l == "got "+from {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

// ProbeOnce runs a short-lived probe mode (dial, vrrp-send, or an extra mode) in ns and returns its
// output without surrounding space; a probe that exits non-zero fails the test.
func ProbeOnce(t testing.TB, ns *NS, args ...string) string {
	t.Helper()
	out, err := ProbeCommand(t, ns, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("probe %v in %s: %v\n%s", args, ns.Name, err, out)
	}
	return strings.TrimSpace(string(out))
}
