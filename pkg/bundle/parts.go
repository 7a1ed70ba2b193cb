package bundle

// Parts: a finished bundle cut into files for removable media, and joined back.
//
// Split streams the bundle directory as one deterministic tar archive (POSIX.1-2001 pax format) and
// cuts the stream at byte boundaries, as split(1) does, into NAME.part001, NAME.part002, … beside a
// NAME.partNNN.sha256 for each (sha256sum(1) format, so `sha256sum -c *.sha256` checks a copy) and
// the manifest PARTS, written last. Without tools of ours the bundle comes back with
// `cat NAME.part??? | tar -x -C DIR`; Join does the same after checking every part, refuses unsafe
// archive entries, and verifies the result.

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// PartsFile is the manifest of a parts directory; PartsKind is its kind.
const (
	PartsFile = "PARTS"
	PartsKind = "BundleParts"
)

// ErrParts: a parts directory has no PARTS (the split did not finish, or this is not one), PARTS is
// malformed, or the archive the parts hold is not a bundle archive Split could have written (an
// absolute or ".." path, a link, a device, a duplicate entry, trailing data). Damaged or missing parts
// are *FileError values wrapping ErrMismatch or ErrMissing instead.
var ErrParts = errors.New("invalid bundle parts")

// minPartSize is the smallest part Split writes, in bytes; tests lower it to exercise many parts.
// MinPartSize is the smallest part Split writes, in bytes (1 MiB; bundlespec.MinPartSize, the spec's
// limit, is the same: TestMinPartSizeMatchesSpec).
const MinPartSize = 1 << 20

