package bundle

// Differential bundles: an update that carries only what its base lacks.
//
// A differential bundle is made like any bundle (Create, Sign) with Metadata.Base naming the bundle
// it applies to by the digest of that bundle's SHA256SUMS; then Prune removes every file the base
// already holds (same path, same SHA-256). Its SHA256SUMS, and so its signature, still cover every
// file of the complete bundle. On the appliance, Import rebuilds the complete bundle from the
// differential one and its base, hard-linking the base's files, and verifies it; the result is an
// ordinary bundle (its bundle.yaml still names the base) that Verify and VerifySignature accept.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// blobsPath is the OCI layout's sha256 blob directory inside a bundle.
const blobsPath = ImagesPath + "/blobs/sha256"

// SumsDigest returns "sha256:" + the lowercase hex SHA-256 of dir/SHA256SUMS: what a differential
// bundle's Metadata.Base.SumsDigest names its base by. Errors name the file.
func SumsDigest(dir string) (string, error) {
	p := filepath.Join(dir, SumsFile)
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%s: %w: not found (is %s a finished bundle?)", p, ErrSums, dir)
		}
		return "", fmt.Errorf("read %s: %w", p, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", p, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// readSums parses dir/SHA256SUMS and returns it in file order and as path → hex SHA-256.
func readSums(dir string) ([]Sum, map[string]string, error) {
	p := filepath.Join(dir, SumsFile)
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, fmt.Errorf("%s: %w: not found (is %s a finished bundle?)", p, ErrSums, dir)
		}
		return nil, nil, fmt.Errorf("read %s: %w", p, err)
	}
	defer f.Close()
	sums, err := ParseSums(f)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", p, err)
	}
	m := make(map[string]string, len(sums))
	for _, s := range sums {
		m[s.Path] = s.SHA256
	}
	return sums, m, nil
}

// checkBase returns an error unless baseDir/SHA256SUMS has the digest meta.Base names. The error
// names both digests and the base to use.
func checkBase(dir string, meta Metadata, baseDir string) error {
	if meta.Base == nil {
		return fmt.Errorf("%s: not a differential bundle (its %s names no base): use it as it is", dir, MetadataFile)
	}
	got, err := SumsDigest(baseDir)
	if err != nil {
		return err
	}
	if got != meta.Base.SumsDigest {
		name := "?"
		if b, err := Open(baseDir); err == nil {
			name = b.Meta.Name
		}
		return fmt.Errorf("%s is not the base of %s: it is bundle %s with %s %s, but %s applies on top of bundle %s; use that bundle as the base",
			baseDir, dir, name, SumsFile, got, dir, meta.Base)
	}
	return nil
}

// PruneResult counts what Prune kept and removed. Files are those SHA256SUMS lists (bundle.yaml
// included; SHA256SUMS and SHA256SUMS.sig are always kept and not counted); bytes are file sizes.
type PruneResult struct {
	Kept, Dropped           int
	KeptBytes, DroppedBytes int64
}

// Prune makes the finished bundle dir differential against the bundle in baseDir: it removes every
// file of dir whose path and SHA-256 (as dir's SHA256SUMS lists them) baseDir's SHA256SUMS lists too,
// then the directories left empty. bundle.yaml, SHA256SUMS and SHA256SUMS.sig always stay. dir's
// bundle.yaml must name baseDir as its base (Metadata.Base, by SumsDigest), so a bundle is never
// pruned against a base it cannot be imported onto. Running it again removes nothing more. Errors
// name the file: a listed file that is neither in dir nor in the base means dir is not the bundle
// its SHA256SUMS describes.
func Prune(dir, baseDir string) (PruneResult, error) {
	var res PruneResult
	b, err := Open(dir)
	if err != nil {
		return res, err
	}
	if err := checkBase(b.Dir, b.Meta, baseDir); err != nil {
		return res, fmt.Errorf("prune: %w", err)
	}
	sums, _, err := readSums(b.Dir)
	if err != nil {
		return res, err
	}
	_, base, err := readSums(baseDir)
	if err != nil {
		return res, err
	}
	for _, s := range sums {
		p := filepath.Join(b.Dir, filepath.FromSlash(s.Path))
		fi, err := os.Lstat(p)
		present := err == nil
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return res, fmt.Errorf("prune %s: %w", s.Path, err)
		}
		if s.Path != MetadataFile && base[s.Path] == s.SHA256 {
			if present {
				if err := os.Remove(p); err != nil {
					return res, fmt.Errorf("prune %s: %w", s.Path, err)
				}
				res.DroppedBytes += fi.Size()
			}
			res.Dropped++
			continue
		}
		if !present {
			return res, &FileError{Path: s.Path, Err: ErrMissing, Detail: "listed in " + SumsFile + " and not in the base's: make the bundle again"}
		}
		res.Kept++
		res.KeptBytes += fi.Size()
	}
	return res, removeEmptyDirs(b.Dir)
}

