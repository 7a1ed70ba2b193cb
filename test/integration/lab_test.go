package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/airgap-appliance/appliance/pkg/applianced"
	"github.com/airgap-appliance/appliance/pkg/bootstrap"
	"github.com/airgap-appliance/appliance/test/labns"
)

// Lab addresses (test/lab/lab.sh): the bootstrap host and the nodes on both planes.
const (
	bootCP    = "10.100.0.2"
	httpsPort = "8443"
	applURL   = "https://" + bootCP + ":" + httpsPort
)

// lab is one namespace lab with a bootstrap configuration for it.
type lab struct {
	t      *testing.T
	prefix string
	dir    string // scratch: config, credentials, state
	config string
	state  string
	// skip lists phases not run (the service-only lab has no nodes to power).
	skip []string
}

// ns returns the full namespace name of a lab host ("boot", "cp1", …).
func (l *lab) ns(host string) string { return l.prefix + "-" + host }

// exec runs argv inside a lab host's namespace.
func (l *lab) exec(host string, argv ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", l.ns(host)}, argv...)...)
}

func (l *lab) run(host string, argv ...string) (string, error) {
	out, err := l.exec(host, argv...).CombinedOutput()
	return string(out), err
}

func (l *lab) mustRun(t *testing.T, host string, argv ...string) string {
	t.Helper()
	out, err := l.run(host, argv...)
	if err != nil {
		t.Fatalf("in %s: %v: %v\n%s", l.ns(host), argv, err, out)
	}
	return out
}

// dial opens (and closes) a TCP connection from a lab host within one second (bash's /dev/tcp).
func (l *lab) dial(host, addr, port string) error {
	out, err := l.run(host, "timeout", "1", "bash", "-c", "exec 3<>/dev/tcp/"+addr+"/"+port)
	if err != nil {
		return fmt.Errorf("%v %s", err, out)
	}
	return nil
}

// purge removes everything a lab of this prefix made under dir, also what a killed earlier run left
// running (test/lab/purge.sh).
func purge(t *testing.T, prefix, dir string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(repoRoot, "test", "lab", "purge.sh"), dir)
	cmd.Env = append(os.Environ(), "LAB_PREFIX="+prefix, "APPLIANCE_BIN="+filepath.Join(binDir, "appliance"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("purge.sh %s: %v\n%s", dir, err, out)
	}
	if len(out) > 0 {
		t.Logf("purge.sh %s:\n%s", dir, out)
	}
}

// newLab brings up a lab under its own namespace prefix and writes bootstrap.yaml for it.
func newLab(t *testing.T, prefix string) *lab {
	t.Helper()
	labns.RequireRoot(t)
	if _, err := os.Stat(filepath.Join(bundlePath, "bundle.yaml")); err != nil {
		if labns.InCI() {
			t.Fatalf("bundle fixture missing at %s: `make fixtures` builds it (%v)", bundlePath, err)
		}
		t.Skipf("SKIPPED: bundle fixture missing at %s; run `make fixtures`", bundlePath)
	}
	// A fixed directory per prefix, not t.TempDir(): a run killed mid-way (a timeout, a CI limit) leaves
	// its lab behind, and the next run of the suite finds it here and purges it before it starts.
	l := &lab{t: t, prefix: prefix, dir: filepath.Join(os.TempDir(), "appliance-lab-"+prefix), skip: []string{"power", "converge"}}
	purge(t, prefix, l.dir)
	if err := os.MkdirAll(l.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // registered first, so it runs last: after the suite's own orderly teardown
		if os.Getenv("E2E_KEEP") == "" {
			purge(t, prefix, l.dir)
		}
	})
	l.state = filepath.Join(l.dir, "state")
	labSh := filepath.Join(repoRoot, "test", "lab", "lab.sh")
	up := exec.Command(labSh, "up")
	up.Env = append(os.Environ(), "LAB_PREFIX="+prefix)
	if out, err := up.CombinedOutput(); err != nil {
		t.Fatalf("lab.sh up: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if _, err := applianced.Stop(l.state); err != nil {
			t.Errorf("stop appliance serve: %v", err)
		}
		// The namespaces are deleted by the purge registered above, which first kills whatever still
		// runs in them (a server started by a bootstrap run killed before it wrote the PID file).
		// Deleting them here first would hide such processes from it, and they would outlive the test.
	})
	creds := filepath.Join(l.dir, "creds")
	if err := os.MkdirAll(creds, 0o700); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(creds, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	pub, _ := os.ReadFile(key + ".pub")
	fields := strings.Fields(string(pub))
	var kh strings.Builder
	for _, ip := range []string{"10.100.0.11", "10.100.0.12", "10.100.0.13"} {
		fmt.Fprintf(&kh, "%s %s %s\n", ip, fields[0], fields[1])
	}
	mustWrite(t, filepath.Join(creds, "known_hosts"), kh.String())
	mustWrite(t, filepath.Join(creds, "bmc-w1"), "lab-bmc-secret\n")
	l.config = filepath.Join(l.dir, "bootstrap.yaml")
	var buf bytes.Buffer
	if err := configTemplate.Execute(&buf, map[string]string{
		"Bundle": bundlePath, "BundleKey": bundleKey, "State": l.state, "Creds": creds, "Name": prefix,
	}); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, l.config, buf.String())
	return l
}

