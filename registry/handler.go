// Package registry is the appliance's OCI registry mirror: Import turns the air-gap bundle's OCI image
// layout into the storage tree of distribution/v3's filesystem driver without copying bytes, and
// NewHandler serves that tree read-only over the OCI distribution API (/v2/...), so nodes pull
// "registry.k8s.io/pause:3.10" from https://APPLIANCE/v2/registry.k8s.io/pause/manifests/3.10 through a
// containerd hosts.toml mirror with override_path.
//
// This is the only package that imports github.com/distribution/distribution/v3; its logrus logging,
// panics and global knobs are contained here.
package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/api/errcode"
	v2 "github.com/distribution/distribution/v3/registry/api/v2"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // registers "filesystem"
	"github.com/distribution/reference"
	"github.com/gorilla/mux"
	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"
)

// ErrHandler is wrapped by NewHandler errors: a bad root directory or a panic inside distribution's
// application constructor (recovered and returned instead).
var ErrHandler = errors.New("registry handler")

// Handler serves the OCI distribution API (/v2/...) read-only from a tree built by Import. Mount it at
// /v2/ of a TLS server (pkg/server terminates TLS). Pushes and deletes answer 405 Method Not Allowed
// (distribution's read-only maintenance mode). Safe for concurrent use.
type Handler struct {
	app      *handlers.App
	root     string
	log      *slog.Logger
	fastPath bool
	blobs    blobFiles
	close    sync.Once
}

// HandlerOption changes how NewHandler builds a Handler.
type HandlerOption func(*Handler)

// WithBlobFastPath turns the blob fast path on (the default) or off. On, GET and HEAD of
// /v2/<name>/blobs/<digest> for a blob linked into <name> are answered by http.ServeContent straight
// from the data file, with the headers distribution sends (Docker-Content-Digest, ETag, Cache-Control,
// Content-Type application/octet-stream, Range support); anything else, including every error case, is
// left to distribution. Off, distribution serves everything (for benchmarks and diagnosis).
func WithBlobFastPath(on bool) HandlerOption { return func(h *Handler) { h.fastPath = on } }

const blobCacheControl = "max-age=31536000" // distribution's blobCacheControlMaxAge (365 days)

