package hostagent

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/dnsrecords"
)

var cpAddrs = []netip.Addr{netip.MustParseAddr("10.100.0.11"), netip.MustParseAddr("10.100.0.12"), netip.MustParseAddr("10.100.0.13")}

// TestResolvConf: the control planes go first, between markers, as many as leave one of the file's
// own servers within glibc's first three (at least one); every line of the file is kept after them;
// a rerun gives the same bytes and a new set of control planes replaces the block, not adds to it.
func TestResolvConf(t *testing.T) {
	const block3 = resolvBegin + "\nnameserver 10.100.0.11\nnameserver 10.100.0.12\nnameserver 10.100.0.13\n" + resolvEnd + "\n"
	const block2 = resolvBegin + "\nnameserver 10.100.0.11\nnameserver 10.100.0.12\n" + resolvEnd + "\n"
	const block1 = resolvBegin + "\nnameserver 10.100.0.11\n" + resolvEnd + "\n"
	tests := []struct {
		name, old, want string
		kept            int
	}{
		{"no file", "", block3, 0},
		{"the lab's", "nameserver 10.100.0.2\n", block2 + "nameserver 10.100.0.2\n", 1},
		{"search, options, comments kept", "# from DHCP\nsearch corp.example\nnameserver 192.0.2.53\noptions edns0\n",
			block2 + "# from DHCP\nsearch corp.example\nnameserver 192.0.2.53\noptions edns0\n", 1},
		{"two of its own", "nameserver 192.0.2.53\nnameserver 192.0.2.54\n", block1 + "nameserver 192.0.2.53\nnameserver 192.0.2.54\n", 2},
		{"three of its own", "nameserver 192.0.2.1\nnameserver 192.0.2.2\nnameserver 192.0.2.3\n",
			block1 + "nameserver 192.0.2.1\nnameserver 192.0.2.2\nnameserver 192.0.2.3\n", 3},
		{"no trailing newline", "nameserver 10.100.0.2", block2 + "nameserver 10.100.0.2\n", 1},
		// A line longer than bufio.Scanner's 64 KiB token once ended the read there, and the rest was lost.
		{"a long comment line", "# " + strings.Repeat("x", 70000) + "\nnameserver 10.100.0.2\n",
			block2 + "# " + strings.Repeat("x", 70000) + "\nnameserver 10.100.0.2\n", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, r := ResolvConf([]byte(tt.old), cpAddrs)
			if d := cmp.Diff(tt.want, string(got)); d != "" {
				t.Fatalf("resolv.conf (-want +got):\n%s", d)
			}
			if len(r.Kept) != tt.kept || len(r.Ours) == 0 {
				t.Errorf("result %+v, want %d kept", r, tt.kept)
			}
			again, _ := ResolvConf(got, cpAddrs)
			if string(again) != string(got) {
				t.Errorf("a rerun changes the file:\n%s", again)
			}
			moved, _ := ResolvConf(got, []netip.Addr{netip.MustParseAddr("10.100.0.14")})
			if strings.Contains(string(moved), "10.100.0.11") || !strings.HasPrefix(string(moved), resolvBegin+"\nnameserver 10.100.0.14\n"+resolvEnd+"\n") ||
				!strings.HasSuffix(string(moved), tt.want[strings.Index(tt.want, resolvEnd)+len(resolvEnd)+1:]) {
				t.Errorf("another control plane set does not replace the block:\n%s", moved)
			}
		})
	}
}

// TestStepDNSWorker: on a worker (no server) the step writes /etc/resolv.conf under the root with the
// control planes first and the lab's server kept after them, and a rerun changes nothing.
func TestStepDNSWorker(t *testing.T) {
	root := t.TempDir()
	dnsTestWrite(t, filepath.Join(root, ResolvConfPath), "nameserver 10.100.0.2\n")
	a := &Agent{opts: Options{Root: root}}
	a.nc = agentapi.NodeConfig{Node: "w1", DNS: &agentapi.DNSConfig{Zone: "lab.example.com", Nameservers: cpAddrs}}
	detail, err := a.stepDNS(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := "/etc/resolv.conf: nameservers 10.100.0.11 10.100.0.12, then its own 10.100.0.2"; detail != want {
		t.Errorf("detail %q, want %q", detail, want)
	}
	b, err := os.ReadFile(filepath.Join(root, ResolvConfPath))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "nameserver 10.100.0.11\nnameserver 10.100.0.12\n"+resolvEnd+"\nnameserver 10.100.0.2\n") {
		t.Errorf("resolv.conf:\n%s", b)
	}
	if detail, err := a.stepDNS(context.Background()); err != nil || !strings.HasPrefix(detail, "unchanged: ") {
		t.Errorf("rerun: %q %v, want unchanged", detail, err)
	}
	if _, err := os.Stat(filepath.Join(root, CoreDNSManifest)); err == nil {
		t.Error("a worker got the CoreDNS static pod")
	}
}

