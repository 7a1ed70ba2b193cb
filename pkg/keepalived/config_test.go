package keepalived

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

func ips(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// goldenIface is the interface every golden config names; checkNS creates it.
const goldenIface = "ens3"

func bootstrapInstance() Instance {
	return Instance{
		Name:            "api-vip",
		Interface:       goldenIface,
		SourceIP:        netip.MustParseAddr("10.100.0.5"),
		Peers:           ips("10.100.0.13", "10.100.0.11", "10.100.0.12"),
		VIP:             netip.MustParsePrefix("10.100.0.100/24"),
		VirtualRouterID: 51,
		Priority:        150,
		AuthPass:        "s3cr3tZq",
	}
}

func goldenCases() map[string]Config {
	cp := bootstrapInstance()
	cp.SourceIP, cp.Peers, cp.Priority = netip.MustParseAddr("10.100.0.11"), ips("10.100.0.5", "10.100.0.12", "10.100.0.13"), 100
	cp.TrackScript = &Script{
		Command:  []string{"/usr/bin/curl", "-sfk", "--max-time", "2", "https://127.0.0.1:6443/healthz"},
		Interval: 2 * time.Second, Fall: 3, Rise: 2, Weight: -60,
	}
	v3 := bootstrapInstance()
	v3.AuthPass, v3.AdvertInterval, v3.Nopreempt = "", 250*time.Millisecond, true
	// The appliance's default for a control plane (pkg/hostagent KeepalivedConfig): VRRPv3 at 250 ms
	// with the API track script in whole seconds.
	cpv3 := cp
	cpv3.AuthPass, cpv3.AdvertInterval = "", 250*time.Millisecond
	cpv3.TrackScript = &Script{
		Command:  []string{"/usr/bin/curl", "-sfk", "https://127.0.0.1:6443/readyz"},
		Interval: 2 * time.Second, Timeout: 2 * time.Second, Fall: 2, Rise: 1, Weight: 50,
	}
	v6 := Instance{
		Name: "api-vip6", Interface: goldenIface,
		SourceIP: netip.MustParseAddr("fd00:77::5"), Peers: ips("fd00:77::11", "fd00:77::12"),
		VIP: netip.MustParsePrefix("fd00:77::100/64"), VirtualRouterID: 52, Priority: 90,
		AdvertInterval: 1500 * time.Millisecond,
	}
	return map[string]Config{
		"bootstrap-v2":            {RouterID: "appliance", Instances: []Instance{bootstrapInstance()}},
		"control-plane-v2-health": {RouterID: "cp-1", ScriptUser: "nobody", Instances: []Instance{cp}},
		"v3-subsecond-nopreempt":  {Instances: []Instance{v3}},
		"control-plane-v3-health": {RouterID: "cp-1", ScriptUser: "nobody", Instances: []Instance{cpv3}},
		"dual-stack":              {RouterID: "cp-2", Instances: []Instance{v3, v6}},
	}
}

func TestRenderGolden(t *testing.T) {
	for name, c := range goldenCases() {
		t.Run(name, func(t *testing.T) {
			got, err := Render(c)
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			again, err := Render(c)
			if err != nil || !bytes.Equal(got, again) {
				t.Fatalf("rendering twice gave different bytes (err %v)", err)
			}
			path := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden (run with -update to create it): %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from Render output (run with -update after checking):\n--- got\n%s--- want\n%s", path, got, want)
			}
		})
	}
}

// TestRenderPeerOrder: the inventory's order must not change the bytes (no needless reloads).
func TestRenderPeerOrder(t *testing.T) {
	a, b := bootstrapInstance(), bootstrapInstance()
	slices.Reverse(b.Peers)
	ra, err1 := Render(Config{Instances: []Instance{a}})
	rb, err2 := Render(Config{Instances: []Instance{b}})
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ra, rb) {
		t.Errorf("peer order changed the rendered config:\n%s\n%s", ra, rb)
	}
}

