package bundle

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/bundlespec"
)

// testPartSize is the part size of these tests: small, so newBundle's few tens of KiB make many parts.
const testPartSize = 4096

// smallParts lowers the minimum part size for one test.
func smallParts(t *testing.T) {
	t.Helper()
	old := minPartSize
	minPartSize = 512
	t.Cleanup(func() { minPartSize = old })
}

// progressLog records progress calls and checks they never go backwards and keep one total.
type progressLog struct {
	t     *testing.T
	calls [][2]int64
}

func (p *progressLog) fn(done, total int64) {
	if n := len(p.calls); n > 0 {
		prev := p.calls[n-1]
		if done < prev[0] || total != prev[1] {
			p.t.Errorf("progress went from %d/%d to %d/%d", prev[0], prev[1], done, total)
		}
	}
	if done < 0 || done > total {
		p.t.Errorf("progress %d/%d out of range", done, total)
	}
	p.calls = append(p.calls, [2]int64{done, total})
}

// checkEnds asserts the first call was (0, total) and the last (total, total).
func (p *progressLog) checkEnds(total int64) {
	p.t.Helper()
	if len(p.calls) < 2 || p.calls[0] != [2]int64{0, total} || p.calls[len(p.calls)-1] != [2]int64{total, total} {
		p.t.Errorf("progress calls %v: want from 0/%d to %d/%d", p.calls, total, total, total)
	}
}

// splitBundle makes a signed bundle and splits it into parts of testPartSize bytes.
func splitBundle(t *testing.T) (dir, parts string, m PartsManifest) {
	t.Helper()
	smallParts(t)
	dir, _ = signedBundle(t)
	parts = filepath.Join(t.TempDir(), "parts")
	m, err := Split(context.Background(), dir, parts, testPartSize, nil)
	if err != nil {
		t.Fatalf("Split: %v", err)
	}
	return dir, parts, m
}

// treeFiles maps every regular file under dir (relative slash path) to its content.
func treeFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			t.Errorf("%s is not a regular file", p)
		}
		data, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(rel)] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(t *testing.T, want, got string) {
	t.Helper()
	w, g := treeFiles(t, want), treeFiles(t, got)
	if len(w) != len(g) {
		t.Errorf("%s has %d files, %s has %d", got, len(g), want, len(w))
	}
	for p, data := range w {
		if g[p] != data {
			t.Errorf("%s differs after the round trip", p)
		}
	}
}

