package bundle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"syscall"

	"golang.org/x/sync/errgroup"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// VerifyResult summarises a verification.
type VerifyResult struct {
	// Files is the number of files listed in SHA256SUMS.
	Files int
	// Bytes is the total size of the listed files that exist, in bytes.
	Bytes int64
	// Hashed is how many files were read and hashed in this run.
	Hashed int
	// Cached is how many files were skipped because the stamp file proved them unchanged.
	Cached int
	// Changed reports whether the stamp file was (re)written.
	Changed bool
}

// maxReported bounds how many individual problems an error lists; the rest are counted.
const maxReported = 50

// fileFacts is what Verify learned about one present file.
type fileFacts struct {
	key    statKey
	sha256 string // actual digest; "" if it could not be read
	stable bool   // the file did not change while it was hashed (or came from the stamp)
}

// statKey identifies one version of a file without reading it: if any field differs, the content may
// have changed (see unchanged for the one exception). ctime is included because, unlike mtime, no
// unprivileged tool can set it back.
type statKey struct {
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtimeNs"`
	Ctime int64  `json:"ctimeNs"`
	Ino   uint64 `json:"ino"`
	Dev   uint64 `json:"dev"`
	// Nlink is the hard-link count (stat(2) st_nlink); not part of the identity, see unchanged.
	Nlink uint64 `json:"nlink,omitempty"`
}

// unchanged reports whether now is the same version of the file the stamp saw as was: same inode,
// device, size and mtime, and same ctime unless the file is hard-linked (st_nlink > 1 then or now).
//
// A hard-linked bundle file shares its inode, hence its ctime, with every other holder of a link:
// each state directory's registry links the OCI blobs (registry.Import) and removing a state directory
// unlinks them, and bundle.Import links a base bundle's files into the new bundle. Each of those
// changes the ctime (link(2), unlink(2)) without touching the content, so a ctime key made every
// verification after any such churn re-hash every blob. For such files the stamp trusts size and
// mtime: any write changes the mtime, a replacement changes the inode, a truncation the size. What it
// no longer sees is a same-size in-place rewrite whose mtime was deliberately put back on a file that
// is linked elsewhere; a file with one link still has that caught by its ctime (and registry clients
// check every blob's digest on pull).
func unchanged(was, now statKey) bool {
	if was.Size != now.Size || was.Mtime != now.Mtime || was.Ino != now.Ino || was.Dev != now.Dev {
		return false
	}
	return was.Ctime == now.Ctime || was.Nlink > 1 || now.Nlink > 1
}

type stampEntry struct {
	statKey
	SHA256 string `json:"sha256"`
}

// stamp is the JSON content of the stamp file.
type stamp struct {
	Version int                   `json:"version"`
	Dir     string                `json:"dir"`
	Files   map[string]stampEntry `json:"files"`
}

const stampVersion = 1

func keyOf(fi fs.FileInfo) statKey {
	k := statKey{Size: fi.Size(), Mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		k.Ino = st.Ino
		k.Dev = uint64(st.Dev) //nolint:unconvert // Dev is int-typed on some platforms
		k.Ctime = st.Ctim.Sec*1e9 + st.Ctim.Nsec
		k.Nlink = uint64(st.Nlink) //nolint:unconvert // Nlink is uint32 on some platforms
	}
	return k
}

