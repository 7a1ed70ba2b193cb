package main

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/dnsrecords"
)

// dnsConfig writes config.Example with baseDomain example.com (and dns.listenAddress 10.100.0.2
// when serve is true), its modification time set to when.
func dnsConfig(t *testing.T, serve bool, when time.Time) string {
	t.Helper()
	c := config.Example()
	c.BaseDomain = "example.com"
	if serve {
		c.DNS.ListenAddress = netip.MustParseAddr("10.100.0.2")
	}
	path := writeConfig(t, c)
	if err := os.Chtimes(path, when, when); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestDNSZone: `appliance dns zone` prints pkg/dnsrecords' zone file for the configuration, with the
// file's modification time as SOA serial unless --serial is given, and BIND's named-checkzone
// accepts what it prints.
func TestDNSZone(t *testing.T) {
	when := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	path := dnsConfig(t, true, when)
	out, errOut, err := runCLI("dns", "zone", "-c", path)
	if err != nil {
		t.Fatalf("dns zone: %v\n%s", err, errOut)
	}
	cfg, _, err := config.Load(path, config.ValidateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	z, err := dnsrecords.New(cfg, dnsrecords.Options{Serial: uint32(when.Unix())})
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	if _, err := z.WriteTo(&want); err != nil {
		t.Fatal(err)
	}
	if out != want.String() {
		t.Errorf("dns zone printed\n%s\nwant\n%s", out, want.String())
	}
	for _, rec := range []string{
		"lab.example.com.\t300\tIN\tSOA\tns.lab.example.com. hostmaster.lab.example.com. " + strconv.FormatInt(when.Unix(), 10) + " ",
		"api.lab.example.com.\t300\tIN\tA\t10.100.0.100\n",
		"_etcd-server-ssl._tcp.lab.example.com.\t300\tIN\tSRV\t0 10 2380 etcd-2.lab.example.com.\n",
	} {
		if !strings.Contains(out, rec) {
			t.Errorf("output lacks %q:\n%s", rec, out)
		}
	}

	out, _, err = runCLI("dns", "zone", "-c", path, "--serial", "2026112401", "--name-server", "192.0.2.53")
	if err != nil || !strings.Contains(out, " 2026112401 3600 600 604800 300\n") || !strings.Contains(out, "ns.lab.example.com.\t300\tIN\tA\t192.0.2.53\n") {
		t.Errorf("--serial and --name-server: %v\n%s", err, out)
	}

	checkzone, lookErr := exec.LookPath("named-checkzone")
	if lookErr != nil {
		t.Skip("SKIPPED the named-checkzone half: named-checkzone not found (Debian bind9-utils); `make deps` installs it")
	}
	file := filepath.Join(t.TempDir(), "zone")
	if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if res, err := exec.Command(checkzone, "-k", "fail", "-n", "fail", "-i", "full", "lab.example.com", file).CombinedOutput(); err != nil || !strings.Contains(string(res), "OK") {
		t.Errorf("named-checkzone refuses the printed zone: %v\n%s", err, res)
	}
}

func TestDNSZoneJSON(t *testing.T) {
	path := dnsConfig(t, true, time.Unix(1000, 0))
	out, _, err := runCLI("dns", "zone", "-c", path, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Origin  string              `json:"origin"`
		Records []dnsrecords.Record `json:"records"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if doc.Origin != "lab.example.com." || len(doc.Records) == 0 {
		t.Fatalf("document %+v", doc)
	}
	if r := doc.Records[0]; r.Type != "SOA" || r.Data != "ns.lab.example.com. hostmaster.lab.example.com. 1000 3600 600 604800 300" {
		t.Errorf("first record %+v, want the SOA", r)
	}
	found := false
	for _, r := range doc.Records {
		found = found || r == dnsrecords.Record{Name: "*.apps.lab.example.com.", TTL: 300, Type: "A", Data: "10.100.0.13"}
	}
	if !found {
		t.Errorf("no *.apps record for cp3 in %+v", doc.Records)
	}
}

// TestDNSZoneRefusals: every refusal says what to fix, and prints nothing on stdout.
func TestDNSZoneRefusals(t *testing.T) {
	noServe := dnsConfig(t, false, time.Unix(1000, 0))
	c := config.Example()
	noBase := writeConfig(t, c)
	c.BaseDomain = "Example.com."
	bad := writeConfig(t, c)
	tests := []struct {
		name string
		args []string
		msg  []string
	}{
		{"invalid baseDomain", []string{"-c", bad}, []string{bad + " is not valid:", `baseDomain: "Example.com." ends with a dot: write the domain without it`}},
		{"no baseDomain", []string{"-c", noBase}, []string{"baseDomain is not set: the cluster has no DNS records; set baseDomain"}},
		{"no name server", []string{"-c", noServe}, []string{"set dns.listenAddress", "(--name-server ADDRESS)"}},
		{"bad --name-server", []string{"-c", noServe, "--name-server", "ns1"}, []string{`--name-server "ns1" is not an IPv4 address`}},
		{"IPv6 --name-server", []string{"-c", noServe, "--name-server", "2001:db8::53"}, []string{`--name-server "2001:db8::53" is not an IPv4 address`}},
		{"missing file", []string{"-c", filepath.Join(t.TempDir(), "nope.yaml")}, []string{"nope.yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _, err := runCLI(append([]string{"dns", "zone"}, tt.args...)...)
			if err == nil {
				t.Fatalf("no error; printed %q", out)
			}
			for _, m := range tt.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q lacks %q", err, m)
				}
			}
			if out != "" {
				t.Errorf("printed %q before refusing", out)
			}
		})
	}
}