func TestSplitJoinRoundTrip(t *testing.T) {
	smallParts(t)
	dir, _ := signedBundle(t)
	parts := filepath.Join(t.TempDir(), "parts")
	sp := &progressLog{t: t}
	m, err := Split(context.Background(), dir, parts, testPartSize, sp.fn)
	if err != nil {
		t.Fatalf("Split: %v", err)
	}
	sp.checkEnds(m.Size)
	if want := int((m.Size + testPartSize - 1) / testPartSize); len(m.Parts) != want || want < 4 {
		t.Fatalf("%d parts of %d bytes, want %d (at least 4)", len(m.Parts), m.Size, want)
	}
	if m.Parts[0].Name != "test-bundle.part001" || m.Bundle != "test-bundle" || m.KubernetesVersion != testMeta.KubernetesVersion {
		t.Errorf("manifest %+v", m)
	}
	sums, _ := os.ReadFile(filepath.Join(dir, SumsFile))
	if m.SumsSHA256 != sha(sums) {
		t.Errorf("sumsSHA256 %s, want the SHA-256 of SHA256SUMS", m.SumsSHA256)
	}
	if got, err := ReadParts(parts); err != nil || got.Size != m.Size || len(got.Parts) != len(m.Parts) {
		t.Fatalf("ReadParts: %+v, %v", got, err)
	}
	des, _ := os.ReadDir(parts)
	if len(des) != 2*len(m.Parts)+1 {
		t.Errorf("%d files in the parts directory, want each part, its .sha256 and PARTS", len(des))
	}

	// Real peers: sha256sum checks each part against its .sha256, and GNU tar extracts the
	// concatenation into a bundle that verifies.
	cmd := exec.Command("sh", "-c", "sha256sum -c --quiet *.sha256")
	cmd.Dir = parts
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("sha256sum -c: %v\n%s", err, out)
	}
	byTar := filepath.Join(t.TempDir(), "tar")
	if err := os.Mkdir(byTar, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command("sh", "-c", "cat test-bundle.part??? | tar -x -C "+byTar)
	cmd.Dir = parts
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cat | tar -x: %v\n%s", err, out)
	}
	sameTree(t, dir, byTar)

	// Join: byte-identical files, a bundle that verifies.
	out := filepath.Join(t.TempDir(), "joined")
	jp := &progressLog{t: t}
	if err := Join(context.Background(), parts, out, jp.fn); err != nil {
		t.Fatalf("Join: %v", err)
	}
	jp.checkEnds(2 * m.Size)
	sameTree(t, dir, out)
	b, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Verify(context.Background(), ""); err != nil {
		t.Errorf("joined bundle: %v", err)
	}
	if _, err := os.Stat(out + ".tmp"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s.tmp left behind: %v", out, err)
	}

	// Deterministic: splitting again gives the same bytes.
	again := filepath.Join(t.TempDir(), "again")
	if _, err := Split(context.Background(), dir, again, testPartSize, nil); err != nil {
		t.Fatal(err)
	}
	if a, b := treeFiles(t, parts), treeFiles(t, again); len(a) != len(b) || a[PartsFile] != b[PartsFile] || a["test-bundle.part002"] != b["test-bundle.part002"] {
		t.Error("splitting the same bundle twice gave different parts")
	}

	// A rerun with a larger part size leaves no part of the first run (zarf-dev/zarf#3266).
	m2, err := Split(context.Background(), dir, parts, 4*testPartSize, nil)
	if err != nil {
		t.Fatal(err)
	}
	des, _ = os.ReadDir(parts)
	if len(des) != 2*len(m2.Parts)+1 || len(m2.Parts) >= len(m.Parts) {
		t.Errorf("after a rerun with larger parts: %d files for %d parts", len(des), len(m2.Parts))
	}
	if err := Join(context.Background(), parts, filepath.Join(t.TempDir(), "joined2"), nil); err != nil {
		t.Errorf("Join after the rerun: %v", err)
	}
}

func TestJoinDamagedParts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, parts string)
		is     error
		want   []string
	}{
		{"flipped byte in part 2", func(t *testing.T, parts string) {
			p := filepath.Join(parts, "test-bundle.part002")
			data, _ := os.ReadFile(p)
			data[100] ^= 1
			write(t, p, data)
		}, ErrMismatch, []string{"test-bundle.part002: checksum mismatch", "copy it again from the medium", "1 of the"}},
		{"missing part", func(t *testing.T, parts string) {
			if err := os.Remove(filepath.Join(parts, "test-bundle.part003")); err != nil {
				t.Fatal(err)
			}
		}, ErrMissing, []string{"test-bundle.part003: file missing", "copy it from the medium"}},
		{"truncated part", func(t *testing.T, parts string) {
			if err := os.Truncate(filepath.Join(parts, "test-bundle.part001"), 1000); err != nil {
				t.Fatal(err)
			}
		}, ErrMismatch, []string{"test-bundle.part001: checksum mismatch", "want 4096 bytes, got 1000 bytes"}},
		{"two problems at once", func(t *testing.T, parts string) {
			os.Remove(filepath.Join(parts, "test-bundle.part001"))
			os.Remove(filepath.Join(parts, "test-bundle.part004"))
		}, ErrMissing, []string{"2 of the", "part001", "part004"}},
		{"no PARTS: the split did not finish", func(t *testing.T, parts string) {
			if err := os.Remove(filepath.Join(parts, PartsFile)); err != nil {
				t.Fatal(err)
			}
		}, ErrParts, []string{"PARTS: invalid bundle parts: not found"}},
		{"PARTS edited", func(t *testing.T, parts string) {
			p := filepath.Join(parts, PartsFile)
			data, _ := os.ReadFile(p)
			write(t, p, bytes.Replace(data, []byte("partSize: 4096"), []byte("partSize: 4000"), 1))
		}, ErrParts, []string{"parts[0].size: 4096 is not partSize (4000)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, parts, _ := splitBundle(t)
			tc.damage(t, parts)
			out := filepath.Join(t.TempDir(), "joined")
			err := Join(context.Background(), parts, out, nil)
			if err == nil || !errors.Is(err, tc.is) {
				t.Fatalf("Join: %v, want %v", err, tc.is)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			for _, p := range []string{out, out + ".tmp"} {
				if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s exists after a refused join: nothing may be extracted", p)
				}
			}
		})
	}
}

