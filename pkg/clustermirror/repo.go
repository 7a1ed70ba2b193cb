package clustermirror

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ulikunitz/xz"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/bundlecreate"
	"github.com/airgap-appliance/appliance/pkg/debrepo"
)

// The repository copied from Upstream/repo/: the bundle's Debian repository (pkg/bundle.RepoPath under
// the appliance's /repo/, suite bundlecreate.RepoSuite) and its keyring.
var (
	repoSubdir  = strings.TrimPrefix(bundle.RepoPath, "repo/")                           // "debian"
	keyringPath = strings.TrimPrefix(bundle.RepoKeyringPath, "repo/")                    // "debian/appliance-repo.gpg"
	suiteDirs   = []string{path.Join(repoSubdir, "dists", bundlecreate.RepoSuite) + "/"} // "debian/dists/stable/"
)

const (
	maxMeta      = 16 << 20         // Release, InRelease, Release.gpg, keyring
	stallTimeout = 60 * time.Second // longest wait for the next byte of a repository file
)

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

var errNotFound = errors.New("not found (404)")

// syncRepo copies the repository into Dir/repo: keyring, then every index the signed Release lists,
// then every .deb, then Release.gpg, Release and InRelease last. It returns the marker's repository
// part (nil when the upstream serves no repository), the .deb count, the bytes of all files, and the
// bytes downloaded.
func (c *config) syncRepo(ctx context.Context, client *http.Client, st *state) (*markerRepo, int, int64, int64, error) {
	root := filepath.Join(c.Dir, repoDir)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, 0, 0, 0, err
	}
	mr := &markerRepo{InReleaseSHA256: map[string]string{}, Files: map[string]int64{}}
	var total, fetched int64
	keyring, err := c.getSmall(ctx, client, keyringPath)
	if errors.Is(err, errNotFound) {
		if _, ierr := c.getSmall(ctx, client, suiteDirs[0]+"InRelease"); errors.Is(ierr, errNotFound) {
			c.Log.Info("the upstream serves no package repository; none is copied", "keyring", "/repo/"+keyringPath)
			st.update(func(s *state) { s.repoState = "none upstream" })
			return nil, 0, 0, 0, nil
		}
		return nil, 0, 0, 0, fmt.Errorf("%w: /repo/%s: the repository has no keyring, so its InRelease cannot be checked", ErrUpstreamContent, keyringPath)
	}
	if err != nil {
		return nil, 0, 0, 0, err
	}
	localKeyring := filepath.Join(root, filepath.FromSlash(keyringPath))
	if _, err := atomicfile.Write(localKeyring, keyring, 0o644); err != nil {
		return nil, 0, 0, 0, err
	}
	if err := os.Chmod(filepath.Dir(localKeyring), 0o755); err != nil {
		return nil, 0, 0, 0, err
	}
	mr.Files[keyringPath] = int64(len(keyring))
	total += int64(len(keyring))
	kr, err := debrepo.ReadKeyring(localKeyring)
	if err != nil {
		return nil, 0, 0, 0, fmt.Errorf("%w: /repo/%s: %w", ErrUpstreamContent, keyringPath, err)
	}

	type metaFile struct {
		rel  string
		data []byte
	}
	var metas []metaFile // written last, InRelease at the very end
	debs := map[string]debrepo.Package{}
	for _, dist := range suiteDirs {
		st.update(func(s *state) { s.repoState = "reading " + dist + "InRelease" })
		inRelease, err := c.getSmall(ctx, client, dist+"InRelease")
		if err != nil {
			return nil, 0, 0, 0, err
		}
		now := time.Now()
		v, err := debrepo.VerifyInRelease(inRelease, kr, now)
		if err != nil {
			return nil, 0, 0, 0, fmt.Errorf("%w: /repo/%sInRelease: %w", ErrUpstreamContent, dist, err)
		}
		rel, err := debrepo.ParseRelease(v.Signed)
		if err != nil {
			return nil, 0, 0, 0, fmt.Errorf("%w: /repo/%sInRelease: %w", ErrUpstreamContent, dist, err)
		}
		sum := sha256.Sum256(inRelease)
		mr.InReleaseSHA256[dist+"InRelease"] = hex.EncodeToString(sum[:])
		release, rerr := c.getSmall(ctx, client, dist+"Release")
		sig, serr := c.getSmall(ctx, client, dist+"Release.gpg")
		switch {
		case rerr == nil && serr == nil:
			if _, err := debrepo.VerifyDetached(release, sig, kr, now); err != nil {
				return nil, 0, 0, 0, fmt.Errorf("%w: /repo/%sRelease.gpg: %w", ErrUpstreamContent, dist, err)
			}
			metas = append(metas, metaFile{dist + "Release.gpg", sig}, metaFile{dist + "Release", release})
		case !errors.Is(rerr, errNotFound) && rerr != nil:
			return nil, 0, 0, 0, rerr
		case !errors.Is(serr, errNotFound) && serr != nil:
			return nil, 0, 0, 0, serr
		}
		metas = append(metas, metaFile{dist + "InRelease", inRelease})

		// Every index the signed Release lists, checked against it.
		names := make([]string, 0, len(rel.SHA256))
		for n := range rel.SHA256 {
			names = append(names, n)
		}
		sort.Strings(names)
		present := map[string]bool{}
		for _, n := range names {
			fh := rel.SHA256[n]
			st.update(func(s *state) { s.repoState = "copying index " + dist + n })
			got, err := c.download(ctx, client, dist+n, fh.Size, fh.SHA256)
			if errors.Is(err, errNotFound) {
				continue // listed but not served (Debian lists uncompressed indexes it does not serve)
			}
			if err != nil {
				return nil, 0, 0, 0, err
			}
			present[n] = true
			fetched += got
			total += fh.Size
			mr.Files[dist+n] = fh.Size
		}
		// The Packages indexes: each directory's plain Packages, else its .gz, else its .xz.
		dirs := map[string]bool{}
		for n := range present {
			if b := path.Base(n); b == "Packages" || b == "Packages.gz" || b == "Packages.xz" {
				dirs[path.Dir(n)] = true
			}
		}
		for d := range dirs {
			ps, err := c.readPackages(filepath.Join(root, filepath.FromSlash(dist)), d, present)
			if err != nil {
				return nil, 0, 0, 0, fmt.Errorf("%w: /repo/%s%s: %w", ErrUpstreamContent, dist, d, err)
			}
			for _, p := range ps {
				if old, ok := debs[p.Filename]; ok && (old.SHA256 != p.SHA256 || old.Size != p.Size) {
					return nil, 0, 0, 0, fmt.Errorf("%w: %s is listed twice with different SHA256", ErrUpstreamContent, p.Filename)
				}
				debs[p.Filename] = p
			}
		}
	}

	// Every .deb, checked against its index.
	files := make([]string, 0, len(debs))
	for f := range debs {
		files = append(files, f)
	}
	sort.Strings(files)
	st.update(func(s *state) { s.debsTotal = len(files); s.repoState = "copying .debs" })
	for _, f := range files {
		p := debs[f]
		rel := path.Join(repoSubdir, f)
		got, err := c.download(ctx, client, rel, p.Size, p.SHA256)
		if errors.Is(err, errNotFound) {
			return nil, 0, 0, 0, fmt.Errorf("%w: /repo/%s is listed by the Packages index but not served", ErrUpstreamContent, rel)
		}
		if err != nil {
			return nil, 0, 0, 0, err
		}
		fetched += got
		total += p.Size
		mr.Files[rel] = p.Size
		st.update(func(s *state) { s.debsDone++ })
	}
	for _, mf := range metas {
		if _, err := atomicfile.Write(filepath.Join(root, filepath.FromSlash(mf.rel)), mf.data, 0o644); err != nil {
			return nil, 0, 0, 0, err
		}
		fetched += int64(len(mf.data))
		total += int64(len(mf.data))
		mr.Files[mf.rel] = int64(len(mf.data))
	}
	if err := fixDirModes(root); err != nil {
		return nil, 0, 0, 0, err
	}
	st.update(func(s *state) { s.repoState = "complete" })
	return mr, len(files), total, fetched, nil
}

