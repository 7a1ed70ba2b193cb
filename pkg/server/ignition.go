package server

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
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
// nothing about which nodes exist; only a token this process saw replaced or revoked is told so
// (NodeTokens.Refusal). A config rendered before the node's token was rotated is served with the
// current token in place of the rendered one (tokenSwaps): Ignition configs served after a rotation
// carry the new token.
type IgnitionStore struct {
	// Dir holds one directory per node.
	Dir string

	tokens   *NodeTokens
	files    fileCache
	versions versionCache
	swaps    tokenSwaps
}

// NewIgnitionStore returns a store for dir that accepts the given node tokens (node name → token).
func NewIgnitionStore(dir string, tokens map[string]string) *IgnitionStore {
	return &IgnitionStore{Dir: dir, tokens: NewNodeTokens(tokens)}
}

// SetTokens replaces the accepted tokens by a fixed set (node name → token).
func (s *IgnitionStore) SetTokens(tokens map[string]string) { s.tokens.set(tokens) }

// UseTokens makes the store accept the tokens of t (NodeTokensIn, shared with the AgentAPI). Call
// it before serving.
func (s *IgnitionStore) UseTokens(t *NodeTokens) { s.tokens = t }

func (s *IgnitionStore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	node := strings.TrimPrefix(r.URL.Path, "/ignition/")
	token := headerBearer(r)
	if node == "" || strings.ContainsAny(node, "/\\") || strings.HasPrefix(node, ".") || !s.tokens.authorized(node, token) {
		unauthorized(w, s.tokens.Refusal(token))
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
	data, length := f.data, f.length
	if rendered := s.renderedToken(node); rendered != "" && rendered != token {
		// Rendered before the node's token was last rotated: served with the token it has now.
		if data, length, err = s.swaps.swap(f, rendered, token); err != nil {
			http.Error(w, "this node's Ignition config does not hold the token of its rendered hostagent configuration; rerun `appliance bootstrap` (render phase)", http.StatusServiceUnavailable)
			return
		}
	}
	// Content-Length up front: without it net/http answers a body larger than its 2 KiB buffer in
	// chunked encoding (chunk framing, and clients cannot tell a truncated config). The header
	// values are built once (per version, per cached file), not per request: under
	// test/bench/ignition.sh the handler's allocations fell from 47 to 17 per request.
	h := w.Header()
	h["Content-Type"] = contentTypeHeaders[version]
	h["Cache-Control"] = noStoreHeader
	h["Content-Length"] = length
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(data)
}

// renderedToken is the token in node's rendered hostagent configuration (Dir/<node>/hostagent.yaml,
// which the render phase writes with the Ignition configs, from the same token); "" when there is
// none or it does not parse (then the configs are served as rendered).
func (s *IgnitionStore) renderedToken(node string) string {
	f, err := s.files.read(filepath.Join(s.Dir, node, statedir.AgentConfigFile))
	if err != nil {
		return ""
	}
	return s.swaps.tokenOf(f)
}

// tokenSwaps serves rendered Ignition configs with a node's current token in place of the one they
// were rendered with (a token rotated by an enrolment, `appliance node reinstall` or `appliance node
// revoke` after the last render). The token is a literal in the config: its base64url alphabet is
// RFC 3986's unreserved characters, which the data URL's escaping (dataurl.Escape) and JSON leave
// as they are, and 256 random bits occur nowhere else. Results are kept per rendered file, keyed by
// the file's version and both tokens' digests.
type tokenSwaps struct {
	mu      sync.Mutex
	tokens  map[string]renderedConfig // hostagent.yaml path → its token
	swapped map[string]swappedFile    // Ignition config path → served bytes
}

type renderedConfig struct {
	file  *cachedFile
	token string
}

type swappedFile struct {
	file     *cachedFile
	from, to [32]byte
	data     []byte
	length   []string
}

func (c *tokenSwaps) tokenOf(f cachedFile) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.tokens[f.path]; ok && r.file.same(f) {
		return r.token
	}
	cfg, err := agentapi.Parse(f.data)
	if err != nil {
		return ""
	}
	if c.tokens == nil || len(c.tokens) >= maxSwaps {
		c.tokens = map[string]renderedConfig{}
	}
	c.tokens[f.path] = renderedConfig{file: &f, token: cfg.Token}
	return cfg.Token
}

// maxSwaps bounds each map of tokenSwaps (one entry per node and spec version).
const maxSwaps = 4096

func (c *tokenSwaps) swap(f cachedFile, from, to string) ([]byte, []string, error) {
	fd, td := sha256.Sum256([]byte(from)), sha256.Sum256([]byte(to))
	c.mu.Lock()
	defer c.mu.Unlock()
	if sw, ok := c.swapped[f.path]; ok && sw.file.same(f) && sw.from == fd && sw.to == td {
		return sw.data, sw.length, nil
	}
	if !bytes.Contains(f.data, []byte(from)) {
		return nil, nil, errors.New("the rendered token is not in the config")
	}
	data := bytes.ReplaceAll(f.data, []byte(from), []byte(to))
	sw := swappedFile{file: &f, from: fd, to: td, data: data, length: []string{strconv.Itoa(len(data))}}
	if c.swapped == nil || len(c.swapped) >= maxSwaps {
		c.swapped = map[string]swappedFile{}
	}
	c.swapped[f.path] = sw
	return sw.data, sw.length, nil
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
	path   string
	size   int64
	mtime  int64
	ino    uint64
	data   []byte
	length []string // the Content-Length header value of data
}

// same reports whether f and g are the same version of the same file.
func (f *cachedFile) same(g cachedFile) bool {
	return f.path == g.path && f.size == g.size && f.mtime == g.mtime && f.ino == g.ino
}

func (c *fileCache) read(path string) (cachedFile, error) {
	st, err := os.Stat(path)
	if err != nil {
		return cachedFile{}, err
	}
	key := cachedFile{path: path, size: st.Size(), mtime: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		key.ino = sys.Ino
	}
	c.mu.RLock()
	f, ok := c.files[path]
	c.mu.RUnlock()
	if ok && f.same(key) {
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