// TestStepDNSResolved: where systemd-resolved runs, the step leaves /etc/resolv.conf (resolved's
// stub) alone and writes a drop-in routing only the zone to the control planes.
func TestStepDNSResolved(t *testing.T) {
	root := t.TempDir()
	dnsTestWrite(t, filepath.Join(root, ResolvedRunDir, "stub-resolv.conf"), "nameserver 127.0.0.53\n")
	dnsTestWrite(t, filepath.Join(root, ResolvConfPath), "nameserver 127.0.0.53\n")
	a := &Agent{opts: Options{Root: root}}
	a.nc = agentapi.NodeConfig{Node: "w1", DNS: &agentapi.DNSConfig{Zone: "lab.example.com", Nameservers: cpAddrs}}
	detail, err := a.stepDNS(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(detail, "systemd-resolved asks 10.100.0.11 10.100.0.12 10.100.0.13 for ~lab.example.com") || !strings.Contains(detail, "restart systemd-resolved to apply") {
		t.Errorf("detail %q", detail)
	}
	b, err := os.ReadFile(filepath.Join(root, ResolvedDropIn))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "[Resolve]\nDNS=10.100.0.11 10.100.0.12 10.100.0.13\nDomains=~lab.example.com\n") {
		t.Errorf("drop-in:\n%s", b)
	}
	if b, _ := os.ReadFile(filepath.Join(root, ResolvConfPath)); string(b) != "nameserver 127.0.0.53\n" {
		t.Errorf("resolv.conf changed under systemd-resolved:\n%s", b)
	}
}