// removeEmptyDirs removes every empty directory below root (not root), deepest first.
func removeEmptyDirs(root string) error {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	for _, d := range dirs {
		if err := os.Remove(d); err != nil && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("prune: %w", err)
		}
	}
	return nil
}

// ImportResult is what Import made.
type ImportResult struct {
	// Dir is the complete bundle (Import's out).
	Dir string
	// FromDiff and FromBase count the files taken from the differential bundle and from the base
	// (bundle.yaml included, SHA256SUMS and its signature not); DiffBytes and BaseBytes their sizes.
	FromDiff, FromBase   int
	DiffBytes, BaseBytes int64
	// Linked files are hard links to the source; Copied ones were copied (another filesystem).
	Linked, Copied int
	// Verify is the verification of the complete bundle.
	Verify VerifyResult
}

// Import makes the complete bundle out from the differential bundle diffDir and its base baseDir:
// diffDir's bundle.yaml must name baseDir by the digest of its SHA256SUMS (else an error naming both
// digests and the base to use). It builds out + ".tmp" holding every file diffDir's SHA256SUMS lists,
// taken from diffDir when it is there, else from baseDir when the base's SHA256SUMS lists the same
// path with the same SHA-256 (else an error naming each such file, wrapping ErrMissing); files are
// hard-linked (which changes the sources' ctime, so a verification stamp of the base re-hashes them
// once), copied when linking fails (e.g. across filesystems). SHA256SUMS and SHA256SUMS.sig come from
// diffDir. Then it verifies out.tmp in full (Verify, no stamp), syncs the filesystem and renames
// out.tmp to out. out must not exist or be an empty directory; a stale out.tmp is replaced. On any
// failure out.tmp is removed and out is not created.
//
// Import does not check signatures: the caller checks diffDir's (VerifySignature with its pinned
// keys) before, and may check out's after (the same bytes of SHA256SUMS and signature).
func Import(ctx context.Context, diffDir, baseDir, out string) (res ImportResult, err error) {
	diff, err := Open(diffDir)
	if err != nil {
		return res, err
	}
	if err := checkBase(diff.Dir, diff.Meta, baseDir); err != nil {
		return res, fmt.Errorf("import: %w", err)
	}
	base, err := resolveDir(baseDir)
	if err != nil {
		return res, err
	}
	sums, _, err := readSums(diff.Dir)
	if err != nil {
		return res, err
	}
	_, baseSums, err := readSums(base)
	if err != nil {
		return res, err
	}
	if err := checkEmptyOut(out); err != nil {
		return res, err
	}
	present, problems, err := scanTree(diff.Dir)
	if err != nil {
		return res, err
	}
	listed := make(map[string]bool, len(sums))
	for _, s := range sums {
		listed[s.Path] = true
	}
	for p := range present {
		if !listed[p] {
			problems[p] = &FileError{Path: p, Err: ErrUnlisted, Detail: "in the differential bundle " + diff.Dir}
		}
	}
	// Every file must have a source before anything is written.
	from := make(map[string]string, len(sums))
	for _, s := range sums {
		if _, bad := problems[s.Path]; bad {
			continue
		}
		if _, ok := present[s.Path]; ok {
			from[s.Path] = diff.Dir
			continue
		}
		switch got, ok := baseSums[s.Path]; {
		case !ok:
			problems[s.Path] = &FileError{Path: s.Path, Err: ErrMissing,
				Detail: "not in the differential bundle, and the base does not list it: get the differential bundle again"}
		case got != s.SHA256:
			problems[s.Path] = &FileError{Path: s.Path, Err: ErrMissing,
				Detail: "not in the differential bundle, and the base holds another version (sha256 " + got + ", want " + s.SHA256 + "): get the differential bundle again"}
		default:
			from[s.Path] = base
		}
	}
	if len(problems) > 0 {
		return res, fmt.Errorf("import %s onto %s: %w", diff.Dir, base, joinProblems(diff.Dir, problems))
	}

	tmp := filepath.Clean(out) + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return res, fmt.Errorf("remove stale %s: %w", tmp, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(tmp)
		}
	}()
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return res, err
	}
	for _, s := range sums {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		src := filepath.Join(from[s.Path], filepath.FromSlash(s.Path))
		n, linked, err := linkOrCopy(src, filepath.Join(tmp, filepath.FromSlash(s.Path)))
		if err != nil {
			return res, fmt.Errorf("import %s: %w", s.Path, err)
		}
		if from[s.Path] == base {
			res.FromBase++
			res.BaseBytes += n
		} else {
			res.FromDiff++
			res.DiffBytes += n
		}
		if linked {
			res.Linked++
		} else {
			res.Copied++
		}
	}
	for _, f := range []string{SumsFile, SignatureFile} {
		if _, _, err := linkOrCopy(filepath.Join(diff.Dir, f), filepath.Join(tmp, f)); err != nil && !(f == SignatureFile && errors.Is(err, fs.ErrNotExist)) {
			return res, fmt.Errorf("import %s: %w", f, err)
		}
	}
	merged, err := Open(tmp)
	if err != nil {
		return res, err
	}
	if res.Verify, err = merged.Verify(ctx, ""); err != nil {
		return res, fmt.Errorf("the bundle imported from %s onto %s does not verify (nothing was written to %s):\n%w", diff.Dir, base, out, err)
	}
	if err := syncFS(tmp); err != nil {
		return res, err
	}
	if err := os.Rename(tmp, out); err != nil {
		return res, fmt.Errorf("import: %w", err)
	}
	if err := syncFS(filepath.Dir(filepath.Clean(out))); err != nil {
		return res, err
	}
	res.Dir, err = resolveDir(out)
	return res, err
}