// sizeText writes n bytes as bundlespec sizes read (e.g. "1MiB"), or in bytes.
func sizeText(n int64) string {
	if n > 0 && n%(1<<20) == 0 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// minPartSize is MinPartSize, lowered by tests that split tiny bundles.
var minPartSize = int64(MinPartSize)

// joinMarker is created in OUT.tmp while Join fills it: a later Join removes an OUT.tmp holding it
// (left by a killed join) and refuses to touch any other.
const joinMarker = ".appliance-join-in-progress"

// maxPartsManifest bounds the size of PARTS, in bytes.
const maxPartsManifest = 4 << 20

// PartsManifest is the content of PARTS (YAML), e.g.
//
//	apiVersion: appliance.airgap.dev/v1alpha1
//	kind: BundleParts
//	bundle: k8s-1.37.2
//	kubernetesVersion: v1.37.2
//	sumsSHA256: 5d41…      # SHA-256 of the bundle's SHA256SUMS: names the bundle the parts rebuild
//	size: 9876543210       # bytes of the whole archive (the parts concatenated)
//	partSize: 4294967296   # every part but the last holds exactly this many bytes
//	parts:
//	  - name: k8s-1.37.2.part001
//	    size: 4294967296
//	    sha256: 9b02…
type PartsManifest struct {
	// APIVersion must be APIVersion, Kind PartsKind.
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	// Bundle and KubernetesVersion are the bundle's bundle.yaml name and kubernetesVersion.
	Bundle            string `yaml:"bundle"`
	KubernetesVersion string `yaml:"kubernetesVersion"`
	// SumsSHA256 is the lowercase hex SHA-256 of the bundle's SHA256SUMS (which the bundle signature
	// covers), so the parts name exactly the bundle they rebuild.
	SumsSHA256 string `yaml:"sumsSHA256"`
	// Size is the length of the archive in bytes, the sum of the parts' sizes.
	Size int64 `yaml:"size"`
	// Base is the bundle's Metadata.Base when it is differential: the join gives the differential
	// bundle, which is then imported onto that base (Import).
	Base *BaseRef `yaml:"base,omitempty"`
	// PartSize is the largest part in bytes: every part but the last is exactly this long.
	PartSize int64 `yaml:"partSize"`
	// Parts are in archive order.
	Parts []Part `yaml:"parts"`
}

// Part is one part file of a split bundle.
type Part struct {
	// Name is the file name in the parts directory, BUNDLE.partNNN (at least three digits, from 001).
	Name string `yaml:"name"`
	// Size in bytes and lowercase hex SHA-256 of the file.
	Size   int64  `yaml:"size"`
	SHA256 string `yaml:"sha256"`
}

var (
	partNameRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]*\.part[0-9]{3,}$`)
	staleFileRE = regexp.MustCompile(`\.part[0-9]{3,}(\.sha256)?(\.tmp)?$`)
	hex256RE    = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Validate returns every problem with m at once (errors.Join), each naming its field and wrapping
// ErrParts: the identity fields, then the parts' names (BUNDLE.partNNN, numbered from 1 in order),
// digests and sizes (every part but the last PartSize bytes, the last 1 to PartSize, summing to Size).
func (m PartsManifest) Validate() error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrParts}, args...)...))
	}
	if m.APIVersion != APIVersion {
		add("apiVersion: %q is not %q", m.APIVersion, APIVersion)
	}
	if m.Kind != PartsKind {
		add("kind: %q is not %q", m.Kind, PartsKind)
	}
	if !nameRE.MatchString(m.Bundle) {
		add("bundle: %q is not a bundle name", m.Bundle)
	}
	if !hex256RE.MatchString(m.SumsSHA256) {
		add("sumsSHA256: %q is not a lowercase hex SHA-256", m.SumsSHA256)
	}
	if m.Base != nil && (!nameRE.MatchString(m.Base.Name) || !digestRE.MatchString(m.Base.SumsDigest)) {
		add("base: %q is not a bundle name and SHA256SUMS digest", m.Base.String())
	}
	if m.PartSize <= 0 {
		add("partSize: %d is not a positive number of bytes", m.PartSize)
	}
	if len(m.Parts) == 0 {
		add("parts: empty")
	}
	var sum int64
	for i, p := range m.Parts {
		want := partName(m.Bundle, i+1, len(m.Parts))
		if !partNameRE.MatchString(p.Name) || p.Name != want {
			add("parts[%d].name: %q is not %q", i, p.Name, want)
		}
		if !hex256RE.MatchString(p.SHA256) {
			add("parts[%d].sha256: %q is not a lowercase hex SHA-256", i, p.SHA256)
		}
		switch last := i == len(m.Parts)-1; {
		case !last && p.Size != m.PartSize:
			add("parts[%d].size: %d is not partSize (%d): only the last part may be shorter", i, p.Size, m.PartSize)
		case last && (p.Size < 1 || p.Size > m.PartSize):
			add("parts[%d].size: %d is not 1 to partSize (%d)", i, p.Size, m.PartSize)
		}
		sum += p.Size
	}
	if m.Size != sum {
		add("size: %d is not the sum of the parts' sizes (%d)", m.Size, sum)
	}
	return errors.Join(errs...)
}

// partName is BUNDLE.partNNN for part i of n: three digits, more when n needs them, so that the
// names sort in order (and `cat BUNDLE.part???` concatenates them in order).
func partName(bundleName string, i, n int) string {
	width := max(3, len(strconv.Itoa(n)))
	return fmt.Sprintf("%s.part%0*d", bundleName, width, i)
}

// ParseParts decodes a PARTS document strictly (an unknown key, a second document or a wrong type is
// an error with its line) and validates it. Errors wrap ErrParts.
func ParseParts(data []byte) (PartsManifest, error) {
	var m PartsManifest
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&m); err != nil {
		if errors.Is(err, io.EOF) {
			return PartsManifest{}, fmt.Errorf("%w: empty document", ErrParts)
		}
		return PartsManifest{}, fmt.Errorf("%w: %w", ErrParts, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return PartsManifest{}, fmt.Errorf("%w: more than one YAML document", ErrParts)
	}
	if err := m.Validate(); err != nil {
		return PartsManifest{}, err
	}
	return m, nil
}

// ReadParts reads and parses partsDir/PARTS. Errors name the file and wrap ErrParts; a missing PARTS
// says that the split did not finish or that the directory holds no parts.
func ReadParts(partsDir string) (PartsManifest, error) {
	p := filepath.Join(partsDir, PartsFile)
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return PartsManifest{}, fmt.Errorf("%s: %w: not found: %s holds no complete set of bundle parts (a split that did not finish writes no %s; split the bundle again, or copy %s from the medium too)",
			p, ErrParts, partsDir, PartsFile, PartsFile)
	} else if err != nil {
		return PartsManifest{}, fmt.Errorf("read %s: %w", p, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxPartsManifest+1))
	if err != nil {
		return PartsManifest{}, fmt.Errorf("read %s: %w", p, err)
	}
	if len(data) > maxPartsManifest {
		return PartsManifest{}, fmt.Errorf("%s: %w: larger than %d bytes", p, ErrParts, maxPartsManifest)
	}
	m, err := ParseParts(data)
	if err != nil {
		return PartsManifest{}, fmt.Errorf("%s: %w", p, err)
	}
	return m, nil
}

// marshalParts renders PARTS: a comment saying how to join, then m as 2-space indented YAML.
func marshalParts(m PartsManifest) ([]byte, error) {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# Bundle %s in %d parts. Join: appliance bundle join DIR --out BUNDLE_DIR\n", m.Bundle, len(m.Parts))
	glob := m.Bundle + ".part" + strings.Repeat("?", len(partName("", 1, len(m.Parts)))-len(".part"))
	fmt.Fprintf(&buf, "# (by hand: sha256sum -c %s.sha256 && cat %s | tar -x -C BUNDLE_DIR)\n", glob, glob)
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("encode %s: %w", PartsFile, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode %s: %w", PartsFile, err)
	}
	return buf.Bytes(), nil
}

// archiveEntry is one member of the bundle archive.
type archiveEntry struct {
	rel  string // slash path relative to the bundle directory
	hdr  *tar.Header
	want string // SHA-256 from SHA256SUMS; "" for directories, SHA256SUMS and its signature
}

// Split cuts the finished, signed bundle dir into parts of at most partSize bytes in partsDir
// (created if missing; it must not lie inside dir) and returns the manifest it wrote there as PARTS.
//
// The archive is a tar stream in pax format of every directory and regular file of the bundle in
// filepath.WalkDir order (lexical within each directory, each directory before its contents), with
// uid and gid 0, no user or group names, the file's permission bits and its mtime truncated to the
// second: the same bundle always gives the same bytes. Each file is checked against SHA256SUMS as it
// is read, so a damaged bundle is refused here rather than discovered at the join. A differential
// bundle (Metadata.Base, after Prune) is split as it is: the files its base holds stay absent.
//
// Each part is written as NAME.partNNN.tmp and renamed when complete, then NAME.partNNN.sha256 beside
// it; PARTS is written last (atomically), so a split that is killed leaves a directory Join refuses.
// Any PARTS and BUNDLE.partNNN[.sha256][.tmp] files already in partsDir are removed first (so a rerun
// with another part size leaves no stale parts), and again when Split fails; other files are left alone.
//
// progress, if not nil, is called with the bytes written so far and the archive's total, in bytes:
// done never decreases, starts at 0 and ends at total. Errors: ErrUnsigned for a bundle without
// SHA256SUMS.sig; *FileError values (ErrMissing, ErrUnlisted, ErrNotRegular, ErrMismatch) for a
// bundle whose files do not match SHA256SUMS; a part size below MinPartSize; ctx.Err().
func Split(ctx context.Context, dir, partsDir string, partSize int64, progress func(done, total int64)) (PartsManifest, error) {
	if partSize < minPartSize {
		return PartsManifest{}, fmt.Errorf("part size %d bytes is too small: parts hold at least %s", partSize, sizeText(minPartSize))
	}
	b, err := Open(dir)
	if err != nil {
		return PartsManifest{}, err
	}
	if _, err := os.Stat(filepath.Join(b.Dir, SignatureFile)); errors.Is(err, fs.ErrNotExist) {
		return PartsManifest{}, fmt.Errorf("%s: %w: only a finished, signed bundle is split (appliance bundle create signs it)", filepath.Join(b.Dir, SignatureFile), ErrUnsigned)
	} else if err != nil {
		return PartsManifest{}, err
	}
	absParts, err := filepath.Abs(partsDir)
	if err != nil {
		return PartsManifest{}, err
	}
	if real, err := filepath.EvalSymlinks(absParts); err == nil {
		absParts = real
	} else if real, err := filepath.EvalSymlinks(filepath.Dir(absParts)); err == nil { // not made yet
		absParts = filepath.Join(real, filepath.Base(absParts))
	}
	if rel, err := filepath.Rel(b.Dir, absParts); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		return PartsManifest{}, fmt.Errorf("parts directory %s is inside the bundle %s: put the parts elsewhere (e.g. %s.parts)", partsDir, b.Dir, b.Dir)
	}
	sumsData, err := os.ReadFile(filepath.Join(b.Dir, SumsFile))
	if err != nil {
		return PartsManifest{}, fmt.Errorf("read %s: %w", filepath.Join(b.Dir, SumsFile), err)
	}
	entries, total, err := planArchive(b.Dir, sumsData, b.Meta.Base != nil)
	if err != nil {
		return PartsManifest{}, err
	}
	m := PartsManifest{APIVersion: APIVersion, Kind: PartsKind, Bundle: b.Meta.Name, KubernetesVersion: b.Meta.KubernetesVersion,
		SumsSHA256: sha256Hex(sumsData), Base: b.Meta.Base, Size: total, PartSize: partSize}

	if err := os.MkdirAll(absParts, 0o755); err != nil {
		return PartsManifest{}, fmt.Errorf("create parts directory: %w", err)
	}
	if err := removeStaleParts(absParts); err != nil {
		return PartsManifest{}, err
	}
	n := int((total + partSize - 1) / partSize)
	pw := &partWriter{dir: absParts, name: func(i int) string { return partName(b.Meta.Name, i, n) },
		size: partSize, total: total, progress: progress}
	if progress != nil {
		progress(0, total)
	}
	if err := writeArchive(ctx, b.Dir, entries, pw); err != nil {
		pw.abort()
		_ = removeStaleParts(absParts)
		return PartsManifest{}, err
	}
	if pw.done != total {
		_ = removeStaleParts(absParts)
		return PartsManifest{}, fmt.Errorf("split %s: wrote %d bytes, planned %d: the bundle changed while it was split; split it again", b.Dir, pw.done, total)
	}
	m.Parts = pw.parts
	if err := m.Validate(); err != nil { // unreachable unless partWriter is wrong; never write a bad PARTS
		_ = removeStaleParts(absParts)
		return PartsManifest{}, fmt.Errorf("split %s: %w", b.Dir, err)
	}
	data, err := marshalParts(m)
	if err != nil {
		return PartsManifest{}, err
	}
	if _, err := atomicfile.Write(filepath.Join(absParts, PartsFile), data, 0o644); err != nil {
		return PartsManifest{}, err
	}
	return m, nil
}

// planArchive lists the archive's entries and computes its exact length in bytes (so progress has a
// total and the part names their width before anything is written). Every regular file but
// SHA256SUMS and its signature must be listed in sumsData, and every listed file present unless the
// bundle is differential.
func planArchive(dir string, sumsData []byte, differential bool) ([]archiveEntry, int64, error) {
	sums, err := ParseSums(bytes.NewReader(sumsData))
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", filepath.Join(dir, SumsFile), err)
	}
	want := make(map[string]string, len(sums))
	for _, s := range sums {
		want[s.Path] = s.SHA256
	}
	var entries []archiveEntry
	problems := map[string]error{}
	seen := map[string]bool{}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("scan bundle %s: %w", dir, err)
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if !d.IsDir() && !d.Type().IsRegular() {
			problems[rel] = &FileError{Path: rel, Err: ErrNotRegular, Detail: d.Type().String()}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return fmt.Errorf("scan bundle %s: %w", dir, err)
		}
		hdr := &tar.Header{Name: rel, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime().Truncate(time.Second), Format: tar.FormatPAX}
		e := archiveEntry{rel: rel, hdr: hdr}
		if d.IsDir() {
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
		} else {
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
			if rel != SumsFile && rel != SignatureFile {
				w, ok := want[rel]
				if !ok {
					problems[rel] = &FileError{Path: rel, Err: ErrUnlisted}
					return nil
				}
				e.want = w
				seen[rel] = true
			}
		}
		entries = append(entries, e)
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	for _, s := range sums {
		if !seen[s.Path] && !differential {
			if _, bad := problems[s.Path]; !bad {
				problems[s.Path] = &FileError{Path: s.Path, Err: ErrMissing, Detail: "listed in " + SumsFile}
			}
		}
	}
	if len(problems) > 0 {
		return nil, 0, fmt.Errorf("not split: %w", joinProblems(dir, problems))
	}
	var total int64 = 2 * blockSize // the end-of-archive marker
	for _, e := range entries {
		n, err := headerLen(e.hdr)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", e.rel, err)
		}
		total += n + roundBlock(e.hdr.Size)
	}
	return entries, total, nil
}

const blockSize = 512

func roundBlock(n int64) int64 { return (n + blockSize - 1) / blockSize * blockSize }

// headerLen is how many bytes archive/tar writes for hdr (its pax extended header, if any, and the
// header block), measured by writing it.
func headerLen(hdr *tar.Header) (int64, error) {
	var c countWriter
	if err := tar.NewWriter(&c).WriteHeader(hdr); err != nil {
		return 0, err
	}
	return int64(c), nil
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

// writeArchive writes the planned entries as a tar stream to pw, checking each file's size against
// the plan and its SHA-256 against SHA256SUMS.
func writeArchive(ctx context.Context, dir string, entries []archiveEntry, pw *partWriter) error {
	bw := bufio.NewWriterSize(pw, int(min(1<<20, pw.size)))
	tw := tar.NewWriter(bw)
	buf := bufPool.Get().(*[]byte)
	defer bufPool.Put(buf)
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := tw.WriteHeader(e.hdr); err != nil {
			return fmt.Errorf("split: %s: %w", e.rel, err)
		}
		if e.hdr.Typeflag != tar.TypeReg {
			continue
		}
		if err := copyFile(ctx, filepath.Join(dir, filepath.FromSlash(e.rel)), e, tw, *buf); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("split: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("split: %w", err)
	}
	return pw.close()
}

func copyFile(ctx context.Context, p string, e archiveEntry, w io.Writer, buf []byte) error {
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("split: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(w, io.TeeReader(ctxReader{ctx, f}, h), buf)
	if err != nil && !errors.Is(err, tar.ErrWriteTooLong) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("split: %s: %w", e.rel, err)
	}
	if err != nil || n != e.hdr.Size {
		return &FileError{Path: e.rel, Err: ErrMismatch, Detail: "the file changed size while the bundle was split; split it again",
			Want: fmt.Sprintf("%d bytes", e.hdr.Size), Got: fmt.Sprintf("%d bytes or more", n)}
	}
	if got := hex.EncodeToString(h.Sum(nil)); e.want != "" && got != e.want {
		return &FileError{Path: e.rel, Err: ErrMismatch, Detail: "the bundle is damaged: make it again or copy it again from its maker", Want: e.want, Got: got}
	}
	return nil
}

// removeStaleParts removes PARTS first (so the directory stops looking complete), then every part,
// part checksum and unfinished part file.
func removeStaleParts(dir string) error {
	if err := os.Remove(filepath.Join(dir, PartsFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the old %s: %w", PartsFile, err)
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read parts directory: %w", err)
	}
	for _, de := range des {
		if de.Type().IsRegular() && staleFileRE.MatchString(de.Name()) {
			if err := os.Remove(filepath.Join(dir, de.Name())); err != nil {
				return fmt.Errorf("remove a stale part: %w", err)
			}
		}
	}
	return nil
}

// partWriter cuts what is written to it into part files of size bytes (the last one shorter).
type partWriter struct {
	dir      string
	name     func(i int) string // file name of part i (from 1)
	size     int64
	total    int64
	progress func(done, total int64)

	done  int64 // bytes written to all parts
	parts []Part
	f     *os.File // the current part's .tmp file, or nil
	h     hash.Hash
	n     int64 // bytes in the current part
}

func (w *partWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		if w.f == nil {
			f, err := os.OpenFile(filepath.Join(w.dir, w.name(len(w.parts)+1)+".tmp"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
			if err != nil {
				return written, fmt.Errorf("write part: %w", err)
			}
			w.f, w.h, w.n = f, sha256.New(), 0
		}
		k := min(int64(len(p)), w.size-w.n)
		m, err := w.f.Write(p[:k])
		w.h.Write(p[:m])
		w.n += int64(m)
		w.done += int64(m)
		written += m
		if err != nil {
			return written, fmt.Errorf("write part %s (is the medium full?): %w", w.f.Name(), err)
		}
		p = p[k:]
		if w.n == w.size {
			if err := w.finish(); err != nil {
				return written, err
			}
		}
	}
	if w.progress != nil {
		w.progress(w.done, w.total)
	}
	return written, nil
}

// finish syncs and closes the current part, renames it into place, writes its .sha256 and records it.
func (w *partWriter) finish() error {
	tmp := w.f.Name()
	err := w.f.Sync()
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	w.f = nil
	if err != nil {
		return fmt.Errorf("write part %s: %w", tmp, err)
	}
	name := w.name(len(w.parts) + 1)
	if err := os.Rename(tmp, filepath.Join(w.dir, name)); err != nil {
		return fmt.Errorf("write part: %w", err)
	}
	sum := hex.EncodeToString(w.h.Sum(nil))
	if _, err := atomicfile.Write(filepath.Join(w.dir, name+".sha256"), FormatSums([]Sum{{Path: name, SHA256: sum}}), 0o644); err != nil {
		return err
	}
	w.parts = append(w.parts, Part{Name: name, Size: w.n, SHA256: sum})
	return nil
}

// close finishes the last, short part.
func (w *partWriter) close() error {
	if w.f == nil {
		return nil
	}
	return w.finish()
}

// abort closes and removes an unfinished part.
func (w *partWriter) abort() {
	if w.f != nil {
		_ = w.f.Close()
		_ = os.Remove(w.f.Name())
		w.f = nil
	}
}

func sha256Hex(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// Join rebuilds the bundle that partsDir holds (as Split wrote it) in the directory out, which must
// not exist or be empty, and verifies it (Verify, without a stamp). It does not check the bundle's
// signature: the caller does, with its pinned keys (bootstrap, `appliance bundle verify`).
//
// In order: it reads PARTS; checks every part's size and SHA-256 and reports every damaged or missing
// part at once (*FileError values naming the part file, wrapping ErrMismatch or ErrMissing), before
// anything is extracted; extracts the concatenated parts into OUT.tmp (re-hashing each part as it is
// read, in case the medium changed in between), accepting only directories and regular files with
// clean relative paths (anything else, e.g. "../x", an absolute path, a link or a device, is refused
// with ErrParts); checks that OUT.tmp/SHA256SUMS is the one PARTS names and every extracted file
// against it; runs Verify on OUT.tmp; and only then renames OUT.tmp to out. A differential bundle
// (Metadata.Base) comes back as it was split, without its base's files: Verify's ErrNeedsBase is
// expected there, and Import verifies the complete bundle. On failure OUT.tmp is removed and out is
// not created. An OUT.tmp left by a killed Join is removed first; any other OUT.tmp is refused, never
// removed.
//
// progress, if not nil, is called with bytes read so far and the total, in bytes: checking the parts
// counts from 0 to the archive's size, extracting from there to twice the size; done never decreases.
// The final Verify is not counted.
func Join(ctx context.Context, partsDir, out string, progress func(done, total int64)) error {
	m, err := ReadParts(partsDir)
	if err != nil {
		return err
	}
	out = filepath.Clean(out)
	if err := checkJoinTarget(out); err != nil {
		return err
	}
	pr := &partsReader{ctx: ctx, dir: partsDir, parts: m.Parts, total: 2 * m.Size, progress: progress}
	if progress != nil {
		progress(0, pr.total)
	}
	if err := pr.checkAll(); err != nil {
		return err
	}

	tmp := out + ".tmp"
	if err := prepareJoinTmp(tmp); err != nil {
		return err
	}
	hashes, err := extract(ctx, pr, tmp)
	if err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	sums, err := os.ReadFile(filepath.Join(tmp, SumsFile))
	if err != nil || sha256Hex(sums) != m.SumsSHA256 {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("%s: %w: the parts do not hold the %s that %s names (sumsSHA256 %s): split the bundle again",
			partsDir, ErrParts, SumsFile, PartsFile, m.SumsSHA256)
	}
	if err := os.Remove(filepath.Join(tmp, joinMarker)); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	b, err := Open(tmp)
	if err == nil {
		err = checkExtracted(tmp, sums, hashes)
	}
	if err == nil {
		// A differential bundle lacks its base's files until Import, which verifies it complete; its
		// own files were checked against SHA256SUMS just above.
		if _, err = b.Verify(ctx, ""); errors.Is(err, ErrNeedsBase) && b.Meta.Base != nil {
			err = nil
		}
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("the bundle joined from %s does not verify (split it again from the original):\n%w", partsDir, err)
	}
	if err := os.Remove(out); err != nil && !errors.Is(err, fs.ErrNotExist) { // an empty directory
		_ = os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("join: %w", err)
	}
	if d, err := os.Open(filepath.Dir(out)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// checkExtracted checks every extracted file (hashes: slash path → hex SHA-256) against the
// extracted SHA256SUMS: listed, with that digest. Errors list every problem as Verify does.
func checkExtracted(dir string, sumsData []byte, hashes map[string]string) error {
	sums, err := ParseSums(bytes.NewReader(sumsData))
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, SumsFile), err)
	}
	want := make(map[string]string, len(sums))
	for _, s := range sums {
		want[s.Path] = s.SHA256
	}
	problems := map[string]error{}
	for p, got := range hashes {
		switch w, ok := want[p]; {
		case p == SumsFile || p == SignatureFile:
		case !ok:
			problems[p] = &FileError{Path: p, Err: ErrUnlisted}
		case w != got:
			problems[p] = &FileError{Path: p, Err: ErrMismatch, Want: w, Got: got}
		}
	}
	if len(problems) > 0 {
		return joinProblems(dir, problems)
	}
	return nil
}

// checkJoinTarget accepts an out that does not exist or is an empty directory.
func checkJoinTarget(out string) error {
	fi, err := os.Lstat(out)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s exists and is not a directory: join into a new directory", out)
	}
	des, err := os.ReadDir(out)
	if err != nil {
		return err
	}
	if len(des) > 0 {
		return fmt.Errorf("%s exists and is not empty: join into a new directory (or remove it first)", out)
	}
	return nil
}

// prepareJoinTmp makes an empty tmp holding the join marker, removing a tmp left by a killed Join.
func prepareJoinTmp(tmp string) error {
	if _, err := os.Lstat(tmp); err == nil {
		_, merr := os.Stat(filepath.Join(tmp, joinMarker))
		des, derr := os.ReadDir(tmp)
		if merr != nil && (derr != nil || len(des) > 0) {
			return fmt.Errorf("%s exists and was not left by an earlier join: remove or rename it, or join elsewhere", tmp)
		}
		if err := os.RemoveAll(tmp); err != nil {
			return fmt.Errorf("remove the unfinished join %s: %w", tmp, err)
		}
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return fmt.Errorf("join: %w", err)
	}
	return os.WriteFile(filepath.Join(tmp, joinMarker), nil, 0o644)
}

// partsReader reads the parts in order as one stream, hashing each part as it goes and failing at a
// part whose size or SHA-256 differs from PARTS.
type partsReader struct {
	ctx      context.Context
	dir      string
	parts    []Part
	done     int64
	total    int64
	progress func(done, total int64)

	i int      // current part
	f *os.File // open current part, or nil
	h hash.Hash
	n int64
}

// checkAll hashes every part (the first half of progress) and returns every problem at once.
func (r *partsReader) checkAll() error {
	var errs []error
	buf := bufPool.Get().(*[]byte)
	defer bufPool.Put(buf)
	for _, p := range r.parts {
		path := filepath.Join(r.dir, p.Name)
		start := r.done
		err := r.checkOne(path, p, *buf)
		r.advance(start + p.Size - r.done) // a short or missing part still moves progress to its end
		if err != nil {
			if ctxErr := r.ctx.Err(); ctxErr != nil {
				return ctxErr
			}
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		head := fmt.Errorf("%d of the %d parts in %s are damaged or missing; nothing was extracted", len(errs), len(r.parts), r.dir)
		return errors.Join(append([]error{head}, errs...)...)
	}
	return nil
}

func (r *partsReader) checkOne(path string, p Part, buf []byte) error {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &FileError{Path: path, Err: ErrMissing, Detail: "listed in " + PartsFile + ": copy it from the medium"}
	} else if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return &FileError{Path: path, Err: ErrNotRegular, Detail: fi.Mode().Type().String() + ": copy the part itself from the medium"}
	}
	if fi.Size() != p.Size {
		return &FileError{Path: path, Err: ErrMismatch, Detail: "wrong size, the copy is incomplete or damaged: copy it again from the medium",
			Want: fmt.Sprintf("%d bytes", p.Size), Got: fmt.Sprintf("%d bytes", fi.Size())}
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	pw := progressWriter{r}
	if _, err := io.CopyBuffer(io.MultiWriter(h, pw), ctxReader{r.ctx, f}, buf); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != p.SHA256 {
		return &FileError{Path: path, Err: ErrMismatch, Detail: "the part is damaged: copy it again from the medium", Want: p.SHA256, Got: got}
	}
	return nil
}

// progressWriter counts bytes into the reader's progress.
type progressWriter struct{ r *partsReader }

func (w progressWriter) Write(p []byte) (int, error) { w.r.advance(int64(len(p))); return len(p), nil }

func (r *partsReader) advance(n int64) {
	if n <= 0 {
		return
	}
	r.done += n
	if r.progress != nil {
		r.progress(r.done, r.total)
	}
}

// current names the part being read, for errors about archive entries.
func (r *partsReader) current() string {
	return filepath.Join(r.dir, r.parts[min(r.i, len(r.parts)-1)].Name)
}

func (r *partsReader) Read(b []byte) (int, error) {
	for {
		if err := r.ctx.Err(); err != nil {
			return 0, err
		}
		if r.i == len(r.parts) {
			return 0, io.EOF
		}
		p := r.parts[r.i]
		path := filepath.Join(r.dir, p.Name)
		if r.f == nil {
			f, err := os.Open(path)
			if err != nil {
				return 0, fmt.Errorf("%s: %w (it was there a moment ago: copy it again from the medium)", path, err)
			}
			r.f, r.h, r.n = f, sha256.New(), 0
		}
		n, err := r.f.Read(b)
		r.h.Write(b[:n])
		r.n += int64(n)
		if r.n > p.Size {
			return 0, &FileError{Path: path, Err: ErrMismatch, Detail: "the part changed while it was read: copy it again from the medium"}
		}
		r.advance(int64(n))
		if errors.Is(err, io.EOF) {
			_ = r.f.Close()
			r.f = nil
			if got := hex.EncodeToString(r.h.Sum(nil)); r.n != p.Size || got != p.SHA256 {
				return n, &FileError{Path: path, Err: ErrMismatch, Detail: "the part changed while it was read: copy it again from the medium", Want: p.SHA256, Got: got}
			}
			r.i++
			if n > 0 {
				return n, nil
			}
			continue
		}
		if err != nil {
			return n, fmt.Errorf("%s: %w", path, err)
		}
		return n, nil
	}
}

func (r *partsReader) close() {
	if r.f != nil {
		_ = r.f.Close()
		r.f = nil
	}
}

// extract writes the archive read from r into dir (which exists and holds only the join marker):
// directories and regular files only, at clean relative paths, each created once. It returns each
// file's hex SHA-256 by slash path.
func extract(ctx context.Context, r *partsReader, dir string) (map[string]string, error) {
	defer r.close()
	tr := tar.NewReader(r)
	buf := bufPool.Get().(*[]byte)
	defer bufPool.Put(buf)
	type dirTime struct {
		path string
		t    time.Time
	}
	var dirs []dirTime
	hashes := map[string]string{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			var fe *FileError
			if errors.As(err, &fe) {
				return nil, err
			}
			return nil, fmt.Errorf("%s: %w: the archive is damaged: %v", r.current(), ErrParts, err)
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		unsafe := func(why string) error {
			return fmt.Errorf("%s: %w: archive entry %q %s; refused (these parts were not written by appliance bundle split, or were tampered with)",
				r.current(), ErrParts, hdr.Name, why)
		}
		if err := checkRelPath(name); err != nil || name == joinMarker {
			return nil, unsafe("is not a clean relative path inside the bundle")
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		perm := fs.FileMode(hdr.Mode).Perm() & 0o755
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, perm|0o700); err != nil {
				return nil, fmt.Errorf("join: %s: %w", name, err)
			}
			dirs = append(dirs, dirTime{target, hdr.ModTime})
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return nil, fmt.Errorf("join: %w", err)
			}
			sum, err := writeEntry(target, perm, hdr, tr, *buf)
			if err != nil {
				if errors.Is(err, fs.ErrExist) {
					return nil, unsafe("appears twice")
				}
				var fe *FileError
				if errors.As(err, &fe) || ctx.Err() != nil {
					return nil, err
				}
				return nil, fmt.Errorf("join: %s: %w", name, err)
			}
			hashes[name] = sum
		default:
			return nil, unsafe(fmt.Sprintf("is of type %q, not a directory or regular file", hdr.Typeflag))
		}
	}
	// What follows the end-of-archive marker must be zeros (Split writes none): anything else means
	// the parts hold more than the archive.
	if _, err := io.Copy(nonZeroWriter{}, r); err != nil {
		if errors.Is(err, errNonZero) {
			return nil, fmt.Errorf("%s: %w: data after the end of the archive", r.current(), ErrParts)
		}
		return nil, err
	}
	for i := len(dirs) - 1; i >= 0; i-- { // deepest first: setting a parent's time does not touch a child's
		_ = os.Chtimes(dirs[i].path, dirs[i].t, dirs[i].t)
	}
	return hashes, nil
}

// writeEntry creates target (which must not exist) with the entry's content and mtime, fsynced, and
// returns the content's hex SHA-256.
func writeEntry(target string, perm fs.FileMode, hdr *tar.Header, r io.Reader, buf []byte) (string, error) {
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	_, err = io.CopyBuffer(io.MultiWriter(f, h), io.LimitReader(r, hdr.Size), buf)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chtimes(target, hdr.ModTime, hdr.ModTime)
	}
	return hex.EncodeToString(h.Sum(nil)), err
}

var errNonZero = errors.New("non-zero byte")

type nonZeroWriter struct{}

func (nonZeroWriter) Write(p []byte) (int, error) {
	for _, c := range p {
		if c != 0 {
			return 0, errNonZero
		}
	}
	return len(p), nil
}
