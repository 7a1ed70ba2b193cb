package debrepo

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/test/labns"
)

// TestResolve drives the real apt-get against a signed upstream served over HTTPS: the closure of
// alpha for an empty system is exactly alpha, bravo (Depends) and charlie++ (bravo's Pre-Depends), not
// delta (a Recommends); versions and hashes are those of the signed index and of the .debs; a rerun
// downloads nothing; an unsatisfiable or unknown package fails naming it. The result then builds our
// own signed repository, from which apt installs alpha again.
func TestResolve(t *testing.T) {
	labns.RequireTool(t, "apt-get")
	u := newUpstream(t, closureDebs, RepoOptions{})
	ctx := context.Background()
	work := t.TempDir()
	opt := Options{
		Sources:  []Source{u.source()},
		Arch:     "amd64",
		Packages: []string{"alpha", "echo"},
		StateDir: filepath.Join(work, "state"),
		CacheDir: filepath.Join(work, "cache"),
		CAFile:   u.caFile,
		Log:      slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	res, err := Resolve(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Package{}
	for _, p := range u.repo.Packages {
		want[p.Name] = p
	}
	var names []string
	for _, p := range res.Packages {
		names = append(names, p.Name+"="+p.Version+":"+p.Architecture)
		w := want[p.Name]
		if p.SHA256 != w.SHA256 || p.Size != w.Size || p.Filename != w.Filename || p.URL != u.srv.URL+"/debian/"+w.Filename ||
			p.SourceURI != u.source().URI || p.Component != "main" {
			t.Errorf("%s: got %+v, want the upstream's %+v", p.Name, p, w)
		}
		if sum, size, err := hashFile(p.Path); err != nil || sum != w.SHA256 || size != w.Size || filepath.Dir(p.Path) != opt.CacheDir {
			t.Errorf("%s: file %s: %s %d %v", p.Name, p.Path, sum, size, err)
		}
	}
	if got, want := strings.Join(names, " "), "alpha=1.0-1:amd64 bravo=2.0-1:all charlie++=3.0-1:amd64 echo=1:5.0-1:amd64"; got != want {
		t.Errorf("closure: got %s, want %s", got, want)
	}
	if n := u.debGets.Load(); n != 4 {
		t.Errorf("first run fetched %d .debs, want 4", n)
	}

	t.Run("rerun downloads nothing", func(t *testing.T) {
		before := u.debGets.Load()
		again, err := Resolve(ctx, opt)
		if err != nil {
			t.Fatal(err)
		}
		if n := u.debGets.Load() - before; n != 0 {
			t.Errorf("rerun fetched %d .debs, want 0", n)
		}
		if !reflect.DeepEqual(again.Packages, res.Packages) {
			t.Errorf("rerun: %+v, want %+v", again.Packages, res.Packages)
		}
	})

	for _, tc := range []struct {
		pkgs []string
		want string
	}{
		{[]string{"alpha", "broken"}, "cannot resolve packages: broken: Depends: missing-package but it is not installable"},
		{[]string{"no-such-package"}, "cannot resolve packages: no-such-package: Unable to locate package"},
		{[]string{"virt-pkg"}, "cannot resolve packages: virt-pkg: has no installation candidate"},
	} {
		t.Run("unresolvable "+strings.Join(tc.pkgs, ","), func(t *testing.T) {
			o := opt
			o.Packages = tc.pkgs
			_, err := Resolve(ctx, o)
			var re *ResolveError
			if !errors.As(err, &re) || !errors.Is(err, ErrUnresolvable) || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("got %v, want one line starting %q", err, tc.want)
			}
			t.Log(err)
		})
	}
	t.Run("source signed by another key", func(t *testing.T) {
		o := opt
		src := u.source()
		src.Keyring = writeKeyring(t, testKey(t), t.TempDir(), "other.gpg")
		o.Sources = []Source{src}
		_, err := Resolve(ctx, o)
		if !errors.Is(err, ErrSignature) || !strings.Contains(err.Error(), src.URI+" stable") || !strings.Contains(err.Error(), u.signer.Fingerprint()) {
			t.Fatalf("got %v, want ErrSignature naming the source and %s", err, u.signer.Fingerprint())
		}
	})

	t.Run("own repository from the result", func(t *testing.T) {
		s := testKey(t)
		repo, err := BuildRepo(ctx, filepath.Join(t.TempDir(), "repo"), res.Paths(), "stable", "main", "amd64", s, RepoOptions{Date: repoDate})
		if err != nil {
			t.Fatal(err)
		}
		url, caFile := serveDir(t, repo.Dir)
		kr := writeKeyring(t, s, t.TempDir(), "appliance.gpg")
		a := aptFor(t, repo, url, caFile, kr)
		if out, err := a.run(ctx, "update", "--error-on=any"); err != nil {
			t.Fatalf("apt-get update: %v\n%s", err, out)
		}
		out, err := a.run(ctx, "install", "--download-only", "--no-install-recommends", "-y", "alpha", "echo")
		if err != nil {
			t.Fatalf("apt-get install --download-only: %v\n%s", err, out)
		}
		if !strings.Contains(out, "Download complete and in download only mode") {
			t.Errorf("apt-get install --download-only:\n%s", out)
		}
	})
}

// testWriter sends log output to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func TestParseProblems(t *testing.T) {
	out := `Reading package lists...
Building dependency tree...
Some packages could not be installed. This may mean that you have
requested an impossible situation or if you are using the unstable
distribution that some required packages have not yet been created
or been moved out of Incoming.
The following information may help to resolve the situation:

The following packages have unmet dependencies:
 broken : Depends: missing-package but it is not installable
          PreDepends: other (>= 2) but 1 is to be installed
 worse : Depends: gone
E: Unable to correct problems, you have held broken packages.
`
	want := []Problem{
		{"broken", "Depends: missing-package but it is not installable, PreDepends: other (>= 2) but 1 is to be installed"},
		{"worse", "Depends: gone"},
	}
	if got := parseProblems(out); !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got := parseProblems("E: Unable to locate package zzz\n"); len(got) != 1 || got[0].Package != "zzz" {
		t.Errorf("Unable to locate: %+v", got)
	}
	if got := parseProblems("E: Failed to fetch https://x/InRelease\n"); len(got) != 0 {
		t.Errorf("a fetch failure is no package problem: %+v", got)
	}
}

func TestResolveOptionsCheck(t *testing.T) {
	err := (&Options{Packages: []string{"ok-name", "Bad_Name", "-oAPT::X=1"}, Arch: "amd64", StateDir: "/tmp/a b"}).check()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"no sources", `package "Bad_Name"`, `package "-oAPT::X=1"`, `StateDir "/tmp/a b"`, "CacheDir is required"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v: lacks %q", err, want)
		}
	}
}
