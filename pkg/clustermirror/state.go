package clustermirror

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// Health is the /healthz document: 200 with Synced true and the counts once the copy is complete and
// served, 503 with Synced false and what is missing before.
type Health struct {
	Synced bool `json:"synced"`
	// Images are the image references served (repository:tag); Blobs the distinct registry blobs
	// (manifests, indexes, configs, layers); Debs the .deb files; Bytes the bytes of blobs and
	// repository files together.
	Images int   `json:"images"`
	Blobs  int   `json:"blobs"`
	Debs   int   `json:"debs"`
	Bytes  int64 `json:"bytes"`
	// While not synced: the step under way ("images", "packages", "serving"), what is missing, the
	// attempt number, the last failure and the wait before the next attempt.
	Phase     string   `json:"phase,omitempty"`
	Missing   []string `json:"missing,omitempty"`
	Attempt   int      `json:"attempt,omitempty"`
	LastError string   `json:"lastError,omitempty"`
	RetryIn   string   `json:"retryIn,omitempty"`
}

// state is what the server shows while Run syncs and serves.
type state struct {
	mu      sync.Mutex
	h       Health
	content atomic.Pointer[http.Handler] // nil until the sync is complete

	// progress of the current attempt
	imagesTotal, imagesDone int
	blobsDone               int
	bytesDone               int64
	debsTotal, debsDone     int
	repoState               string
}

func newState() *state {
	s := &state{}
	s.h.Phase = "images"
	s.repoState = "not started"
	return s
}

func (s *state) health() Health {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.h
	if !h.Synced {
		imgs := "image list not fetched yet"
		if s.imagesTotal > 0 || h.Phase != "images" {
			imgs = fmt.Sprintf("%d of %d images copied (%d blobs, %d bytes so far)", s.imagesDone, s.imagesTotal, s.blobsDone, s.bytesDone)
		}
		pkgs := "packages: " + s.repoState
		if s.debsTotal > 0 {
			pkgs = fmt.Sprintf("packages: %d of %d .debs copied", s.debsDone, s.debsTotal)
		}
		h.Missing = []string{"images: " + imgs, pkgs}
	}
	return h
}

func (s *state) update(f func(s *state)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *state) attempt(n int) {
	s.update(func(s *state) {
		s.h.Attempt, s.h.RetryIn, s.h.Phase = n, "", "images"
		s.imagesTotal, s.imagesDone, s.blobsDone, s.bytesDone = 0, 0, 0, 0
		s.debsTotal, s.debsDone, s.repoState = 0, 0, "not started"
	})
}

func (s *state) failed(err error, retryIn time.Duration) {
	s.update(func(s *state) {
		s.h.LastError = err.Error()
		s.h.RetryIn = ""
		if retryIn > 0 {
			s.h.RetryIn = retryIn.Round(time.Millisecond).String()
		}
	})
}

func (s *state) setCounts(m *marker) {
	s.update(func(s *state) {
		s.h.Images, s.h.Blobs, s.h.Debs, s.h.Bytes = len(m.Images), m.Blobs, m.Debs, m.Bytes
		s.h.Phase = "serving"
	})
}

// ready switches /v2/, /repo/ and /ca.crt to content and /healthz to 200.
func (s *state) ready(content http.Handler) {
	s.content.Store(&content)
	s.update(func(s *state) {
		s.h = Health{Synced: true, Images: s.h.Images, Blobs: s.h.Blobs, Debs: s.h.Debs, Bytes: s.h.Bytes}
	})
}

// handler is the root handler: /healthz always; the content once ready, 503 before.
func (s *state) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			h := s.health()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			if !h.Synced {
				w.Header().Set("Retry-After", "5")
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			_ = json.NewEncoder(w).Encode(h)
			return
		}
		if c := s.content.Load(); c != nil {
			(*c).ServeHTTP(w, r)
			return
		}
		w.Header().Set("Retry-After", "5")
		http.Error(w, "cluster mirror: still copying from the appliance; see /healthz", http.StatusServiceUnavailable)
	})
}

// marker is Dir/synced.json: a complete sync.
type marker struct {
	Version   int       `json:"version"`
	Upstream  string    `json:"upstream"`
	Completed time.Time `json:"completed"`
	// Images are the references copied with their pinned digests.
	Images []markerImage `json:"images"`
	// Repo is the copied repository; nil when the upstream serves none.
	Repo  *markerRepo `json:"repo,omitempty"`
	Blobs int         `json:"blobs"`
	Debs  int         `json:"debs"`
	Bytes int64       `json:"bytes"`
}

type markerImage struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

type markerRepo struct {
	// InReleaseSHA256 is the SHA-256 of each suite's InRelease, keyed by its path under repo/.
	InReleaseSHA256 map[string]string `json:"inReleaseSHA256"`
	// Files are every copied file under repo/ (slash-separated) with its size.
	Files map[string]int64 `json:"files"`
}

const markerVersion = 1

func readMarker(dir string) (*marker, error) {
	b, err := os.ReadFile(filepath.Join(dir, markerFile))
	if err != nil {
		return nil, err
	}
	var m marker
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", markerFile, err)
	}
	if m.Version != markerVersion {
		return nil, fmt.Errorf("%s: version %d, want %d", markerFile, m.Version, markerVersion)
	}
	return &m, nil
}

func writeMarker(dir string, m *marker) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	_, err = atomicfile.Write(filepath.Join(dir, markerFile), append(b, '\n'), 0o644)
	return err
}
