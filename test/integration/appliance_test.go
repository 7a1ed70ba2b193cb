package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/bootstrap"
	"github.com/airgap-appliance/appliance/test/labns"
)

// TestApplianceOnLab bootstraps the appliance once in the lab's bootstrap namespace and checks
// every service with real clients from the node namespaces.
func TestApplianceOnLab(t *testing.T) {
	l := newLab(t, "it")
	ctx := context.Background()

	// --dry-run on a fresh state: every phase's check runs and says what it would change; nothing is
	// created, not even the state directory.
	fresh := l.bootstrap(ctx, "", 0, "--dry-run")
	if fresh.err != nil {
		t.Fatalf("dry run on a fresh state: %v\n%s", fresh.err, fresh.stderr)
	}
	for _, name := range []string{"pki", "bundle", "render", "firewall", "serve"} {
		if ev, ok := fresh.phase(name); !ok || ev.Status != bootstrap.StatusDone || !ev.Changed {
			t.Errorf("dry run on a fresh state: phase %s = %+v, want done with changes to make", name, ev)
		}
	}
	if fresh.report["dryRun"] != true || fresh.report["changes"] != true {
		t.Errorf("dry run report %v, want dryRun and changes", fresh.report)
	}
	if _, err := os.Stat(l.state); !os.IsNotExist(err) {
		t.Fatalf("dry run created the state directory %s (%v)", l.state, err)
	}

	first := l.mustBootstrap(ctx)
	if ev, _ := first.phase("pki"); !ev.Changed {
		t.Errorf("first run: pki phase reported no change: %+v", ev)
	}
	caDir := filepath.Join(l.state, "pki")
	caFile := filepath.Join(caDir, "ca.crt")
	certDir := t.TempDir() // skopeo --cert-dir wants *.crt files only
	copyFile(t, caFile, filepath.Join(certDir, "ca.crt"))

	t.Run("second run changes nothing", func(t *testing.T) {
		r := l.mustBootstrap(ctx)
		for _, name := range l.phases() {
			if ev, _ := r.phase(name); ev.Changed {
				t.Errorf("phase %s changed something on the second run: %s", name, ev.Detail)
			}
		}
		if r.report["changed"] != false {
			t.Errorf("report says changed: %v", r.report)
		}
	})

	t.Run("dry run after a run reports zero changes and writes nothing", func(t *testing.T) {
		before, _ := os.ReadFile(filepath.Join(l.state, "journal.jsonl"))
		r := l.bootstrap(ctx, "", 0, "--dry-run")
		if r.err != nil {
			t.Fatalf("dry run: %v\n%s", r.err, r.stderr)
		}
		for _, name := range l.phases() {
			if ev, _ := r.phase(name); ev.Changed || ev.Status != bootstrap.StatusDone {
				t.Errorf("dry run: phase %s = %+v, want done without changes", name, ev)
			}
		}
		if r.report["changes"] != false {
			t.Errorf("dry run report %v, want zero changes", r.report)
		}
		if after, _ := os.ReadFile(filepath.Join(l.state, "journal.jsonl")); !bytes.Equal(before, after) {
			t.Error("a dry run wrote the journal")
		}
	})

	t.Run("skopeo pulls a bundle image over HTTPS with the CA", func(t *testing.T) {
		labns.RequireTool(t, "skopeo")
		out := t.TempDir()
		l.mustRun(t, "cp1", "skopeo", "copy", "--src-cert-dir", certDir,
			"docker://"+bootCP+":"+httpsPort+"/registry.k8s.io/pause:3.10", "oci:"+out+":pause")
		idx, err := os.ReadFile(filepath.Join(out, "index.json"))
		if err != nil || !strings.Contains(string(idx), "sha256:") {
			t.Fatalf("pulled layout has no manifest: %v %s", err, idx)
		}
	})

	t.Run("skopeo without the CA fails with an x509 error", func(t *testing.T) {
		out, err := l.run("cp1", "skopeo", "inspect", "--cert-dir", t.TempDir(),
			"docker://"+bootCP+":"+httpsPort+"/registry.k8s.io/pause:3.10")
		if err == nil || !strings.Contains(out, "x509") {
			t.Fatalf("want an x509 failure without the CA, got err=%v\n%s", err, out)
		}
	})

	t.Run("a push over the network is refused", func(t *testing.T) {
		src := t.TempDir()
		l.mustRun(t, "cp1", "skopeo", "copy", "--src-cert-dir", certDir,
			"docker://"+bootCP+":"+httpsPort+"/docker.io/library/busybox:1.35", "oci:"+src+":b")
		out, err := l.run("cp1", "skopeo", "copy", "--dest-cert-dir", certDir,
			"oci:"+src+":b", "docker://"+bootCP+":"+httpsPort+"/docker.io/library/pushed:evil")
		if err == nil {
			t.Fatalf("push succeeded:\n%s", out)
		}
		if _, err := l.run("cp1", "skopeo", "inspect", "--cert-dir", certDir,
			"docker://"+bootCP+":"+httpsPort+"/docker.io/library/pushed:evil"); err == nil {
			t.Fatal("pushed image is pullable")
		}
	})

	t.Run("ignition endpoint refuses a wrong or missing token alike", func(t *testing.T) {
		token := readToken(t, l, "cp1")
		get := func(node, tok string) (int, string) {
			out, err := l.run("cp1", "curl", "-s", "--cacert", caFile, "-o", "/dev/stdout", "-w", "\n%{http_code}",
				"-H", "Accept: application/vnd.coreos.ignition+json;version=3.3.0", "-H", "Authorization: Bearer "+tok, applURL+"/ignition/"+node)
			if err != nil {
				t.Fatalf("curl: %v %s", err, out)
			}
			i := strings.LastIndex(out, "\n")
			code, _ := strconv.Atoi(strings.TrimSpace(out[i+1:]))
			return code, out[:i]
		}
		okCode, body := get("cp1", token)
		var doc struct {
			Ignition struct{ Version string } `json:"ignition"`
		}
		if okCode != 200 || json.Unmarshal([]byte(body), &doc) != nil || doc.Ignition.Version != "3.3.0" {
			t.Fatalf("own token: %d %.300s", okCode, body)
		}
		wrongCode, wrongBody := get("cp1", "not-the-token")
		otherCode, otherBody := get("cp2", token)
		unknownCode, unknownBody := get("nosuchnode", token)
		if wrongCode != 401 || otherCode != 401 || unknownCode != 401 {
			t.Fatalf("want 401 for wrong token, other node's token and unknown node; got %d %d %d", wrongCode, otherCode, unknownCode)
		}
		if wrongBody != unknownBody || otherBody != unknownBody {
			t.Fatalf("answers differ, leaking which nodes exist: %q / %q / %q", wrongBody, otherBody, unknownBody)
		}
	})

	t.Run("healthz and metrics answer", func(t *testing.T) {
		out := l.mustRun(t, "cp1", "curl", "-sf", "--cacert", caFile, applURL+"/metrics")
		if !strings.Contains(out, `appliance_http_requests_total{code="200",service="registry"}`) {
			t.Fatalf("metrics lack registry requests:\n%.2000s", out)
		}
		var h map[string]any
		if err := json.Unmarshal([]byte(l.mustRun(t, "cp1", "curl", "-sf", "--cacert", caFile, applURL+"/healthz")), &h); err != nil || h["status"] != "ok" {
			t.Fatalf("healthz: %v %v", h, err)
		}
	})

	t.Run("firewall: nft table in place, served port open, closed port blocked", func(t *testing.T) {
		table := l.mustRun(t, "boot", "nft", "list", "table", "inet", "appliance")
		for _, want := range []string{"8443", "policy drop", "10.100.0.0/24", "10.200.0.0/24"} {
			if !strings.Contains(table, want) {
				t.Errorf("nft table lacks %q:\n%s", want, table)
			}
		}
		// A listener on a port the port table does not open, reachable locally but not from a node.
		nc := l.exec("boot", "busybox", "nc", "-l", "-p", "9099")
		if err := nc.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = nc.Process.Kill(); _ = nc.Wait() }()
		if err := waitFor(5*time.Second, func() error { return l.dial("boot", bootCP, "9099") }); err != nil {
			t.Fatalf("listener on 9099 never came up inside the bootstrap namespace: %v", err)
		}
		if err := l.dial("cp1", bootCP, httpsPort); err != nil {
			t.Errorf("served port %s unreachable from a node: %v", httpsPort, err)
		}
		if err := l.dial("cp1", bootCP, "9099"); err == nil {
			t.Errorf("closed port 9099 reachable from a node through the firewall")
		}
	})

	t.Run("apt fetches and verifies a package from /repo/", func(t *testing.T) {
		aptFetch(t, l, caFile)
	})

	var ignRoot string
	ignDir := t.TempDir() // outlives the subtest: the containerd subtest uses what ignition wrote
	t.Run("Debian ignition fetches the node config and writes its files", func(t *testing.T) {
		ignRoot = ignitionFetch(t, l, "cp1", caFile, ignDir)
	})

	t.Run("containerd pulls registry.k8s.io through the rendered hosts.toml mirror", func(t *testing.T) {
		if ignRoot == "" {
			t.Fatal("needs the files ignition wrote (previous subtest failed)")
		}
		containerdPull(t, l, ignRoot)
	})
}