func TestValidateFieldPaths(t *testing.T) {
	one := func(mut func(*Instance)) Config {
		in := bootstrapInstance()
		mut(&in)
		return Config{Instances: []Instance{in}}
	}
	script := &Script{Command: []string{"/usr/bin/curl", "https://127.0.0.1:6443/healthz"}}
	cases := []struct {
		name string
		c    Config
		want []string // every error's field path, in order
	}{
		{"no instances", Config{}, []string{"instances"}},
		{"bad router id and user", Config{RouterID: "a b", ScriptUser: "Root!", Instances: []Instance{bootstrapInstance()}},
			[]string{"routerID", "scriptUser"}},
		{"duplicate name and vrid", Config{Instances: []Instance{bootstrapInstance(), bootstrapInstance()}},
			[]string{"instances[1].name", "instances[1].virtualRouterID"}},
		{"empty instance", Config{Instances: []Instance{{}}}, []string{
			"instances[0].name", "instances[0].interface", "instances[0].virtualRouterID", "instances[0].priority",
			"instances[0].sourceIP", "instances[0].vip", "instances[0].peers"}},
		{"priority 255", one(func(in *Instance) { in.Priority = 255 }), []string{"instances[0].priority"}},
		{"interface too long", one(func(in *Instance) { in.Interface = "averyveryverylongname" }), []string{"instances[0].interface"}},
		{"interface with slash", one(func(in *Instance) { in.Interface = "a/b" }), []string{"instances[0].interface"}},
		{"zoned and mapped and loopback", one(func(in *Instance) {
			in.SourceIP = netip.MustParseAddr("fe80::1%eth0")
			in.Peers = ips("::ffff:10.100.0.11", "127.0.0.1", "224.0.0.18")
		}), []string{"instances[0].sourceIP", "instances[0].peers[0]", "instances[0].peers[1]", "instances[0].peers[2]"}},
		{"vip is network address", one(func(in *Instance) { in.VIP = netip.MustParsePrefix("10.100.0.0/24") }), []string{"instances[0].vip"}},
		{"vip is broadcast", one(func(in *Instance) { in.VIP = netip.MustParsePrefix("10.100.0.255/24") }), []string{"instances[0].vip"}},
		{"vip is source", one(func(in *Instance) { in.VIP = netip.MustParsePrefix("10.100.0.5/24") }), []string{"instances[0].vip"}},
		{"vip family differs", one(func(in *Instance) {
			in.AuthPass = ""
			in.VIP = netip.MustParsePrefix("fd00::100/64")
		}), []string{"instances[0].vip"}},
		{"peers wrong", one(func(in *Instance) {
			in.Peers = ips("10.100.0.11", "10.100.0.11", "10.100.0.5", "10.100.0.100", "fd00::1")
		}), []string{"instances[0].peers[1]", "instances[0].peers[2]", "instances[0].peers[3]", "instances[0].peers[4]"}},
		{"no peers", one(func(in *Instance) { in.Peers = nil }), []string{"instances[0].peers"}},
		{"auth pass too long", one(func(in *Instance) { in.AuthPass = "123456789" }), []string{"instances[0].authPass"}},
		{"auth pass comment char", one(func(in *Instance) { in.AuthPass = "ab#c" }), []string{"instances[0].authPass"}},
		{"auth with ipv6", one(func(in *Instance) {
			in.SourceIP, in.Peers, in.VIP = netip.MustParseAddr("fd00::5"), ips("fd00::6"), netip.MustParsePrefix("fd00::100/64")
		}), []string{"instances[0].authPass"}},
		{"v2 sub-second", one(func(in *Instance) { in.AdvertInterval = 500 * time.Millisecond }), []string{"instances[0].advertInterval"}},
		{"v2 too long", one(func(in *Instance) { in.AdvertInterval = 256 * time.Second }), []string{"instances[0].advertInterval"}},
		{"v3 not centiseconds", one(func(in *Instance) { in.AuthPass, in.AdvertInterval = "", 1234*time.Microsecond }), []string{"instances[0].advertInterval"}},
		{"negative interval", one(func(in *Instance) { in.AdvertInterval = -time.Second }), []string{"instances[0].advertInterval"}},
		{"script without user", one(func(in *Instance) { in.TrackScript = script }), []string{"scriptUser"}},
		{"script fields", Config{ScriptUser: "nobody", Instances: []Instance{func() Instance {
			in := bootstrapInstance()
			in.TrackScript = &Script{Command: []string{"curl", "a b", ""}, Interval: 1500 * time.Millisecond,
				Timeout: -time.Second, Weight: 254}
			return in
		}()}}, []string{"instances[0].trackScript.command[0]", "instances[0].trackScript.command[1]",
			"instances[0].trackScript.command[2]", "instances[0].trackScript.interval", "instances[0].trackScript.timeout",
			"instances[0].trackScript.weight"}},
		{"script empty command", Config{ScriptUser: "nobody", Instances: []Instance{func() Instance {
			in := bootstrapInstance()
			in.TrackScript = &Script{}
			return in
		}()}}, []string{"instances[0].trackScript.command"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(tc.c)
			if err == nil {
				t.Fatalf("Render accepted an invalid config; want errors at %v", tc.want)
			}
			var got []string
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				if !errors.Is(e, ErrInvalidConfig) {
					t.Errorf("error %q does not wrap ErrInvalidConfig", e)
				}
				msg := strings.TrimPrefix(e.Error(), ErrInvalidConfig.Error()+": ")
				path, _, ok := strings.Cut(msg, ": ")
				if !ok {
					t.Errorf("error %q has no field path", e)
				}
				got = append(got, path)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("field paths = %q, want %q\nerrors:\n%v", got, tc.want, err)
			}
		})
	}
}

