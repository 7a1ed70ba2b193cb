package bundle

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airgap-appliance/appliance/test/labns"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/airgap-appliance/appliance/pkg/debrepo"
)

var testMeta = Metadata{
	APIVersion:        APIVersion,
	Kind:              Kind,
	Name:              "test-bundle",
	KubernetesVersion: "v1.37.2",
	Created:           time.Date(2025, 1, 31, 12, 0, 0, 0, time.UTC),
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func write(t testing.TB, p string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeRepo writes a Debian repository with the given packages (name → .deb bytes) under dir,
// Packages/Packages.gz for stable/main/binary-amd64, and a Release listing both (as apt-ftparchive does).
// shaOverride, when set for a package, is put in Packages instead of the real digest.
func writeRepo(t testing.TB, dir string, debs map[string][]byte, shaOverride map[string]string) {
	t.Helper()
	var pk bytes.Buffer
	for _, name := range []string{"alpha", "beta"} {
		data, ok := debs[name]
		if !ok {
			continue
		}
		fn := fmt.Sprintf("pool/main/%c/%s/%s_1.0_amd64.deb", name[0], name, name)
		write(t, filepath.Join(dir, fn), data)
		digest := sha(data)
		if o, ok := shaOverride[name]; ok {
			digest = o
		}
		fmt.Fprintf(&pk, "Package: %s\nVersion: 1.0\nArchitecture: amd64\nDescription: test package\n multi-line body\n .\n end\nFilename: %s\nSize: %d\nSHA256: %s\n\n", name, fn, len(data), digest)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(pk.Bytes())
	zw.Close()
	suite := filepath.Join(dir, "dists", "stable")
	write(t, filepath.Join(suite, "main", "binary-amd64", "Packages"), pk.Bytes())
	write(t, filepath.Join(suite, "main", "binary-amd64", "Packages.gz"), gz.Bytes())
	rel := fmt.Sprintf("Origin: test\nSuite: stable\nCodename: stable\nArchitectures: amd64\nComponents: main\nSHA256:\n %s %d main/binary-amd64/Packages\n %s %d main/binary-amd64/Packages.gz\n",
		sha(pk.Bytes()), pk.Len(), sha(gz.Bytes()), gz.Len())
	write(t, filepath.Join(suite, "Release"), []byte(rel))
	signRepo(t, dir, repoSigner(t))
}

// testRepoSigner is one OpenPGP key for every test repository of this process (key generation is the
// slow part of signing).
var testRepoSigner = sync.OnceValues(func() (*debrepo.Signer, error) {
	return debrepo.GenerateRepoKey(time.Now().Add(-time.Hour))
})

func repoSigner(t testing.TB) *debrepo.Signer {
	t.Helper()
	s, err := testRepoSigner()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// signRepo clear-signs dists/stable/Release into InRelease with signer and writes the signer's public
// keyring as the bundle's repository keyring, as bundle create does.
func signRepo(t testing.TB, dir string, signer *debrepo.Signer) {
	t.Helper()
	rel, err := os.ReadFile(filepath.Join(dir, "dists", "stable", "Release"))
	if err != nil {
		t.Fatal(err)
	}
	in, err := signer.ClearSign(rel, time.Now().Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "dists", "stable", "InRelease"), in)
	if _, err := signer.WritePublicKeyring(filepath.Join(dir, filepath.Base(RepoKeyringPath))); err != nil {
		t.Fatal(err)
	}
}

// newBundle builds a small but complete bundle in a temp dir: an OCI layout with one image and one
// two-platform index (go-containerregistry random images), a two-package Debian repository, bundle.yaml
// and SHA256SUMS.
func newBundle(t testing.TB) *Bundle {
	t.Helper()
	dir := t.TempDir()
	lp, err := layout.Write(filepath.Join(dir, ImagesPath), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	img, err := random.Image(512, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{RefNameAnnotation: "docker.io/library/busybox:1.36"})); err != nil {
		t.Fatal(err)
	}
	idx, err := random.Index(256, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{RefNameAnnotation: "registry.k8s.io/pause:3.10"})); err != nil {
		t.Fatal(err)
	}
	writeRepo(t, filepath.Join(dir, filepath.FromSlash(RepoPath)), map[string][]byte{
		"alpha": bytes.Repeat([]byte("alpha deb "), 100),
		"beta":  bytes.Repeat([]byte("beta deb "), 300),
	}, nil)
	if err := Create(context.Background(), dir, testMeta); err != nil {
		t.Fatalf("Create: %v", err)
	}
	b, err := Open(dir)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return b
}

func TestCreateVerifyOK(t *testing.T) {
	b := newBundle(t)
	if b.Meta != testMeta {
		t.Errorf("Meta = %+v, want %+v", b.Meta, testMeta)
	}
	res, err := b.Verify(context.Background(), "")
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	sums, _ := os.ReadFile(filepath.Join(b.Dir, SumsFile))
	lines := strings.Count(string(sums), "\n")
	// bundle.yaml, oci-layout, index.json, blobs, 2 debs, Packages, Packages.gz, Release.
	if res.Files != lines || res.Files < 12 || res.Hashed != res.Files || res.Cached != 0 || res.Bytes <= 0 || res.Changed {
		t.Errorf("Verify result %+v, want %d files all hashed", res, lines)
	}
	if got := b.ImagesDir(); got != filepath.Join(b.Dir, "images") {
		t.Errorf("ImagesDir = %s", got)
	}
	if got := b.RepoDir(); got != filepath.Join(b.Dir, "repo", "debian") {
		t.Errorf("RepoDir = %s", got)
	}
	// Opening through a symlink (the cache's stable "bundle" link) resolves it.
	link := filepath.Join(t.TempDir(), "bundle")
	if err := os.Symlink(b.Dir, link); err != nil {
		t.Fatal(err)
	}
	lb, err := Open(link)
	if err != nil || lb.Dir != b.Dir {
		t.Fatalf("Open(symlink) = %+v, %v; want Dir %s", lb, err, b.Dir)
	}
	if _, err := lb.Verify(context.Background(), ""); err != nil {
		t.Errorf("Verify through symlink: %v", err)
	}
	if strings.Contains(string(sums), SumsFile) {
		t.Errorf("SHA256SUMS lists itself:\n%s", sums)
	}
}

// TestSumsAcceptedBySha256sum checks our SHA256SUMS against the real sha256sum(1).
func TestSumsAcceptedBySha256sum(t *testing.T) {
	bin := labns.RequireTool(t, "sha256sum")
	b := newBundle(t)
	cmd := exec.Command(bin, "--check", "--strict", "--quiet", SumsFile)
	cmd.Dir = b.Dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum -c rejected our SHA256SUMS: %v\n%s", err, out)
	}
}

func TestCreateDeterministic(t *testing.T) {
	b := newBundle(t)
	first, _ := os.ReadFile(filepath.Join(b.Dir, SumsFile))
	meta1, _ := os.ReadFile(filepath.Join(b.Dir, MetadataFile))
	if err := Create(context.Background(), b.Dir, testMeta); err != nil {
		t.Fatal(err)
	}
	second, _ := os.ReadFile(filepath.Join(b.Dir, SumsFile))
	meta2, _ := os.ReadFile(filepath.Join(b.Dir, MetadataFile))
	if !bytes.Equal(first, second) || !bytes.Equal(meta1, meta2) {
		t.Errorf("Create is not deterministic:\n%s\n---\n%s", first, second)
	}
}

// rewriteIndex edits images/index.json through fn and re-creates SHA256SUMS, so only the layout check
// can catch the problem.
func rewriteIndex(fn func(*ocispec.Index)) func(t *testing.T, b *Bundle) {
	return func(t *testing.T, b *Bundle) {
		p := filepath.Join(b.ImagesDir(), "index.json")
		var idx ocispec.Index
		data, _ := os.ReadFile(p)
		if err := json.Unmarshal(data, &idx); err != nil {
			t.Fatal(err)
		}
		fn(&idx)
		data, _ = json.Marshal(idx)
		write(t, p, data)
		recreate(t, b)
	}
}

func recreate(t *testing.T, b *Bundle) {
	t.Helper()
	if err := Create(context.Background(), b.Dir, testMeta); err != nil {
		t.Fatal(err)
	}
}

func debPath(name string) string {
	return fmt.Sprintf("%s/pool/main/%c/%s/%s_1.0_amd64.deb", RepoPath, name[0], name, name)
}

func firstBlob(t *testing.T, b *Bundle) string {
	ents, err := os.ReadDir(filepath.Join(b.ImagesDir(), "blobs", "sha256"))
	if err != nil || len(ents) == 0 {
		t.Fatal(err)
	}
	return "images/blobs/sha256/" + ents[0].Name()
}

func TestVerifyDetects(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(t *testing.T, b *Bundle) string // returns the file the error must name
		want   []error
		msg    string // substring of the error
	}{
		{"corrupt byte", func(t *testing.T, b *Bundle) string {
			p := filepath.Join(b.Dir, filepath.FromSlash(debPath("beta")))
			data, _ := os.ReadFile(p)
			data[10] ^= 0xff
			write(t, p, data)
			return debPath("beta")
		}, []error{ErrMismatch}, "checksum mismatch: want "},
		{"deleted file", func(t *testing.T, b *Bundle) string {
			os.Remove(filepath.Join(b.Dir, "images", "oci-layout"))
			return "images/oci-layout"
		}, []error{ErrMissing}, "file missing"},
		{"extra file", func(t *testing.T, b *Bundle) string {
			write(t, filepath.Join(b.Dir, "repo", "stray.txt"), []byte("x"))
			return "repo/stray.txt"
		}, []error{ErrUnlisted}, "not listed in SHA256SUMS"},
		{"symlink", func(t *testing.T, b *Bundle) string {
			os.Symlink("/etc/passwd", filepath.Join(b.Dir, "images", "link"))
			return "images/link"
		}, []error{ErrNotRegular}, "not a regular file"},
		{"Release does not match Packages", func(t *testing.T, b *Bundle) string {
			p := filepath.Join(b.RepoDir(), "dists", "stable", "main", "binary-amd64", "Packages")
			data, _ := os.ReadFile(p)
			write(t, p, append(data, []byte("Package: gamma\nFilename: pool/main/a/alpha/alpha_1.0_amd64.deb\nSize: 1000\nSHA256: "+sha(bytes.Repeat([]byte("alpha deb "), 100))+"\n")...))
			recreate(t, b)
			return RepoPath + "/dists/stable/main/binary-amd64/Packages"
		}, []error{ErrRepo, ErrMismatch}, "listed in repo/debian/dists/stable/"}, // InRelease or Release: both list it
		{"Packages does not match deb", func(t *testing.T, b *Bundle) string {
			writeRepo(t, b.RepoDir(), map[string][]byte{
				"alpha": bytes.Repeat([]byte("alpha deb "), 100),
				"beta":  bytes.Repeat([]byte("beta deb "), 300),
			}, map[string]string{"alpha": strings.Repeat("ab", 32)})
			recreate(t, b)
			return debPath("alpha")
		}, []error{ErrRepo, ErrMismatch}, "want abababab"},
		{"Packages names a missing deb", func(t *testing.T, b *Bundle) string {
			os.Remove(filepath.Join(b.Dir, filepath.FromSlash(debPath("beta"))))
			recreate(t, b)
			return debPath("beta")
		}, []error{ErrRepo, ErrMissing}, "package beta listed in"},
		{"index not in Release", func(t *testing.T, b *Bundle) string {
			write(t, filepath.Join(b.RepoDir(), "dists", "stable", "main", "binary-amd64", "Packages.xz"), []byte("x"))
			recreate(t, b)
			return RepoPath + "/dists/stable/main/binary-amd64/Packages.xz"
		}, []error{ErrRepo, ErrUnlisted}, "apt would reject it"},
		{"unsigned repository", func(t *testing.T, b *Bundle) string {
			os.Remove(filepath.Join(b.Dir, filepath.FromSlash(RepoKeyringPath)))
			recreate(t, b)
			return RepoKeyringPath
		}, []error{ErrRepo, ErrMissing}, "the repository is unsigned"},
		{"suite without InRelease", func(t *testing.T, b *Bundle) string {
			os.Remove(filepath.Join(b.RepoDir(), "dists", "stable", "InRelease"))
			recreate(t, b)
			return RepoPath + "/dists/stable/InRelease"
		}, []error{ErrRepo, ErrMissing}, "the suite is unsigned"},
		{"InRelease signed by another key", func(t *testing.T, b *Bundle) string {
			other, err := debrepo.GenerateRepoKey(time.Now().Add(-time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			keyring := filepath.Join(b.Dir, filepath.FromSlash(RepoKeyringPath))
			kr, _ := os.ReadFile(keyring)
			signRepo(t, b.RepoDir(), other)
			write(t, keyring, kr) // the bundle's keyring stays the first key's
			recreate(t, b)
			return RepoPath + "/dists/stable/InRelease"
		}, []error{ErrRepo, debrepo.ErrSignature}, "apt would refuse"},
		{"Release differs from InRelease", func(t *testing.T, b *Bundle) string {
			p := filepath.Join(b.RepoDir(), "dists", "stable", "Release")
			data, _ := os.ReadFile(p)
			write(t, p, append(data, "X-Extra: 1\n"...))
			recreate(t, b)
			return RepoPath + "/dists/stable/Release"
		}, []error{ErrRepo, ErrMismatch}, "differs from the text"},
		{"suite without Release", func(t *testing.T, b *Bundle) string {
			write(t, filepath.Join(b.RepoDir(), "dists", "testing", "main", "binary-amd64", "Packages"), nil)
			recreate(t, b)
			return RepoPath + "/dists/testing/Release"
		}, []error{ErrRepo, ErrMissing}, "needs a Release file"},
		{"blob content differs from its name", func(t *testing.T, b *Bundle) string {
			p := firstBlob(t, b)
			write(t, filepath.Join(b.Dir, p), []byte("tampered"))
			recreate(t, b)
			return p
		}, []error{ErrImages, ErrMismatch}, "hash to its name"},
		{"missing ref.name", func(t *testing.T, b *Bundle) string {
			rewriteIndex(func(i *ocispec.Index) { i.Manifests[0].Annotations = nil })(t, b)
			return "images/index.json"
		}, []error{ErrImages}, "no org.opencontainers.image.ref.name annotation"},
		{"short ref.name", func(t *testing.T, b *Bundle) string {
			rewriteIndex(func(i *ocispec.Index) { i.Manifests[0].Annotations[RefNameAnnotation] = "busybox:1.36" })(t, b)
			return "images/index.json"
		}, []error{ErrImages}, "not a fully qualified image reference"},
		{"blob removed", func(t *testing.T, b *Bundle) string {
			p := firstBlob(t, b)
			os.Remove(filepath.Join(b.Dir, p))
			recreate(t, b)
			return p
		}, []error{ErrImages, ErrMissing}, "referenced by images/"},
		{"no SHA256SUMS", func(t *testing.T, b *Bundle) string {
			os.Remove(filepath.Join(b.Dir, SumsFile))
			return SumsFile
		}, []error{ErrSums}, "not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newBundle(t)
			file := tc.break_(t, b)
			_, err := b.Verify(context.Background(), "")
			if err == nil {
				t.Fatal("Verify accepted a broken bundle")
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("error does not wrap %v:\n%v", w, err)
				}
			}
			msg := err.Error()
			if !strings.Contains(msg, file) || !strings.Contains(msg, tc.msg) {
				t.Errorf("error does not name %q with %q:\n%v", file, tc.msg, msg)
			}
		})
	}
}

