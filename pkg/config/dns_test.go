package config

import (
	"net/netip"
	"os"
	"strings"
	"testing"
)

func TestDNSValid(t *testing.T) {
	for name, tt := range map[string]struct {
		extra    string
		edits    []string
		wantZone string
	}{
		"no baseDomain: no zone":   {},
		"baseDomain":               {extra: "baseDomain: example.com\n", wantZone: "lab.example.com"},
		"one-label baseDomain":     {extra: "baseDomain: internal\n", wantZone: "lab.internal"},
		"served":                   {extra: "baseDomain: dc1.example.com\ndns:\n  listenAddress: 10.100.0.2\n", wantZone: "lab.dc1.example.com"},
		"etcd-N beyond the CPs":    {extra: "baseDomain: example.com\n", edits: []string{"- name: w1", "- name: etcd-3"}, wantZone: "lab.example.com"},
		"etcd--1":                  {extra: "baseDomain: example.com\n", edits: []string{"- name: w1", "- name: etcd--1"}, wantZone: "lab.example.com"},
		"a node named like apps-x": {extra: "baseDomain: example.com\n", edits: []string{"- name: w1", "- name: apps-1"}, wantZone: "lab.example.com"},
	} {
		t.Run(name, func(t *testing.T) {
			c, warns, errs := labWith(t, tt.extra, tt.edits...)
			if len(errs) > 0 || len(warns) > 0 {
				t.Fatalf("errors %v, warnings %v", errs, warns)
			}
			if got := c.DNSZone(); got != tt.wantZone {
				t.Errorf("DNSZone() = %q, want %q", got, tt.wantZone)
			}
		})
	}
}