// TestStepDNSControlPlane: on a control plane the step writes the Corefile and zone file (0644, in a
// directory the non-root CoreDNS user can read) and the static pod (host network, the image, the
// Corefile, the health probe), and waits while nothing answers the zone on the listen address.
func TestStepDNSControlPlane(t *testing.T) {
	root := t.TempDir()
	a := &Agent{opts: Options{Root: root}}
	s := &agentapi.DNSServer{Image: "registry.k8s.io/coredns/coredns:v1.12.1", Corefile: "COREFILE", ZoneFile: "ZONE",
		Listen: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, HealthPort: 18080}
	a.nc = agentapi.NodeConfig{Node: "cp1", DNS: &agentapi.DNSConfig{Zone: "lab.example.com", Nameservers: cpAddrs, Server: s}}
	_, err := a.stepDNS(context.Background())
	var w *waitError
	if !errors.As(err, &w) || !strings.Contains(err.Error(), "waiting for the CoreDNS static pod") {
		t.Fatalf("with nothing answering: %v, want a wait", err)
	}
	for path, want := range map[string]string{dnsrecords.CoreDNSCorefile: "COREFILE", dnsrecords.CoreDNSZoneFile: "ZONE"} {
		st, err := os.Stat(filepath.Join(root, path))
		if b, _ := os.ReadFile(filepath.Join(root, path)); err != nil || st.Mode().Perm() != 0o644 || string(b) != want {
			t.Errorf("%s: %v %v %q", path, st, err, b)
		}
	}
	if st, err := os.Stat(filepath.Join(root, dnsrecords.CoreDNSConfigDir)); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("config dir: %v %v, want 0755", st, err)
	}
	var pod struct {
		Metadata struct{ Name, Namespace string }
		Spec     struct {
			HostNetwork bool `json:"hostNetwork"`
			Containers  []struct {
				Image         string
				Args          []string
				LivenessProbe struct {
					HTTPGet struct {
						Host string
						Port int
						Path string
					} `json:"httpGet"`
				} `json:"livenessProbe"`
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(root, CoreDNSManifest))
	if err != nil || json.Unmarshal(b, &pod) != nil || len(pod.Spec.Containers) != 1 {
		t.Fatalf("manifest: %v\n%s", err, b)
	}
	c := pod.Spec.Containers[0]
	if !pod.Spec.HostNetwork || pod.Metadata.Name != CoreDNSPodName || pod.Metadata.Namespace != "kube-system" || c.Image != s.Image ||
		!slices.Equal(c.Args, []string{"-conf", dnsrecords.CoreDNSCorefile}) ||
		c.LivenessProbe.HTTPGet.Host != "127.0.0.1" || c.LivenessProbe.HTTPGet.Port != 18080 || c.LivenessProbe.HTTPGet.Path != "/health" {
		t.Errorf("manifest:\n%s", b)
	}
	if st, _ := os.Stat(filepath.Join(root, CoreDNSManifest)); st.Mode().Perm() != 0o600 {
		t.Errorf("manifest mode %v, want 0600", st.Mode())
	}
}

// TestCoreDNSAnswers: the step's check accepts a server answering the zone's SOA authoritatively
// (pkg/dnsrecords' server, real DNS over UDP on 127.0.0.1) and refuses one that does not serve the
// zone (it answers REFUSED for another zone).
func TestCoreDNSAnswers(t *testing.T) {
	c := config.Example()
	c.BaseDomain = "example.com"
	config.SetDefaults(c)
	if _, errs := config.Validate(c, config.ValidateOptions{}); len(errs) > 0 {
		t.Fatal(errs)
	}
	z, err := dnsrecords.ForCoreDNS(c)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := dnsrecords.Start(z, netip.MustParseAddrPort("127.0.0.1:0"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Shutdown(context.Background()) }()
	a := &Agent{}
	if err := a.coreDNSAnswers(context.Background(), srv.Addr(), c.DNSZone()); err != nil {
		t.Errorf("serving the zone: %v", err)
	}
	if err := a.coreDNSAnswers(context.Background(), srv.Addr(), "other.example.org"); err == nil || !strings.Contains(err.Error(), "REFUSED") {
		t.Errorf("another zone: %v, want REFUSED named", err)
	}
}

// TestWaitCoreDNS: the dns step keeps asking CoreDNS for a while instead of leaving it to the agent's
// next loop (2 s later): a server that starts answering the zone after the first check (pkg/dnsrecords'
// server, real DNS over UDP on 127.0.0.1, started 300 ms in) is seen within the same step; with
// nothing answering, the last check's error comes back once the limit has passed.
func TestWaitCoreDNS(t *testing.T) {
	c := config.Example()
	c.BaseDomain = "example.com"
	config.SetDefaults(c)
	if _, errs := config.Validate(c, config.ValidateOptions{}); len(errs) > 0 {
		t.Fatal(errs)
	}
	z, err := dnsrecords.ForCoreDNS(c)
	if err != nil {
		t.Fatal(err)
	}
	// A port on 127.0.0.1 free for both UDP and TCP, which the late server binds (CI: a port free for
	// UDP only was in use for TCP by the lane beside, and the server could not start).
	addr := freeDNSPort(t)
	a := &Agent{}
	if err := a.coreDNSAnswers(context.Background(), addr, c.DNSZone()); err == nil {
		t.Fatalf("something answers on %s before the server started", addr)
	}
	started := make(chan *dnsrecords.Server, 1)
	time.AfterFunc(300*time.Millisecond, func() {
		srv, err := dnsrecords.Start(z, addr, nil)
		if err != nil {
			t.Errorf("start the zone server on %s: %v", addr, err)
			srv = nil
		}
		started <- srv
	})
	err = a.waitCoreDNS(context.Background(), addr, c.DNSZone(), 10*time.Second)
	if srv := <-started; srv != nil {
		defer func() { _ = srv.Shutdown(context.Background()) }()
	}
	if err != nil {
		t.Errorf("a server that started answering during the wait: %v", err)
	}
	if err := a.waitCoreDNS(context.Background(), addr, "other.example.org", 300*time.Millisecond); err == nil || !strings.Contains(err.Error(), "REFUSED") {
		t.Errorf("a zone nobody serves: %v, want the last check's REFUSED", err)
	}
}

// freeDNSPort returns 127.0.0.1:PORT with PORT free for UDP and TCP at once (both bound, then closed).
func freeDNSPort(t *testing.T) netip.AddrPort {
	t.Helper()
	for range 50 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := netip.MustParseAddrPort(pc.LocalAddr().String())
		l, err := net.Listen("tcp", addr.String())
		_ = pc.Close()
		if err == nil {
			_ = l.Close()
			return addr
		}
	}
	t.Fatal("no port on 127.0.0.1 free for both UDP and TCP in 50 tries")
	return netip.AddrPort{}
}

func dnsTestWrite(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// FuzzResolvConf: whatever the node's resolv.conf holds, ResolvConf keeps every line of it (outside a
// block of ours), puts at least one control plane first, and a rerun gives the same bytes.
func FuzzResolvConf(f *testing.F) {
	f.Add("nameserver 10.100.0.2\n")
	f.Add("search a b\nnameserver 192.0.2.1\nnameserver 192.0.2.2\nnameserver 192.0.2.3\noptions rotate\n")
	f.Add(resolvBegin + "\nnameserver 10.100.0.11\n" + resolvEnd + "\nnameserver 10.100.0.2\n")
	f.Add("# BEGIN appliance-dns unterminated\nnameserver 192.0.2.1")
	f.Fuzz(func(t *testing.T, old string) {
		out, r := ResolvConf([]byte(old), cpAddrs)
		if len(r.Ours) == 0 || !strings.HasPrefix(string(out), resolvBegin+"\nnameserver "+cpAddrs[0].String()+"\n") {
			t.Fatalf("no control plane first:\n%s", out)
		}
		again, _ := ResolvConf(out, cpAddrs)
		if string(again) != string(out) {
			t.Fatalf("rerun differs:\n%q\n%q", out, again)
		}
		if strings.Contains(old, "# BEGIN appliance-dns") || strings.Contains(old, "\r") {
			return // a block of ours (or a line scanner's view of CR) is not the file's own
		}
		for _, line := range strings.Split(strings.TrimSuffix(old, "\n"), "\n") {
			if line != "" && !strings.Contains(string(out), line+"\n") {
				t.Fatalf("line %q of the file lost:\n%s", line, out)
			}
		}
	})
}