// Verify checks the bundle and returns what it did. It checks, in order:
//
//  0. A differential bundle (bundle.yaml names a base) that lacks files SHA256SUMS lists, i.e. one not
//     yet imported onto its base, is refused at once with one error wrapping ErrNeedsBase that names
//     the base and says to run `appliance bundle import`; nothing is hashed.
//  1. SHA256SUMS parses (ErrSums); every listed file exists (ErrMissing), is a regular file
//     (ErrNotRegular), and has the listed SHA-256 (ErrMismatch); no other file exists (ErrUnlisted).
//     Files are hashed in parallel, one worker per GOMAXPROCS.
//  2. The Debian repository under repo/debian, if present, is self-consistent the way apt checks it:
//     each dists/<suite>/Release lists the SHA256 and size of every index file present beside it, and
//     every Packages (or Packages.gz) paragraph's Filename exists with its SHA256 and Size (ErrRepo).
//  3. The OCI layout under images/, if present, is complete: oci-layout and index.json exist, every
//     manifest in index.json carries a fully qualified ref.name annotation, and every descriptor reachable
//     from it names an existing blob of that size whose content hashes to its name (ErrImages).
//
// stampFile, if not empty, caches verified files by (path, size, mtime, ctime, inode, device; ctime
// not for hard-linked files, see unchanged): a file whose stat matches its cached entry and whose
// cached digest equals the listed one is not read again.
// The stamp is rewritten (atomically) after every run with the files found good, so a rerun after fixing
// one file re-hashes only that file. A corrupt or foreign stamp is ignored.
//
// The error lists every problem found (up to 50, then a count); each is a *FileError naming the file
// relative to the bundle directory. Cancelling ctx stops hashing and returns ctx.Err().
func (b *Bundle) Verify(ctx context.Context, stampFile string) (VerifyResult, error) {
	var res VerifyResult
	sumsPath := filepath.Join(b.Dir, SumsFile)
	f, err := os.Open(sumsPath)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return res, fmt.Errorf("%s: %w: not found (create it with `appliance bundle`)", sumsPath, ErrSums)
		}
		return res, fmt.Errorf("read %s: %w", sumsPath, err)
	}
	sums, err := ParseSums(f)
	_ = f.Close()
	if err != nil {
		return res, fmt.Errorf("%s: %w", sumsPath, err)
	}
	res.Files = len(sums)

	present, problems, err := scanTree(b.Dir)
	if err != nil {
		return res, err
	}
	if err := b.needsBase(sums, present, problems); err != nil {
		return res, err
	}
	want := make(map[string]string, len(sums))
	for _, s := range sums {
		want[s.Path] = s.SHA256
		if _, ok := present[s.Path]; !ok {
			if _, bad := problems[s.Path]; !bad {
				problems[s.Path] = &FileError{Path: s.Path, Err: ErrMissing, Detail: "listed in " + SumsFile}
			}
		}
	}
	for p := range present {
		if _, ok := want[p]; !ok {
			problems[p] = &FileError{Path: p, Err: ErrUnlisted}
			delete(present, p)
		}
	}

	old := loadStamp(stampFile, b.Dir)
	facts := make(map[string]*fileFacts, len(present))
	var todo []string
	for p, fi := range present {
		k := keyOf(fi)
		res.Bytes += k.Size
		if e, ok := old.Files[p]; ok && unchanged(e.statKey, k) && e.SHA256 == want[p] {
			// The entry is kept as recorded: a link made since (registry import) changes ctime and
			// nlink, and rewriting the stamp for that alone would report a change on a rerun.
			facts[p] = &fileFacts{key: e.statKey, sha256: e.SHA256, stable: true}
			res.Cached++
			continue
		}
		todo = append(todo, p)
	}
	sort.Strings(todo)

	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(runtime.GOMAXPROCS(0))
	for _, p := range todo {
		g.Go(func() error {
			ff, herr := hashFile(gctx, filepath.Join(b.Dir, filepath.FromSlash(p)))
			mu.Lock()
			defer mu.Unlock()
			if herr != nil {
				if ctxErr := gctx.Err(); ctxErr != nil {
					return ctxErr
				}
				problems[p] = &FileError{Path: p, Err: herr}
				return nil
			}
			facts[p] = ff
			res.Hashed++
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return res, fmt.Errorf("verify %s: %w", b.Dir, err)
	}

	for p, ff := range facts {
		if ff.sha256 != want[p] {
			problems[p] = &FileError{Path: p, Err: ErrMismatch, Want: want[p], Got: ff.sha256}
		}
	}
	for _, e := range checkDebianRepo(b.Dir, facts) {
		addProblem(problems, e)
	}
	for _, e := range checkImages(b.Dir, facts) {
		addProblem(problems, e)
	}

	if stampFile != "" {
		changed, err := writeStamp(stampFile, b.Dir, facts, want)
		if err != nil {
			return res, err
		}
		res.Changed = changed
	}
	if len(problems) > 0 {
		return res, joinProblems(b.Dir, problems)
	}
	return res, nil
}

// needsBase refuses a differential bundle that lacks files it lists (the ones its base holds) with
// one error wrapping ErrNeedsBase, instead of one ErrMissing per file: such a directory is not a
// bundle until Import has merged it with its base, and Import verifies the result in full. A bundle
// that names a base but holds every file (what Import makes) passes on to the normal checks.
func (b *Bundle) needsBase(sums []Sum, present map[string]fs.FileInfo, problems map[string]error) error {
	if b.Meta.Base == nil {
		return nil
	}
	missing := 0
	for _, s := range sums {
		_, ok := present[s.Path]
		_, bad := problems[s.Path]
		if !ok && !bad {
			missing++
		}
	}
	if missing == 0 {
		return nil
	}
	return fmt.Errorf("%s: %w: differential bundle on top of %s, which holds %d of its %d files: import it onto its base with `appliance bundle import %s --base BASE_DIR --out NEW_DIR`",
		b.Dir, ErrNeedsBase, b.Meta.Base, missing, len(sums), b.Dir)
}

// addProblem records e under its file, keeping the first problem found for each file.
func addProblem(problems map[string]error, e error) {
	key := ""
	var fe *FileError
	if errors.As(e, &fe) {
		key = fe.Path
	}
	if _, ok := problems[key]; ok && key != "" {
		return
	}
	if key == "" {
		key = fmt.Sprintf("\x00%d", len(problems))
	}
	problems[key] = e
}

func joinProblems(dir string, problems map[string]error) error {
	keys := make([]string, 0, len(problems))
	for k := range problems {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	errs := []error{fmt.Errorf("bundle %s failed verification with %d problem(s)", dir, len(keys))}
	for i, k := range keys {
		if i == maxReported {
			rest := make([]error, 0, len(keys)-maxReported)
			for _, k := range keys[maxReported:] {
				rest = append(rest, problems[k])
			}
			errs = append(errs, more(rest))
			break
		}
		errs = append(errs, problems[k])
	}
	return errors.Join(errs...)
}

// more stands for the problems past maxReported: printed as a count, still visible to errors.Is/As.
type more []error

func (m more) Error() string   { return fmt.Sprintf("... and %d more", len(m)) }
func (m more) Unwrap() []error { return m }

// scanTree lists every regular file under dir (relative slash paths) except SHA256SUMS and its
// signature SHA256SUMS.sig at the top,
// and records non-regular entries (symlinks, devices, sockets) as problems.
func scanTree(dir string) (map[string]fs.FileInfo, map[string]error, error) {
	present := map[string]fs.FileInfo{}
	problems := map[string]error{}
	dir, err := resolveDir(dir) // WalkDir does not follow a symlinked root
	if err != nil {
		return nil, nil, err
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("scan bundle %s: %w", dir, err)
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return fmt.Errorf("scan bundle %s: %w", dir, err)
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() || rel == SumsFile || rel == SignatureFile {
			return nil
		}
		if !d.Type().IsRegular() {
			problems[rel] = &FileError{Path: rel, Err: ErrNotRegular, Detail: d.Type().String()}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return fmt.Errorf("scan bundle %s: %w", dir, err)
		}
		present[rel] = fi
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return present, problems, nil
}

// ctxReader fails reads once ctx is done, so hashing a large file stops promptly.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// hashFile returns the file's SHA-256 and its stat key, and whether the file stayed unchanged while
// it was read (only then may the result be cached).
func hashFile(ctx context.Context, p string) (*fileFacts, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	defer f.Close()
	before, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat: %w", err)
	}
	h := sha256.New()
	buf := bufPool.Get().(*[]byte)
	defer bufPool.Put(buf)
	if _, err := io.CopyBuffer(h, ctxReader{ctx, f}, *buf); err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	after, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat: %w", err)
	}
	k := keyOf(before)
	return &fileFacts{key: k, sha256: hex.EncodeToString(h.Sum(nil)), stable: unchanged(k, keyOf(after))}, nil
}

func loadStamp(stampFile, dir string) stamp {
	var s stamp
	if stampFile == "" {
		return s
	}
	data, err := os.ReadFile(stampFile)
	if err != nil {
		return s
	}
	if json.Unmarshal(data, &s) != nil || s.Version != stampVersion || s.Dir != dir {
		return stamp{}
	}
	return s
}

func writeStamp(stampFile, dir string, facts map[string]*fileFacts, want map[string]string) (bool, error) {
	s := stamp{Version: stampVersion, Dir: dir, Files: map[string]stampEntry{}}
	for p, ff := range facts {
		if ff.stable && ff.sha256 == want[p] {
			s.Files[p] = stampEntry{statKey: ff.key, SHA256: ff.sha256}
		}
	}
	data, err := json.MarshalIndent(s, "", " ")
	if err != nil {
		return false, fmt.Errorf("encode verification stamp: %w", err)
	}
	changed, err := atomicfile.Write(stampFile, append(data, '\n'), 0o644)
	if err != nil {
		return false, fmt.Errorf("write verification stamp (is the state directory writable?): %w", err)
	}
	return changed, nil
}
