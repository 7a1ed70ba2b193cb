package dnsrecords

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// labConfig is config.Example (three control planes, two workers) with baseDomain example.com and
// the DNS server on 10.100.0.2, edited by edit, defaulted and validated.
func labConfig(t testing.TB, edit func(*config.BootstrapConfiguration)) *config.BootstrapConfiguration {
	t.Helper()
	c := config.Example()
	c.BaseDomain = "example.com"
	c.DNS.ListenAddress = netip.MustParseAddr("10.100.0.2")
	if edit != nil {
		edit(c)
	}
	config.SetDefaults(c)
	if _, errs := config.Validate(c, config.ValidateOptions{}); len(errs) > 0 {
		t.Fatalf("test configuration is not valid: %v", errs)
	}
	return c
}

// records is the zone's records in presentation format without the TTL and class columns.
func records(z *Zone) []string {
	var out []string
	for _, rr := range z.RRs {
		f := strings.Split(rr.String(), "\t")
		out = append(out, f[0]+" "+strings.Join(f[3:], " "))
	}
	return out
}

func TestNew(t *testing.T) {
	const soa = "lab.example.com. SOA ns.lab.example.com. hostmaster.lab.example.com. 1 3600 600 604800 300"
	head := []string{soa, "lab.example.com. NS ns.lab.example.com.", "ns.lab.example.com. A 10.100.0.2"}
	api := []string{"api.lab.example.com. A 10.100.0.100", "api-int.lab.example.com. A 10.100.0.100"}
	cps := []string{
		"*.apps.lab.example.com. A 10.100.0.11",
		"*.apps.lab.example.com. A 10.100.0.12",
		"*.apps.lab.example.com. A 10.100.0.13",
		"etcd-0.lab.example.com. A 10.100.0.11",
		"etcd-1.lab.example.com. A 10.100.0.12",
		"etcd-2.lab.example.com. A 10.100.0.13",
		"_etcd-server-ssl._tcp.lab.example.com. SRV 0 10 2380 etcd-0.lab.example.com.",
		"_etcd-server-ssl._tcp.lab.example.com. SRV 0 10 2380 etcd-1.lab.example.com.",
		"_etcd-server-ssl._tcp.lab.example.com. SRV 0 10 2380 etcd-2.lab.example.com.",
	}
	nodes := []string{
		"cp1.lab.example.com. A 10.100.0.11",
		"cp2.lab.example.com. A 10.100.0.12",
		"cp3.lab.example.com. A 10.100.0.13",
		"w1.lab.example.com. A 10.100.0.21",
		"w2.lab.example.com. A 10.100.0.22",
	}
	cat := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		name string
		edit func(*config.BootstrapConfiguration)
		opts Options
		want []string
	}{
		{name: "the lab", want: cat(head, api, cps, nodes)},
		{name: "name server and serial from options", opts: Options{NameServer: netip.MustParseAddr("192.0.2.53"), Serial: 2026112401},
			want: cat([]string{strings.Replace(soa, " 1 3600", " 2026112401 3600", 1), head[1], "ns.lab.example.com. A 192.0.2.53"}, api, cps, nodes)},
		{name: "no VIP: no api records", edit: func(c *config.BootstrapConfiguration) {
			f := false
			c.Kubernetes.Enabled, c.APIServer.Keepalived.Enabled, c.APIServer.VIP = &f, &f, netip.Addr{}
		}, want: cat(head, cps, nodes)},
		{name: "a worker with a workload-plane address only", edit: func(c *config.BootstrapConfiguration) {
			c.Nodes[3].Addresses = []netip.Addr{netip.MustParseAddr("10.200.0.21")}
		}, want: cat(head, api, cps, nodes[:3], []string{"w1.lab.example.com. A 10.200.0.21"}, nodes[4:])},
		{name: "a worker without addresses gets no record", edit: func(c *config.BootstrapConfiguration) {
			c.Nodes[3].Addresses = nil
			c.Kubernetes.Enabled = new(bool)
		}, want: cat(head, api, cps, nodes[:3], nodes[4:])},
		{name: "an ingress VIP: *.apps names it alone", edit: func(c *config.BootstrapConfiguration) {
			c.Ingress.VIP = netip.MustParseAddr("10.100.0.101")
		}, want: cat(head, api, []string{"*.apps.lab.example.com. A 10.100.0.101"}, cps[3:], nodes)},
		{name: "one control plane", edit: func(c *config.BootstrapConfiguration) {
			c.Nodes = c.Nodes[:1]
		}, want: cat(head, api, []string{cps[0], cps[3], cps[6]}, nodes[:1])},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z, err := New(labConfig(t, tt.edit), tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if z.Origin != "lab.example.com." {
				t.Errorf("Origin = %q", z.Origin)
			}
			if d := cmp.Diff(tt.want, records(z)); d != "" {
				t.Errorf("records (-want +got):\n%s", d)
			}
			for _, rr := range z.RRs {
				if rr.Header().Ttl != TTL || rr.Header().Class != dns.ClassINET {
					t.Errorf("%s: want TTL %d, class IN", rr, TTL)
				}
			}
		})
	}
}

func TestNewRefuses(t *testing.T) {
	noBase := labConfig(t, func(c *config.BootstrapConfiguration) { c.BaseDomain, c.DNS = "", config.DNS{} })
	if _, err := New(noBase, Options{}); !errors.Is(err, ErrNoBaseDomain) {
		t.Errorf("no baseDomain: %v, want ErrNoBaseDomain", err)
	}
	noNS := labConfig(t, func(c *config.BootstrapConfiguration) { c.DNS = config.DNS{} })
	if _, err := New(noNS, Options{}); !errors.Is(err, ErrNoNameServer) {
		t.Errorf("no name server: %v, want ErrNoNameServer", err)
	}
	if _, err := New(noNS, Options{NameServer: netip.MustParseAddr("2001:db8::53")}); err == nil || !strings.Contains(err.Error(), "is not IPv4") {
		t.Errorf("IPv6 name server: %v", err)
	}
}

// TestZoneFile: the zone file is deterministic (rendered twice: identical bytes), and miekg/dns's
// own zone parser reads back exactly the records it was written from. TestZoneFileNamedCheckzone
// has BIND check it.
func TestZoneFile(t *testing.T) {
	c := labConfig(t, nil)
	z, err := New(c, Options{Serial: 42})
	if err != nil {
		t.Fatal(err)
	}
	var a, b bytes.Buffer
	if _, err := z.WriteTo(&a); err != nil {
		t.Fatal(err)
	}
	z2, _ := New(c, Options{Serial: 42})
	if _, err := z2.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatalf("two renders differ:\n%s\n---\n%s", a.String(), b.String())
	}
	zp := dns.NewZoneParser(bytes.NewReader(a.Bytes()), "", "zone")
	var got []string
	for rr, ok := zp.Next(); ok; rr, ok = zp.Next() {
		got = append(got, rr.String())
	}
	if err := zp.Err(); err != nil {
		t.Fatalf("parse the zone file: %v\n%s", err, a.String())
	}
	var want []string
	for _, rr := range z.RRs {
		want = append(want, rr.String())
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("zone file read back (-want +got):\n%s", d)
	}
}

func TestFileSerial(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bootstrap.yaml")
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	when := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	if err := os.Chtimes(path, when, when); err != nil {
		t.Fatal(err)
	}
	if s, err := FileSerial(path); err != nil || s != uint32(when.Unix()) {
		t.Errorf("FileSerial = %d, %v; want %d", s, err, when.Unix())
	}
	if _, err := FileSerial(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("FileSerial of a missing file: no error")
	}
}