func TestValidateNeverLeaksAuthPass(t *testing.T) {
	in := bootstrapInstance()
	in.AuthPass = "toolong-secret"
	_, err := Render(Config{Instances: []Instance{in}})
	if err == nil || strings.Contains(err.Error(), in.AuthPass) {
		t.Fatalf("want an error that does not quote the secret, got %v", err)
	}
}

func FuzzRender(f *testing.F) {
	f.Add("api-vip", "ens3", "10.0.0.1", "10.0.0.2", "10.0.0.100/24", uint8(1), uint8(100), "pass", int64(time.Second))
	f.Fuzz(func(t *testing.T, name, iface, src, peer, vip string, vrid, prio uint8, pass string, iv int64) {
		in := Instance{Name: name, Interface: iface, VirtualRouterID: vrid, Priority: prio, AuthPass: pass,
			AdvertInterval: time.Duration(iv)}
		in.SourceIP, _ = netip.ParseAddr(src)
		if a, err := netip.ParseAddr(peer); err == nil {
			in.Peers = []netip.Addr{a}
		}
		in.VIP, _ = netip.ParsePrefix(vip)
		out, err := Render(Config{Instances: []Instance{in}})
		if err != nil {
			return
		}
		// Anything accepted must stay one token per value: no injected lines or blocks.
		lines := 20
		if pass != "" {
			lines = 24
		}
		if strings.Count(string(out), "\n") != lines || strings.Count(string(out), "{") != strings.Count(string(out), "}") ||
			strings.ContainsAny(name+iface+pass, " \t\n\"{}#!") {
			t.Fatalf("accepted config with injectable values:\n%s", out)
		}
	})
}

// checkNS is a namespace with the interface the golden configs name, so `keepalived -t` finds it.
func checkNS(t *testing.T) *labns.NS {
	t.Helper()
	labns.RequireTool(t, "keepalived")
	ns := labns.New(t, "kachk")
	ns.MustRun("ip", "link", "add", goldenIface, "type", "veth", "peer", "name", goldenIface+"p")
	ns.MustRun("ip", "link", "set", goldenIface, "up")
	return ns
}

// TestCheckGolden: every rendered config passes the real `keepalived -t`.
func TestCheckGolden(t *testing.T) {
	ns := checkNS(t)
	for name, c := range goldenCases() {
		t.Run(name, func(t *testing.T) {
			conf, err := Render(c)
			if err != nil {
				t.Fatal(err)
			}
			if err := CheckIn(context.Background(), ns.Name, conf); err != nil {
				t.Errorf("keepalived -t rejected the rendered config: %v\n%s", err, conf)
			}
		})
	}
}

// TestCheckRejects: keepalived's own verdict reaches the caller, with its words.
func TestCheckRejects(t *testing.T) {
	ns := checkNS(t)
	good, err := Render(goldenCases()["bootstrap-v2"])
	if err != nil {
		t.Fatal(err)
	}
	withScript, err := Render(goldenCases()["control-plane-v2-health"])
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, conf, want string
	}{
		{"auth with VRRPv3", strings.Replace(string(good), "version 2", "version 3", 1), "does not support authentication"},
		{"sub-second VRRPv2", strings.Replace(string(good), "advert_int 1", "advert_int 0.5", 1), "must be an integer"},
		{"missing interface", strings.ReplaceAll(string(good), goldenIface, "nosuch0"), "doesn't exist"},
		{"unknown script user", strings.Replace(string(withScript), "script_user nobody", "script_user nosuchuser9", 1), "script uid/gid"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckIn(context.Background(), ns.Name, []byte(tc.conf))
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CheckIn = %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func TestClearPidFiles(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pid     string
		wantErr error
		kept    bool
	}{
		{"live process refuses", strconv.Itoa(os.Getpid()), ErrAlreadyRunning, true},
		{"dead pid removed", "2147483646", nil, false},
		{"garbage removed", "not-a-pid", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Process{Dir: t.TempDir()}
			f := filepath.Join(p.Dir, "vrrp.pid")
			if err := os.WriteFile(f, []byte(tc.pid+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := p.clearPidFiles(); !errors.Is(err, tc.wantErr) {
				t.Errorf("clearPidFiles = %v, want %v", err, tc.wantErr)
			}
			if _, err := os.Stat(f); (err == nil) != tc.kept {
				t.Errorf("pid file kept = %v, want %v", err == nil, tc.kept)
			}
		})
	}
}
