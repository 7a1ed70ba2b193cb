// Package upstream runs real upstream services for tests of the connected side (bundle creation):
// Debian's docker-registry (distribution 2.8) as a separate process on 127.0.0.1, with TLS from a
// throwaway CA (pkg/pki/pkitest) and htpasswd basic auth, and helpers to push images to it with
// go-containerregistry. It is a real peer, not a fake; tests that need it call Start, which fails
// under CI (CI=true) and skips loudly elsewhere when docker-registry is not installed.
package upstream

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/crypto/bcrypt"

	"github.com/airgap-appliance/appliance/pkg/pki/pkitest"
	"github.com/airgap-appliance/appliance/test/labns"
)

// Registry is one docker-registry process on 127.0.0.1 with its own storage, TLS certificate (from
// a CA made by pkitest) and htpasswd basic auth, unless plain/noAuth.
type Registry struct {
	bin string
	// Host is 127.0.0.1:PORT; Dir holds its storage, config and log (LogPath).
	Host, Dir, LogPath string
	cfgPath            string
	// CAFile is the PEM CA its certificate chains to, CertDir a directory holding it as ca.crt (for
	// skopeo --cert-dir), Pool the same as a pool.
	CAFile, CertDir string
	Pool            *x509.CertPool
	// Plain: HTTP without TLS. Auth: htpasswd with User and Password.
	Plain, Auth    bool
	User, Password string
	cmd            *exec.Cmd
	exited         chan struct{}
}

// Options say how Start runs the registry.
type Options struct {
	// Plain serves plain HTTP without TLS (and then without auth).
	Plain bool
	// NoAuth turns htpasswd authentication off.
	NoAuth bool
}

// Start runs docker-registry on a free 127.0.0.1 port with storage in a temporary directory, waits
// until /v2/ answers, and stops it when the test ends.
func Start(t testing.TB, o Options) *Registry {
	t.Helper()
	bin := labns.RequireTool(t, "docker-registry")
	dir := t.TempDir()
	r := &Registry{bin: bin, Dir: dir, Plain: o.Plain, Auth: !o.Plain && !o.NoAuth, User: "builder", Password: "s3cret-" + randHex(),
		cfgPath: filepath.Join(dir, "config.yml"), LogPath: filepath.Join(dir, "registry.log"), CertDir: filepath.Join(dir, "certs")}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.Host = l.Addr().String()
	_ = l.Close()

	cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\n  maintenance:\n    uploadpurging:\n      enabled: false\nhttp:\n  addr: %s\n",
		filepath.Join(dir, "storage"), r.Host)
	if !r.Plain {
		caPEM, leaf := pkitest.Issue(t)
		r.Pool = x509.NewCertPool()
		r.Pool.AppendCertsFromPEM(caPEM)
		r.CAFile = filepath.Join(dir, "ca.pem")
		write(t, r.CAFile, caPEM)
		write(t, filepath.Join(r.CertDir, "ca.crt"), caPEM)
		certFile, keyFile := pkitest.WritePEM(t, dir, leaf)
		cfg += fmt.Sprintf("  tls:\n    certificate: %s\n    key: %s\n", certFile, keyFile)
	}
	if r.Auth {
		// bcrypt's minimum cost: the registry checks the hash on every request.
		h, err := bcrypt.GenerateFromPassword([]byte(r.Password), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, "htpasswd"), []byte(r.User+":"+string(h)+"\n"))
		cfg += fmt.Sprintf("auth:\n  htpasswd:\n    realm: appliance-mirror-test\n    path: %s\n", filepath.Join(dir, "htpasswd"))
	}
	write(t, r.cfgPath, []byte(cfg))
	r.Run(t)
	t.Cleanup(r.Stop)
	return r
}

// Scheme is "https", or "http" when Plain.
func (r *Registry) Scheme() string {
	if r.Plain {
		return "http"
	}
	return "https"
}

// Run (re)starts the process and waits until /v2/ answers.
func (r *Registry) Run(t testing.TB) {
	t.Helper()
	logf, err := os.OpenFile(r.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	r.cmd = exec.Command(r.bin, "serve", r.cfgPath)
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	r.cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none")
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("start docker-registry: %v", err)
	}
	r.exited = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(r.cmd, r.exited)
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: r.Pool}}}
	defer client.CloseIdleConnections()
	for deadline := time.Now().Add(20 * time.Second); ; {
		select {
		case <-r.exited:
			b, _ := os.ReadFile(r.LogPath)
			t.Fatalf("docker-registry exited at start:\n%s", b)
		default:
		}
		resp, err := client.Get(r.Scheme() + "://" + r.Host + "/v2/")
		if err == nil {
			_ = resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(r.LogPath)
			t.Fatalf("docker-registry not answering on %s: %v\n%s", r.Host, err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop kills the process this test started (by its PID) and waits for it.
func (r *Registry) Stop() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	select {
	case <-r.exited:
	default:
		_ = r.cmd.Process.Kill()
		<-r.exited
	}
}

// Ref is HOST/repoTag as a go-containerregistry reference.
func (r *Registry) Ref(t testing.TB, repoTag string) name.Reference {
	t.Helper()
	var opts []name.Option
	if r.Plain {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(r.Host+"/"+repoTag, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// RemoteOpts are go-containerregistry options that trust the CA and log in.
func (r *Registry) RemoteOpts() []remote.Option {
	opts := []remote.Option{remote.WithTransport(&http.Transport{TLSClientConfig: &tls.Config{RootCAs: r.Pool}})}
	if r.Auth {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: r.User, Password: r.Password}))
	}
	return opts
}

// push uploads img as HOST/repoTag and returns its digest.
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) v1.Hash {
	t.Helper()
	if err := remote.Write(r.Ref(t, repoTag), img, r.RemoteOpts()...); err != nil {
		t.Fatalf("push %s: %v", repoTag, err)
	}
	h, _ := img.Digest()
	return h
}

// PushIndex uploads idx as HOST/repoTag and returns its digest.
func (r *Registry) PushIndex(t testing.TB, repoTag string, idx v1.ImageIndex) v1.Hash {
	t.Helper()
	if err := remote.WriteIndex(r.Ref(t, repoTag), idx, r.RemoteOpts()...); err != nil {
		t.Fatalf("push index %s: %v", repoTag, err)
	}
	h, _ := idx.Digest()
	return h
}

// DockerConfig writes a Docker config.json holding user:password for this registry and returns its path.
func (r *Registry) DockerConfig(t testing.TB, password string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.json")
	auth := base64.StdEncoding.EncodeToString([]byte(r.User + ":" + password))
	write(t, p, fmt.Appendf(nil, `{"auths": {%q: {"auth": %q}}}`, r.Host, auth))
	return p
}

// write writes p (creating its directory) or fails the test.
func write(t testing.TB, p string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func randHex() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