// checkEmptyOut refuses an out that exists and is not an empty directory.
func checkEmptyOut(out string) error {
	entries, err := os.ReadDir(out)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("output %s: %w (want a new directory)", out, err)
	case len(entries) > 0:
		return fmt.Errorf("output %s already exists and is not empty: name a new directory (a bundle is never overwritten)", out)
	}
	return nil
}

// linkOrCopy makes dst (creating its directory) the same content as the regular file src: a hard
// link, or a copy (fsynced, mode 0644) when linking fails. It returns src's size and whether it linked.
func linkOrCopy(src, dst string) (int64, bool, error) {
	fi, err := os.Lstat(src)
	if err != nil {
		return 0, false, err
	}
	if !fi.Mode().IsRegular() {
		return 0, false, &FileError{Path: src, Err: ErrNotRegular, Detail: fi.Mode().Type().String()}
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return 0, false, err
	}
	if err := os.Link(src, dst); err == nil {
		return fi.Size(), true, nil
	}
	in, err := os.Open(src)
	if err != nil {
		return 0, false, err
	}
	defer in.Close()
	o, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, false, err
	}
	buf := bufPool.Get().(*[]byte)
	defer bufPool.Put(buf)
	n, err := io.CopyBuffer(o, in, *buf)
	if err == nil {
		err = o.Sync()
	}
	if cerr := o.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(dst)
		return 0, false, fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return n, false, nil
}

// syncFS flushes the filesystem holding dir (syncfs(2)): every link, copy and rename made there.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// SeedResult counts the blobs SeedBlobs put in place.
type SeedResult struct {
	Linked, Copied int
	Bytes          int64
}

