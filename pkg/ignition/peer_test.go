package ignition

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

// testPKI is a throwaway CA and a serving certificate for 127.0.0.1 issued by it.
type testPKI struct {
	caPEM  []byte
	server tls.Certificate
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	caPEM, server := pkitest.Issue(t)
	return testPKI{caPEM: caPEM, server: server}
}

// applianceFront is a stand-in for the appliance's HTTPS front: /ignition/cp-1 negotiates and
// marshals the node's config, /files/hostagent serves the binary. It records what Ignition sent.
type applianceFront struct {
	cfg *Config
	mu  sync.Mutex
	log []string // "METHOD PATH | Accept: ... | served VERSION"
}

func (f *applianceFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	accept := strings.Join(r.Header.Values("Accept"), ", ")
	entry := r.Method + " " + r.URL.Path + " | Accept: " + accept
	defer func() { f.mu.Lock(); f.log = append(f.log, entry); f.mu.Unlock() }()
	switch r.URL.Path {
	case "/ignition/cp-1":
		v, err := Negotiate(accept)
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotAcceptable)
			return
		}
		b, _, err := f.cfg.Marshal(v)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		entry += " | served " + v
		w.Header().Set("Content-Type", ContentType(v))
		_, _ = w.Write(b)
	case "/files/hostagent":
		_, _ = w.Write([]byte(hostagentBlob))
	default:
		http.NotFound(w, r)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func (f *applianceFront) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.log...)
}