// TestKillAndRerun SIGKILLs `appliance bootstrap` on a fresh state directory as each phase
// starts, and then at growing delays into runs, checking after every kill that the CA, once
// written, is never regenerated; then a plain rerun must converge, serve, and a further run must
// change nothing.
func TestKillAndRerun(t *testing.T) {
	l := newLab(t, "ik")
	ctx := context.Background()
	caFile := filepath.Join(l.state, "pki", "ca.crt")
	var ca []byte
	checkCA := func(when string) {
		b, err := os.ReadFile(caFile)
		if err != nil {
			return
		}
		if ca == nil {
			ca = b
		} else if !bytes.Equal(ca, b) {
			t.Fatalf("CA regenerated (%s)", when)
		}
	}
	for _, phase := range l.phases()[1:] {
		if r := l.bootstrap(ctx, phase, 0); r.err == nil {
			// A short last phase can finish before the signal lands; the run is then simply complete.
			t.Logf("bootstrap finished before the kill at %s arrived", phase)
		}
		checkCA("killed as phase " + phase + " started")
	}
	for _, d := range []time.Duration{5, 20, 50, 100, 200, 400} {
		l.bootstrap(ctx, "", d*time.Millisecond)
		checkCA(fmt.Sprintf("killed after %v", d*time.Millisecond))
	}
	l.mustBootstrap(ctx)
	checkCA("after convergence")
	r := l.mustBootstrap(ctx)
	if r.report["changed"] != false {
		t.Fatalf("run after convergence changed something: %+v", r.events)
	}
	out := l.mustRun(t, "cp1", "curl", "-sf", "--cacert", caFile, applURL+"/v2/registry.k8s.io/pause/tags/list")
	if !strings.Contains(out, "3.10") {
		t.Fatalf("tags list after kill/rerun: %s", out)
	}
}

func readToken(t *testing.T, l *lab, node string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(l.state, "pki", "tokens", node))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