// TestDNSInvalid asserts the exact set of error paths, each with what its message must say.
func TestDNSInvalid(t *testing.T) {
	type want = fieldWant
	long := strings.Repeat("a", 60)
	longDomain := strings.Join([]string{long, long, long, long}, ".") // 243 characters
	tests := []struct {
		name  string
		extra string
		edits []string
		want  []want
	}{
		{"not a DNS name", "baseDomain: \"example_com\"\n", nil, []want{{"baseDomain", `"example_com" is not a DNS name: use a DNS-1123 subdomain`}}},
		{"empty label", "baseDomain: example..com\n", nil, []want{{"baseDomain", `"example..com" is not a DNS name`}}},
		{"trailing dot", "baseDomain: example.com.\n", nil, []want{{"baseDomain", `"example.com." ends with a dot: write the domain without it, e.g. example.com`}}},
		{"capitals", "baseDomain: Example.COM\n", nil, []want{{"baseDomain", `write it in lowercase, example.com`}}},
		{"label too long", "baseDomain: " + strings.Repeat("a", 64) + ".com\n", nil, []want{{"baseDomain", "is not a DNS name"}}},
		{"names too long", "baseDomain: " + longDomain + "\n", nil, []want{
			// cp1.lab.<longDomain> (251 characters) still fits.
			{"baseDomain", "is 243 characters long, which makes the zone's longest name (_etcd-server-ssl._tcp.<clusterName>.<baseDomain>) 269 characters long: DNS names have at most 253"}}},
		{"cluster name not a label", "baseDomain: example.com\n", []string{"clusterName: lab", "clusterName: Lab_1"}, []want{
			{"clusterName", `"Lab_1" is not a valid name: use a DNS-1123 label`}}},
		{"node named api", "baseDomain: example.com\n", []string{"- name: w1", "- name: api"}, []want{
			{"nodes[3].name", `"api" is also the DNS name api.lab.example.com of the zone's own records`}}},
		{"node named api-int", "baseDomain: example.com\n", []string{"- name: w1", "- name: api-int"}, []want{
			{"nodes[3].name", `"api-int" is also the DNS name api-int.lab.example.com`}}},
		{"node named ns", "baseDomain: example.com\n", []string{"- name: w1", "- name: ns"}, []want{
			{"nodes[3].name", `"ns" is also the DNS name ns.lab.example.com`}}},
		{"node named etcd-2", "baseDomain: example.com\n", []string{"- name: w1", "- name: etcd-2"}, []want{
			{"nodes[3].name", `"etcd-2" is also the DNS name etcd-2.lab.example.com of control plane number 2's etcd`}}},
		{"node under apps", "baseDomain: example.com\n", []string{"- name: w1", "- name: w1.apps"}, []want{
			{"nodes[3].name", `"w1.apps" falls under apps.lab.example.com, the ingress wildcard's domain`}}},
		{"listen without baseDomain", "dns:\n  listenAddress: 10.100.0.2\n", nil, []want{
			{"dns.listenAddress", "is set but baseDomain is not"}}},
		{"listen on every address", "baseDomain: example.com\ndns:\n  listenAddress: 0.0.0.0\n", nil, []want{
			{"dns.listenAddress", "0.0.0.0 is not one address: the zone's name server record (ns.lab.example.com) points at it"}}},
		{"listen on loopback", "baseDomain: example.com\ndns:\n  listenAddress: 127.0.0.1\n", nil, []want{
			{"dns.listenAddress", "127.0.0.1 is not a unicast address other hosts reach"}}},
		{"listen on IPv6", "baseDomain: example.com\ndns:\n  listenAddress: \"fd00::2\"\n", nil, []want{
			{"dns.listenAddress", "fd00::2 is IPv6"}}},
		{"listen on the VIP", "baseDomain: example.com\ndns:\n  listenAddress: 10.100.0.100\n", nil, []want{
			{"dns.listenAddress", "10.100.0.100 is the API server VIP (apiServer.vip)"}}},
		{"listen not an address", "baseDomain: example.com\ndns:\n  listenAddress: ns1\n", nil, []want{
			{"dns.listenAddress", "an IP address"}}},
		{"unknown key", "baseDomain: example.com\ndns:\n  port: 5353\n", nil, []want{{"dns.port", ""}}},
		{"server.port collides with DNS", "baseDomain: example.com\nserver:\n  port: 53\n", nil, []want{
			{"server.port", "53 is also the port of dns-tcp (tcp 53) on the appliance host"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, errs := labWith(t, tt.extra, tt.edits...)
			requireExactly(t, errs, tt.want)
		})
	}
}

// TestDNSNodeNameTooLong: a node name that fits DNS-1123 but not under the zone is refused at its
// own path.
func TestDNSNodeNameTooLong(t *testing.T) {
	long := strings.Repeat("a", 60)
	base := strings.Join([]string{long, long, long}, ".") + ".example" // 190 characters: the SRV name fits
	node := strings.Repeat("b", 63)
	_, _, errs := labWith(t, "baseDomain: "+base+"\n", "- name: w1", "- name: "+node)
	requireErr(t, errs, "nodes[3].name", "characters long: DNS names have at most 253", 0)
	if got := errPaths(errs); len(got) != 1 {
		t.Errorf("errors at %v, want only nodes[3].name:\n%v", got, errs)
	}
}

// TestDNSErrorLine: dns errors carry the source line.
func TestDNSErrorLine(t *testing.T) {
	data, err := os.ReadFile("testdata/lab.yaml")
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Count(string(data), "\n") + 1 // baseDomain is the first appended line
	_, _, errs := labWith(t, "baseDomain: example.com.\ndns:\n  listenAddress: 127.0.0.1\n")
	requireErr(t, errs, "baseDomain", "ends with a dot", line)
	requireErr(t, errs, "dns.listenAddress", "is not a unicast address", line+2)
}

// TestDNSMarshalRoundTrip: baseDomain and dns.listenAddress survive Marshal and Decode (the
// effective document `appliance config defaults` prints), and are left out when unset.
func TestDNSMarshalRoundTrip(t *testing.T) {
	c := Example()
	b, err := Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); strings.Contains(s, "baseDomain") || strings.Contains(s, "dns:") {
		t.Errorf("unset DNS fields are printed:\n%s", s)
	}
	c.BaseDomain = "example.com"
	c.DNS.ListenAddress = netip.MustParseAddr("10.100.0.2")
	if b, err = Marshal(c); err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatalf("Decode(Marshal): %v\n%s", err, b)
	}
	if got.BaseDomain != c.BaseDomain || got.DNS != c.DNS {
		t.Errorf("round trip: baseDomain %q dns %+v, want %q %+v\n%s", got.BaseDomain, got.DNS, c.BaseDomain, c.DNS, b)
	}
}
