// Package lab tests lab.sh, the namespace lab: an air-gapped two-plane L2 fabric built from network
// namespaces (see lab.sh for the topology and LAB.md for the safety rules).
package lab

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/test/labns"
)

// prefix keeps the test's lab apart from a lab a person runs with the default prefix "lab".
const prefix = "labt"

func lab(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return labEnv(t, nil, args...)
}

// labEnv runs lab.sh with the test's prefix and the extra environment env (NAME=VALUE).
func labEnv(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"lab.sh"}, args...)...)
	cmd.Env = append(append(os.Environ(), "LAB_PREFIX="+prefix), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func mustLab(t *testing.T, args ...string) string {
	t.Helper()
	out, err := lab(t, args...)
	if err != nil {
		t.Fatalf("lab.sh %v: %v\n%s", args, err, out)
	}
	return out
}

func run(t *testing.T, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", argv, err, out)
	}
	return string(out)
}

var expires = regexp.MustCompile(`expires \d+sec`)

// rootNetState is everything about the root namespace's network that the lab must not change.
func rootNetState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, argv := range [][]string{
		{"ip", "-br", "link"},
		{"ip", "-br", "addr"},
		{"ip", "-4", "route", "show", "table", "all"},
		{"ip", "-6", "route", "show", "table", "all"},
		{"ip", "-4", "rule"},
	} {
		b.WriteString(expires.ReplaceAllString(run(t, argv...), "expires"))
	}
	return b.String()
}

func labNamespaces(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(run(t, "ip", "netns", "list"), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], prefix+"-") {
			out = append(out, f[0])
		}
	}
	return out
}

