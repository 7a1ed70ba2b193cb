package registry

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// Image is one image of the bundle as the mirror serves it.
type Image struct {
	Ref        string // reference from the layout's ref.name annotation, e.g. "registry.k8s.io/pause:3.10"
	Repository string // mirror repository, e.g. "registry.k8s.io/pause" (see RepositoryFor)
	Tag        string // "3.10"; "" for a digest-only reference
	Digest     string // manifest or index digest, "sha256:<64 hex>"
}

// ImportResult summarises an Import or Check.
type ImportResult struct {
	Images     []Image  // sorted by Ref
	Registries []string // sorted unique source registry hosts, lowercased, e.g. ["docker.io", "myreg:5000"]; HostComponent gives each one's mirror path
	Blobs      int      // distinct blobs (manifests, indexes, configs, layers) the images need
	Linked     int      // blobs whose data file is a hard link or symlink to the layout file
	Copied     int      // blobs whose data file is a copy (neither link was possible) or was already there
	Changed    bool     // Import: something was written; Check: Import would write something
}

// Storage tree of distribution's filesystem driver (registry/storage/paths.go in distribution v3.1.2).
func v2root(root string) string { return filepath.Join(root, "docker", "registry", "v2") }

func blobDataPath(root string, h v1.Hash) string {
	return filepath.Join(v2root(root), "blobs", h.Algorithm, h.Hex[:2], h.Hex, "data")
}

func repoPath(root, repo string) string {
	return filepath.Join(v2root(root), "repositories", filepath.FromSlash(repo))
}

func layerLinkPath(root, repo string, h v1.Hash) string {
	return filepath.Join(repoPath(root, repo), "_layers", h.Algorithm, h.Hex, "link")
}

func revisionLinkPath(root, repo string, h v1.Hash) string {
	return filepath.Join(repoPath(root, repo), "_manifests", "revisions", h.Algorithm, h.Hex, "link")
}

func tagIndexLinkPath(root, repo, tag string, h v1.Hash) string {
	return filepath.Join(repoPath(root, repo), "_manifests", "tags", tag, "index", h.Algorithm, h.Hex, "link")
}

func tagCurrentLinkPath(root, repo, tag string) string {
	return filepath.Join(repoPath(root, repo), "_manifests", "tags", tag, "current", "link")
}

// Import makes every image named in the OCI image layout at layoutDir pullable from a registry served
// by NewHandler(rootDir), without copying bytes: it builds distribution's filesystem-driver tree under
// rootDir (docker/registry/v2/...) whose blob data files are hard links to the layout's blob files when
// both sit on one filesystem, else absolute symlinks to them (the layout must then stay mounted at the
// same path, e.g. the read-only appliance ISO), and copies only when neither is possible.
//
// Order makes a kill at any instant safe: blob data first (each placed by link-then-rename), then the
// _layers links, then manifest revision links (index children before their index), then tag index
// links (each placed by write-then-rename), then one syncfs(2) barrier, and each tag's current/link
// last, written with pkg/atomicfile (fsync). A tag therefore never
// resolves to a manifest whose blobs are not in place. Import only adds or repairs: tags and blobs of
// earlier bundles are left alone. A rerun over a complete tree writes nothing and reports Changed=false.
//
// Errors wrap ErrLayout or ErrInvalidReference for a bad layout, or the failing *fs.PathError for the
// state directory. rootDir is created (0755) if missing.
func Import(ctx context.Context, layoutDir, rootDir string, log *slog.Logger) (ImportResult, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	p, err := readLayout(layoutDir)
	if err != nil {
		return ImportResult{}, err
	}
	res, err := apply(ctx, p, rootDir, false)
	if err != nil {
		return res, err
	}
	log.Info("registry import finished", "layout", layoutDir, "images", len(res.Images), "blobs", res.Blobs,
		"linked", res.Linked, "copied", res.Copied, "changed", res.Changed, "duration", time.Since(start))
	return res, nil
}

// Check reports what Import(layoutDir, rootDir) would find, without writing anything: the result (with
// Changed=true when Import would write), and ok=true when every image is already pullable exactly as
// Import would leave it. Errors are those of Import for a bad layout.
func Check(layoutDir, rootDir string) (ImportResult, bool, error) {
	p, err := readLayout(layoutDir)
	if err != nil {
		return ImportResult{}, false, err
	}
	res, err := apply(context.Background(), p, rootDir, true)
	if err != nil {
		return res, false, err
	}
	return res, !res.Changed, nil
}

