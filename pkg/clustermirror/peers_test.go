package clustermirror

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/airgap-appliance/appliance/test/labns"
)

// TestSkopeoPullsFromMirror: the real skopeo copies every tagged image from the synced cluster mirror
// (the appliance CA as its only trust, as containerd on a node has it) into OCI layouts, and the
// copy is byte-identical to the bundle: manifests, configs and layers. Without the CA it
// refuses the mirror (x509).
func TestSkopeoPullsFromMirror(t *testing.T) {
	skopeo := labns.RequireTool(t, "skopeo")
	ca := newTestPKI(t)
	u := buildUpstream(t, ca)
	u.start(t, "127.0.0.1:0")
	m := runMirror(t, ca, filepath.Join(t.TempDir(), "mirror"), u.url)
	m.waitSynced(t)
	certDir := t.TempDir()
	caPEM, _ := os.ReadFile(ca.caFile)
	if err := os.WriteFile(filepath.Join(certDir, "ca.crt"), caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, rt := range u.repos {
		repo, _, _ := strings.Cut(rt, ":")
		// The manifest or index as skopeo reads it is the bundle's, byte for byte.
		raw, err := exec.Command(skopeo, "inspect", "--raw", "--cert-dir", certDir, "docker://"+m.addr+"/"+rt).Output()
		if err != nil {
			t.Errorf("skopeo inspect --raw %s: %v", rt, err)
			continue
		}
		sum := sha256.Sum256(raw)
		want, err := os.ReadFile(filepath.Join(u.dir, "oci", "blobs", "sha256", hex.EncodeToString(sum[:])))
		if err != nil || !bytes.Equal(raw, want) {
			t.Errorf("%s: skopeo read a manifest that is not the bundle's (%v)", rt, err)
		}
		// Each image (an index's children one by one: skopeo 1.9 cannot write go-containerregistry's
		// OCI index with --preserve-digests) is copied into an OCI layout; every blob is the bundle's.
		srcs := []string{rt}
		var idx v1.IndexManifest
		if json.Unmarshal(raw, &idx) == nil && idx.MediaType.IsIndex() {
			srcs = nil
			for _, c := range idx.Manifests {
				srcs = append(srcs, repo+"@"+c.Digest.String())
			}
		}
		for _, src := range srcs {
			dst := filepath.Join(t.TempDir(), "oci")
			cmd := exec.Command(skopeo, "copy", "--preserve-digests", "--src-cert-dir", certDir, "docker://"+m.addr+"/"+src, "oci:"+dst+":x")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("skopeo copy %s: %v\n%s", src, err, out)
				continue
			}
			ents, err := os.ReadDir(filepath.Join(dst, "blobs", "sha256"))
			if err != nil || len(ents) < 3 {
				t.Fatalf("skopeo wrote %d blobs for %s: %v", len(ents), src, err)
			}
			for _, e := range ents {
				got, _ := os.ReadFile(filepath.Join(dst, "blobs", "sha256", e.Name()))
				want, err := os.ReadFile(filepath.Join(u.dir, "oci", "blobs", "sha256", e.Name()))
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("%s: blob %s differs from the bundle's (%v)", src, e.Name(), err)
				}
			}
		}
	}
	out, err := exec.Command(skopeo, "inspect", "--raw", "--cert-dir", t.TempDir(), "docker://"+m.addr+"/"+u.repos[0]).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "x509") {
		t.Errorf("skopeo without the CA: %v %s, want an x509 refusal", err, out)
	}
}

// TestNo5xxForClientInput: whatever path or method a client sends to the synced mirror, the answer
// is not a 5xx.
func TestNo5xxForClientInput(t *testing.T) {
	ca := newTestPKI(t)
	u := buildUpstream(t, ca)
	u.start(t, "127.0.0.1:0")
	m := runMirror(t, ca, filepath.Join(t.TempDir(), "mirror"), u.url)
	m.waitSynced(t)
	long := strings.Repeat("p", 300)
	probes := []struct{ method, path string }{
		{"GET", "/"}, {"GET", "/nonexistent"}, {"GET", "/healthz?x=1"}, {"POST", "/healthz"},
		{"GET", "/repo/"}, {"GET", "/repo/debian/"}, {"GET", "/repo/../../etc/passwd"}, {"GET", "/repo/%2e%2e/%2e%2e/etc/passwd"},
		{"GET", "/repo/debian/.hidden"}, {"GET", "/repo/debian/dists/stable/InRelease%00"}, {"PUT", "/repo/debian/x"},
		{"GET", "/v2/"}, {"GET", "/v2/_catalog"}, {"GET", "/v2/UPPER/manifests/1"}, {"GET", "/v2/registry.k8s.io/" + long + "/manifests/latest"},
		{"GET", "/v2/registry.k8s.io/pause/manifests/sha256:zz"}, {"GET", "/v2/registry.k8s.io/pause/blobs/sha256:" + strings.Repeat("0", 64)},
		{"DELETE", "/v2/registry.k8s.io/pause/manifests/3.10"}, {"POST", "/v2/registry.k8s.io/pause/blobs/uploads/"},
		{"GET", "/v2/../../etc/passwd"}, {"GET", "/ca.crt/x"}, {"GET", "/metrics"},
	}
	for _, p := range probes {
		req, err := http.NewRequest(p.method, "https://"+m.addr+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.URL.Opaque = p.path // sent as written, not cleaned
		if raw, err := url.PathUnescape(p.path); err == nil {
			req.URL.Path = raw
		}
		resp, err := m.client.Do(req)
		if err != nil {
			t.Errorf("%s %s: %v", p.method, p.path, err)
			continue
		}
		_ = resp.Body.Close()
		if resp.StatusCode >= 500 {
			t.Errorf("%s %s: %d", p.method, p.path, resp.StatusCode)
		}
	}
}