// NewHandler builds distribution's application over the filesystem tree rooted at rootDir (the same
// rootDir given to Import; created 0755 if missing). The configuration is parsed with
// configuration.Parse (so distribution's defaults apply), then the security-relevant sections are
// forced: filesystem storage at rootDir, read-only maintenance mode, no delete, no redirects, upload
// purging off, no auth/proxy/notifications/middleware/redis, so REGISTRY_* environment variables cannot
// make the mirror writable. Storage health checks are never registered (handlers.NewApp does not, and
// two apps in one process would panic if it did). OTEL_TRACES_EXPORTER defaults to "none".
//
// distribution logs through the process-wide logrus standard logger; NewHandler silences its output
// and forwards its entries to log ("registry: distribution" messages: client errors at Debug, the rest
// at Warn). With several Handlers in one process, the last one created receives them.
//
// A panic inside distribution's constructor is recovered and returned wrapped in ErrHandler; a panic
// while serving a request is recovered, logged and answered 500. ctx bounds the application's
// background work; call Close when done.
func NewHandler(ctx context.Context, rootDir string, log *slog.Logger, opts ...HandlerOption) (h *Handler, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if rootDir == "" {
		return nil, fmt.Errorf("%w: empty root directory", ErrHandler)
	}
	root, err := filepath.Abs(rootDir)
	if err != nil {
		return nil, fmt.Errorf("%w: root directory %q: %w", ErrHandler, rootDir, err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("%w: create root directory: %w", ErrHandler, err)
	}
	if _, ok := os.LookupEnv("OTEL_TRACES_EXPORTER"); !ok {
		_ = os.Setenv("OTEL_TRACES_EXPORTER", "none")
	}
	routeLogrus(log)

	cfg, err := configuration.Parse(strings.NewReader(configYAML(root)))
	if err != nil {
		return nil, fmt.Errorf("%w: distribution configuration: %w", ErrHandler, err)
	}
	forceConfig(cfg, root)

	defer func() {
		if r := recover(); r != nil {
			h, err = nil, fmt.Errorf("%w: distribution refused its configuration: %v", ErrHandler, r)
		}
	}()
	h = &Handler{app: handlers.NewApp(ctx, cfg), root: root, log: log, fastPath: true}
	for _, o := range opts {
		o(h)
	}
	return h, nil
}

func configYAML(root string) string {
	return fmt.Sprintf(`version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %q
  maintenance:
    uploadpurging:
      enabled: false
    readonly:
      enabled: true
  delete:
    enabled: false
  redirect:
    disable: true
  cache:
    blobdescriptor: inmemory
http:
  secret: %q
  headers:
    X-Content-Type-Options: [nosniff]
health:
  storagedriver:
    enabled: false
`, root, randHex()+randHex())
}

// forceConfig resets every section that could make the mirror writable, remote or noisy, whatever
// REGISTRY_* environment variables configuration.Parse merged in. Value types match what
// handlers.NewApp type-asserts (map[any]any, bool).
func forceConfig(cfg *configuration.Configuration, root string) {
	cfg.Storage = configuration.Storage{
		"filesystem": configuration.Parameters{"rootdirectory": root},
		"maintenance": configuration.Parameters{
			"uploadpurging": map[any]any{"enabled": false},
			"readonly":      map[any]any{"enabled": true},
		},
		"delete":   configuration.Parameters{"enabled": false},
		"redirect": configuration.Parameters{"disable": true},
		"cache":    configuration.Parameters{"blobdescriptor": "inmemory"},
	}
	cfg.Auth = nil
	cfg.Proxy = configuration.Proxy{}
	cfg.Middleware = nil
	cfg.Notifications = configuration.Notifications{}
	cfg.Redis = configuration.Redis{}
	cfg.HTTP.Prefix = ""
	cfg.HTTP.Host = ""
	cfg.Health.StorageDriver.Enabled = false
	cfg.Log.Hooks = nil
}

// Close stops distribution's background work and closes the blob files the fast path keeps open; call
// it after the HTTP server has stopped (in-flight blob responses would be cut). It is idempotent.
func (h *Handler) Close() error {
	var err error
	h.close.Do(func() {
		unrouteLogrus(h.log)
		h.blobs.closeAll()
		if e := h.app.Shutdown(); e != nil {
			err = fmt.Errorf("%w: shutdown: %w", ErrHandler, e)
		}
	})
	return err
}

// ServeHTTP serves /v2/... (the path must keep its /v2/ prefix).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			h.log.Error("registry request panicked", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v))
			http.Error(w, "internal registry error", http.StatusInternalServerError)
		}
	}()
	if refuseMalformed(w, r) || refuseWrite(w, r) {
		return
	}
	if h.fastPath && (r.Method == http.MethodGet || r.Method == http.MethodHead) && h.serveBlob(w, r) {
		return
	}
	h.app.ServeHTTP(w, r)
}

// refuseWrite answers every method but GET and HEAD on a route distribution serves with 405 and the
// OCI error UNSUPPORTED (distribution spec, "Error Codes"; Allow: GET, HEAD as RFC 9110 §15.5.6
// asks), and returns whether it did. The mirror is read-only; distribution's own read-only refusal is
// a plain-text "Method not allowed" without Allow, which OCI clients cannot parse.
func refuseWrite(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return false
	}
	var m mux.RouteMatch
	if !v2.Router().Match(r, &m) {
		return false
	}
	w.Header().Set("Allow", "GET, HEAD")
	serveRegistryError(w, errcode.ErrorCodeUnsupported.WithMessage("this registry is a read-only mirror of the bundle: only GET and HEAD are served"))
	return true
}

// maxEchoed bounds how much of a client's malformed digest an error detail repeats.
const maxEchoed = 100

