package upstream

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/pkg/debrepo"
	"github.com/airgap-appliance/appliance/test/labns"
)

// Deb describes a tiny binary package made with the real dpkg-deb.
type Deb struct {
	Name, Version, Arch string
	// Extra are further control lines, e.g. "Depends: b\n".
	Extra string
}

// MakeDeb builds d with dpkg-deb into dir and returns the .deb's path.
func MakeDeb(t testing.TB, dir string, d Deb) string {
	t.Helper()
	dpkgDeb := labns.RequireTool(t, "dpkg-deb")
	root := filepath.Join(t.TempDir(), d.Name)
	for _, sub := range []string{"DEBIAN", "usr/share/doc/" + d.Name} {
		if err := os.MkdirAll(filepath.Join(root, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctl := "Package: " + d.Name + "\nVersion: " + d.Version + "\nArchitecture: " + d.Arch +
		"\nMaintainer: Appliance Tests <tests@example.invalid>\n" + d.Extra + "Description: test package " + d.Name + "\n"
	write(t, filepath.Join(root, "DEBIAN", "control"), []byte(ctl))
	_ = os.Chmod(filepath.Join(root, "DEBIAN", "control"), 0o644)
	write(t, filepath.Join(root, "usr/share/doc", d.Name, "README"), []byte(d.Name+"\n"))
	out := filepath.Join(dir, d.Name+"_"+strings.ReplaceAll(d.Version, ":", "%3a")+"_"+d.Arch+".deb")
	cmd := exec.Command(dpkgDeb, "--root-owner-group", "-Zgzip", "--build", root, out)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1735689600")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build %s: %v\n%s", d.Name, err, b)
	}
	return out
}

// AptRepo is a signed Debian repository (pkg/debrepo.BuildRepo, suite "stable", component "main",
// amd64) served over HTTPS by httptest at URL (the repository root), as an upstream for bundle
// creation tests.
type AptRepo struct {
	URL     string
	Suite   string
	Keyring string // binary public keyring of the signing key (apt's signed-by)
	CAFile  string // PEM of the server's certificate
	// DebGets counts GETs of .deb files.
	DebGets atomic.Int64
}

// StartAptRepo builds debs into a repository signed by a new key and serves it until the test ends.
func StartAptRepo(t testing.TB, debs []Deb) *AptRepo {
	t.Helper()
	tmp := t.TempDir()
	var files []string
	for _, d := range debs {
		files = append(files, MakeDeb(t, tmp, d))
	}
	return ServeAptRepo(t, files)
}

// ServeAptRepo builds the .deb files into a repository (suite "stable", component "main", amd64)
// signed by a new OpenPGP key, serves it over HTTPS on 127.0.0.1 until the test ends (t.Cleanup), and
// returns where: URL, Keyring (the signer's public keyring) and CAFile.
func ServeAptRepo(t testing.TB, files []string) *AptRepo {
	t.Helper()
	tmp := t.TempDir()
	now := time.Now().UTC().Truncate(time.Second)
	signer, err := debrepo.GenerateRepoKey(now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tmp, "repo")
	if _, err := debrepo.BuildRepo(context.Background(), dir, files, "stable", "main", "amd64", signer, debrepo.RepoOptions{Date: now.Add(-time.Minute)}); err != nil {
		t.Fatal(err)
	}
	r := &AptRepo{Suite: "stable", Keyring: filepath.Join(tmp, "upstream.gpg")}
	if _, err := signer.WritePublicKeyring(r.Keyring); err != nil {
		t.Fatal(err)
	}
	fs := http.FileServer(http.Dir(dir))
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.HasSuffix(req.URL.Path, ".deb") {
			r.DebGets.Add(1)
		}
		fs.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	r.CAFile = filepath.Join(tmp, "ca.pem")
	write(t, r.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	return r
}