func TestLabUpDown(t *testing.T) {
	labns.RequireRoot(t)
	labns.RequireTool(t, "ip")
	ping := labns.RequireTool(t, "ping")
	if _, err := lab(t, "down"); err != nil { // leftovers of an interrupted run
		t.Fatalf("initial down: %v", err)
	}
	// A namespace that shares the prefix but is not the lab's: down must leave it alone.
	decoy := labns.New(t, prefix)

	before := rootNetState(t)
	t.Cleanup(func() { _, _ = lab(t, "down") })

	mustLab(t, "up")
	status := mustLab(t, "up") // idempotent: a rerun succeeds and changes nothing
	nodes := map[string]string{"cp1": "11", "cp2": "12", "cp3": "13", "w1": "21", "boot": "2"}
	for n, host := range nodes {
		for _, want := range []string{prefix + "-" + n + ":", "10.100.0." + host + "/24", "10.200.0." + host + "/24"} {
			if !strings.Contains(status, want) {
				t.Errorf("status after up lacks %q:\n%s", want, status)
			}
		}
	}
	if got := len(labNamespaces(t)); got != 7 { // fabric, boot, 3 control planes, 1 worker, the decoy
		t.Errorf("after up: %d namespaces with prefix %s-, want 7: %v", got, prefix, labNamespaces(t))
	}

	t.Run("ping both planes", func(t *testing.T) {
		for _, tc := range []struct{ from, to string }{
			{"cp1", "10.100.0.2"}, {"cp1", "10.200.0.2"},
			{"cp3", "10.100.0.2"}, {"w1", "10.200.0.2"},
			{"w1", "10.100.0.11"}, {"boot", "10.200.0.13"},
		} {
			out, err := exec.Command("ip", "netns", "exec", prefix+"-"+tc.from, ping, "-c", "1", "-W", "3", tc.to).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "1 received") {
				t.Errorf("ping %s → %s: %v\n%s", tc.from, tc.to, err, out)
			}
		}
	})

	t.Run("air gap", func(t *testing.T) {
		for _, ns := range labNamespaces(t) {
			if ns == decoy.Name {
				continue
			}
			for _, fam := range []string{"-4", "-6"} {
				if out := run(t, "ip", "-n", ns, fam, "route", "show", "default"); strings.TrimSpace(out) != "" {
					t.Errorf("%s has a default route (%s): %s", ns, fam, out)
				}
			}
			// A route lookup sends no packet; it must find no way out of the lab.
			if out, err := exec.Command("ip", "-n", ns, "route", "get", "192.0.2.1").CombinedOutput(); err == nil {
				t.Errorf("%s can route to 192.0.2.1: %s", ns, out)
			}
		}
		if out := run(t, "ip", "-n", prefix+"-fabric", "-br", "addr"); regexp.MustCompile(`\d+\.\d+\.\d+\.\d+/|fe80::`).MatchString(
			strings.ReplaceAll(out, "127.0.0.1/8", "")) {
			t.Errorf("fabric namespace has addresses (want pure L2):\n%s", out)
		}
	})

	if after := rootNetState(t); after != before {
		t.Errorf("root namespace network changed by lab up:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	out := mustLab(t, "down")
	if strings.Contains(out, decoy.Name) {
		t.Errorf("down deleted a namespace it does not own:\n%s", out)
	}
	left := labNamespaces(t)
	if len(left) != 1 || left[0] != decoy.Name {
		t.Errorf("after down, namespaces with prefix %s-: %v, want only the decoy %s", prefix, left, decoy.Name)
	}
	if after := rootNetState(t); after != before {
		t.Errorf("root namespace network changed after lab down:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if !strings.Contains(mustLab(t, "status"), "no lab namespaces") {
		t.Errorf("status after down still lists namespaces")
	}
}

// TestLabTwoSubnets: with LAB_WL_SUBNETS=2 the workers' workload-plane addresses sit in a second
// subnet (10.201.0.0/24) behind the router namespace P-rtr, as issue 13's two-subnet lab asks. A packet
// from a control plane's workload-plane address to a worker's crosses exactly one router (the reply's
// TTL is one less than the sender's 64), the control-plane network stays one segment (TTL 64), the two
// workload-plane bridges share no L2 (no worker address answers ARP on br-wl), and nothing leaves the lab.
func TestLabTwoSubnets(t *testing.T) {
	labns.RequireRoot(t)
	ping := labns.RequireTool(t, "ping")
	two := []string{"LAB_WL_SUBNETS=2", "LAB_WORKER_KIND=nspawn"}
	if _, err := labEnv(t, two, "down"); err != nil {
		t.Fatalf("initial down: %v", err)
	}
	before := rootNetState(t)
	t.Cleanup(func() { _, _ = labEnv(t, two, "down") })
	// The one-segment lab first, as test suites make it before they ask for more: the second `up`
	// moves the workers' workload-plane addresses, leaving none of the first subnet's behind.
	if out, err := labEnv(t, []string{"LAB_WORKER_KIND=nspawn"}, "up", "2", "2"); err != nil {
		t.Fatalf("lab.sh up 2 2: %v\n%s", err, out)
	}
	out, err := labEnv(t, two, "up", "2", "2")
	if err != nil {
		t.Fatalf("lab.sh up 2 2 with LAB_WL_SUBNETS=2: %v\n%s", err, out)
	}
	for _, want := range []string{prefix + "-rtr:", "10.200.0.1/24", "10.201.0.1/24", "10.201.0.21/24", "10.201.0.22/24", "10.200.0.12/24", "10.100.0.22/24"} {
		if !strings.Contains(out, want) {
			t.Errorf("status after up lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "10.200.0.21/") {
		t.Errorf("w1 still has a first-subnet workload-plane address:\n%s", out)
	}
	ttl := regexp.MustCompile(`ttl=(\d+)`)
	for _, tc := range []struct {
		from, to string
		ttl      string
	}{
		{"cp1", "10.201.0.21", "63"}, {"w2", "10.200.0.12", "63"}, {"boot", "10.201.0.22", "63"},
		{"w1", "10.201.0.22", "64"}, {"cp1", "10.100.0.21", "64"}, {"w1", "10.100.0.2", "64"},
	} {
		out, err := exec.Command("ip", "netns", "exec", prefix+"-"+tc.from, ping, "-c", "1", "-W", "3", tc.to).CombinedOutput()
		m := ttl.FindStringSubmatch(string(out))
		if err != nil || m == nil || m[1] != tc.ttl {
			t.Errorf("ping %s → %s: %v, want a reply with ttl=%s (%s):\n%s", tc.from, tc.to, err, tc.ttl,
				map[string]string{"63": "one router", "64": "one segment"}[tc.ttl], out)
		}
	}
	// No L2 path between the workload-plane subnets: with a worker's second-subnet address made on-link
	// on cp1's first-subnet interface, cp1 asks for it by ARP on br-wl and gets no answer.
	onlink := []string{"ip", "-n", prefix + "-cp1", "route", "replace", "10.201.0.21/32", "dev", "eth1"}
	run(t, onlink...)
	if out, err := exec.Command("ip", "netns", "exec", prefix+"-cp1", ping, "-c", "1", "-W", "2", "10.201.0.21").CombinedOutput(); err == nil {
		t.Errorf("10.201.0.21 answered on the first subnet's segment (the subnets share L2):\n%s", out)
	}
	onlink[4] = "del"
	run(t, onlink...)
	for _, ns := range labNamespaces(t) {
		if out, err := exec.Command("ip", "-n", ns, "route", "get", "192.0.2.1").CombinedOutput(); err == nil {
			t.Errorf("%s can route to 192.0.2.1: %s", ns, out)
		}
	}
	if after := rootNetState(t); after != before {
		t.Errorf("root namespace network changed by lab up:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	out, err = labEnv(t, two, "down")
	if err != nil || !strings.Contains(out, "deleted "+prefix+"-rtr") {
		t.Errorf("lab.sh down: %v, want %s-rtr deleted:\n%s", err, prefix, out)
	}
	if left := labNamespaces(t); len(left) != 0 {
		t.Errorf("after down: %v", left)
	}
}

func TestLabRejectsBadInput(t *testing.T) {
	labns.RequireRoot(t)
	tests := []struct {
		name   string
		env    string
		args   []string
		stderr string
	}{
		{"long prefix", "LAB_PREFIX=toolongprefix", []string{"status"}, "must be 1-6 characters"},
		{"prefix with dash", "LAB_PREFIX=a-b", []string{"status"}, "must be 1-6 characters"},
		{"too many control planes", "LAB_PREFIX=" + prefix, []string{"up", "10"}, "CONTROL_PLANES must be 1-9"},
		{"bad workers", "LAB_PREFIX=" + prefix, []string{"up", "1", "x"}, "WORKERS must be 0-79"},
		{"unknown verb", "LAB_PREFIX=" + prefix, []string{"destroy"}, "usage:"},
		{"three workload subnets", "LAB_WL_SUBNETS=3", []string{"status"}, "LAB_WL_SUBNETS '3' must be 1 or 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("bash", append([]string{"lab.sh"}, tc.args...)...)
			cmd.Env = append(os.Environ(), tc.env)
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.stderr) {
				t.Errorf("lab.sh %v with %s: %v, %s; want failure with %q", tc.args, tc.env, err, out, tc.stderr)
			}
			if n := len(labNamespaces(t)); n != 0 {
				t.Errorf("rejected input still created %d namespaces", n)
			}
		})
	}
}
