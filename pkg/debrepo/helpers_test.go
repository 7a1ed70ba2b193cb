package debrepo

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"
)

// repoDate is the Release Date of test repositories: before the test keys' creation, which proves that
// signatures still verify (they carry the key's creation time then).
var repoDate = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// testKey returns a fresh signing key (Ed25519, created now).
func testKey(t *testing.T) *Signer {
	t.Helper()
	s, err := GenerateRepoKey(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// writeKeyring writes s's public keyring to dir/name and returns the path.
func writeKeyring(t *testing.T, s *Signer, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if changed, err := s.WritePublicKeyring(p); err != nil || !changed {
		t.Fatalf("WritePublicKeyring: changed=%v err=%v", changed, err)
	}
	if changed, err := s.WritePublicKeyring(p); err != nil || changed {
		t.Fatalf("WritePublicKeyring again: changed=%v err=%v", changed, err)
	}
	return p
}

// debSpec is a tiny binary package made with the real dpkg-deb.
type debSpec struct {
	name, version, arch string
	extra               string // further control lines, e.g. "Depends: b\n"
}

var debMu sync.Mutex

// makeDeb builds spec with dpkg-deb into dir and returns the .deb's path.
func makeDeb(t *testing.T, dir string, spec debSpec) string {
	t.Helper()
	dpkgDeb := labns.RequireTool(t, "dpkg-deb")
	root := filepath.Join(t.TempDir(), spec.name)
	for _, d := range []string{"DEBIAN", "usr/share/doc/" + spec.name} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctl := "Package: " + spec.name + "\nVersion: " + spec.version + "\nArchitecture: " + spec.arch +
		"\nMaintainer: Appliance Tests <tests@example.invalid>\n" + spec.extra +
		"Description: test package " + spec.name + "\n made by pkg/debrepo tests\n .\n second paragraph\n"
	if err := os.WriteFile(filepath.Join(root, "DEBIAN", "control"), []byte(ctl), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/share/doc", spec.name, "README"), []byte(spec.name+" "+spec.version+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, spec.name+"_"+strings.ReplaceAll(spec.version, ":", "%3a")+"_"+spec.arch+".deb")
	cmd := exec.Command(dpkgDeb, "--root-owner-group", "-Zgzip", "--build", root, out)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1735689600")
	debMu.Lock()
	defer debMu.Unlock()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build %s: %v\n%s", spec.name, err, b)
	}
	return out
}

// closureDebs are the upstream packages of the resolution tests: alpha depends on bravo, bravo
// (Architecture: all) pre-depends on charlie++, alpha recommends delta (not pulled: no Recommends),
// broken depends on a package nobody has, echo has an epoch and an alternative dependency, virt-pkg
// is a virtual package with two providers (no installation candidate).
var closureDebs = []debSpec{
	{"alpha", "1.0-1", "amd64", "Depends: bravo (>= 2.0)\nRecommends: delta\n"},
	{"bravo", "2.0-1", "all", "Pre-Depends: charlie++\n"},
	{"charlie++", "3.0-1", "amd64", "Provides: virt-pkg\n"},
	{"delta", "4.0-1", "amd64", "Provides: virt-pkg\n"},
	{"broken", "1.0-1", "amd64", "Depends: missing-package\n"},
	{"echo", "1:5.0-1", "amd64", "Depends: charlie++ | delta\n"},
}

// upstream is a signed repository served over HTTPS by httptest.
type upstream struct {
	dir     string // repository root
	repo    *Repo
	signer  *Signer
	keyring string // binary public keyring of signer
	srv     *httptest.Server
	caFile  string // PEM of the server's certificate
	debGets atomic.Int64
	// override, when set, answers a request path instead of the file (for tampering).
	override atomic.Pointer[map[string][]byte]
}

func (u *upstream) source() Source {
	return Source{URI: u.srv.URL + "/debian", Suite: "stable", Components: []string{"main"}, Keyring: u.keyring}
}

// newUpstream builds specs into a repository signed by a new key and serves it at URL/debian.
func newUpstream(t *testing.T, specs []debSpec, opt RepoOptions) *upstream {
	t.Helper()
	tmp := t.TempDir()
	var debs []string
	for _, s := range specs {
		debs = append(debs, makeDeb(t, tmp, s))
	}
	// The key predates the repository, so that FetchIndex can run at clocks around repoDate.
	key, err := GenerateRepoKey(repoDate.Add(-24 * time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{dir: filepath.Join(tmp, "repo"), signer: key}
	u.keyring = writeKeyring(t, u.signer, tmp, "upstream.gpg")
	if opt.Date.IsZero() {
		opt.Date = repoDate
	}
	repo, err := BuildRepo(context.Background(), u.dir, debs, "stable", "main", "amd64", u.signer, opt)
	if err != nil {
		t.Fatal(err)
	}
	u.repo = repo
	files := http.StripPrefix("/debian", http.FileServer(http.Dir(u.dir)))
	u.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, ".deb") {
			u.debGets.Add(1)
		}
		if m := u.override.Load(); m != nil {
			if data, ok := (*m)[r.URL.Path]; ok {
				if data == nil {
					http.NotFound(w, r)
					return
				}
				_, _ = w.Write(data)
				return
			}
		}
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(u.srv.Close)
	u.caFile = writeCA(t, u.srv)
	return u
}

// writeCA writes srv's self-signed certificate as a PEM CA file.
func writeCA(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// serveDir serves dir over HTTPS and returns its URL and CA file.
func serveDir(t *testing.T, dir string) (url, caFile string) {
	t.Helper()
	srv := httptest.NewTLSServer(http.FileServer(http.Dir(dir)))
	t.Cleanup(srv.Close)
	return srv.URL, writeCA(t, srv)
}

// set makes the server answer path with data (nil: 404) instead of the file.
func (u *upstream) set(m map[string][]byte) { u.override.Store(&m) }

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
