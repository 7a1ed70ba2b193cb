package clustermirror

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// helperEnv, when set in the environment, makes the test binary run the cluster mirror with the
// Options it holds (JSON) instead of the tests: TestSyncResumesAfterSIGKILL kills that process.
const helperEnv = "CLUSTERMIRROR_TEST_RUN"

func TestMain(m *testing.M) {
	if spec := os.Getenv(helperEnv); spec != "" {
		var o Options
		if err := json.Unmarshal([]byte(spec), &o); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		o.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
		if err := Run(context.Background(), o); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSyncResumesAfterSIGKILL: the cluster mirror process is killed with SIGKILL (no cleanup of any
// kind) once in the middle of the blob copies and once in the middle of the .deb copies; a new Run
// over the same Dir then completes, serves everything identical to the upstream, and leaves no
// temporary file behind.
func TestSyncResumesAfterSIGKILL(t *testing.T) {
	ca := newTestPKI(t)
	u := buildUpstream(t, ca)
	u.start(t, "127.0.0.1:0")
	dir := filepath.Join(t.TempDir(), "mirror")
	spec, err := json.Marshal(Options{Upstream: u.url, CAFile: ca.caFile, Dir: dir, Listen: "127.0.0.1:0",
		CertFile: ca.mirrorCert, KeyFile: ca.mirKey})
	if err != nil {
		t.Fatal(err)
	}

	temps := func() []string {
		var left []string
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && (strings.Contains(d.Name(), ".tmp-") || strings.HasPrefix(d.Name(), ".partial-")) {
				left = append(left, p)
			}
			return nil
		})
		return left
	}
	// killAt runs the cluster mirror as a process of its own and kills it with SIGKILL once the
	// upstream has sent `after` bytes of the n-th response matching match, so that files are half
	// written when it dies.
	killAt := func(what string, match func(r *http.Request) bool, n, after int64) {
		t.Helper()
		var proc atomic.Pointer[os.Process]
		var seen atomic.Int64
		u.setHook(func(r *http.Request) {
			if match(r) {
				seen.Add(1)
			}
		})
		var once sync.Once
		w := func(r *http.Request, written int64) {
			if match(r) && seen.Load() >= n && written >= after {
				once.Do(func() {
					if p := proc.Load(); p != nil {
						_ = p.Kill() // SIGKILL
					}
				})
			}
		}
		u.written.Store(&w)
		defer u.written.Store(nil)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"="+string(spec))
		var logs strings.Builder
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		proc.Store(cmd.Process)
		// Should the kill never come (a broken test), the helper would serve forever once synced:
		// the completion marker then ends it, and the test fails below.
		stopWatch := make(chan struct{})
		go func() {
			for {
				select {
				case <-stopWatch:
					return
				case <-time.After(50 * time.Millisecond):
				}
				if _, err := os.Stat(filepath.Join(dir, markerFile)); err == nil {
					_ = cmd.Process.Kill()
					return
				}
			}
		}()
		err := cmd.Wait()
		close(stopWatch)
		if ee, ok := err.(*exec.ExitError); !ok || ee.ProcessState.String() != "signal: killed" {
			t.Fatalf("cluster mirror killed during the %s: %v, want signal: killed\n%s", what, err, logs.String())
		}
		if _, err := os.Stat(filepath.Join(dir, markerFile)); err == nil {
			t.Fatalf("a sync killed during the %s wrote the completion marker", what)
		}
		t.Logf("killed during the %s: %d temporary files left %q", what, len(temps()), temps())
	}
	isBlob := func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/blobs/") }
	isDeb := func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/kubeadm_1.0-1_amd64.deb") }
	killAt("blob copies", isBlob, 1, 1<<20)
	killAt(".deb copies", isDeb, 1, 4<<20)

	u.setHook(func(*http.Request) {})
	m := runMirror(t, ca, dir, u.url)
	h := m.waitSynced(t)
	checkServes(t, u, m)
	if h.Images != 4 || h.Debs != 3 {
		t.Errorf("/healthz: %+v", h)
	}
	if left := temps(); len(left) > 0 {
		t.Errorf("temporary files left after the resumed sync: %q", left)
	}
}
