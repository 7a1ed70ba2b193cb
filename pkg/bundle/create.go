package bundle

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// Create turns dir, which already holds images/ and/or repo/debian/, into a bundle: it validates meta,
// writes dir/bundle.yaml, then hashes every file (in parallel, one worker per GOMAXPROCS) and writes
// dir/SHA256SUMS sorted by path. Both writes are atomic (temp file + rename). It fails with
// ErrNotRegular if the tree holds a symlink or special file, and with ErrMetadata if meta is invalid;
// it does not check the repository or image layout (Verify does). Creating twice over the same
// content yields identical files.
func Create(ctx context.Context, dir string, meta Metadata) error {
	return CreateWith(ctx, dir, meta, CreateOptions{})
}

// CreateOptions tune CreateWith.
type CreateOptions struct {
	// BlobsVerified: the caller has just verified that every images/blobs/sha256/<hex> file hashes to
	// its name (registry.Mirror does, as blobs arrive or from its stamp), so their SHA256SUMS lines
	// are taken from the names instead of reading the blobs again. Every other file is hashed.
	BlobsVerified bool
}

// CreateWith is Create with options.
func CreateWith(ctx context.Context, dir string, meta Metadata, o CreateOptions) error {
	abs, err := resolveDir(dir)
	if err != nil {
		return err
	}
	if err := meta.Validate(); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(abs, MetadataFile), err)
	}
	data, err := MarshalMetadata(meta)
	if err != nil {
		return err
	}
	if _, err := atomicfile.Write(filepath.Join(abs, MetadataFile), data, 0o644); err != nil {
		return fmt.Errorf("create bundle: %w", err)
	}
	present, problems, err := scanTree(abs)
	if err != nil {
		return err
	}
	if len(problems) > 0 {
		errs := make([]error, 0, len(problems))
		for _, e := range problems {
			errs = append(errs, e)
		}
		sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
		return fmt.Errorf("create bundle %s: %w", abs, errors.Join(errs...))
	}
	paths := make([]string, 0, len(present))
	for p := range present {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	sums := make([]Sum, len(paths))
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(runtime.GOMAXPROCS(0))
	blobPrefix := ImagesPath + "/blobs/sha256/"
	for i, p := range paths {
		if hexName, ok := strings.CutPrefix(p, blobPrefix); o.BlobsVerified && ok && isSHA256Hex(hexName) {
			sums[i] = Sum{Path: p, SHA256: hexName}
			continue
		}
		g.Go(func() error {
			ff, err := hashFile(gctx, filepath.Join(abs, filepath.FromSlash(p)))
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			mu.Lock()
			sums[i] = Sum{Path: p, SHA256: ff.sha256}
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("create bundle %s: %w", abs, err)
	}
	if _, err := atomicfile.Write(filepath.Join(abs, SumsFile), FormatSums(sums), 0o644); err != nil {
		return fmt.Errorf("create bundle: %w", err)
	}
	return nil
}

// isSHA256Hex reports whether s is 64 lower-case hex digits.
func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