// SeedBlobs puts every blob of the base bundle's OCI layout (baseDir/images/blobs/sha256/<hex>) that
// dir/images/blobs/sha256 lacks into it, hard-linked (copied across filesystems), so that mirroring
// into dir reuses them instead of fetching them again (registry.Mirror re-hashes a present blob and
// keeps it when it matches its name). A base without images seeds nothing. Follow the mirroring with
// UnseedBlobs, which removes the seeded blobs the new images do not use.
func SeedBlobs(dir, baseDir string) (SeedResult, error) {
	var res SeedResult
	src := filepath.Join(baseDir, filepath.FromSlash(blobsPath))
	entries, err := os.ReadDir(src)
	if errors.Is(err, fs.ErrNotExist) {
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("seed from base: %w", err)
	}
	dst := filepath.Join(dir, filepath.FromSlash(blobsPath))
	for _, e := range entries {
		if !isBlobName(e.Name()) || !e.Type().IsRegular() {
			continue
		}
		to := filepath.Join(dst, e.Name())
		if _, err := os.Lstat(to); err == nil {
			continue
		}
		n, linked, err := linkOrCopy(filepath.Join(src, e.Name()), to)
		if err != nil {
			return res, fmt.Errorf("seed from base %s: %w", blobsPath+"/"+e.Name(), err)
		}
		res.Bytes += n
		if linked {
			res.Linked++
		} else {
			res.Copied++
		}
	}
	return res, nil
}

// UnseedBlobs removes from dir/images/blobs/sha256 every blob that nothing reachable from
// dir/images/index.json references (indexes, manifests, configs, layers) and that baseDir's layout
// also holds: the blobs SeedBlobs put there for images the new bundle no longer carries. It returns
// how many it removed. Errors name the index or manifest that could not be read.
func UnseedBlobs(dir, baseDir string) (int, error) {
	used, err := referencedBlobs(filepath.Join(dir, ImagesPath))
	if err != nil {
		return 0, err
	}
	blobs := filepath.Join(dir, filepath.FromSlash(blobsPath))
	entries, err := os.ReadDir(blobs)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		if !isBlobName(e.Name()) || used[e.Name()] {
			continue
		}
		if _, err := os.Lstat(filepath.Join(baseDir, filepath.FromSlash(blobsPath), e.Name())); err != nil {
			continue // not from the base: not ours to remove
		}
		if err := os.Remove(filepath.Join(blobs, e.Name())); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// referencedBlobs returns the hex digests of every blob reachable from layout/index.json; a layout
// without index.json references nothing. Blobs that are absent are listed and not followed.
func referencedBlobs(layout string) (map[string]bool, error) {
	used := map[string]bool{}
	var idx ocispec.Index
	if err := readJSON(filepath.Join(layout, ocispec.ImageIndexFile), &idx); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return used, nil
		}
		return nil, fmt.Errorf("%s/%s: %w", ImagesPath, ocispec.ImageIndexFile, err)
	}
	var walk func(d ocispec.Descriptor, depth int) error
	walk = func(d ocispec.Descriptor, depth int) error {
		if d.Digest.Validate() != nil || d.Digest.Algorithm() != "sha256" || depth > 4 {
			return nil // Verify reports these
		}
		hexd := d.Digest.Encoded()
		if used[hexd] {
			return nil
		}
		used[hexd] = true
		p := filepath.Join(layout, "blobs", "sha256", hexd)
		switch d.MediaType {
		case ocispec.MediaTypeImageIndex, dockerManifestList:
			var ix ocispec.Index
			if err := readJSON(p, &ix); err != nil {
				return ignoreAbsent(err, blobsPath+"/"+hexd)
			}
			for _, c := range ix.Manifests {
				if err := walk(c, depth+1); err != nil {
					return err
				}
			}
		case ocispec.MediaTypeImageManifest, dockerManifest:
			var m ocispec.Manifest
			if err := readJSON(p, &m); err != nil {
				return ignoreAbsent(err, blobsPath+"/"+hexd)
			}
			for _, c := range append([]ocispec.Descriptor{m.Config}, m.Layers...) {
				if err := walk(c, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, d := range idx.Manifests {
		if err := walk(d, 0); err != nil {
			return nil, err
		}
	}
	return used, nil
}

func ignoreAbsent(err error, p string) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return fmt.Errorf("%s: %w", p, err)
}

// isBlobName reports whether name is 64 lowercase hex digits (not a .partial-* file).
func isBlobName(name string) bool {
	if len(name) != 64 {
		return false
	}
	return strings.Trim(name, "0123456789abcdef") == ""
}
