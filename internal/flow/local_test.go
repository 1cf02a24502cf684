package flow_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/flow"
)

func TestLocal(t *testing.T) {
	t.Parallel()
	if _, err := flow.NewLocal(0); err == nil {
		t.Fatal("NewLocal(0) accepted")
	}
	l, err := flow.NewLocal(2)
	must(t, "NewLocal", err)
	for i := range 2 {
		if !l.TryAcquire() {
			t.Fatalf("TryAcquire %d refused with places free", i+1)
		}
	}
	if l.TryAcquire() {
		t.Fatal("TryAcquire took a third place of 2")
	}
	if l.Held() != 2 || l.Limit() != 2 {
		t.Fatalf("Held, Limit = %d, %d; want 2, 2", l.Held(), l.Limit())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := l.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with all held = %v, want the context's error", err)
	}
	got := make(chan error, 1)
	go func() { got <- l.Acquire(t.Context()) }()
	l.Release()
	if err := <-got; err != nil {
		t.Fatalf("Acquire after a Release: %v", err)
	}
	l.Release()
	l.Release()
	defer func() {
		if recover() == nil {
			t.Error("Release with nothing held did not panic")
		}
	}()
	l.Release()
}

// TestLocalConcurrent: 50 goroutines never hold more than the limit.
func TestLocalConcurrent(t *testing.T) {
	t.Parallel()
	const limit = 3
	l, err := flow.NewLocal(limit)
	must(t, "NewLocal", err)
	var in, peak atomic.Int64
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			for range 200 {
				if !l.TryAcquire() {
					continue
				}
				n := in.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				in.Add(-1)
				l.Release()
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > limit || p < 1 {
		t.Fatalf("peak holders %d, want 1 to %d", p, limit)
	}
}