// writeCraftedParts writes stream as the single part of a parts directory with a matching PARTS
// naming sumsSHA256 (any digest when empty), so that only the archive's content can be wrong.
func writeCraftedParts(t *testing.T, stream []byte, sumsSHA256 string) string {
	t.Helper()
	dir := t.TempDir()
	name := partName("crafted", 1, 1)
	write(t, filepath.Join(dir, name), stream)
	m := PartsManifest{APIVersion: APIVersion, Kind: PartsKind, Bundle: "crafted", KubernetesVersion: "v1.37.2",
		SumsSHA256: cmp.Or(sumsSHA256, sha([]byte("x"))), Size: int64(len(stream)), PartSize: int64(len(stream)),
		Parts: []Part{{Name: name, Size: int64(len(stream)), SHA256: sha(stream)}}}
	data, err := marshalParts(m)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, PartsFile), data)
	return dir
}

func TestJoinRefusesUnsafeEntries(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdr  tar.Header
		want string
	}{
		{"parent escape", tar.Header{Name: "../x", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}, `"../x" is not a clean relative path`},
		{"deep escape", tar.Header{Name: "images/../../x", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}, "is not a clean relative path"},
		{"absolute", tar.Header{Name: "/tmp/x", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}, "is not a clean relative path"},
		{"dot", tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755}, "is not a clean relative path"},
		{"symlink", tar.Header{Name: "images", Typeflag: tar.TypeSymlink, Linkname: "/etc"}, "is of type"},
		{"hardlink", tar.Header{Name: "x", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}, "is of type"},
		{"device", tar.Header{Name: "x", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}, "is of type"},
		{"fifo", tar.Header{Name: "x", Typeflag: tar.TypeFifo}, "is of type"},
		{"marker", tar.Header{Name: joinMarker, Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}, "is not a clean relative path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			// A harmless entry first: refusing must also undo what was already extracted.
			if err := tw.WriteHeader(&tar.Header{Name: "ok", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}); err != nil {
				t.Fatal(err)
			}
			tw.Write([]byte("k"))
			hdr := tc.hdr
			if err := tw.WriteHeader(&hdr); err != nil {
				t.Fatal(err)
			}
			if hdr.Size > 0 {
				tw.Write([]byte("x"))
			}
			tw.Close()
			parts := writeCraftedParts(t, buf.Bytes(), "")
			base := t.TempDir()
			out := filepath.Join(base, "sub", "joined")
			err := Join(context.Background(), parts, out, nil)
			if err == nil || !errors.Is(err, ErrParts) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "crafted.part001") {
				t.Fatalf("Join: %v, want ErrParts naming the part and %q", err, tc.want)
			}
			des, _ := os.ReadDir(filepath.Join(base, "sub"))
			if _, err := os.Stat(filepath.Join(base, "x")); err == nil || len(des) != 0 {
				t.Errorf("something was left: %v in %s/sub, x outside: %v", des, base, err)
			}
		})
	}
}

