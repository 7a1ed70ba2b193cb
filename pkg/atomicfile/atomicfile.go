// Package atomicfile writes state files so that a crash or kill at any instant leaves either the old
// content or the new content on disk, never a torn file: write to a temporary file in the same
// directory, fsync it, rename it over the target, fsync the directory (the usual POSIX recipe, as in
// kubeadm's and etcd's writers).
package atomicfile

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("create directory for %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if err = tmp.Chmod(perm); err == nil {
		if _, err = tmp.Write(data); err == nil {
			err = tmp.Sync()
		}
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return true, nil
}