// readPackages parses the Packages index of directory d (relative to distDir), whichever form was
// copied: plain, .gz or .xz.
func (c *config) readPackages(distDir, d string, present map[string]bool) ([]debrepo.Package, error) {
	for _, name := range []string{"Packages", "Packages.gz", "Packages.xz"} {
		rel := path.Join(d, name)
		if !present[rel] {
			continue
		}
		data, err := os.ReadFile(filepath.Join(distDir, filepath.FromSlash(rel)))
		if err != nil {
			return nil, err
		}
		var r io.Reader = bytes.NewReader(data)
		switch name {
		case "Packages.gz":
			zr, err := gzip.NewReader(r)
			if err != nil {
				return nil, err
			}
			defer zr.Close()
			r = zr
		case "Packages.xz":
			xr, err := xz.NewReader(r)
			if err != nil {
				return nil, err
			}
			r = xr
		}
		return debrepo.ParsePackages(r)
	}
	return nil, nil
}

// getSmall GETs /repo/rel whole (at most maxMeta bytes); errNotFound on 404.
func (c *config) getSmall(ctx context.Context, client *http.Client, rel string) ([]byte, error) {
	resp, err := c.get(ctx, client, rel)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxMeta+1))
	if err != nil {
		return nil, fmt.Errorf("GET /repo/%s: %w", rel, err)
	}
	if len(data) > maxMeta {
		return nil, fmt.Errorf("%w: /repo/%s is larger than %d bytes", ErrUpstreamContent, rel, maxMeta)
	}
	return data, nil
}