func TestJoinTrailingData(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "a", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
	tw.Write([]byte("a"))
	tw.Close()
	buf.WriteString("smuggled")
	err := Join(context.Background(), writeCraftedParts(t, buf.Bytes(), ""), filepath.Join(t.TempDir(), "out"), nil)
	if !errors.Is(err, ErrParts) || !strings.Contains(err.Error(), "after the end of the archive") {
		t.Fatalf("Join: %v, want a refusal of the trailing data", err)
	}
}

func TestJoinTarget(t *testing.T) {
	_, parts, _ := splitBundle(t)
	base := t.TempDir()

	full := filepath.Join(base, "full")
	write(t, filepath.Join(full, "keep"), []byte("mine"))
	if err := Join(context.Background(), parts, full, nil); err == nil || !strings.Contains(err.Error(), "is not empty") {
		t.Errorf("Join into a non-empty directory: %v", err)
	}

	foreign := filepath.Join(base, "foreign")
	write(t, filepath.Join(foreign+".tmp", "keep"), []byte("mine"))
	if err := Join(context.Background(), parts, foreign, nil); err == nil || !strings.Contains(err.Error(), "not left by an earlier join") {
		t.Errorf("Join beside a foreign .tmp: %v", err)
	}
	if data, _ := os.ReadFile(filepath.Join(foreign+".tmp", "keep")); string(data) != "mine" {
		t.Error("Join touched a .tmp directory it did not make")
	}

	// An empty directory is fine; so is the .tmp of a killed join.
	killed := filepath.Join(base, "killed")
	write(t, filepath.Join(killed+".tmp", joinMarker), nil)
	write(t, filepath.Join(killed+".tmp", "images", "half"), []byte("half"))
	if err := os.Mkdir(killed, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Join(context.Background(), parts, killed, nil); err != nil {
		t.Fatalf("Join over a killed join's leftovers: %v", err)
	}
	if _, err := os.Stat(filepath.Join(killed, "images", "half")); !errors.Is(err, fs.ErrNotExist) {
		t.Error("the killed join's file survived")
	}
}

func TestSplitRefuses(t *testing.T) {
	smallParts(t)
	t.Run("unsigned", func(t *testing.T) {
		b := newBundle(t)
		_, err := Split(context.Background(), b.Dir, t.TempDir(), testPartSize, nil)
		if !errors.Is(err, ErrUnsigned) || !strings.Contains(err.Error(), SignatureFile) {
			t.Errorf("Split of an unsigned bundle: %v", err)
		}
	})
	t.Run("not a bundle", func(t *testing.T) {
		if _, err := Split(context.Background(), t.TempDir(), t.TempDir(), testPartSize, nil); !errors.Is(err, ErrMetadata) {
			t.Errorf("Split of an empty directory: %v", err)
		}
	})
	dir, _ := signedBundle(t)
	t.Run("part size", func(t *testing.T) {
		minPartSize = 1 << 20
		defer func() { minPartSize = 512 }()
		if _, err := Split(context.Background(), dir, t.TempDir(), 4096, nil); err == nil || !strings.Contains(err.Error(), "at least 1MiB") {
			t.Errorf("Split with 4096-byte parts: %v", err)
		}
	})
	t.Run("parts inside the bundle", func(t *testing.T) {
		_, err := Split(context.Background(), dir, filepath.Join(dir, "images", "parts"), testPartSize, nil)
		if err == nil || !strings.Contains(err.Error(), "inside the bundle") {
			t.Errorf("Split into the bundle: %v", err)
		}
	})
	t.Run("damaged file", func(t *testing.T) {
		dir, _ := signedBundle(t)
		p := filepath.Join(dir, filepath.FromSlash(debPath("beta")))
		data, _ := os.ReadFile(p)
		data[0] ^= 1
		write(t, p, data)
		parts := t.TempDir()
		write(t, filepath.Join(parts, "old.part001"), []byte("stale"))
		write(t, filepath.Join(parts, "unrelated"), []byte("kept"))
		_, err := Split(context.Background(), dir, parts, testPartSize, nil)
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), debPath("beta")) {
			t.Fatalf("Split of a damaged bundle: %v, want a mismatch naming the file", err)
		}
		des, _ := os.ReadDir(parts)
		if len(des) != 1 || des[0].Name() != "unrelated" {
			t.Errorf("after a failed split the parts directory holds %v, want only the unrelated file", des)
		}
	})
	t.Run("unlisted file", func(t *testing.T) {
		dir, _ := signedBundle(t)
		write(t, filepath.Join(dir, "extra"), []byte("x"))
		if _, err := Split(context.Background(), dir, t.TempDir(), testPartSize, nil); !errors.Is(err, ErrUnlisted) {
			t.Errorf("Split with an unlisted file: %v", err)
		}
	})
}

