package server

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/airgap-appliance/appliance/pkg/ignition"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// IgnitionStore serves the Ignition configs the render phase wrote to
// Dir/<node>/ignition/<spec version>.json, one per supported spec version.
//
// GET /ignition/<node> with the node's token as "Authorization: Bearer <token>" (never in the query:
// a URL reaches logs and kernel command lines; Ignition sends it through a config source's httpHeaders,
// `hostagent enroll --ignition-out` as a header)
// (Ignition's first fetch from the kernel command line cannot send headers). The version is
// negotiated from the Accept header (pkg/ignition.Negotiate). A missing or wrong token and an
// unknown node get the same 401 answer, after the same constant-time work, so a caller learns
// nothing about which nodes exist.
type IgnitionStore struct {
	// Dir holds one directory per node.
	Dir string

	tokens   tokenSet
	files    fileCache
	versions versionCache
}

// NewIgnitionStore returns a store for dir that accepts the given node tokens (node name → token).
func NewIgnitionStore(dir string, tokens map[string]string) *IgnitionStore {
	s := &IgnitionStore{Dir: dir}
	s.SetTokens(tokens)
	return s
}

// SetTokens replaces the accepted tokens (node name → token).
func (s *IgnitionStore) SetTokens(tokens map[string]string) { s.tokens.set(tokens) }

func (s *IgnitionStore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	node := strings.TrimPrefix(r.URL.Path, "/ignition/")
	if node == "" || strings.ContainsAny(node, "/\\") || strings.HasPrefix(node, ".") || !s.tokens.authorized(node, headerBearer(r)) {
		unauthorized(w)
		return
	}
	version, err := s.versions.negotiate(r.Header.Values("Accept"))
	if err != nil {
		http.Error(w, "not acceptable: this appliance serves Ignition spec "+strings.Join(ignition.SupportedVersions, ", "), http.StatusNotAcceptable)
		return
	}
	f, err := s.files.read(filepath.Join(s.Dir, node, statedir.IgnitionDir, version+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		// Authorized but not rendered (yet, or the node's snippets need a newer spec version).
		http.Error(w, "no Ignition config rendered for this node in spec "+version+"; rerun `appliance bootstrap` (render phase)", http.StatusNotFound)
		return
	} else if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	// Content-Length up front: without it net/http answers a body larger than its 2 KiB buffer in
	// chunked encoding (chunk framing, and clients cannot tell a truncated config). The header
	// values are built once (per version, per cached file), not per request: under
	// test/bench/ignition.sh the handler's allocations fell from 47 to 17 per request.
	h := w.Header()
	h["Content-Type"] = contentTypeHeaders[version]
	h["Cache-Control"] = noStoreHeader
	h["Content-Length"] = f.length
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(f.data)
}

// Header values shared by every response (net/http only reads them; an Add would copy on append,
// as each slice is full).
var (
	noStoreHeader      = []string{"no-store"}
	contentTypeHeaders = func() map[string][]string {
		m := make(map[string][]string, len(ignition.SupportedVersions))
		for _, v := range ignition.SupportedVersions {
			m[v] = []string{ignition.ContentType(v)}
		}
		return m
	}()
)

// maxNegotiated bounds versionCache: nodes send a handful of distinct Accept headers (one per
// Ignition release); anything beyond is negotiated afresh on every request.
const maxNegotiated = 64

// versionCache memoizes ignition.Negotiate per Accept header (its parse allocated and took ~5% of
// the appliance's CPU under test/bench/ignition.sh). Only successful negotiations are kept, at most
// maxNegotiated of them, so a client cannot grow it.
type versionCache struct {
	mu       sync.RWMutex
	versions map[string]string // Accept header → negotiated spec version
}

func (c *versionCache) negotiate(values []string) (string, error) {
	accept := ""
	if len(values) == 1 {
		accept = values[0]
	} else if len(values) > 1 {
		accept = strings.Join(values, ", ")
	}
	c.mu.RLock()
	v, ok := c.versions[accept]
	c.mu.RUnlock()
	if ok {
		return v, nil
	}
	v, err := ignition.Negotiate(accept)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	if c.versions == nil {
		c.versions = map[string]string{}
	}
	if len(c.versions) < maxNegotiated {
		c.versions[accept] = v
	}
	c.mu.Unlock()
	return v, nil
}

// fileCache keeps rendered files in memory, revalidated on every read by one stat (size, mtime,
// inode): the render phase replaces files atomically (rename), so a changed file always has a new
// inode, and the handler neither re-reads nor re-allocates unchanged ones.
type fileCache struct {
	mu    sync.RWMutex
	files map[string]cachedFile
}

type cachedFile struct {
	size   int64
	mtime  int64
	ino    uint64
	data   []byte
	length []string // the Content-Length header value of data
}

func (c *fileCache) read(path string) (cachedFile, error) {
	st, err := os.Stat(path)
	if err != nil {
		return cachedFile{}, err
	}
	key := cachedFile{size: st.Size(), mtime: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		key.ino = sys.Ino
	}
	c.mu.RLock()
	f, ok := c.files[path]
	c.mu.RUnlock()
	if ok && f.size == key.size && f.mtime == key.mtime && f.ino == key.ino {
		return f, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return cachedFile{}, err
	}
	key.data, key.length = data, []string{strconv.Itoa(len(data))}
	c.mu.Lock()
	if c.files == nil {
		c.files = map[string]cachedFile{}
	}
	c.files[path] = key
	c.mu.Unlock()
	return key, nil
}
