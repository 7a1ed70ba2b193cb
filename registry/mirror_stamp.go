package registry

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// blobStamp remembers blobs of the layout whose content was verified (hashed to their name) by an
// earlier Mirror call, keyed by digest with the file's identity then: size, mtime and ctime (ns),
// inode and device. A blob whose stat still matches is trusted without reading it again; any write,
// rename over, chmod or copy changes ctime or inode and sends it back to hashing. The stamp lives
// outside the layout (MirrorOptions.VerifiedStamp), so it never becomes part of a bundle.
type blobStamp struct {
	path string
	mu   sync.Mutex
	old  map[string]statID
	good map[string]statID
}

// statID is a file's identity as blobStamp compares it.
type statID struct {
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtime"`
	Ctime int64  `json:"ctime"`
	Ino   uint64 `json:"ino"`
	Dev   uint64 `json:"dev"`
}

const blobStampVersion = 1

type blobStampFile struct {
	Version int               `json:"version"`
	Dir     string            `json:"dir"`
	Blobs   map[string]statID `json:"blobs"`
}

func statIDOf(fi os.FileInfo) (statID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return statID{}, false
	}
	return statID{Size: fi.Size(), Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano(), Ino: st.Ino, Dev: uint64(st.Dev)}, true
}

// loadBlobStamp reads path (empty: no stamp). A missing, corrupt or foreign (other layout directory)
// stamp is treated as empty.
func loadBlobStamp(path, dir string) *blobStamp {
	s := &blobStamp{path: path, old: map[string]statID{}, good: map[string]statID{}}
	if path == "" {
		return s
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return s
	}
	var f blobStampFile
	if json.Unmarshal(data, &f) == nil && f.Version == blobStampVersion && f.Dir == dir && f.Blobs != nil {
		s.old = f.Blobs
	}
	return s
}

// known reports whether digest was verified before with exactly fi's identity.
func (s *blobStamp) known(digest string, fi os.FileInfo) bool {
	id, ok := statIDOf(fi)
	if !ok {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.old[digest]; ok && old == id {
		s.good[digest] = id
		return true
	}
	return false
}

// verified records that the file at path now holds digest's content.
func (s *blobStamp) verified(digest, path string) {
	fi, err := os.Stat(path)
	if err != nil {
		return
	}
	if id, ok := statIDOf(fi); ok {
		s.mu.Lock()
		s.good[digest] = id
		s.mu.Unlock()
	}
}

// save writes the blobs verified or trusted by this call (atomically); nothing when there is no path.
func (s *blobStamp) save(dir string) error {
	if s.path == "" {
		return nil
	}
	s.mu.Lock()
	data, err := json.Marshal(blobStampFile{Version: blobStampVersion, Dir: dir, Blobs: s.good})
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
		return err
	}
	_, err = atomicfile.Write(s.path, data, 0o600)
	return err
}