// TestSplitKilled: a split stopped half way leaves parts but no PARTS, which Join refuses; a rerun
// completes it.
func TestSplitKilled(t *testing.T) {
	smallParts(t)
	dir, _ := signedBundle(t)
	parts := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := Split(ctx, dir, parts, testPartSize, func(done, total int64) {
		if done > 2*testPartSize {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Split: %v", err)
	}
	if _, err := os.Stat(filepath.Join(parts, PartsFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("a cancelled split wrote PARTS")
	}
	// What a kill (rather than a cancel) leaves: finished parts and a .tmp, without PARTS.
	write(t, filepath.Join(parts, "test-bundle.part001"), []byte("finished"))
	write(t, filepath.Join(parts, "test-bundle.part002.tmp"), []byte("half"))
	if err := Join(context.Background(), parts, filepath.Join(t.TempDir(), "out"), nil); !errors.Is(err, ErrParts) || !strings.Contains(err.Error(), "not found") {
		t.Errorf("Join of an unfinished split: %v, want a refusal", err)
	}
	if _, err := Split(context.Background(), dir, parts, testPartSize, nil); err != nil {
		t.Fatal(err)
	}
	if err := Join(context.Background(), parts, filepath.Join(t.TempDir(), "out"), nil); err != nil {
		t.Errorf("Join after the rerun: %v", err)
	}
}

func TestParseParts(t *testing.T) {
	h := strings.Repeat("ab", 32)
	valid := func() PartsManifest {
		return PartsManifest{APIVersion: APIVersion, Kind: PartsKind, Bundle: "b", KubernetesVersion: "v1.37.2", SumsSHA256: h,
			Size: 25, PartSize: 10, Parts: []Part{{"b.part001", 10, h}, {"b.part002", 10, h}, {"b.part003", 5, h}}}
	}
	for _, tc := range []struct {
		name string
		edit func(m *PartsManifest)
		want string
	}{
		{"valid", func(*PartsManifest) {}, ""},
		{"kind", func(m *PartsManifest) { m.Kind = "Bundle" }, `kind: "Bundle" is not "BundleParts"`},
		{"name with a slash", func(m *PartsManifest) { m.Parts[1].Name = "../b.part002" }, `parts[1].name: "../b.part002" is not "b.part002"`},
		{"out of order", func(m *PartsManifest) { m.Parts[0].Name, m.Parts[1].Name = m.Parts[1].Name, m.Parts[0].Name }, `parts[0].name: "b.part002" is not "b.part001"`},
		{"short middle part", func(m *PartsManifest) { m.Parts[1].Size = 9; m.Size = 24 }, "parts[1].size: 9 is not partSize (10)"},
		{"empty last part", func(m *PartsManifest) { m.Parts[2].Size = 0; m.Size = 20 }, "parts[2].size: 0 is not 1 to partSize (10)"},
		{"size", func(m *PartsManifest) { m.Size = 26 }, "size: 26 is not the sum of the parts' sizes (25)"},
		{"digest", func(m *PartsManifest) { m.Parts[0].SHA256 = strings.ToUpper(h) }, "parts[0].sha256:"},
		{"no parts", func(m *PartsManifest) { m.Parts = nil; m.Size = 0 }, "parts: empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := valid()
			tc.edit(&m)
			data, err := marshalParts(m)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseParts(data)
			if tc.want == "" {
				if err != nil || got.Size != m.Size || len(got.Parts) != 3 {
					t.Fatalf("ParseParts: %+v, %v", got, err)
				}
				return
			}
			if !errors.Is(err, ErrParts) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseParts: %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := ParseParts([]byte("apiVersion: x\nextra: 1\n")); !errors.Is(err, ErrParts) || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("unknown key: %v, want an error naming its line", err)
	}
	if partName("b", 7, 1200) != "b.part0007" {
		t.Errorf("partName for 1200 parts: %s", partName("b", 7, 1200))
	}
}

// FuzzParseParts: no panic on any input, and whatever parses survives a marshalParts round trip.
func FuzzParseParts(f *testing.F) {
	h := strings.Repeat("ab", 32)
	f.Add([]byte("apiVersion: " + APIVersion + "\nkind: BundleParts\nbundle: b\nsumsSHA256: " + h + "\nsize: 3\npartSize: 3\nparts:\n- {name: b.part001, size: 3, sha256: " + h + "}\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := ParseParts(in)
		if err != nil {
			return
		}
		data, err := marshalParts(m)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseParts(data)
		if err != nil || again.Size != m.Size || len(again.Parts) != len(m.Parts) {
			t.Fatalf("round trip: %+v, %v", again, err)
		}
	})
}

// TestSplitJoinDifferential: an update made with --since (pruned) travels in parts too; the join gives
// the differential bundle back, which imports onto its base into a bundle that verifies.
func TestSplitJoinDifferential(t *testing.T) {
	smallParts(t)
	u := newUpdate(t)
	if _, err := Prune(u.Dir, u.Base); err != nil {
		t.Fatal(err)
	}
	parts := t.TempDir()
	m, err := Split(context.Background(), u.Dir, parts, testPartSize, nil)
	if err != nil {
		t.Fatalf("Split of a differential bundle: %v", err)
	}
	if m.Base == nil || m.Base.Name != testMeta.Name {
		t.Errorf("PARTS base %v, want the update's base", m.Base)
	}
	joined := filepath.Join(t.TempDir(), "joined")
	if err := Join(context.Background(), parts, joined, nil); err != nil {
		t.Fatalf("Join: %v", err)
	}
	sameTree(t, u.Dir, joined)
	full := filepath.Join(t.TempDir(), "full")
	if _, err := Import(context.Background(), joined, u.Base, full); err != nil {
		t.Fatalf("Import of the joined update: %v", err)
	}
	sameTree(t, u.Full, full)
}

// TestJoinChecksDifferentialFiles: Verify cannot run on a differential bundle before Import, so Join
// checks each file it extracts against SHA256SUMS itself.
func TestJoinChecksDifferentialFiles(t *testing.T) {
	u := newUpdate(t)
	if _, err := Prune(u.Dir, u.Base); err != nil {
		t.Fatal(err)
	}
	index := filepath.Join(u.Dir, ImagesPath, "index.json")
	data, _ := os.ReadFile(index)
	write(t, index, append(data, ' '))
	var stream bytes.Buffer
	cmd := exec.Command("tar", "--format=pax", "-c", "-C", u.Dir, SumsFile, SignatureFile, MetadataFile, ImagesPath)
	cmd.Stdout = &stream
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	sums, _ := os.ReadFile(filepath.Join(u.Dir, SumsFile))
	out := filepath.Join(t.TempDir(), "out")
	err := Join(context.Background(), writeCraftedParts(t, stream.Bytes(), sha(sums)), out, nil)
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "images/index.json") {
		t.Fatalf("Join: %v, want a mismatch naming images/index.json", err)
	}
	if _, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
		t.Error("out was created")
	}
}

// TestMinPartSizeMatchesSpec: the spec refuses what Split refuses, no more, no less.
func TestMinPartSizeMatchesSpec(t *testing.T) {
	if MinPartSize != int64(bundlespec.MinPartSize) {
		t.Fatalf("bundle.MinPartSize %d, bundlespec.MinPartSize %d", MinPartSize, bundlespec.MinPartSize)
	}
}
