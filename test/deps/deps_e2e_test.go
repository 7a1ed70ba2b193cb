//go:build e2e

package deps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

// suite is the Debian release the README promises (Debian 12).
const suite = "bookworm"

// TestMakeDepsOnBareDebian runs `make deps` as a new user would, on a bare Debian 12, and then looks
// for every program the suites call (suiteTools).
//
//   - The root: `debootstrap --variant=minbase --include=make bookworm` (Debian's smallest system, plus
//     the make the user types), from this machine's mirror; its apt sources are this machine's (same
//     mirror and suites), and so are the two Acquire settings this mirror (a dated snapshot) needs.
//   - Go: the README asks for it in /usr/local/go with /usr/local/go/bin on PATH; this machine's GOROOT
//     is bind-mounted read-only there (deps.sh checks its version against go.mod).
//   - The repository is bind-mounted read-only at /src: `make deps` writes nothing into it.
//   - The network: the container (systemd-nspawn, not booted) runs in a network namespace of the test's
//     own with only loopback up. On 127.0.0.1 there a listener of this test process (made inside that
//     namespace) is an HTTP proxy that forwards GET/HEAD to the mirror's host:port only, and apt is told
//     to use it. No route leaves the namespace, so the mirror is the only reachable peer; what the proxy
//     refused fails the test.
//   - Host changes: none. debootstrap and every nspawn run in private mount namespaces (nspawn's tmpfs
//     on /run/systemd/nspawn is mounted there), the container's files live in a temporary directory
//     removed at the end, failed or not.
//
// Then `make deps` again must install nothing and fetch nothing, and every tool must be found the way
// labns.RequireTool finds it (PATH, then /usr/sbin, /sbin, the dracut ignition directory). A missing one
// is reported with the call sites and the Debian package that provides it on this machine.
// Wall time here (2 cores, beside other suites, at nice 19): 5.5-8.5 min, debootstrap ~3 min and `make deps`
// 2-4.5 min (293 requests, 231 MB from the mirror); run with -timeout 45m.
func TestMakeDepsOnBareDebian(t *testing.T) {
	labns.RequireRoot(t)
	for _, tool := range []string{"debootstrap", "systemd-nspawn", "unshare", "mount", "make", "dpkg-query", "go"} {
		labns.RequireTool(t, tool)
	}
	repo := repoRoot(t)
	tools, unresolved, err := suiteTools(repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(unresolved) > 0 {
		t.Fatalf("RequireTool calls whose tool name cannot be read (see TestSuiteToolsDerived): %v", unresolved)
	}
	debPackages := makeVariable(t, repo, "DEB_PACKAGES")
	goroot := strings.TrimSpace(mustOutput(t, exec.Command("go", "env", "GOROOT")))

	sources, err := aptSources("/etc/apt")
	if err != nil {
		t.Fatal(err)
	}
	uris, err := sourceURIs(sources)
	if err != nil || len(uris) == 0 {
		t.Fatalf("this machine's apt sources name no mirror (%v): %v", err, sources)
	}
	var allowed []string
	for _, u := range uris {
		if u.Scheme != "http" {
			t.Fatalf("apt source %s: the test's proxy forwards plain http only", u)
		}
		hp := u.Host
		if u.Port() == "" {
			hp = net.JoinHostPort(u.Hostname(), "80")
		}
		allowed = append(allowed, hp)
	}
	slices.Sort(allowed)
	allowed = slices.Compact(allowed)

	work := tempDir(t)
	root := filepath.Join(work, "root")

	// The namespace and the proxy inside it.
	ns := labns.New(t, "deps")
	var ln net.Listener
	if err := labns.InNamespace(ns.Path(), func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatalf("listen in %s: %v", ns, err)
	}
	proxy := newMirrorProxy(allowed)
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 30 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	t.Logf("apt's proxy: %s in %s, forwarding to %v only", ln.Addr(), ns, allowed)

	// A bare Debian 12.
	start := time.Now()
	mirror := uris[0].String()
	out, err := runBounded(t, 15*time.Minute, "unshare", "--mount", "--propagation", "private", "--",
		"debootstrap", "--variant=minbase", "--include=make", suite, root, mirror)
	if err != nil {
		t.Fatalf("debootstrap %s from %s: %v\n%s", suite, mirror, err, tail(out, 30))
	}
	t.Logf("debootstrap --variant=minbase %s: %.0f s", suite, time.Since(start).Seconds())
	configureApt(t, root, sources, ln.Addr().String())

	nspawn := func(timeout time.Duration, argv ...string) (string, error) {
		args := []string{"--mount", "--propagation", "private", "--", "bash", "-c",
			`mount -t tmpfs -o mode=0755,size=16m appliance-deps-nspawn /run/systemd/nspawn && exec systemd-nspawn "$@"`, "nspawn",
			"--quiet", "--directory=" + root, "--machine=appliance-deps", "--register=no", "--keep-unit", "--console=pipe",
			"--link-journal=no", "--resolv-conf=off", "--timezone=off", "--as-pid2",
			"--network-namespace-path=" + ns.Path(),
			"--bind-ro=" + goroot + ":/usr/local/go", "--bind-ro=" + repo + ":/src", "--chdir=/src",
			"--setenv=PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"--"}
		return runBounded(t, timeout, append(append([]string{"unshare"}, args...), argv...)...)
	}
	if err := os.MkdirAll("/run/systemd/nspawn", 0o755); err != nil {
		t.Fatal(err)
	}

	// make deps, as the user types it.
	start = time.Now()
	out, err = nspawn(30*time.Minute, "make", "deps", "V=1")
	requests, mb, refused, failed := proxy.counts()
	t.Logf("make deps: %.0f s; %d requests to the mirror, %.0f MB", time.Since(start).Seconds(), requests, float64(mb)/1e6)
	if len(refused) > 0 {
		t.Errorf("the container asked the proxy for something other than the mirror (refused): %q", refused)
	}
	if len(failed) > 0 {
		t.Errorf("requests to the mirror that failed: %q", failed)
	}
	if err != nil {
		t.Fatalf("make deps on a bare Debian 12: %v\n%s", err, tail(out, 60))
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "deps: ") || strings.HasPrefix(l, "[stage] ") {
			t.Log(strings.TrimSpace(ansi.ReplaceAllString(l, "")))
		}
	}

	// Again: nothing to install, nothing fetched.
	out, err = nspawn(5*time.Minute, "make", "deps", "V=1")
	if err != nil {
		t.Fatalf("make deps, second run: %v\n%s", err, tail(out, 30))
	}
	want := fmt.Sprintf("deps: all %d Debian packages installed", len(debPackages))
	if !strings.Contains(out, want) {
		t.Errorf("make deps, second run: want %q in its output:\n%s", want, tail(out, 20))
	}
	if again, _, _, _ := proxy.counts(); again != requests {
		t.Errorf("make deps, second run: %d requests to the mirror, want none", again-requests)
	}

	// Every tool, found the way labns.RequireTool finds it.
	names := make([]string, 0, len(tools))
	for n := range tools {
		names = append(names, n)
	}
	slices.Sort(names)
	const check = `for t in "$@"; do
	if p=$(command -v "$t"); then echo "found $t $p"; continue; fi
	for d in /usr/sbin /sbin /usr/lib/dracut/modules.d/30ignition; do
		if [ -f "$d/$t" ] && [ -x "$d/$t" ]; then echo "found $t $d/$t"; continue 2; fi
	done
	echo "missing $t"
done`
	out, err = nspawn(2*time.Minute, append([]string{"bash", "-c", check, "check"}, names...)...)
	if err != nil {
		t.Fatalf("tool check: %v\n%s", err, tail(out, 30))
	}
	found := map[string]bool{}
	var missing []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 3 && f[0] == "found":
			found[f[1]] = true
		case len(f) == 2 && f[0] == "missing":
			missing = append(missing, f[1])
		}
	}
	for _, name := range missing {
		t.Errorf("%s is missing after `make deps` on a bare Debian 12 (called at %s); %s",
			name, strings.Join(tools[name], ", "), providedBy(name, debPackages))
	}
	if len(found)+len(missing) != len(names) {
		t.Errorf("tool check answered for %d of %d tools:\n%s", len(found)+len(missing), len(names), tail(out, 30))
	}
	t.Logf("%d of %d tools present after make deps", len(found), len(names))
}