// get GETs /repo/rel from the upstream; a 200 response is returned, a 404 is errNotFound, any other
// status an error (retried by Run).
func (c *config) get(ctx context.Context, client *http.Client, rel string) (*http.Response, error) {
	u := c.base.JoinPath("repo", rel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("upstream unreachable: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return resp, nil
	case http.StatusNotFound, http.StatusGone:
		_ = resp.Body.Close()
		return nil, fmt.Errorf("GET /repo/%s: %w", rel, errNotFound)
	default:
		_ = resp.Body.Close()
		return nil, fmt.Errorf("GET /repo/%s: %s", rel, resp.Status)
	}
}

// download makes Dir/repo/rel hold the file of size bytes and SHA-256 sum: kept when already there
// and intact (nothing is downloaded), else streamed from the upstream into a temporary file, checked,
// and renamed into place. It returns the bytes downloaded. A mismatch wraps ErrMismatch and names
// the file.
func (c *config) download(ctx context.Context, client *http.Client, rel string, size int64, sum string) (int64, error) {
	dst := filepath.Join(c.Dir, repoDir, filepath.FromSlash(rel))
	if fi, err := os.Stat(dst); err == nil && fi.Mode().IsRegular() && fi.Size() == size {
		if got, _, err := sha256File(dst); err == nil && got == sum {
			return 0, nil
		}
		c.Log.Warn("local repository file does not match its index; fetching it again", "file", rel)
	}
	// A stalled upstream (no byte for stallTimeout) fails the request, which Run then retries.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stalled atomic.Bool
	timer := time.AfterFunc(stallTimeout, func() { stalled.Store(true); cancel() })
	defer timer.Stop()
	resp, err := c.get(rctx, client, rel)
	if err != nil {
		if stalled.Load() {
			return 0, fmt.Errorf("GET /repo/%s: no answer for %s", rel, stallTimeout)
		}
		return 0, err
	}
	defer resp.Body.Close()
	body := readerFunc(func(p []byte) (int, error) {
		n, err := resp.Body.Read(p)
		if n > 0 {
			timer.Reset(stallTimeout)
		}
		if err != nil && err != io.EOF && stalled.Load() {
			err = fmt.Errorf("no bytes for %s: %w", stallTimeout, err)
		}
		return n, err
	})
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return 0, err
	}
	tmp := atomicfile.TempName(dst)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, err
	}
	renamed := false
	defer func() {
		if !renamed {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(f, h), io.LimitReader(body, size+1), make([]byte, 1<<20))
	got := hex.EncodeToString(h.Sum(nil))
	switch {
	case n > size || (n == size && got != sum):
		return 0, fmt.Errorf("%w: /repo/%s: its index lists %d bytes SHA256 %s, the upstream sent %d bytes SHA256 %s",
			ErrMismatch, rel, size, sum, n, got)
	case err != nil:
		return 0, fmt.Errorf("GET /repo/%s: %w", rel, err)
	case n < size:
		return 0, fmt.Errorf("GET /repo/%s: connection ended after %d of %d bytes: %w", rel, n, size, io.ErrUnexpectedEOF)
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return 0, err
	}
	renamed = true
	return n, nil
}

// fixDirModes makes every directory under root 0755 (atomicfile creates missing parents 0700; the
// repository is public).
func fixDirModes(root string) error {
	return filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.Chmod(p, 0o755)
		}
		return nil
	})
}
