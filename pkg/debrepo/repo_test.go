package debrepo

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"pault.ag/go/debian/control"

	"github.com/airgap-appliance/appliance/test/labns"
)

const testOrigin = "https://upstream.example/debian bookworm"

// buildTestRepo builds specs into a fresh repository signed by s.
func buildTestRepo(t *testing.T, s *Signer, specs []debSpec) *Repo {
	t.Helper()
	tmp := t.TempDir()
	var debs []string
	origins := map[string]string{} // every paragraph carries OriginField: apt (TestAptAcceptsRepo) ignores it
	for _, sp := range specs {
		debs = append(debs, makeDeb(t, tmp, sp))
		origins[debs[len(debs)-1]] = testOrigin
	}
	repo, err := BuildRepo(context.Background(), filepath.Join(tmp, "repo"), debs, "stable", "main", "amd64", s, RepoOptions{Date: repoDate, Origins: origins})
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

// TestBuildRepoLayout checks the files and the hash chain Release → Packages → .deb.
func TestBuildRepoLayout(t *testing.T) {
	s := testKey(t)
	repo := buildTestRepo(t, s, closureDebs)
	dist := filepath.Join(repo.Dir, "dists", "stable")
	rel, err := ParseRelease(readFile(t, filepath.Join(dist, "Release")))
	if err != nil {
		t.Fatal(err)
	}
	if rel.Suite != "stable" || rel.Codename != "stable" || !rel.Date.Equal(repoDate) || !rel.ValidUntil.IsZero() ||
		strings.Join(rel.Architectures, " ") != "amd64" || strings.Join(rel.Components, " ") != "main" || rel.Origin != "airgap-appliance" {
		t.Errorf("Release fields: %+v", rel)
	}
	if len(rel.SHA256) != 2 {
		t.Errorf("Release SHA256 lists %v, want Packages and Packages.gz", rel.SHA256)
	}
	for name, fh := range rel.SHA256 {
		if err := checkHash(name, readFile(t, filepath.Join(dist, filepath.FromSlash(name))), fh); err != nil {
			t.Error(err)
		}
	}
	plain := readFile(t, filepath.Join(dist, "main/binary-amd64/Packages"))
	if n := strings.Count(string(plain), "\n"+OriginField+": "+testOrigin+"\n"); n != len(closureDebs) {
		t.Errorf("%d paragraphs carry %s: %s, want %d:\n%s", n, OriginField, testOrigin, len(closureDebs), plain)
	}
	zr, err := gzip.NewReader(bytes.NewReader(readFile(t, filepath.Join(dist, "main/binary-amd64/Packages.gz"))))
	if err != nil {
		t.Fatal(err)
	}
	unz, _ := io.ReadAll(zr)
	if !bytes.Equal(plain, unz) {
		t.Error("Packages.gz does not decompress to Packages")
	}
	ps, err := ParsePackages(bytes.NewReader(plain))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range ps {
		names = append(names, p.Name+"="+p.Version+":"+p.Architecture)
		sum, size, err := hashFile(filepath.Join(repo.Dir, filepath.FromSlash(p.Filename)))
		if err != nil || sum != p.SHA256 || size != p.Size {
			t.Errorf("%s: pool file %s: sha256 %s size %d err %v, Packages says %s %d", p.Name, p.Filename, sum, size, err, p.SHA256, p.Size)
		}
	}
	if got, want := strings.Join(names, " "), "alpha=1.0-1:amd64 bravo=2.0-1:all broken=1.0-1:amd64 charlie++=3.0-1:amd64 delta=4.0-1:amd64 echo=1:5.0-1:amd64"; got != want {
		t.Errorf("Packages order: got %s, want %s", got, want)
	}
	for _, want := range []string{"pool/main/e/echo/echo_5.0-1_amd64.deb", "pool/main/b/bravo/bravo_2.0-1_all.deb"} {
		if _, err := os.Stat(filepath.Join(repo.Dir, want)); err != nil {
			t.Errorf("pool layout: %v", err)
		}
	}
	// Package first, description continuation lines kept, computed fields last.
	if !bytes.HasPrefix(plain, []byte("Package: alpha\n")) || !bytes.Contains(plain, []byte(" made by pkg/debrepo tests\n .\n second paragraph\nFilename: pool/main/a/alpha/alpha_1.0-1_amd64.deb\nSize: ")) {
		t.Errorf("Packages paragraph layout:\n%s", plain)
	}
	// pkg/bundle's verifier reads InRelease with pault.ag's ParagraphReader (signature stripped).
	pr, err := control.NewParagraphReader(bytes.NewReader(readFile(t, filepath.Join(dist, "InRelease"))), nil)
	if err != nil {
		t.Fatal(err)
	}
	if para, err := pr.Next(); err != nil || !strings.Contains(para.Values["SHA256"], "main/binary-amd64/Packages.gz") {
		t.Errorf("InRelease through control.ParagraphReader: %v %v", para, err)
	}
	if v, err := VerifyInRelease(readFile(t, filepath.Join(dist, "InRelease")), mustKeyring(t, s), time.Now()); err != nil {
		t.Error(err)
	} else if !bytes.Equal(v.Signed, readFile(t, filepath.Join(dist, "Release"))) {
		t.Errorf("InRelease signs other text than Release:\n%s", v.Signed)
	}
}

func mustKeyring(t *testing.T, s *Signer) *Keyring {
	t.Helper()
	kr, err := ReadKeyring(writeKeyring(t, s, t.TempDir(), "k.gpg"))
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// TestBuildRepoReproducible: the same .debs, key and Date give byte-identical metadata and signatures.
func TestBuildRepoReproducible(t *testing.T) {
	s := testKey(t)
	tmp := t.TempDir()
	var debs []string
	for _, sp := range closureDebs[:3] {
		debs = append(debs, makeDeb(t, tmp, sp))
	}
	var dirs []string
	for i, order := range [][]string{debs, {debs[2], debs[0], debs[1], debs[0]}} {
		dir := filepath.Join(tmp, "r"+string(rune('0'+i)))
		if _, err := BuildRepo(context.Background(), dir, order, "stable", "main", "amd64", s, RepoOptions{Date: repoDate, ValidFor: 24 * time.Hour}); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
	}
	// Rebuilding in place keeps the pool and rewrites the same bytes.
	if _, err := BuildRepo(context.Background(), dirs[0], debs, "stable", "main", "amd64", s, RepoOptions{Date: repoDate, ValidFor: 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"Release", "InRelease", "Release.gpg", "main/binary-amd64/Packages", "main/binary-amd64/Packages.gz"} {
		a := readFile(t, filepath.Join(dirs[0], "dists/stable", f))
		b := readFile(t, filepath.Join(dirs[1], "dists/stable", f))
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between two builds", f)
		}
	}
	if !bytes.Contains(readFile(t, filepath.Join(dirs[0], "dists/stable/Release")), []byte("Valid-Until: Thu, 02 Jan 2025 00:00:00 UTC\n")) {
		t.Error("Valid-Until missing or wrong")
	}
}

func TestBuildRepoRefuses(t *testing.T) {
	s := testKey(t)
	tmp := t.TempDir()
	a1 := makeDeb(t, tmp, debSpec{"alpha", "1.0-1", "amd64", ""})
	other := t.TempDir()
	a1b := makeDeb(t, other, debSpec{"alpha", "1.0-1", "amd64", "Depends: charlie++\n"})
	arm := makeDeb(t, tmp, debSpec{"armpkg", "1.0", "arm64", ""})
	bad := filepath.Join(tmp, "bad.deb")
	if err := os.WriteFile(bad, []byte("not a deb"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		debs []string
		want string
	}{
		{"same version, other content", []string{a1, a1b}, "but differ"},
		{"foreign architecture", []string{arm}, `Architecture "arm64" belongs in no binary-amd64 index`},
		{"not a deb", []string{bad}, "dpkg-deb --field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := BuildRepo(context.Background(), filepath.Join(t.TempDir(), "r"), tc.debs, "stable", "main", "amd64", s, RepoOptions{Date: repoDate})
			if !errors.Is(err, ErrDeb) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrDeb containing %q", err, tc.want)
			}
		})
	}
	t.Run("pool conflict", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "r")
		if _, err := BuildRepo(context.Background(), dir, []string{a1}, "stable", "main", "amd64", s, RepoOptions{Date: repoDate}); err != nil {
			t.Fatal(err)
		}
		_, err := BuildRepo(context.Background(), dir, []string{a1b}, "stable", "main", "amd64", s, RepoOptions{Date: repoDate})
		if !errors.Is(err, ErrDeb) || !strings.Contains(err.Error(), "already exists") {
			t.Fatalf("got %v, want a pool conflict", err)
		}
	})
	if _, err := BuildRepo(context.Background(), t.TempDir(), nil, "sta ble", "main", "amd64", s, RepoOptions{Date: repoDate}); err == nil {
		t.Error("suite with a space accepted")
	}
	if _, err := BuildRepo(context.Background(), t.TempDir(), nil, "stable", "main", "amd64", s, RepoOptions{}); err == nil {
		t.Error("zero Date accepted")
	}
}