// apply makes the tree match p (or, with dryRun, only reports whether it does).
func apply(ctx context.Context, p *plan, root string, dryRun bool) (ImportResult, error) {
	res := ImportResult{Images: p.images, Registries: p.hosts, Blobs: len(p.blobs)}
	if !dryRun {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return res, fmt.Errorf("create registry root: %w", err)
		}
	}
	digests := make([]v1.Hash, 0, len(p.blobs))
	for h := range p.blobs {
		digests = append(digests, h)
	}
	sort.Slice(digests, func(i, j int) bool { return digests[i].Hex < digests[j].Hex })
	for _, h := range digests {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		how, changed, err := placeBlob(p.blobs[h], blobDataPath(root, h), dryRun)
		if err != nil {
			return res, err
		}
		res.Changed = res.Changed || changed
		switch how {
		case placedLink:
			res.Linked++
		case placedCopy:
			res.Copied++
		}
	}
	repos := make([]string, 0, len(p.repos))
	for r := range p.repos {
		repos = append(repos, r)
	}
	sort.Strings(repos)
	link := func(path string, h v1.Hash) error {
		changed, err := writeLink(path, h, dryRun, false)
		res.Changed = res.Changed || changed
		return err
	}
	// Phase order across all repositories: layers, revisions, tag index entries, tag current links.
	for _, r := range repos {
		rp := p.repos[r]
		layers := make([]v1.Hash, 0, len(rp.layers))
		for h := range rp.layers {
			layers = append(layers, h)
		}
		sort.Slice(layers, func(i, j int) bool { return layers[i].Hex < layers[j].Hex })
		for _, h := range layers {
			if err := link(layerLinkPath(root, r, h), h); err != nil {
				return res, err
			}
		}
	}
	for _, r := range repos {
		for _, h := range p.repos[r].manifests {
			if err := link(revisionLinkPath(root, r, h), h); err != nil {
				return res, err
			}
		}
	}
	for _, r := range repos {
		rp := p.repos[r]
		for _, t := range sortedTags(rp) {
			if err := link(tagIndexLinkPath(root, r, t, rp.tags[t]), rp.tags[t]); err != nil {
				return res, err
			}
		}
	}
	// Barrier: everything a tag leads to is durable before any tag current link is written, so even a
	// power loss cannot leave a tag pointing at content that did not reach the disk.
	if res.Changed && !dryRun {
		if err := syncFS(root); err != nil {
			return res, err
		}
	}
	for _, r := range repos {
		rp := p.repos[r]
		for _, t := range sortedTags(rp) {
			changed, err := writeLink(tagCurrentLinkPath(root, r, t), rp.tags[t], dryRun, true)
			res.Changed = res.Changed || changed
			if err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

func sortedTags(rp *repoPlan) []string {
	tags := make([]string, 0, len(rp.tags))
	for t := range rp.tags {
		tags = append(tags, t)
	}
	sort.Strings(tags)
	return tags
}

// writeLink makes path hold the digest string, as distribution's blobStore.link writes it, so that a
// kill leaves the old link or the new one, never a torn file. Ordinary links (durable=false) are
// written under a temporary name and renamed into place without fsync: one syncfs barrier in apply
// covers them all before any tag link is written (per-file fsyncs made Import ten times slower). A
// tag's current/link, the last step that makes an image pullable by tag, is durable: pkg/atomicfile
// (fsync of file and directory).
func writeLink(path string, h v1.Hash, dryRun, durable bool) (bool, error) {
	want := []byte(h.String())
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, want) {
		return false, nil
	}
	if dryRun {
		return true, nil
	}
	if err := beforeWrite(); err != nil {
		return false, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("create link directory: %w", err)
	}
	if durable {
		return atomicfile.Write(path, want, 0o644)
	}
	tmp := atomicfile.TempName(path) // its writer's PID in the name: the next bootstrap removes it after a kill
	if err := os.WriteFile(tmp, want, 0o644); err != nil {
		_ = os.Remove(tmp)
		return false, fmt.Errorf("write link: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return false, fmt.Errorf("write link: %w", err)
	}
	return true, nil
}

// syncFS flushes the filesystem holding root (syncfs(2)).
func syncFS(root string) error {
	f, err := os.Open(root)
	if err != nil {
		return fmt.Errorf("sync registry root: %w", err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync registry root: %w", err)
	}
	return nil
}

// testHookBeforeWrite, when set by a test, runs before every write; an error stops Import there, as a
// kill would.
var testHookBeforeWrite func() error

func beforeWrite() error {
	if testHookBeforeWrite != nil {
		return testHookBeforeWrite()
	}
	return nil
}

type placement int

const (
	placedNone placement = iota // dry run: not in place
	placedLink                  // hard link or symlink to the layout
	placedCopy                  // regular file of its own
)

// placeBlob makes dst (a blob data path) hold src's content: left alone when it already is src's inode,
// a symlink to src, or an own file of the right size (a previous copy, or a blob pushed by other means,
// content-addressed); otherwise replaced by a hard link, else a symlink, else a copy, each created under
// a temporary name and renamed into place so a kill never leaves a partial data file.
func placeBlob(src blobSrc, dst string, dryRun bool) (placement, bool, error) {
	if how, ok := inPlace(src, dst); ok {
		return how, false, nil
	}
	if dryRun {
		return placedNone, true, nil
	}
	if err := beforeWrite(); err != nil {
		return placedNone, false, err
	}
	dir := filepath.Dir(dst)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return placedNone, false, fmt.Errorf("create blob directory: %w", err)
	}
	tmp := atomicfile.TempName(dst) // its writer's PID in the name: the next bootstrap removes it after a kill
	defer os.Remove(tmp)            // no-op after a successful rename
	how := placedLink
	if err := os.Link(src.path, tmp); err != nil {
		// EXDEV (layout on another filesystem, e.g. the ISO), EPERM (protected_hardlinks): symlink.
		if err := os.Symlink(src.path, tmp); err != nil {
			how = placedCopy
			if err := copyFile(src.path, tmp); err != nil {
				return placedNone, false, err
			}
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		return placedNone, false, fmt.Errorf("place blob: %w", err)
	}
	return how, true, nil
}

// inPlace reports whether dst already serves src's content, and how.
func inPlace(src blobSrc, dst string) (placement, bool) {
	lst, err := os.Lstat(dst)
	if err != nil {
		return placedNone, false
	}
	if lst.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(dst)
		if err != nil || target != src.path {
			return placedNone, false
		}
		st, err := os.Stat(dst)
		return placedLink, err == nil && st.Mode().IsRegular() && st.Size() == src.size
	}
	if !lst.Mode().IsRegular() || lst.Size() != src.size {
		return placedNone, false
	}
	if sst, err := os.Stat(src.path); err == nil && os.SameFile(sst, lst) {
		return placedLink, true
	}
	return placedCopy, true
}

func copyFile(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy blob: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("copy blob: %w", err)
	}
	if _, err = io.Copy(out, in); err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy blob %s: %w", src, err)
	}
	return nil
}

func randHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