func TestVerifyStamp(t *testing.T) {
	b := newBundle(t)
	stampFile := filepath.Join(t.TempDir(), "state", "bundle.stamp")
	ctx := context.Background()

	res, err := b.Verify(ctx, stampFile)
	if err != nil || res.Hashed != res.Files || res.Cached != 0 || !res.Changed {
		t.Fatalf("first Verify = %+v, %v; want all hashed, stamp written", res, err)
	}
	res, err = b.Verify(ctx, stampFile)
	if err != nil || res.Hashed != 0 || res.Cached != res.Files || res.Changed {
		t.Fatalf("second Verify = %+v, %v; want 0 hashed, all cached, stamp unchanged", res, err)
	}

	// Touching a file (new mtime, same content) forces exactly that file to be re-hashed.
	p := filepath.Join(b.Dir, filepath.FromSlash(debPath("alpha")))
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(p, later, later); err != nil {
		t.Fatal(err)
	}
	res, err = b.Verify(ctx, stampFile)
	if err != nil || res.Hashed != 1 || res.Cached != res.Files-1 || !res.Changed {
		t.Fatalf("after touch Verify = %+v, %v; want 1 hashed", res, err)
	}

	// Same size, mtime put back: ctime still changes, so the corruption is found.
	st, _ := os.Stat(p)
	data, _ := os.ReadFile(p)
	data[0] ^= 0xff
	write(t, p, data)
	if err := os.Chtimes(p, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	res, err = b.Verify(ctx, stampFile)
	if !errors.Is(err, ErrMismatch) || res.Hashed != 1 {
		t.Fatalf("after same-size rewrite Verify = %+v, %v; want 1 hashed and a mismatch", res, err)
	}

	// A stamp from another directory is ignored, never trusted.
	other := t.TempDir()
	if err := os.CopyFS(other, os.DirFS(b.Dir)); err != nil {
		t.Fatal(err)
	}
	ob := &Bundle{Dir: other, Meta: b.Meta}
	if _, err := ob.Verify(ctx, stampFile); !errors.Is(err, ErrMismatch) {
		t.Fatalf("copied bundle: %v, want mismatch", err)
	}

	// A corrupt stamp is ignored.
	write(t, stampFile, []byte("{not json"))
	if res, err := ob.Verify(ctx, stampFile); !errors.Is(err, ErrMismatch) || res.Hashed != res.Files {
		t.Fatalf("corrupt stamp: %+v, %v; want full re-hash", res, err)
	}
}

func TestVerifyCancelled(t *testing.T) {
	b := newBundle(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Verify(ctx, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("Verify with cancelled context: %v, want context.Canceled", err)
	}
}

func TestOpen(t *testing.T) {
	tests := []struct {
		name string
		yaml string // "" means: no bundle.yaml at all
		want string
	}{
		{"missing", "", "bundle.yaml: invalid bundle metadata: not found"},
		{"unknown key", "apiVersion: appliance.airgap.dev/v1alpha1\nkind: Bundle\nname: x\nkubernetesVersion: v1.37.2\ncreated: 2025-01-01T00:00:00Z\nextra: 1\n", "line 6: field extra not found"},
		{"bad version", "apiVersion: appliance.airgap.dev/v1alpha1\nkind: Bundle\nname: x\nkubernetesVersion: \"1.37\"\ncreated: 2025-01-01T00:00:00Z\n", `kubernetesVersion: "1.37" is not a version like v1.37.2`},
		{"all errors at once", "apiVersion: v1\nkind: Pod\nname: UPPER\n", "apiVersion: \"v1\" is not"},
		{"two documents", "apiVersion: appliance.airgap.dev/v1alpha1\nkind: Bundle\nname: x\nkubernetesVersion: v1.37.2\ncreated: 2025-01-01T00:00:00Z\n---\nkind: Bundle\n", "more than one YAML document"},
		{"wrong type", "apiVersion: appliance.airgap.dev/v1alpha1\nkind: Bundle\nname: [x]\n", "line 3"},
		{"empty", "\n", "empty document"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.yaml != "" {
				write(t, filepath.Join(dir, MetadataFile), []byte(tc.yaml))
			}
			_, err := Open(dir)
			if !errors.Is(err, ErrMetadata) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), filepath.Join(dir, MetadataFile)) {
				t.Fatalf("Open error = %v\nwant ErrMetadata naming the file and containing %q", err, tc.want)
			}
		})
	}
	// "all errors at once" must report every field.
	_, err := ParseMetadata([]byte("apiVersion: v1\nkind: Pod\nname: UPPER\n"))
	for _, field := range []string{"apiVersion:", "kind:", "name:", "kubernetesVersion:", "created:"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error misses %s: %v", field, err)
		}
	}
}

