package dnsrecords

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// The real peers of this package: BIND's zone checker (named-checkzone, Debian bind9-utils) reads
// the zone file, and BIND's resolver tool (dig, Debian bind9-dnsutils) queries the server, over UDP
// and TCP, on 127.0.0.1 with an ephemeral port.

func lookPath(t *testing.T, tool, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		t.Skipf("SKIPPED: %s not found (Debian %s): `make deps` installs it; this test checks against the real tool and does not run without it", tool, pkg)
	}
	return p
}

// checkZone runs named-checkzone with every check fatal: check-names (-k), NS/MX/SRV targets that
// are addresses or CNAMEs (-n, -m), full integrity of in-zone NS and SRV targets (-i full).
func checkZone(t *testing.T, zoneFile []byte) (string, error) {
	t.Helper()
	tool := lookPath(t, "named-checkzone", "bind9-utils")
	path := filepath.Join(t.TempDir(), "lab.example.com.zone")
	if err := os.WriteFile(path, zoneFile, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tool, "-k", "fail", "-n", "fail", "-m", "fail", "-M", "fail", "-S", "fail", "-i", "full", "lab.example.com", path).CombinedOutput()
	return string(out), err
}

// TestZoneFileNamedCheckzone: BIND loads the zone file with every check fatal, and finds all of its
// records; and it does reject a zone that lacks what ours has (the name server's address), so a
// pass means something.
func TestZoneFileNamedCheckzone(t *testing.T) {
	z, err := New(labConfig(t, nil), Options{Serial: 2026112401})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := z.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	out, err := checkZone(t, b.Bytes())
	if err != nil {
		t.Fatalf("named-checkzone refuses the zone: %v\n%s\n--- zone ---\n%s", err, out, b.String())
	}
	if !strings.Contains(out, "loaded serial 2026112401") || !strings.Contains(out, "OK") {
		t.Errorf("named-checkzone output lacks the serial and OK:\n%s", out)
	}

	broken := bytes.Replace(b.Bytes(), []byte("ns.lab.example.com.\t300\tIN\tA\t10.100.0.2\n"), nil, 1)
	if bytes.Equal(broken, b.Bytes()) {
		t.Fatal("the zone file has no name server address line to remove")
	}
	if out, err := checkZone(t, broken); err == nil {
		t.Errorf("named-checkzone accepts a zone whose in-zone name server has no address:\n%s", out)
	}
}

// digResult is one dig answer.
type digResult struct {
	status                        string
	flags                         []string
	answer, authority, additional []string
}

// dig queries addr with BIND's dig, recursion off, and parses its header and sections.
func dig(t *testing.T, addr netip.AddrPort, args ...string) digResult {
	t.Helper()
	return digIn(t, "", addr, args...)
}

// digIn is dig run inside the network namespace netns (ip netns exec), or in the test's own with "".
func digIn(t *testing.T, netns string, addr netip.AddrPort, args ...string) digResult {
	t.Helper()
	tool := lookPath(t, "dig", "bind9-dnsutils")
	argv := append([]string{"@" + addr.Addr().String(), "-p", strconv.Itoa(int(addr.Port())),
		"+norecurse", "+tries=1", "+time=5", "+nocookie", "+nocmd", "+noall", "+comments", "+answer", "+authority", "+additional"}, args...)
	if netns != "" {
		argv = append([]string{"netns", "exec", netns, tool}, argv...)
		tool = "ip"
	}
	out, err := exec.Command(tool, argv...).CombinedOutput()
	if err != nil {
		t.Fatalf("dig %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	var r digResult
	var section *[]string
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, ";; ->>HEADER<<-"):
			if _, s, ok := strings.Cut(line, "status: "); ok {
				r.status, _, _ = strings.Cut(s, ",")
			}
		case strings.HasPrefix(line, ";; flags: "):
			f, _, _ := strings.Cut(strings.TrimPrefix(line, ";; flags: "), ";")
			r.flags = strings.Fields(f)
		case line == ";; ANSWER SECTION:":
			section = &r.answer
		case line == ";; AUTHORITY SECTION:":
			section = &r.authority
		case line == ";; ADDITIONAL SECTION:":
			section = &r.additional
		case line == "" || strings.HasPrefix(line, ";"):
			section = nil
		case section != nil:
			rr, err := dns.NewRR(line)
			if err != nil {
				t.Fatalf("dig printed a record miekg/dns cannot parse: %q: %v", line, err)
			}
			*section = append(*section, short([]dns.RR{rr})...)
		}
	}
	if r.status == "" {
		t.Fatalf("dig output has no header:\n%s", out)
	}
	return r
}