// refuseMalformed answers, before distribution sees the request, the malformed paths distribution
// answers wrongly, and returns whether it did. The request is matched against distribution's own route
// table (registry/api/v2.Router), so the checks apply to exactly the routes distribution serves, for
// every method:
//
//   - a repository name longer than reference.RepositoryNameTotalLengthMax (255) characters, counted
//     over the whole name as the mirror's repositories are (RepositoryFor), or otherwise refused by
//     reference.WithName: 400 NAME_INVALID (distribution v3.1.2 answers 500 UNKNOWN, as it passes
//     reference's error on unwrapped; the OCI distribution spec's error table has NAME_INVALID);
//   - a digest in the path (blobs/<digest>, or manifests/<reference> holding a ':', distribution's rule
//     for a digest rather than a tag) that opencontainers/go-digest does not parse: 400 DIGEST_INVALID,
//     with a message about the path's digest instead of distribution's stock one about uploaded
//     content, and the first maxEchoed characters of the digest as detail.
func refuseMalformed(w http.ResponseWriter, r *http.Request) bool {
	var m mux.RouteMatch
	if !v2.Router().Match(r, &m) {
		return false
	}
	if name, ok := m.Vars["name"]; ok {
		_, err := reference.WithName(name)
		if len(name) > reference.RepositoryNameTotalLengthMax {
			err = fmt.Errorf("repository name is %d characters long, more than %d", len(name), reference.RepositoryNameTotalLengthMax)
		}
		if err != nil {
			serveRegistryError(w, errcode.ErrorCodeNameInvalid.WithDetail(err.Error()))
			return true
		}
	}
	ds, ok := m.Vars["digest"]
	if ref, isManifest := m.Vars["reference"]; isManifest && strings.ContainsRune(ref, ':') {
		ds, ok = ref, true
	}
	if !ok {
		return false
	}
	if _, err := digest.Parse(ds); err != nil {
		if len(ds) > maxEchoed {
			ds = ds[:maxEchoed] + "..."
		}
		serveRegistryError(w, errcode.ErrorCodeDigestInvalid.
			WithMessage("the digest in the request path is malformed: want <algorithm>:<encoded>, e.g. sha256: and 64 lower-case hex digits").
			WithDetail(map[string]string{"digest": ds, "reason": err.Error()}))
		return true
	}
	return false
}

// serveRegistryError writes e as the OCI distribution error document, with the headers distribution
// sends on every response.
func serveRegistryError(w http.ResponseWriter, e errcode.Error) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_ = errcode.ServeJSON(w, e)
}

// serveBlob answers GET/HEAD /v2/<name>/blobs/<digest> when the blob is linked into <name>
// (_layers/<alg>/<hex>/link holds the digest, as distribution's linkedBlobStatter requires) and its
// data file opens. It returns false, having written nothing, in every other case.
func (h *Handler) serveBlob(w http.ResponseWriter, r *http.Request) bool {
	rest, ok := strings.CutPrefix(r.URL.Path, "/v2/")
	if !ok {
		return false
	}
	i := strings.LastIndex(rest, "/blobs/")
	if i <= 0 {
		return false
	}
	name, ds := rest[:i], rest[i+len("/blobs/"):]
	dgst, err := digest.Parse(ds)
	if err != nil || dgst.Algorithm() != digest.SHA256 {
		return false
	}
	f, err := h.blobs.open(h.root, name, dgst)
	if err != nil {
		return false
	}
	if f.closeAfter {
		defer f.Close()
	}
	hd := w.Header()
	hd.Set("Docker-Distribution-API-Version", "registry/2.0")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("ETag", `"`+ds+`"`)
	hd.Set("Cache-Control", blobCacheControl)
	hd.Set("Docker-Content-Digest", ds)
	hd.Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", time.Time{}, io.NewSectionReader(f, 0, f.size))
	return true
}

// blobFiles keeps the data files the fast path serves open, and remembers which (repository, digest)
// pairs were found linked, so that a request costs one stat instead of reading the link and opening
// and closing the data file. Links are only ever added (Import never removes one, the handler is
// read-only), so a positive link check stays true. A cached file is reused only while the data path
// still names the same inode: a blob repaired by a later Import is reopened. At most maxOpenBlobs
// files are kept; past that, files are opened per request.
type blobFiles struct {
	mu     sync.RWMutex
	linked map[string]bool      // name + "@" + digest
	files  map[string]*blobFile // data path
}

