package runner

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestPool(t *testing.T) {
	t.Parallel()

	// StrictOrder: in strict order a lower queue is asked only once every
	// higher one is found empty.
	t.Run("StrictOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 1, pool: []string{"a", "b"}})
		var mu sync.Mutex
		var ran []string
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			mu.Lock()
			ran = append(ran, f.Job)
			mu.Unlock()
			return nil
		}
		b.backend.push("b", 3)
		b.backend.push("a", 3)
		b.start()
		waitFor(t, "every job acked", func() bool { return b.acked() == 6 })
		b.stop(t)
		mu.Lock()
		defer mu.Unlock()
		want := []string{"a-4", "a-5", "a-6", "b-1", "b-2", "b-3"}
		if !slices.Equal(ran, want) {
			t.Errorf("ran %v, want %v", ran, want)
		}
	})

	// ClaimsBounded: a pool claims at most Concurrency+Prefetch deliveries
	// over all its queues while they have work.
	t.Run("ClaimsBounded", func(t *testing.T) {
		t.Parallel()
		const concurrency, prefetch = 2, 1
		b := setup(t, testOpts{concurrency: concurrency, prefetch: prefetch, pool: []string{"a", "b"}})
		release := make(chan struct{})
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			b.block(release)
			return nil
		}
		b.backend.push("a", 2)
		b.backend.push("b", 10)
		b.start()
		limit := concurrency + prefetch
		waitFor(t, "the claim slots to fill", func() bool { return b.outstanding() >= limit && b.running.Load() == concurrency })
		time.Sleep(50 * time.Millisecond) // may only hide a bug
		if n := b.outstanding(); n != limit {
			t.Errorf("%d deliveries claimed, want %d", n, limit)
		}
		close(release)
		waitFor(t, "every job acked", func() bool { return b.acked() == 12 })
		b.stop(t)
		if m := b.maxRunning.Load(); m > concurrency {
			t.Errorf("%d handlers ran at once, want at most %d", m, concurrency)
		}
	})

	// PauseOneQueue: a paused queue of a pool is not asked (its sentinel is
	// cancelled on Wake) while the others are worked; released, it is
	// worked again.
	t.Run("PauseOneQueue", func(t *testing.T) {
		t.Parallel()
		// noLimit: a sentinel claims with no slot held, and its Receive
		// may start (late, on a busy machine) after the fetcher filled
		// every slot from the other queue.
		b := setup(t, testOpts{concurrency: 2, pool: []string{"a", "b"}, noLimit: true})
		b.start()
		blocked := func(q string) (n int) {
			b.backend.snapshot(func() { n = b.backend.blocked[q] })
			return n
		}
		waitFor(t, "a Receive waiting on each queue", func() bool { return blocked("a") > 0 && blocked("b") > 0 })
		// A waiting Receive is counted (a pause waits for it before the
		// backend's Release).
		if !b.queue.Receiving("a") || !b.queue.Receiving("b") || b.queue.Receiving("c") {
			t.Errorf("Receiving: a %v, b %v, c %v; want a and b", b.queue.Receiving("a"), b.queue.Receiving("b"), b.queue.Receiving("c"))
		}
		b.pauses[0].Hold()
		b.queue.Wake()
		waitFor(t, "the paused queue's Receive to end", func() bool { return blocked("a") == 0 })
		waitFor(t, "the paused queue's Receive uncounted", func() bool { return !b.queue.Receiving("a") })
		if !b.queue.Receiving("b") {
			t.Error("Receiving(b) false while b's Receive waits")
		}
		if !b.queue.Paused("a") || b.queue.Paused("b") {
			t.Errorf("Paused: a %v, b %v; want a alone", b.queue.Paused("a"), b.queue.Paused("b"))
		}
		b.backend.push("a", 2)
		b.backend.push("b", 2)
		waitFor(t, "b's jobs acked", func() bool { return b.acked() == 2 })
		time.Sleep(50 * time.Millisecond) // may only hide a bug
		b.backend.snapshot(func() {
			if n := len(b.backend.ready["a"]); n != 2 {
				t.Errorf("%d of the paused queue's 2 jobs left, want both", n)
			}
			if slices.Contains(b.backend.byQueueClaims, "a") {
				t.Errorf("the paused queue was claimed from: %v", b.backend.byQueueClaims)
			}
		})
		b.pauses[0].Release()
		b.queue.Wake()
		waitFor(t, "a's jobs acked after the release", func() bool { return b.acked() == 4 })
	})

	// StopHandsBackClaimed: a job a sentinel claimed while every slot was
	// taken waits, held (its lease kept), for a slot; a stop then hands it
	// back through PoolConfig.HandBack.
	t.Run("StopHandsBackClaimed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 1, pool: []string{"a", "b"}, noLimit: true})
		release := make(chan struct{})
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			b.block(release)
			return nil
		}
		b.start()
		blocked := func(q string) (n int) {
			b.backend.snapshot(func() { n = b.backend.blocked[q] })
			return n
		}
		waitFor(t, "a Receive waiting on each queue", func() bool { return blocked("a") > 0 && blocked("b") > 0 })
		b.backend.push("a", 1)
		waitFor(t, "a's job to run", func() bool { return b.running.Load() == 1 })
		b.backend.push("b", 1)
		waitFor(t, "b's job claimed and held", func() bool { return b.held() == 2 })
		// Held, so its lease is kept while it waits.
		waitExtends(t, b.backend, 1, "b-2")
		b.stopFetching(t)
		if n := b.handedBack.Load(); n != 1 {
			t.Errorf("%d deliveries handed back, want b's", n)
		}
		if h := b.held(); h != 1 {
			t.Errorf("%d deliveries held after the stop, want the running one", h)
		}
		close(release)
		b.stop(t)
		b.backend.snapshot(func() {
			if !slices.Equal(b.backend.acked, []string{"a-1"}) || !slices.Equal(b.backend.requeued, []string{"b-2"}) {
				t.Errorf("acked %v, requeued %v; want a-1 acked and b-2 handed back", b.backend.acked, b.backend.requeued)
			}
		})
		if n := b.started.Load(); n != 1 {
			t.Errorf("%d handlers started, want 1", n)
		}
	})

	t.Run("Order", func(t *testing.T) {
		t.Parallel()
		strict := &PoolConfig[string]{Names: []string{"a", "b", "c", "d"}}
		if o := strict.order(make([]int, 4)); !slices.Equal(o, []int{0, 1, 2, 3}) {
			t.Errorf("strict order %v, want 0 1 2 3", o)
		}
		weighted := &PoolConfig[string]{Names: []string{"a", "b", "c", "d"}, Weights: []int{6, 3, 1, 1000}}
		o := make([]int, 4)
		for range 1000 {
			got := slices.Clone(weighted.order(o))
			slices.Sort(got)
			if !slices.Equal(got, []int{0, 1, 2, 3}) {
				t.Fatalf("weighted order %v is not a permutation", o)
			}
		}
	})
}