var configTemplate = template.Must(template.New("cfg").Parse(`apiVersion: appliance.airgap.dev/v1alpha1
kind: BootstrapConfiguration
clusterName: {{.Name}}
networks:
  controlPlane: {cidrs: [10.100.0.0/24]}
  workloadPlane: {cidrs: [10.200.0.0/24]}
  services: 10.96.0.0/16 # the default 10.96.0.0/12 would contain the lab's 10.100.0.0/24
apiServer:
  vip: 10.100.0.100
bundle:
  path: {{.Bundle}}
  publicKeyFiles: [{{.BundleKey}}]
server:
  port: 8443
  names: [appliance.lab]
stateDir: {{.State}}
nodes:
- name: cp1
  roles: [control-plane]
  addresses: [10.100.0.11, 10.200.0.11]
  power: {kind: ssh, privateKeyFile: {{.Creds}}/id_ed25519, knownHostsFile: {{.Creds}}/known_hosts}
- name: cp2
  roles: [control-plane]
  addresses: [10.100.0.12, 10.200.0.12]
  power: {kind: ssh, privateKeyFile: {{.Creds}}/id_ed25519, knownHostsFile: {{.Creds}}/known_hosts}
- name: cp3
  roles: [control-plane]
  addresses: [10.100.0.13, 10.200.0.13]
  power: {kind: ssh, privateKeyFile: {{.Creds}}/id_ed25519, knownHostsFile: {{.Creds}}/known_hosts}
- name: w1
  roles: [worker]
  addresses: [10.100.0.21, 10.200.0.21]
  power: {kind: ipmi, address: 10.100.0.121, username: admin, passwordFile: {{.Creds}}/bmc-w1}
`))

func mustWrite(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// bootstrapRun is one `appliance bootstrap -o json` in the bootstrap namespace.
type bootstrapRun struct {
	events []bootstrap.Event
	report map[string]any
	stderr string
	err    error
}

// phase returns the final event of a phase.
func (r bootstrapRun) phase(name string) (bootstrap.Event, bool) {
	for i := len(r.events) - 1; i >= 0; i-- {
		if r.events[i].Phase == name && r.events[i].Status != bootstrap.StatusStarted {
			return r.events[i], true
		}
	}
	return bootstrap.Event{}, false
}

// bootstrap runs the appliance; killAt, if not empty, SIGKILLs it when that phase starts;
// killAfter, if not zero, SIGKILLs it that long after the start.
func (l *lab) bootstrap(ctx context.Context, killAt string, killAfter time.Duration, extra ...string) bootstrapRun {
	l.t.Helper()
	args := append([]string{filepath.Join(binDir, "appliance"), "bootstrap", "--config", l.config, "-o", "json"}, extra...)
	if len(l.skip) > 0 {
		args = append(args, "--skip-phases", strings.Join(l.skip, ","))
	}
	cmd := l.exec("boot", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		l.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	var r bootstrapRun
	if killAfter > 0 {
		timer := time.AfterFunc(killAfter, func() { _ = cmd.Process.Kill() })
		defer timer.Stop()
	}
	sc := bufio.NewScanner(stdout)
	killed := false
	for sc.Scan() {
		line := sc.Bytes()
		var ev bootstrap.Event
		if json.Unmarshal(line, &ev) == nil && ev.Phase != "" {
			r.events = append(r.events, ev)
			if !killed && killAt != "" && ev.Phase == killAt && ev.Status == bootstrap.StatusStarted {
				_ = cmd.Process.Kill()
				killed = true
			}
			continue
		}
		var rep map[string]any
		if json.Unmarshal(line, &rep) == nil {
			r.report = rep
		}
	}
	r.err = cmd.Wait()
	r.stderr = stderr.String()
	if killAt != "" && !killed {
		l.t.Fatalf("phase %s never started; events %+v\nstderr: %s", killAt, r.events, r.stderr)
	}
	return r
}

func (l *lab) mustBootstrap(ctx context.Context) bootstrapRun {
	l.t.Helper()
	r := l.bootstrap(ctx, "", 0)
	if r.err != nil {
		l.t.Fatalf("appliance bootstrap: %v\nevents: %+v\nstderr:\n%s", r.err, r.events, r.stderr)
	}
	for _, name := range l.phases() {
		ev, ok := r.phase(name)
		if !ok || ev.Status != bootstrap.StatusDone {
			l.t.Fatalf("phase %s: %+v (ok=%v)\nstderr:\n%s", name, ev, ok, r.stderr)
		}
	}
	if slices.Contains(l.skip, "converge") {
		if ev, ok := r.phase("upgrade"); !ok || ev.Status != bootstrap.StatusSkipped || !strings.HasPrefix(ev.Detail, "needs converge, which --skip-phases skipped") {
			l.t.Fatalf("phase upgrade with converge skipped: %+v (ok=%v), want it skipped because it needs converge\nstderr:\n%s", ev, ok, r.stderr)
		}
	}
	return r
}

// phases lists the phases this lab runs to the end: not those it skips, nor upgrade when it skips
// converge (upgrade then skips itself and says why: the lab's nodes never converged).
func (l *lab) phases() []string {
	var out []string
	for _, p := range bootstrap.PhaseNames() {
		if !slices.Contains(l.skip, p) && (p != "upgrade" || !slices.Contains(l.skip, "converge")) {
			out = append(out, p)
		}
	}
	return out
}

// waitFor polls f every 100 ms until it succeeds or d passes (bounded waits for real processes).
func waitFor(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
