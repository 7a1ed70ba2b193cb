package upstream

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Standalone is a testing.TB for programs, so that the fixture build (test/fixtures/mkupstream) runs
// the same upstream peers as the tests: TempDir makes directories under Dir, Cleanup functions run
// (last first) at Close, Fatal/Fatalf run them and exit with status 1, Log/Logf write to stderr. Only
// those methods (and Helper, Name, Failed) are implemented: the embedded nil testing.TB makes any
// other method panic, which a caller of this package would see at once.
type Standalone struct {
	testing.TB // nil: only satisfies testing.TB's unexported method

	// Dir is the parent of every TempDir; Close removes it unless Keep.
	Dir  string
	Keep bool

	mu       sync.Mutex
	cleanups []func()
	n        int
}

// NewStandalone returns a Standalone whose temporary directories live under dir (created 0700).
func NewStandalone(dir string) (*Standalone, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &Standalone{Dir: dir}, nil
}

func (s *Standalone) Helper()      {}
func (s *Standalone) Name() string { return filepath.Base(os.Args[0]) }
func (s *Standalone) Failed() bool { return false }

func (s *Standalone) Log(args ...any)                 { fmt.Fprintln(os.Stderr, args...) }
func (s *Standalone) Logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

// TempDir returns a new directory under Dir.
func (s *Standalone) TempDir() string {
	s.mu.Lock()
	s.n++
	d := filepath.Join(s.Dir, fmt.Sprintf("%03d", s.n))
	s.mu.Unlock()
	if err := os.MkdirAll(d, 0o700); err != nil {
		s.Fatal(err)
	}
	return d
}

// Cleanup registers f to run at Close.
func (s *Standalone) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}

// Close runs the cleanup functions, last registered first, then removes Dir unless Keep.
func (s *Standalone) Close() {
	s.mu.Lock()
	fs := s.cleanups
	s.cleanups = nil
	s.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
	if !s.Keep {
		_ = os.RemoveAll(s.Dir)
	}
}

func (s *Standalone) Fatal(args ...any) {
	fmt.Fprintln(os.Stderr, append([]any{s.Name() + ": error:"}, args...)...)
	s.Close()
	os.Exit(1)
}

func (s *Standalone) Fatalf(format string, args ...any) { s.Fatal(fmt.Sprintf(format, args...)) }
func (s *Standalone) Error(args ...any)                 { s.Fatal(args...) }
func (s *Standalone) Errorf(format string, args ...any) { s.Fatalf(format, args...) }

// Skipf is fatal for a program: a missing peer stops the build.
func (s *Standalone) Skipf(format string, args ...any) { s.Fatalf(format, args...) }
