package ignition

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
	"github.com/vishvananda/netns"
)

// listenInNetns opens a TCP listener on 127.0.0.1 inside the namespace at nsPath. The goroutine
// keeps its OS thread locked, so the thread (switched to the namespace) dies with it.
func listenInNetns(t *testing.T, nsPath string) net.Listener {
	t.Helper()
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		h, err := netns.GetFromPath(nsPath)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			ch <- result{err: err}
			return
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		ch <- result{ln, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listen in %s: %v", nsPath, r.err)
	}
	return r.ln
}

// tinyImage is a one-layer OCI image (an empty tar) served by a static registry handler.
type tinyImage struct {
	manifest, config, layer []byte
}

func digestOf(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }

func newTinyImage(t *testing.T) tinyImage {
	t.Helper()
	var tarBuf bytes.Buffer
	if err := tar.NewWriter(&tarBuf).Close(); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(tarBuf.Bytes())
	_ = zw.Close()
	config, _ := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{digestOf(tarBuf.Bytes())}},
	})
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digestOf(config), "size": len(config)},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digestOf(gz.Bytes()), "size": gz.Len()}},
	})
	return tinyImage{manifest: manifest, config: config, layer: gz.Bytes()}
}

// TestRealContainerdUsesMirror checks the rendered hosts.toml with containerd 1.6 itself: in a
// network namespace of its own (so containerd can reach nothing but the test server), `ctr content
// fetch registry.k8s.io/pause:3.10` must fetch the image through the appliance endpoint, trusting
// it through the CA file the hosts.toml names. A hosts.toml containerd did not understand would
// make it go to https://registry.k8s.io, which is unreachable there.
func TestRealContainerdUsesMirror(t *testing.T) {
	labns.RequireRoot(t)
	containerd := labns.RequireTool(t, "containerd")
	ctr := labns.RequireTool(t, "ctr")
	ns := labns.New(t, "ignctd")

	img := newTinyImage(t)
	pki := newTestPKI(t)
	var mu sync.Mutex
	var seen []string
	const repoPath = "/v2/registry.k8s.io/pause"
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path)
		mu.Unlock()
		var body []byte
		switch r.URL.Path {
		case repoPath + "/manifests/3.10", repoPath + "/manifests/" + digestOf(img.manifest):
			body = img.manifest
			w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		case repoPath + "/blobs/" + digestOf(img.config):
			body = img.config
		case repoPath + "/blobs/" + digestOf(img.layer):
			body = img.layer
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Docker-Content-Digest", digestOf(body))
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		if r.Method != http.MethodHead {
			_, _ = w.Write(body)
		}
	}))
	srv.Listener = listenInNetns(t, ns.Path())
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()

	p := goldenParams(t)
	p.CAPEM = pki.caPEM
	p.ApplianceURL = srv.URL
	p.Mirrors = []Mirror{{Registry: "registry.k8s.io"}}
	out, _, err := mustRender(t, p).Marshal("3.3.0")
	if err != nil {
		t.Fatal(err)
	}

	// The node's /etc/containerd as Ignition would write it, from the served config itself.
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc-containerd")
	for path, data := range filesOf(t, out, "/etc/containerd/") {
		full := filepath.Join(etc, strings.TrimPrefix(path, "/etc/containerd/"))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	sock := filepath.Join(dir, "containerd.sock")
	conf := fmt.Sprintf("version = 2\nroot = %q\nstate = %q\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\n  address = %q\n",
		filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock)
	confPath := filepath.Join(dir, "containerd.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var daemonLog bytes.Buffer
	daemon := ns.Command(containerd, "--config", confPath)
	daemon.Stdout, daemon.Stderr = &daemonLog, &daemonLog
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = daemon.Process.Signal(syscall.SIGTERM)
		_ = daemon.Wait()
	})
	ready := false
	for range 100 { // readiness wait, bounded at ~10 s
		if exec.Command(ctr, "-a", sock, "version").Run() == nil {
			ready = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !ready {
		t.Fatalf("containerd did not come up:\n%s", daemonLog.String())
	}

	// ip netns exec gives the command a mount namespace of its own (slave of the host's); unshare
	// makes it private, so the bind over /etc/containerd never reaches the host.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a bound, not an assertion
	defer cancel()
	script := `mount --bind "$1" /etc/containerd && exec "$2" -a "$3" -n ignition-test content fetch --hosts-dir /etc/containerd/certs.d registry.k8s.io/pause:3.10`
	fetch := exec.CommandContext(ctx, "ip", "netns", "exec", ns.Name, "unshare", "--mount", "--propagation", "private",
		"sh", "-c", script, "sh", etc, ctr, sock)
	fetchOut, err := fetch.CombinedOutput()
	mu.Lock()
	requests := append([]string(nil), seen...)
	mu.Unlock()
	if err != nil {
		t.Fatalf("ctr content fetch through the mirror: %v\n%s\nserver saw: %q\ncontainerd:\n%s", err, fetchOut, requests, daemonLog.String())
	}
	want := []string{repoPath + "/manifests/3.10", repoPath + "/blobs/" + digestOf(img.config), repoPath + "/blobs/" + digestOf(img.layer)}
	for _, w := range want {
		found := false
		for _, r := range requests {
			found = found || strings.HasSuffix(r, " "+w)
		}
		if !found {
			t.Errorf("containerd never requested %s through the mirror; server saw %q", w, requests)
		}
	}
	if ls, err := exec.Command(ctr, "-a", sock, "-n", "ignition-test", "content", "ls", "-q").CombinedOutput(); err != nil ||
		!bytes.Contains(ls, []byte(digestOf(img.layer))) {
		t.Errorf("layer not in containerd's content store: %v\n%s", err, ls)
	}
}

// filesOf decodes the inline files under prefix from a served config (any spec 3.x).
func filesOf(t *testing.T, served []byte, prefix string) map[string][]byte {
	t.Helper()
	var cfg struct {
		Storage struct {
			Files []struct {
				Path     string
				Contents struct{ Source *string }
			}
		}
	}
	if err := json.Unmarshal(served, &cfg); err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, f := range cfg.Storage.Files {
		if !strings.HasPrefix(f.Path, prefix) || f.Contents.Source == nil {
			continue
		}
		out[f.Path] = []byte(decodeDataURL(t, *f.Contents.Source))
	}
	if len(out) == 0 {
		t.Fatalf("no files under %s in the served config", prefix)
	}
	return out
}