func TestCreateRejects(t *testing.T) {
	dir := t.TempDir()
	if err := Create(context.Background(), dir, Metadata{}); !errors.Is(err, ErrMetadata) {
		t.Errorf("Create with empty metadata: %v, want ErrMetadata", err)
	}
	os.Symlink("/etc", filepath.Join(dir, "etc"))
	if err := Create(context.Background(), dir, testMeta); !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), "etc") {
		t.Errorf("Create over a symlink: %v, want ErrNotRegular naming it", err)
	}
}

func TestParseSums(t *testing.T) {
	h := strings.Repeat("0a", 32)
	tests := []struct {
		name, in string
		want     []Sum
		err      string
	}{
		{"text and binary mode", h + "  a/b\n" + h + " *c\n", []Sum{{"a/b", h}, {"c", h}}, ""},
		{"escaped path", `\` + h + `  a\\b\nc` + "\n", []Sum{{"a\\b\nc", h}}, ""},
		{"no trailing newline", h + "  x", []Sum{{"x", h}}, ""},
		{"empty file", "", nil, ""},
		{"uppercase hex", strings.ToUpper(h) + "  x\n", nil, "line 1: \"0A0A"},
		{"short digest", "abc  x\n", nil, "line 1: want"},
		{"one space", h + " x\n", nil, "two spaces"},
		{"absolute", h + "  /etc/passwd\n", nil, "is absolute"},
		{"dotdot", h + "  ../x\n", nil, "not a clean path"},
		{"unclean", h + "  a//b\n", nil, "not a clean path"},
		{"duplicate", h + "  x\n" + h + "  x\n", nil, "line 2: \"x\" already listed on line 1"},
		{"empty line", h + "  x\n\n", nil, "line 2: empty line"},
		{"bad escape", `\` + h + `  a\t` + "\n", nil, `unknown escape \t`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSums(strings.NewReader(tc.in))
			if tc.err != "" {
				if !errors.Is(err, ErrSums) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want ErrSums containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			again, err := ParseSums(bytes.NewReader(FormatSums(got)))
			if err != nil || len(again) != len(got) {
				t.Fatalf("round trip: %q, %v", again, err)
			}
		})
	}
}

func TestParsePackagesAndRelease(t *testing.T) {
	h := strings.Repeat("ab", 32)
	if _, err := parsePackages(strings.NewReader("Package: a\nFilename: ../x.deb\nSize: 1\nSHA256: " + h + "\n")); err == nil || !strings.Contains(err.Error(), "not a clean path") {
		t.Errorf("Packages escaping the repo: %v", err)
	}
	if _, err := parsePackages(strings.NewReader("Package: a\nFilename: x.deb\nSize: -1\nSHA256: " + h + "\n")); err == nil || !strings.Contains(err.Error(), "Size") {
		t.Errorf("negative Size: %v", err)
	}
	if _, err := parseReleaseSHA256(strings.NewReader("Suite: stable\n")); err == nil || !strings.Contains(err.Error(), "no SHA256 field") {
		t.Errorf("Release without SHA256: %v", err)
	}
	got, err := parseReleaseSHA256(strings.NewReader("Suite: stable\nSHA256:\n " + h + " 12 main/binary-amd64/Packages\n"))
	if err != nil || got["main/binary-amd64/Packages"].Size != 12 || got["main/binary-amd64/Packages"].Hash != h {
		t.Errorf("parse Release: %+v, %v", got, err)
	}
}

func TestVerifyManyProblemsCapped(t *testing.T) {
	b := newBundle(t)
	for i := range maxReported + 5 {
		write(t, filepath.Join(b.Dir, "extra", fmt.Sprintf("f%03d", i)), nil)
	}
	_, err := b.Verify(context.Background(), "")
	if !errors.Is(err, ErrUnlisted) || !strings.Contains(err.Error(), "... and 5 more") || strings.Contains(err.Error(), "extra/f054") {
		t.Fatalf("want the first %d problems and a count of the rest, got:\n%v", maxReported, err)
	}
	var fe *FileError
	if !errors.As(err, &fe) || fe.Path != "extra/f000" {
		t.Errorf("errors.As FileError = %+v", fe)
	}
}

// BenchmarkVerify measures verification of a bundle holding 64 MiB in 16 files: full hashing versus a
// rerun proved unchanged by the stamp (b.SetBytes makes `go test -bench` report MB/s).
func BenchmarkVerify(b *testing.B) {
	bd := newBundle(b)
	chunk := bytes.Repeat([]byte{0x5a}, 4<<20)
	for i := range 16 {
		write(b, filepath.Join(bd.Dir, "repo", "blobs", fmt.Sprintf("f%02d", i)), chunk)
	}
	if err := Create(context.Background(), bd.Dir, testMeta); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		stamp string
	}{{"hash", ""}, {"stamped", filepath.Join(b.TempDir(), "stamp")}} {
		b.Run(tc.name, func(b *testing.B) {
			if tc.stamp != "" {
				if _, err := bd.Verify(context.Background(), tc.stamp); err != nil {
					b.Fatal(err)
				}
			}
			var res VerifyResult
			for b.Loop() {
				var err error
				if res, err = bd.Verify(context.Background(), tc.stamp); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(res.Bytes)
			b.ReportMetric(float64(res.Hashed), "files-hashed/op")
		})
	}
}

// TestVerifyStampSurvivesLinks (issue 16, class 6): every state directory's registry hard-links the
// bundle's OCI blobs (registry.Import), and removing a state directory unlinks them again; each link
// or unlink changes the blob's ctime. A verification after such churn must hash nothing (it re-hashed
// every blob before), while a damaged blob (written in place, or replaced by a copy with the old
// mtime) is still re-hashed and caught. (A same-size rewrite with the mtime put back is caught by
// ctime on files with one link: TestVerifyStamp.)
func TestVerifyStampSurvivesLinks(t *testing.T) {
	b := newBundle(t)
	stampFile := filepath.Join(t.TempDir(), "state", "bundle-verify.json")
	ctx := context.Background()
	var blobs []string
	_ = filepath.WalkDir(filepath.Join(b.ImagesDir(), "blobs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			blobs = append(blobs, p)
		}
		return err
	})
	hourAgo := time.Now().Add(-time.Hour) // so that the damaging write below surely moves the mtime
	for _, p := range blobs {
		if err := os.Chtimes(p, hourAgo, hourAgo); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Verify(ctx, stampFile); err != nil {
		t.Fatal(err)
	}
	if len(blobs) == 0 {
		t.Fatal("test bundle has no blobs")
	}
	// This state directory's registry links every blob (it stays), as the bundle phase does...
	link := func(dir string) {
		t.Helper()
		for i, p := range blobs {
			if err := os.Link(p, filepath.Join(dir, fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	ownRegistry := t.TempDir()
	link(ownRegistry)
	res, err := b.Verify(ctx, stampFile)
	if err != nil || res.Hashed != 0 {
		t.Errorf("Verify after this state directory's registry linked the blobs: %+v, %v; want 0 hashed", res, err)
	}
	// ...then another state directory links them too and is removed (a test run, a trial install).
	other := filepath.Join(t.TempDir(), "other-state")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	link(other)
	res, err = b.Verify(ctx, stampFile)
	if err != nil || res.Hashed != 0 {
		t.Errorf("Verify while another state directory links the blobs: %+v, %v; want 0 hashed", res, err)
	}
	if err := os.RemoveAll(other); err != nil {
		t.Fatal(err)
	}
	res, err = b.Verify(ctx, stampFile)
	if err != nil || res.Hashed != 0 || res.Cached != res.Files {
		t.Errorf("second Verify after link churn: %+v, %v; want 0 hashed, all %d cached", res, err, res.Files)
	}

	// Damage one blob in place (same size, a write as dd conv=notrunc does): re-hashed and caught.
	p := blobs[0]
	st, _ := os.Stat(p)
	data, _ := os.ReadFile(p)
	data[len(data)/2] ^= 0xff
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	res, err = b.Verify(ctx, stampFile)
	if !errors.Is(err, ErrMismatch) || res.Hashed != 1 {
		t.Errorf("after damaging a linked blob in place: %+v, %v; want 1 hashed and ErrMismatch", res, err)
	}
	// Replaced by a damaged copy (new inode, mtime kept): caught too.
	data[len(data)/2] ^= 0xff // repair, then replace with a damaged copy
	data[0] ^= 0xff
	tmp := p + ".new"
	write(t, tmp, data)
	_ = os.Chtimes(tmp, st.ModTime(), st.ModTime())
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	res, err = b.Verify(ctx, stampFile)
	if !errors.Is(err, ErrMismatch) || res.Hashed != 1 {
		t.Errorf("after replacing a blob by a damaged copy: %+v, %v; want 1 hashed and ErrMismatch", res, err)
	}
}
