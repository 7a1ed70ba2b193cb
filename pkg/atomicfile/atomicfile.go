// Package atomicfile writes state files so that a crash or kill at any instant leaves either the old
// content or the new content on disk, never a torn file: write to a temporary file in the same
// directory, fsync it, rename it over the target, fsync the directory (the usual POSIX recipe, as in
// kubeadm's and etcd's writers).
//
// A writer killed between creating its temporary file and the rename leaves that file behind
// (".NAME.tmp-PID-RANDOM", mode as the target: a key's temporary file holds the key). CleanStale
// removes those whose writer process is gone; callers run it when they start.
package atomicfile

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

// Write makes path hold exactly data with permission perm. It returns changed=false without touching
// the file when it already holds data with that permission. Parent directories are created 0700.
// Errors wrap the failing system call's *fs.PathError.
func Write(path string, data []byte, perm fs.FileMode) (changed bool, err error) {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		if st, err := os.Stat(path); err == nil && st.Mode().Perm() == perm {
			return false, nil
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	if err := replace(path, perm, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	}); err != nil {
		return false, err
	}
	return true, nil
}

// WriteFrom makes path hold what r yields, with permission perm, streamed (for files too large to
// hold in memory: a node image ISO), by the same temporary file, fsync and rename as Write; it always
// writes. Parent directories are created 0700. Errors wrap r's error or the failing system call's.
func WriteFrom(path string, r io.Reader, perm fs.FileMode) error {
	return replace(path, perm, func(f *os.File) error {
		_, err := io.Copy(f, r)
		return err
	})
}

// replace writes path through a temporary file in its directory that fill writes, then fsyncs,
// renames over path and fsyncs the directory; the temporary file is removed on failure.
func replace(path string, perm fs.FileMode, fill func(*os.File) error) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create directory for %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(dir, tempPrefix(path)+"*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if err = tmp.Chmod(perm); err == nil {
		if err = fill(tmp); err == nil {
			err = tmp.Sync()
		}
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// tempPrefix is the start of path's temporary file name: ".NAME.tmp-PID-"; os.CreateTemp appends a
// random decimal number. The writer's PID lets CleanStale tell a live writer's file from a leftover.
func tempPrefix(path string) string {
	return "." + filepath.Base(path) + ".tmp-" + strconv.Itoa(os.Getpid()) + "-"
}

// TempName is a temporary name next to path for writers that cannot use Write (a hard link or
// symlink renamed into place, as the registry import does): ".NAME.tmp-PID-RANDOM" in path's directory,
// RANDOM decimal, so CleanStale removes it once this process is gone. The caller creates and renames it.
func TempName(path string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return filepath.Join(filepath.Dir(path), tempPrefix(path)+strconv.FormatUint(binary.BigEndian.Uint64(b[:])>>1, 10))
}

// tempRE matches the temporary files of Write (".NAME.tmp-PID-RANDOM", group 1 the PID) and the
// older ".NAME.tmp-RANDOM" form without a PID that earlier versions (and other writers following
// the same recipe: pkg/debrepo) use.
var tempRE = regexp.MustCompile(`^\..+\.tmp-(?:([0-9]+)-)?[0-9]+$`)

// legacyAge is how old a temporary file without a PID must be before CleanStale removes it: no
// writer keeps one open that long (they hold small state files), so it is a leftover.
const legacyAge = time.Minute

// CleanStale removes, in root and every directory below it except those named in skip (paths
// relative to root, e.g. "registry"), the temporary files (regular files, or TempName's symlinks) that
// killed callers of Write and TempName left: those
// whose writer PID no longer runs (/proc/PID is gone or a zombie), and those without a PID older than
// a minute. A live writer's file is never touched, so CleanStale is safe while other processes write
// in root. It returns the removed paths. A missing root is not an error; other errors are the failing
// walk or remove (*fs.PathError), after everything else was tried.
func CleanStale(root string, skip ...string) (removed []string, err error) {
	skipped := map[string]bool{}
	for _, s := range skip {
		skipped[filepath.Join(root, s)] = true
	}
	var errs []error
	now := time.Now()
	werr := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			errs = append(errs, err)
			return nil
		}
		if d.IsDir() {
			if skipped[p] {
				return fs.SkipDir
			}
			return nil
		}
		m := tempRE.FindStringSubmatch(d.Name())
		if m == nil || !d.Type().IsRegular() && d.Type()&fs.ModeSymlink == 0 { // a symlink: TempName's callers make them
			return nil
		}
		if m[1] != "" {
			if pid, err := strconv.Atoi(m[1]); err == nil && running(pid) {
				return nil
			}
		} else if fi, err := d.Info(); err != nil || now.Sub(fi.ModTime()) < legacyAge {
			return nil
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			return nil
		}
		removed = append(removed, p)
		return nil
	})
	if werr != nil {
		errs = append(errs, werr)
	}
	return removed, errors.Join(errs...)
}

// running reports whether pid is a live process: /proc/PID/stat exists and its state (proc(5), the
// field after the parenthesised command name) is not zombie or dead.
func running(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] != 'Z' && b[i+2] != 'X'
}