// TestServerDig: dig, a real resolver tool, gets authoritative answers (the AA bit) from the server
// over UDP and TCP: A, the *.apps wildcard, the etcd SRV records with their targets' addresses,
// NODATA and NXDOMAIN with the SOA, REFUSED without AA outside the zone and for zone transfers,
// BADVERS for EDNS version 1, and no recursion offered.
func TestServerDig(t *testing.T) {
	lookPath(t, "dig", "bind9-dnsutils")
	z, err := New(labConfig(t, nil), Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := Start(z, netip.MustParseAddrPort("127.0.0.1:0"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for i := range 2 { // a second Shutdown returns the first one's result instead of waiting forever
			if err := srv.Shutdown(context.Background()); err != nil {
				t.Errorf("Shutdown #%d: %v", i+1, err)
			}
		}
		if _, _, err := (&dns.Client{Net: "tcp"}).Exchange(new(dns.Msg).SetQuestion("api.lab.example.com.", dns.TypeA), srv.Addr().String()); err == nil {
			t.Error("the server still answers over TCP after Shutdown")
		}
	}()
	addr := srv.Addr()
	if addr.Port() == 0 {
		t.Fatalf("Addr() = %s: no port", addr)
	}
	const soa = "lab.example.com. SOA ns.lab.example.com. hostmaster.lab.example.com. 1 3600 600 604800 300"
	tests := []struct {
		name                   string
		args                   []string
		status                 string
		aa                     bool
		answer, ns, additional []string
	}{
		{"A", []string{"api.lab.example.com", "A"}, "NOERROR", true, []string{"api.lab.example.com. A 10.100.0.100"}, nil, nil},
		{"A over TCP", []string{"+tcp", "api-int.lab.example.com", "A"}, "NOERROR", true, []string{"api-int.lab.example.com. A 10.100.0.100"}, nil, nil},
		{"node", []string{"w2.lab.example.com", "A"}, "NOERROR", true, []string{"w2.lab.example.com. A 10.100.0.22"}, nil, nil},
		{"wildcard", []string{"console.apps.lab.example.com", "A"}, "NOERROR", true, []string{
			"console.apps.lab.example.com. A 10.100.0.11", "console.apps.lab.example.com. A 10.100.0.12", "console.apps.lab.example.com. A 10.100.0.13"}, nil, nil},
		{"etcd SRV", []string{"_etcd-server-ssl._tcp.lab.example.com", "SRV"}, "NOERROR", true, []string{
			"_etcd-server-ssl._tcp.lab.example.com. SRV 0 10 2380 etcd-0.lab.example.com.",
			"_etcd-server-ssl._tcp.lab.example.com. SRV 0 10 2380 etcd-1.lab.example.com.",
			"_etcd-server-ssl._tcp.lab.example.com. SRV 0 10 2380 etcd-2.lab.example.com."}, nil, []string{
			"etcd-0.lab.example.com. A 10.100.0.11", "etcd-1.lab.example.com. A 10.100.0.12", "etcd-2.lab.example.com. A 10.100.0.13"}},
		{"NODATA", []string{"api.lab.example.com", "AAAA"}, "NOERROR", true, nil, []string{soa}, nil},
		{"NXDOMAIN", []string{"nosuch.lab.example.com", "A"}, "NXDOMAIN", true, nil, []string{soa}, nil},
		{"NXDOMAIN over TCP", []string{"+tcp", "x.api.lab.example.com", "A"}, "NXDOMAIN", true, nil, []string{soa}, nil},
		{"outside the zone", []string{"www.example.org", "A"}, "REFUSED", false, nil, nil, nil},
		{"recursion asked for, outside the zone", []string{"+recurse", "example.com", "A"}, "REFUSED", false, nil, nil, nil},
		{"zone transfer", []string{"+tcp", "lab.example.com", "AXFR"}, "", false, nil, nil, nil},
		{"EDNS version 1", []string{"+edns=1", "+noednsnegotiation", "api.lab.example.com", "A"}, "BADVERS", false, nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.status == "" { // AXFR: dig prints no header for a refused transfer
				tool := lookPath(t, "dig", "bind9-dnsutils")
				out, _ := exec.Command(tool, "@"+addr.Addr().String(), "-p", strconv.Itoa(int(addr.Port())), "+tries=1", "+time=5", "lab.example.com", "AXFR").CombinedOutput()
				if !strings.Contains(string(out), "Transfer failed") || strings.Contains(string(out), "\tSOA\t") {
					t.Errorf("AXFR was not refused:\n%s", out)
				}
				return
			}
			r := dig(t, addr, tt.args...)
			if r.status != tt.status {
				t.Errorf("status %s, want %s", r.status, tt.status)
			}
			if got := slices.Contains(r.flags, "aa"); got != tt.aa {
				t.Errorf("flags %v: aa %v, want %v", r.flags, got, tt.aa)
			}
			if slices.Contains(r.flags, "ra") {
				t.Errorf("flags %v offer recursion", r.flags)
			}
			for _, s := range []struct {
				name      string
				got, want []string
			}{{"answer", r.answer, tt.answer}, {"authority", r.authority, tt.ns}, {"additional", r.additional, tt.additional}} {
				if d := cmp.Diff(s.want, s.got); d != "" {
					t.Errorf("%s section (-want +got):\n%s", s.name, d)
				}
			}
		})
	}
}

// TestServerDigTruncation: an answer larger than a UDP query allows (fifteen etcd SRV records are
// about 700 bytes; a query without EDNS allows 512) arrives with the TC bit and no partial record
// set, and dig, retrying over TCP as RFC 7766 asks, gets all fifteen.
func TestServerDigTruncation(t *testing.T) {
	lookPath(t, "dig", "bind9-dnsutils")
	const cps = 15
	z, err := New(labConfig(t, func(c *config.BootstrapConfiguration) {
		cp := c.Nodes[0]
		c.Nodes = nil
		for i := range cps {
			n := cp
			n.Name, n.MAC = fmt.Sprintf("cp%d", i+1), ""
			n.Addresses = []netip.Addr{netip.AddrFrom4([4]byte{10, 100, 0, byte(11 + i)}), netip.AddrFrom4([4]byte{10, 200, 0, byte(11 + i)})}
			n.Power.Address = ""
			c.Nodes = append(c.Nodes, n)
		}
	}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := Start(z, netip.MustParseAddrPort("127.0.0.1:0"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Shutdown(context.Background()) }()

	const q = "_etcd-server-ssl._tcp.lab.example.com"
	udp := dig(t, srv.Addr(), "+noedns", "+ignore", q, "SRV")
	if !slices.Contains(udp.flags, "tc") || len(udp.answer) >= cps {
		t.Errorf("UDP without EDNS: flags %v, %d answers; want tc and fewer than %d", udp.flags, len(udp.answer), cps)
	}
	full := dig(t, srv.Addr(), "+noedns", q, "SRV")
	if slices.Contains(full.flags, "tc") || len(full.answer) != cps || full.status != "NOERROR" {
		t.Errorf("after dig's retry over TCP: status %s, flags %v, %d answers; want all %d", full.status, full.flags, len(full.answer), cps)
	}
}
