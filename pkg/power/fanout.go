package power

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// RetryPolicy bounds the retries of one node's operation in RunAll and PowerOnAll.
type RetryPolicy struct {
	// MaxAttempts per node, ≥ 1. 0 → 3.
	MaxAttempts int
	// InitialInterval before the 2nd attempt, doubling (±50% jitter) up to MaxInterval.
	// 0 → 500 ms; MaxInterval 0 → 5 s.
	InitialInterval time.Duration
	MaxInterval     time.Duration
	// NodeTimeout bounds everything done for one node (all attempts and waits). 0 → 2 minutes.
	NodeTimeout time.Duration
}

func (r RetryPolicy) withDefaults() RetryPolicy {
	if r.MaxAttempts <= 0 {
		r.MaxAttempts = 3
	}
	if r.InitialInterval <= 0 {
		r.InitialInterval = 500 * time.Millisecond
	}
	if r.MaxInterval <= 0 {
		r.MaxInterval = 5 * time.Second
	}
	if r.NodeTimeout <= 0 {
		r.NodeTimeout = 2 * time.Minute
	}
	return r
}

// Result is the outcome for one node.
type Result struct {
	// Node is the key of the controller in the map given to RunAll/PowerOnAll.
	Node string
	// Err is nil on success, else the last attempt's error (wrapping the sentinels).
	Err error
	// Attempts made (≥ 1 unless ctx was already done or the controller was nil).
	Attempts int
	// Duration from the node's start to its last attempt's end, waits included.
	Duration time.Duration
}

// PowerOnAll powers on every node concurrently: see RunAll.
func PowerOnAll(ctx context.Context, ctrls map[string]Controller, concurrency int, retry RetryPolicy) []Result {
	return RunAll(ctx, ctrls, concurrency, retry, func(ctx context.Context, c Controller) error { return c.PowerOn(ctx) })
}

// RunAll runs op on every controller with at most concurrency (≤ 0 → 16) nodes in flight. Each
// node gets its own deadline (retry.NodeTimeout) and exponential-backoff retries
// (cenkalti/backoff/v5); errors that retrying cannot fix (ErrAuth, ErrHostKeyUnknown,
// ErrHostKeyMismatch, ErrCertificate, ErrUnsupported) stop that node at once. One slow or dead
// node never blocks the others beyond holding one concurrency slot. Results come back sorted by
// node name, one per map entry.
func RunAll(ctx context.Context, ctrls map[string]Controller, concurrency int, retry RetryPolicy, op func(context.Context, Controller) error) []Result {
	retry = retry.withDefaults()
	if concurrency <= 0 {
		concurrency = 16
	}
	names := make([]string, 0, len(ctrls))
	for n := range ctrls {
		names = append(names, n)
	}
	sort.Strings(names)
	results := make([]Result, len(names))
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	for i, name := range names {
		results[i].Node = name
		c := ctrls[name]
		if c == nil {
			results[i].Err = fmt.Errorf("node %s: no power controller", name)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				results[i].Err = fmt.Errorf("node %s: not started: %w", name, ctx.Err())
				return
			}
			defer func() { <-sem }()
			if err := ctx.Err(); err != nil {
				results[i].Err = fmt.Errorf("node %s: not started: %w", name, err)
				return
			}
			results[i] = runOne(ctx, name, c, retry, op)
		}()
	}
	wg.Wait()
	return results
}

func runOne(ctx context.Context, name string, c Controller, retry RetryPolicy, op func(context.Context, Controller) error) Result {
	start := time.Now()
	nctx, cancel := context.WithTimeout(ctx, retry.NodeTimeout)
	defer cancel()
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = retry.InitialInterval
	b.MaxInterval = retry.MaxInterval
	attempts := 0
	var last error
	_, err := backoff.Retry(nctx, func() (struct{}, error) {
		attempts++
		err := op(nctx, c)
		last = err
		if err != nil && permanent(err) {
			return struct{}{}, backoff.Permanent(err)
		}
		return struct{}{}, err
	}, backoff.WithBackOff(b), backoff.WithMaxTries(uint(retry.MaxAttempts)), backoff.WithMaxElapsedTime(retry.NodeTimeout))
	if err != nil {
		if last != nil && !errors.Is(err, last) {
			// the node deadline or ctx ended the waits: report the last real error too
			err = fmt.Errorf("%w (after: %w)", last, err)
		} else if last != nil {
			err = last
		}
		err = fmt.Errorf("node %s: %w", name, err)
	}
	return Result{Node: name, Err: err, Attempts: attempts, Duration: time.Since(start)}
}
