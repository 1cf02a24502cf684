package status

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/decide"
)

// jittery is a batcher whose batch calls take a random 0-3ms, so batches
// of several writers overlap and finish out of order.
type jittery struct{ *batcher }

func jitter() { time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond) }

func (j *jittery) GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error) {
	jitter()
	return j.batcher.GetEach(ctx, keys)
}
func (j *jittery) CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	jitter()
	return j.batcher.CreateEach(ctx, items)
}
func (j *jittery) UpdateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	jitter()
	return j.batcher.UpdateEach(ctx, items)
}

// Many jobs each ended several times (in try order per job, a
// late earlier try mixed in), by several goroutines at once, over a store
// whose batch calls take random times: every job ends at its last try,
// and a Flush after a Settled returns only once that end is written.
func TestEndsManyWritersReview8(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &batcher{Store: newStore(t)}
	s := &jittery{b}
	tk := newTracker(s, "w1")
	other := newTracker(s, "w2")
	const n, tries, procs = 3 * driver.MaxBatch, 4, 6
	jobs := make([]Job, n)
	for i := range jobs {
		jobs[i] = Job{ID: fmt.Sprintf("j%d", i), Queue: "q", Type: "t", Nonce: "n", Copy: 1}
	}
	tk.Enqueued(ctx, jobs)
	var wg sync.WaitGroup
	errs := make(chan string, 100)
	stopGets := make(chan struct{})
	var getters sync.WaitGroup
	for range 2 {
		getters.Go(func() { // Get and Cancel-free reads of this process's view meanwhile
			for {
				select {
				case <-stopGets:
					return
				default:
				}
				r, err := tk.Get(ctx, jobs[rand.IntN(n)].ID)
				if err == nil {
					for _, c := range r.History.Changes {
						_ = c.State
					}
				}
			}
		})
	}
	for p := range procs {
		wg.Go(func() {
			for i := p; i < n; i += procs {
				for try := range tries {
					j := jobs[i]
					j.TryCount = try
					tr := deliver(t, tk, j)
					var late *Track
					if try == tries-1 {
						e := jobs[i]
						e.TryCount = try - 2
						late = deliver(t, tk, e) // an earlier try's delivery, settled late
					}
					tr.Ended(ctx, false)
					tr.Settled(ctx, decide.Decision{Outcome: decide.Succeeded}, try+1, []byte("ok"), "")
					if late != nil {
						late.Ended(ctx, false)
						late.Settled(ctx, decide.Decision{Outcome: decide.Retried, RetryAt: clock.Add(time.Minute), Failures: 1}, try-1, nil, "late")
					}
					if i%7 == 0 && try == 1 {
						fctx, cancel := context.WithTimeout(ctx, time.Minute)
						err := tk.Flush(fctx)
						cancel()
						if err != nil {
							errs <- fmt.Sprintf("Flush: %v", err)
							return
						}
						if r, err := other.Get(ctx, j.ID); err != nil || r.Tries < 2 {
							select {
							case errs <- fmt.Sprintf("after Flush, %s: %+v %v; want at least try 2 written", j.ID, r, err):
							default:
							}
						}
					}
				}
			}
		})
	}
	wg.Wait()
	close(stopGets)
	getters.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	flush(t, tk)
	for _, j := range jobs {
		r := get(t, other, j.ID)
		if r.State != Succeeded || r.Tries != tries {
			t.Errorf("%s after Flush: state %s tries %d; want succeeded after %d tries", j.ID, r.State, r.Tries, tries)
		}
	}
	tk.ends.mu.Lock()
	defer tk.ends.mu.Unlock()
	if tk.ends.writers != 0 || len(tk.ends.waiting) != 0 || len(tk.ends.inflight) != 0 || len(tk.ends.byKey) != 0 || tk.ends.idle != nil {
		t.Errorf("after Flush: writers %d, waiting %d, inflight %d, byKey %d, idle %v", tk.ends.writers, len(tk.ends.waiting), len(tk.ends.inflight), len(tk.ends.byKey), tk.ends.idle)
	}
}

// With every writer's batch held in its write and the waiting
// ends at MaxPendingEnds, all of them on keys the held batches hold (the
// jobs' later tries), further Settled calls wait for room; once the writes
// go on, every end is written, the latest try last, and nothing hangs.
func TestEndsRoomWhileKeysInFlightReview8(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := &heldBatches{batcher: &batcher{Store: newStore(t)}, gate: make(chan struct{}), held: map[string]bool{}}
	tk := newTracker(h, "w1")
	n := MaxPendingEnds + driver.MaxBatch
	jobs := make([]Job, n)
	for i := range jobs {
		jobs[i] = Job{ID: fmt.Sprintf("j%d", i), Queue: "q", Type: "t", Nonce: "n"}
	}
	tk.Enqueued(ctx, jobs)
	h.mu.Lock()
	h.shut = true
	h.mu.Unlock()
	end := func(j Job, try int) {
		j.TryCount = try
		tr := deliver(t, tk, j)
		tr.Ended(ctx, false)
		tr.Settled(ctx, decide.Decision{Outcome: decide.Succeeded}, try+1, []byte("ok"), "")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, j := range jobs {
			end(j, 0)
		}
		for _, j := range jobs {
			end(j, 1)
		}
	}()
	waitFor(t, "writers held", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.calls >= 2
	})
	time.Sleep(200 * time.Millisecond)
	close(h.gate)
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Settled calls still waiting for room a minute after the writes went on")
	}
	flush(t, tk)
	other := newTracker(h, "w2")
	for _, j := range jobs {
		if r := get(t, other, j.ID); r.State != Succeeded || r.Tries != 2 {
			t.Fatalf("%s after Flush: %s after %d tries; want succeeded after 2", j.ID, r.State, r.Tries)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.overlap) > 0 {
		t.Errorf("batches in flight at once shared keys %q", h.overlap[:min(5, len(h.overlap))])
	}
}