const maxOpenBlobs = 4096

type blobFile struct {
	*os.File
	size       int64
	info       os.FileInfo
	closeAfter bool // not cached: the request closes it
}

func (b *blobFiles) open(root, name string, dgst digest.Digest) (*blobFile, error) {
	hx := dgst.Encoded()
	v2 := filepath.Join(root, "docker", "registry", "v2")
	key := name + "@" + dgst.String()
	b.mu.RLock()
	linked := b.linked[key]
	b.mu.RUnlock()
	if !linked {
		if _, err := reference.WithName(name); err != nil { // also keeps ".." out of the path
			return nil, err
		}
		link, err := os.ReadFile(filepath.Join(v2, "repositories", filepath.FromSlash(name), "_layers", "sha256", hx, "link"))
		if err != nil || string(link) != dgst.String() {
			return nil, errors.New("blob not linked")
		}
		b.mu.Lock()
		if b.linked == nil {
			b.linked = map[string]bool{}
		}
		if len(b.linked) < 16*maxOpenBlobs {
			b.linked[key] = true
		}
		b.mu.Unlock()
	}
	path := filepath.Join(v2, "blobs", "sha256", hx[:2], hx, "data")
	st, err := os.Stat(path)
	if err != nil || !st.Mode().IsRegular() {
		return nil, errors.New("blob data missing")
	}
	b.mu.RLock()
	f := b.files[path]
	b.mu.RUnlock()
	if f != nil && os.SameFile(f.info, st) {
		return f, nil
	}
	osf, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fst, err := osf.Stat()
	if err != nil {
		osf.Close()
		return nil, err
	}
	f = &blobFile{File: osf, size: fst.Size(), info: fst}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.files == nil {
		b.files = map[string]*blobFile{}
	}
	if old := b.files[path]; old != nil || len(b.files) >= maxOpenBlobs {
		// A replaced inode (the old file may still be in use: leave it to the GC finaliser) or a full
		// cache: this request owns its file.
		f.closeAfter = old == nil
		if old != nil {
			b.files[path] = f
		}
		return f, nil
	}
	b.files[path] = f
	return f, nil
}

func (b *blobFiles) closeAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, f := range b.files {
		_ = f.Close()
	}
	b.files = nil
}

// logrus bridge: distribution logs through logrus' standard logger (internal/dcontext's default).

var (
	logrusOnce   sync.Once
	logrusTarget atomic.Pointer[slog.Logger]
)

func routeLogrus(log *slog.Logger) {
	logrusTarget.Store(log)
	logrusOnce.Do(func() {
		std := logrus.StandardLogger()
		std.SetOutput(io.Discard)
		std.SetLevel(logrus.WarnLevel)
		std.AddHook(logrusHook{})
	})
}

func unrouteLogrus(log *slog.Logger) { logrusTarget.CompareAndSwap(log, nil) }

type logrusHook struct{}

func (logrusHook) Levels() []logrus.Level { return logrus.AllLevels }

func (logrusHook) Fire(e *logrus.Entry) error {
	log := logrusTarget.Load()
	if log == nil {
		return nil
	}
	level := slog.LevelWarn
	if status, ok := e.Data["http.response.status"].(int); ok && status < 500 {
		level = slog.LevelDebug // unknown manifests/blobs, refused pushes: the client's business
	}
	ctx := context.Background()
	if !log.Enabled(ctx, level) {
		return nil
	}
	attrs := []slog.Attr{slog.String("message", e.Message), slog.String("logrus_level", e.Level.String())}
	for _, k := range []string{"http.request.method", "http.request.uri", "http.response.status", "err.code", "err.message", "error"} {
		if v, ok := e.Data[k]; ok {
			attrs = append(attrs, slog.Any(k, v))
		}
	}
	log.LogAttrs(ctx, level, "registry: distribution", attrs...)
	return nil
}