// configureApt gives the container this machine's apt sources, the Acquire settings its mirror needs,
// and the proxy.
func configureApt(t *testing.T, root string, sources map[string]string, proxy string) {
	t.Helper()
	etc := filepath.Join(root, "etc/apt")
	if err := os.Remove(filepath.Join(etc, "sources.list")); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for rel, text := range sources {
		if err := os.WriteFile(filepath.Join(etc, rel), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	conf := "// test/deps: the container reaches the Debian mirror only through the test's proxy.\n" +
		fmt.Sprintf("Acquire::http::Proxy %q;\n", "http://"+proxy+"/")
	// This machine's mirror is a dated snapshot: its apt accepts Release files past their Valid-Until
	// (and dated ahead of the clock), so the container's must too.
	dump := mustOutput(t, exec.Command("apt-config", "dump"))
	for _, l := range strings.Split(dump, "\n") {
		if strings.HasPrefix(l, "Acquire::Check-Valid-Until ") || strings.HasPrefix(l, "Acquire::Check-Date ") {
			conf += l + "\n"
		}
	}
	if err := os.WriteFile(filepath.Join(etc, "apt.conf.d/90appliance-deps-test"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
}

// providedBy says which Debian package provides name on this machine (where the suites run) and
// whether DEB_PACKAGES names it.
func providedBy(name string, debPackages []string) string {
	p := ""
	if strings.HasPrefix(name, "/") {
		p = name
	} else if lp, err := exec.LookPath(name); err == nil {
		p = lp
	} else {
		for _, d := range []string{"/usr/sbin", "/sbin", "/usr/lib/dracut/modules.d/30ignition"} {
			if st, err := os.Stat(filepath.Join(d, name)); err == nil && st.Mode().IsRegular() {
				p = filepath.Join(d, name)
				break
			}
		}
	}
	if p == "" {
		return "it is not installed on this machine either"
	}
	cands := []string{p}
	if r, err := filepath.EvalSymlinks(p); err == nil && r != p {
		cands = append(cands, r)
	}
	for _, c := range slices.Clone(cands) { // merged /usr: dpkg knows one spelling
		if rest, ok := strings.CutPrefix(c, "/usr"); ok {
			cands = append(cands, rest)
		} else {
			cands = append(cands, "/usr"+c)
		}
	}
	for _, c := range cands {
		out, err := exec.Command("dpkg-query", "-S", c).Output()
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(out), "\n") {
			pkgs, _, ok := strings.Cut(l, ": ")
			if !ok || strings.HasPrefix(l, "diversion ") {
				continue
			}
			for _, pkg := range strings.Split(pkgs, ", ") {
				pkg = strings.Split(pkg, ":")[0] // drop :amd64
				if slices.Contains(debPackages, pkg) {
					return fmt.Sprintf("on this machine %s comes from Debian package %s, which DEB_PACKAGES names: "+
						"apt-get install --no-install-recommends %s does not bring it in a bare root", p, pkg, pkg)
				}
				return fmt.Sprintf("on this machine %s comes from Debian package %s: add %s to DEB_PACKAGES (Makefile)", p, pkg, pkg)
			}
		}
	}
	return fmt.Sprintf("on this machine it is %s, which no Debian package provides (installed by hand?)", p)
}

// makeVariable is the value of a Makefile variable, as make itself expands it, split into words.
func makeVariable(t *testing.T, repo, name string) []string {
	t.Helper()
	out := mustOutput(t, exec.Command("make", "-s", "--no-print-directory", "-C", repo,
		"--eval", fmt.Sprintf("print-variable-for-test-deps: ; @echo $(%s)", name), "print-variable-for-test-deps"))
	words := strings.Fields(out)
	if len(words) == 0 {
		t.Fatalf("the Makefile's %s is empty", name)
	}
	return words
}

// runBounded runs argv with a bound: past it SIGTERM (systemd-nspawn then kills its container), SIGKILL
// 30 s later. It returns the combined output.
func runBounded(t *testing.T, bound time.Duration, argv ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (bound %s)", ctx.Err(), bound)
	}
	return buf.String(), err
}

// tempDir is a directory for the container's files, removed at the end with `rm -rf --one-file-system`
// (never into a mount below it: there should be none, everything mounted lives in private mount
// namespaces).
func tempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "appliance-deps-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("rm", "-rf", "--one-file-system", dir).CombinedOutput(); err != nil {
			t.Errorf("remove %s: %v\n%s", dir, err, out)
		}
	})
	return dir
}

func mustOutput(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, ee.Stderr)
		}
		t.Fatalf("%s: %v", strings.Join(cmd.Args, " "), err)
	}
	return string(out)
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)

// tail is the last n lines of out.
func tail(out string, n int) string {
	lines := strings.Split(strings.TrimRight(ansi.ReplaceAllString(out, ""), "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"… (" + strconv.Itoa(len(lines)-n) + " lines before)"}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