// TestGPGVVerifiesRepo: Debian's gpgv (what apt 2.6 runs) accepts our InRelease and Release.gpg with
// the exported binary keyring, and rejects a tampered Release and another key's keyring.
func TestGPGVVerifiesRepo(t *testing.T) {
	gpgv := labns.RequireTool(t, "gpgv")
	s := testKey(t)
	repo := buildTestRepo(t, s, closureDebs[:3])
	dist := filepath.Join(repo.Dir, "dists", "stable")
	home := t.TempDir()
	kr := writeKeyring(t, s, home, "repo.gpg")
	otherKR := writeKeyring(t, testKey(t), home, "other.gpg")
	run := func(keyring string, args ...string) (string, error) {
		cmd := exec.Command(gpgv, append([]string{"--homedir", home, "--keyring", keyring}, args...)...)
		cmd.Env = append(os.Environ(), "LC_ALL=C")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run(kr, filepath.Join(dist, "InRelease")); err != nil || !strings.Contains(out, "Good signature") {
		t.Errorf("gpgv InRelease: %v\n%s", err, out)
	} else if !strings.Contains(out, "EDDSA key") || !strings.Contains(out, s.Fingerprint()) {
		t.Errorf("gpgv InRelease: want an EdDSA signature by %s:\n%s", s.Fingerprint(), out)
	}
	if out, err := run(kr, filepath.Join(dist, "Release.gpg"), filepath.Join(dist, "Release")); err != nil || !strings.Contains(out, "Good signature") {
		t.Errorf("gpgv Release.gpg Release: %v\n%s", err, out)
	}
	tampered := filepath.Join(t.TempDir(), "Release")
	rel := readFile(t, filepath.Join(dist, "Release"))
	rel[bytes.Index(rel, []byte("Label: "))+7] ^= 0x01
	if err := os.WriteFile(tampered, rel, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(kr, filepath.Join(dist, "Release.gpg"), tampered); err == nil || !strings.Contains(out, "BAD signature") {
		t.Errorf("gpgv accepted a tampered Release: %v\n%s", err, out)
	}
	if out, err := run(otherKR, filepath.Join(dist, "InRelease")); err == nil || !strings.Contains(out, "No public key") {
		t.Errorf("gpgv accepted InRelease with another key's keyring: %v\n%s", err, out)
	}
}

// aptFor returns a private apt (the one Resolve uses) whose only source is repo's dir served over
// HTTPS at url (CA in caFile).
func aptFor(t *testing.T, repo *Repo, url, caFile, keyring string) *aptEnv {
	t.Helper()
	labns.RequireTool(t, "apt-get")
	state := t.TempDir()
	a, err := newAptEnv(Options{
		Sources: []Source{{URI: url, Suite: repo.Suite, Components: []string{repo.Component}, Keyring: keyring}},
		Arch:    repo.Arch, StateDir: state, CacheDir: filepath.Join(state, "archives"), CAFile: caFile,
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestAptAcceptsRepo: the real apt-get, with an empty dpkg status and signed-by= our exported keyring,
// updates from our repository (served over HTTPS, CA via Acquire::https::CaInfo) and downloads alpha's closure; it refuses the repository once a byte of
// Release is changed (InRelease and Release.gpg paths), and once Packages no longer matches Release.
func TestAptAcceptsRepo(t *testing.T) {
	s := testKey(t)
	repo := buildTestRepo(t, s, closureDebs)
	kr := writeKeyring(t, s, t.TempDir(), "repo.gpg")
	ctx := context.Background()

	url, caFile := serveDir(t, repo.Dir)
	a := aptFor(t, repo, url, caFile, kr)
	if out, err := a.run(ctx, "update", "--error-on=any"); err != nil {
		t.Fatalf("apt-get update: %v\n%s", err, out)
	}
	if out, err := a.run(ctx, "install", "--download-only", "--no-install-recommends", "-y", "alpha"); err != nil {
		t.Fatalf("apt-get install --download-only alpha: %v\n%s", err, out)
	}
	got, _ := filepath.Glob(filepath.Join(filepath.Dir(a.config), "..", "archives", "*.deb"))
	var names []string
	for _, g := range got {
		names = append(names, filepath.Base(g))
	}
	if want := "alpha_1.0-1_amd64.deb bravo_2.0-1_all.deb charlie++_3.0-1_amd64.deb"; strings.Join(names, " ") != want {
		t.Errorf("apt downloaded %v, want %s", names, want)
	}

	dist := filepath.Join(repo.Dir, "dists", "stable")
	flip := func(t *testing.T, name, marker string) {
		p := filepath.Join(dist, name)
		b := readFile(t, p)
		i := bytes.Index(b, []byte(marker))
		if i < 0 {
			t.Fatalf("%s has no %q", name, marker)
		}
		b[i+len(marker)] ^= 0x01
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	restore := func(t *testing.T) {
		t.Helper()
		var pool []string
		for _, p := range repo.Packages {
			pool = append(pool, p.Path)
		}
		if _, err := BuildRepo(ctx, repo.Dir, pool, "stable", "main", "amd64", s, RepoOptions{Date: repoDate}); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("tampered InRelease", func(t *testing.T) {
		flip(t, "InRelease", "Label: ")
		flip(t, "Release", "Label: ")
		out, err := aptFor(t, repo, url, caFile, kr).run(ctx, "update", "--error-on=any")
		t.Logf("apt-get update: %v", err)
		if err == nil || !strings.Contains(out, "BADSIG "+s.KeyID()) || !strings.Contains(out, "is not signed") {
			t.Fatalf("apt-get update accepted a tampered InRelease (err %v):\n%s", err, out)
		}
	})
	t.Run("tampered Release with Release.gpg", func(t *testing.T) {
		if err := os.Remove(filepath.Join(dist, "InRelease")); err != nil {
			t.Fatal(err)
		}
		out, err := aptFor(t, repo, url, caFile, kr).run(ctx, "update", "--error-on=any")
		t.Logf("apt-get update: %v", err)
		if err == nil || !strings.Contains(out, "BADSIG "+s.KeyID()) {
			t.Fatalf("apt-get update accepted a tampered Release (err %v):\n%s", err, out)
		}
	})
	t.Run("other keyring", func(t *testing.T) {
		restore(t)
		other := writeKeyring(t, testKey(t), t.TempDir(), "other.gpg")
		out, err := aptFor(t, repo, url, caFile, other).run(ctx, "update", "--error-on=any")
		t.Logf("apt-get update: %v", err)
		if err == nil || !strings.Contains(out, "NO_PUBKEY "+s.KeyID()) {
			t.Fatalf("apt-get update accepted our repo with another keyring (err %v):\n%s", err, out)
		}
	})
	t.Run("tampered Packages", func(t *testing.T) {
		restore(t)
		for _, n := range []string{"Packages", "Packages.gz"} {
			p := filepath.Join(dist, "main/binary-amd64", n)
			b := readFile(t, p)
			if n == "Packages" {
				b = bytes.Replace(b, []byte("Version: 3.0-1"), []byte("Version: 3.0-2"), 1)
			} else {
				var z bytes.Buffer
				zw := gzip.NewWriter(&z)
				_, _ = zw.Write(readFile(t, filepath.Join(dist, "main/binary-amd64/Packages")))
				_ = zw.Close()
				b = z.Bytes()
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		out, err := aptFor(t, repo, url, caFile, kr).run(ctx, "update", "--error-on=any")
		t.Logf("apt-get update: %v", err)
		if err == nil || !strings.Contains(out, "Hash Sum mismatch") && !strings.Contains(out, "File has unexpected size") {
			t.Fatalf("apt-get update accepted a Packages that differs from Release (err %v):\n%s", err, out)
		}
	})
}
