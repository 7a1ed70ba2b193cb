package power

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// scripted is an in-memory Controller whose PowerOn returns the queued errors in order, then nil,
// and records the peak number of concurrent calls across all scripted controllers sharing gauge.
type scripted struct {
	mu    sync.Mutex
	errs  []error
	calls int
	block bool // PowerOn waits for ctx to end
	gauge *gauge
}

type gauge struct{ cur, peak atomic.Int32 }

func (s *scripted) PowerOn(ctx context.Context) error {
	n := s.gauge.cur.Add(1)
	defer s.gauge.cur.Add(-1)
	for {
		p := s.gauge.peak.Load()
		if n <= p || s.gauge.peak.CompareAndSwap(p, n) {
			break
		}
	}
	time.Sleep(time.Millisecond) // let other goroutines overlap
	if s.block {
		<-ctx.Done()
		return fmt.Errorf("blocked: %w", errors.Join(ErrUnreachable, ctx.Err()))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if len(s.errs) > 0 {
		err := s.errs[0]
		s.errs = s.errs[1:]
		return err
	}
	return nil
}
func (s *scripted) PowerOff(context.Context) error                        { return nil }
func (s *scripted) PowerCycle(context.Context) error                      { return nil }
func (s *scripted) PowerState(context.Context) (State, error)             { return StateOn, nil }
func (s *scripted) SetBootDevice(context.Context, BootDevice, bool) error { return nil }
func (s *scripted) Close() error                                          { return nil }

func TestRunAllRetriesAndBounds(t *testing.T) {
	g := &gauge{}
	flaky := errors.Join(ErrUnreachable, errors.New("timeout"))
	ctrls := map[string]Controller{
		"ok":        &scripted{gauge: g},
		"flaky":     &scripted{gauge: g, errs: []error{flaky, flaky}},
		"auth":      &scripted{gauge: g, errs: []error{fmt.Errorf("bad: %w", ErrAuth)}},
		"hostkey":   &scripted{gauge: g, errs: []error{fmt.Errorf("bad: %w", ErrHostKeyMismatch)}},
		"always":    &scripted{gauge: g, errs: []error{flaky, flaky, flaky, flaky}},
		"hangs":     &scripted{gauge: g, block: true},
		"nil":       nil,
		"ok-2":      &scripted{gauge: g},
		"ok-3":      &scripted{gauge: g},
		"ok-4":      &scripted{gauge: g},
		"ok-5":      &scripted{gauge: g},
		"ok-6":      &scripted{gauge: g},
		"unsupport": &scripted{gauge: g, errs: []error{ErrUnsupported}},
	}
	res := PowerOnAll(context.Background(), ctrls, 3, RetryPolicy{MaxAttempts: 3, InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond, NodeTimeout: 200 * time.Millisecond})
	want := map[string]struct {
		err      error // nil: success
		attempts int
	}{
		"ok": {nil, 1}, "ok-2": {nil, 1}, "ok-3": {nil, 1}, "ok-4": {nil, 1}, "ok-5": {nil, 1}, "ok-6": {nil, 1},
		"flaky":     {nil, 3},
		"auth":      {ErrAuth, 1},
		"hostkey":   {ErrHostKeyMismatch, 1},
		"unsupport": {ErrUnsupported, 1},
		"always":    {ErrUnreachable, 3},
		"hangs":     {ErrUnreachable, 1},
		"nil":       {errors.New("any"), 0},
	}
	if len(res) != len(ctrls) {
		t.Fatalf("%d results for %d nodes", len(res), len(ctrls))
	}
	for i, r := range res {
		if i > 0 && res[i-1].Node >= r.Node {
			t.Fatalf("results not sorted by node: %q before %q", res[i-1].Node, r.Node)
		}
		w := want[r.Node]
		switch {
		case w.err == nil && r.Err != nil:
			t.Errorf("%s: %v, want success", r.Node, r.Err)
		case w.err != nil && r.Err == nil:
			t.Errorf("%s: success, want an error", r.Node)
		case w.err != nil && r.Node != "nil" && !errors.Is(r.Err, w.err):
			t.Errorf("%s: %v, want %v", r.Node, r.Err, w.err)
		}
		if r.Attempts != w.attempts {
			t.Errorf("%s: %d attempts, want %d", r.Node, r.Attempts, w.attempts)
		}
	}
	if p := g.peak.Load(); p > 3 || p < 2 {
		t.Errorf("peak concurrency %d, want 2..3 (limit 3)", p)
	}
}

func TestRunAllCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res := PowerOnAll(ctx, map[string]Controller{"a": &scripted{gauge: &gauge{}}}, 1, RetryPolicy{})
	if len(res) != 1 || res[0].Err == nil {
		t.Fatalf("PowerOnAll on a cancelled context = %+v, want an error", res)
	}
}