// TestRealIgnitionFetchesAndWritesFiles runs Debian's ignition 2.14 (spec 3.3) against a config
// served over HTTPS by a server whose certificate a test CA issued:
//   - stage fetch: the file platform reads a pointer config that replaces itself with
//     https://127.0.0.1:PORT/ignition/cp-1. Ignition trusts the test CA for this first fetch only
//     through SSL_CERT_FILE (Go's crypto/x509 system pool); a run without it must fail.
//   - stage files: without SSL_CERT_FILE, Ignition downloads the hostagent binary over HTTPS,
//     trusting the server only through the rendered ignition.security.tls.certificateAuthorities,
//     verifies its sha256, and writes every file into a scratch root.
//
// It records the Accept header Ignition sent and checks that Negotiate maps it to 3.3.0.
func TestRealIgnitionFetchesAndWritesFiles(t *testing.T) {
	labns.RequireRoot(t) // ignition chowns the files it writes
	ign := labns.RequireTool(t, "ignition")

	pki := newTestPKI(t)
	p := goldenParams(t)
	p.CAPEM = pki.caPEM
	p.Snippets = []Snippet{{Name: "roles/worker.ign", Data: []byte(snippetAddsFile)}}

	front := &applianceFront{}
	srv := httptest.NewUnstartedServer(front)
	// Each TLS handshake a client aborts (Ignition refusing our certificate) is signalled here.
	rejected := make(chan struct{}, 64)
	srv.Config.ErrorLog = log.New(writerFunc(func(b []byte) (int, error) {
		if bytes.Contains(b, []byte("TLS handshake error")) {
			select {
			case rejected <- struct{}{}:
			default:
			}
		}
		return len(b), nil
	}), "", 0)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()
	p.ApplianceURL = srv.URL
	p.HostagentURL = srv.URL + "/files/hostagent"
	p.Mirrors = []Mirror{{Registry: "registry.k8s.io"}, {Registry: "docker.io"}}
	cfg := mustRender(t, p)
	front.cfg = cfg

	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	bin := filepath.Join(dir, "bin")
	write := func(name, data string, mode os.FileMode) string {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		return name
	}
	// LAB.md: ignition's files stage relabels with setfiles when it finds an SELinux config.
	write(filepath.Join(root, "etc/selinux/config"), "SELINUX=disabled\nSELINUXTYPE=targeted\n", 0o644)
	write(filepath.Join(bin, "setfiles"), "#!/bin/sh\nexit 0\n", 0o755)
	caFile := write(filepath.Join(dir, "test-ca.pem"), string(pki.caPEM), 0o644)
	pointer := write(filepath.Join(dir, "pointer.ign"),
		`{"ignition":{"version":"3.3.0","config":{"replace":{"source":"`+srv.URL+`/ignition/cp-1"}}}}`, 0o644)

	// run runs one Ignition stage; stop (if not nil) ends it early when it fires.
	run := func(stage, sslCertFile, cache string, stop <-chan struct{}) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a bound, not an assertion
		defer cancel()
		if stop != nil {
			go func() {
				select {
				case <-stop:
					cancel()
				case <-ctx.Done():
				}
			}()
		}
		cmd := exec.CommandContext(ctx, ign, "-platform", "file", "-stage", stage, "-root", root,
			"-config-cache", cache, "-state-file", filepath.Join(dir, "state"),
			"-neednet", filepath.Join(dir, "neednet"), "-fetch-timeout", "5s", "-log-to-stdout")
		cmd.Env = []string{"PATH=" + bin + ":/usr/sbin:/usr/bin:/sbin:/bin", "IGNITION_CONFIG_FILE=" + pointer}
		if sslCertFile != "" {
			cmd.Env = append(cmd.Env, "SSL_CERT_FILE="+sslCertFile)
		}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	// Negative first: without the CA, Ignition refuses the server's certificate and retries forever;
	// stop it once it has refused twice (the first refusal is then surely in its log).
	stop := make(chan struct{})
	go func() { <-rejected; <-rejected; close(stop) }()
	out, err := run("fetch", "", filepath.Join(dir, "untrusted.json"), stop)
	if err == nil {
		t.Fatalf("ignition fetched the config without trusting the test CA:\n%s", out)
	}
	if !strings.Contains(out, "x509: certificate signed by unknown authority") || len(front.requests()) != 0 {
		t.Fatalf("untrusted fetch failed for another reason than the certificate: %v\n%s\nserver saw: %q", err, out, front.requests())
	}

	cache := filepath.Join(dir, "ignition.json")
	if out, err := run("fetch", caFile, cache, nil); err != nil {
		t.Fatalf("ignition -stage fetch: %v\n%s\nserver saw: %q", err, out, front.requests())
	}
	if out, err := run("files", "", cache, nil); err != nil {
		t.Fatalf("ignition -stage files: %v\n%s\nserver saw: %q", err, out, front.requests())
	}

	// What Ignition 2.14 sent, and what we served.
	var accept string
	for _, r := range front.requests() {
		t.Logf("server saw: %s", r)
		if strings.HasPrefix(r, "GET /ignition/cp-1 ") && strings.HasSuffix(r, "served 3.3.0") {
			accept = strings.TrimSuffix(strings.SplitN(r, "| Accept: ", 2)[1], " | served 3.3.0")
		}
	}
	if accept != acceptIgnition214 {
		t.Errorf("ignition 2.14 sent Accept %q, want %q (update acceptIgnition214 and the docs)", accept, acceptIgnition214)
	}
	if v, err := Negotiate(accept); err != nil || v != "3.3.0" {
		t.Errorf("Negotiate(%q) = %q, %v; want 3.3.0", accept, v, err)
	}

	hostsK8s := string(hostsTOML(Mirror{Registry: "registry.k8s.io", Endpoint: srv.URL + "/v2/registry.k8s.io"}))
	files := []struct {
		path     string
		mode     os.FileMode
		contents string
	}{
		{CAPathFedora, 0o644, string(pki.caPEM)},
		{CAPathDebian, 0o644, string(pki.caPEM)},
		{ContainerdCAPath, 0o644, string(pki.caPEM)},
		{"/etc/containerd/certs.d/registry.k8s.io/hosts.toml", 0o644, hostsK8s},
		{HostagentConfigPath, 0o600, string(p.HostagentConfig)},
		{HostagentBinaryPath, 0o755, hostagentBlob},
		{"/etc/sysctl.d/90-k8s.conf", 0o644, "net.ipv4.ip_forward=1\n"},
		{"/etc/systemd/system/" + HostagentUnit, 0o644, agentapi.HostagentUnitContents},
	}
	for _, f := range files {
		full := filepath.Join(root, f.path)
		st, err := os.Stat(full)
		if err != nil {
			t.Errorf("ignition did not write %s: %v", f.path, err)
			continue
		}
		if st.Mode().Perm() != f.mode {
			t.Errorf("%s: mode %o, want %o", f.path, st.Mode().Perm(), f.mode)
		}
		if got := readFile(t, full); !bytes.Equal(got, []byte(f.contents)) {
			t.Errorf("%s contents:\n%s\nwant:\n%s", f.path, got, f.contents)
		}
	}
	if st, err := os.Stat(filepath.Join(root, HostagentConfigDir)); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("%s: %v, want a 0700 directory", HostagentConfigDir, err)
	}
	preset, err := os.ReadFile(filepath.Join(root, "etc/systemd/system-preset/20-ignition.preset"))
	if err != nil || !bytes.Contains(preset, []byte("enable "+HostagentUnit)) {
		t.Errorf("hostagent unit not enabled by preset: %v %q", err, preset)
	}
	if _, err := os.Stat(filepath.Join(root, "docker.io")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("unexpected file outside the config: %v", err)
	}
}
