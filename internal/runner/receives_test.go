package runner

import (
	"context"

	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestConcurrentReceives covers a queue whose backend declares
// Capabilities.ConcurrentReceives: several fetch loops, each claiming the
// slots freed while another's Receive waits.
func TestConcurrentReceives(t *testing.T) {
	t.Parallel()

	// Overlap: with one delivery running and one Receive waiting on the
	// empty queue, the slot the running one frees is claimed by a second
	// Receive while the first still waits. With the capability off the
	// freed slot waits for the one Receive to return.
	t.Run("Overlap", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name     string
			receives int
			want     int
		}{
			{"On", 2, 2},
			{"Off", 0, 1},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, testOpts{concurrency: 1, prefetch: 1, receives: tc.receives})
				release := make(chan struct{})
				b.handler = func(ctx context.Context, f *Delivery[string]) error {
					b.block(release)
					return nil
				}
				b.backend.push(testQueue, 1)
				b.start()
				waitFor(t, "the job running and a Receive waiting", func() bool {
					n := 0
					b.backend.snapshot(func() { n = b.backend.blocked[testQueue] })
					return b.running.Load() == 1 && n == 1
				})
				close(release)
				waitFor(t, "the job acked", func() bool { return b.acked() == 1 })
				if tc.want == 2 {
					waitFor(t, "two Receives waiting at once", func() bool {
						n := 0
						b.backend.snapshot(func() { n = b.backend.blocked[testQueue] })
						return n == 2
					})
					if !b.queue.Receiving(testQueue) {
						t.Error("Receiving is false while two Receives run")
					}
				} else {
					time.Sleep(50 * time.Millisecond) // may only hide a bug
				}
				b.backend.snapshot(func() {
					if b.backend.maxInReceive != tc.want {
						t.Errorf("at most %d Receives in flight at once, want %d", b.backend.maxInReceive, tc.want)
					}
				})
				b.backend.push(testQueue, 2)
				waitFor(t, "the later jobs acked", func() bool { return b.acked() == 3 })
			})
		}
	})

	// ReceivingWhileEither: once one of two waiting Receives returns, the
	// other still counts: Receiving stays true while either runs, so that
	// a pause waits for both (pause.Engine.release).
	t.Run("ReceivingWhileEither", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 1, prefetch: 1, receives: 2})
		first, second := make(chan struct{}), make(chan struct{})
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			if f.Job == "q-1" {
				b.block(first)
			} else {
				b.block(second)
			}
			return nil
		}
		blocked := func() (n int) {
			b.backend.snapshot(func() { n = b.backend.blocked[testQueue] })
			return n
		}
		// As in Overlap: q-1 runs while a Receive waits; its freed slot
		// goes to a second Receive.
		b.backend.push(testQueue, 1)
		b.start()
		waitFor(t, "q-1 running and a Receive waiting", func() bool { return b.running.Load() == 1 && blocked() == 1 })
		close(first)
		waitFor(t, "two Receives waiting", func() bool { return blocked() == 2 })
		b.backend.push(testQueue, 1)
		// One Receive takes q-2 and returns; its handler holds that slot,
		// and the other Receive holds the last: its loop waits for a slot.
		waitFor(t, "q-2 running and one Receive still waiting", func() bool {
			n := 0
			b.backend.snapshot(func() { n = b.backend.inReceive })
			return b.running.Load() == 1 && n == 1 && blocked() == 1
		})
		if !b.queue.Receiving(testQueue) {
			t.Error("Receiving is false while a Receive waits")
		}
		if _, r := b.queue.Quiet(); !r {
			t.Error("Quiet reports no Receive while one waits")
		}
		close(second)
		waitFor(t, "both jobs acked", func() bool { return b.acked() == 2 })
	})

	// ClaimsBounded: many short jobs through several fetch loops; the fake
	// fails the test on any Receive that asks for more than the slots left
	// by the deliveries held and the Receives in flight, and the queue
	// never holds more than Concurrency+Prefetch.
	t.Run("ClaimsBounded", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name                            string
			concurrency, prefetch, receives int
		}{
			{"Two", 3, 2, 2},
			{"Four", 2, 3, 4},
			{"MoreThanSlots", 1, 1, 8},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, testOpts{concurrency: tc.concurrency, prefetch: tc.prefetch, receives: tc.receives})
				limit := tc.concurrency + tc.prefetch
				b.handler = func(ctx context.Context, f *Delivery[string]) error {
					time.Sleep(100 * time.Microsecond)
					return nil
				}
				const jobs = 400
				b.start()
				for range jobs / 20 {
					b.backend.push(testQueue, 20)
					time.Sleep(time.Millisecond)
				}
				waitFor(t, "every job acked", func() bool { return b.acked() == jobs })
				b.stop(t)
				b.backend.snapshot(func() {
					if b.backend.maxOutstanding > limit {
						t.Errorf("at most %d deliveries held at once, want at most %d", b.backend.maxOutstanding, limit)
					}
					if b.backend.maxInReceive > min(tc.receives, limit) {
						t.Errorf("%d Receives in flight at once, want at most %d", b.backend.maxInReceive, min(tc.receives, limit))
					}
				})
				if n := len(b.queue.slots); n != limit {
					t.Errorf("%d claim slots free after the stop, want all %d", n, limit)
				}
			})
		}
	})

	// ClosedEndsEvery: a loop whose Receive finds the backend closed ends
	// the other, which waits in Receive, and the work channel is closed
	// once: Fetch returns and the workers end.
	t.Run("ClosedEndsEvery", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 1, prefetch: 1, receives: 2})
		release := make(chan struct{})
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			b.block(release)
			return nil
		}
		blocked := func() (n int) {
			b.backend.snapshot(func() { n = b.backend.blocked[testQueue] })
			return n
		}
		// As in Overlap: two Receives wait on the empty queue.
		b.backend.push(testQueue, 1)
		b.start()
		waitFor(t, "the job running and a Receive waiting", func() bool { return b.running.Load() == 1 && blocked() == 1 })
		close(release)
		waitFor(t, "two Receives waiting", func() bool { return blocked() == 2 })
		b.backend.wakeWith(driver.ErrClosed)
		closed(t, "Fetch to return on ErrClosed", b.fetchDone)
		done := make(chan struct{})
		go func() {
			b.workers.Wait()
			close(done)
		}()
		closed(t, "the workers to return", done)
	})

	// StopHandsBack: the stop with several loops: Fetch returns once every
	// loop has, the deliveries they claimed ahead are handed back and the
	// work channel is closed once.
	t.Run("StopHandsBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 1, prefetch: 3, receives: 2})
		release := make(chan struct{})
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			b.block(release)
			return nil
		}
		b.backend.push(testQueue, 6)
		b.start()
		waitFor(t, "one running and three claimed ahead", func() bool { return b.running.Load() == 1 && b.held() == 4 })
		b.stopFetching(t)
		if n := b.handedBack.Load(); n != 3 {
			t.Errorf("%d deliveries handed back, want the 3 claimed ahead", n)
		}
		close(release)
		waitFor(t, "the running job acked", func() bool { return b.acked() == 1 })
		b.stop(t)
		b.backend.snapshot(func() {
			if b.backend.outstanding != 0 || len(b.backend.ready[testQueue]) != 5 {
				t.Errorf("%d outstanding, %d ready after the stop; want 0 and 5", b.backend.outstanding, len(b.backend.ready[testQueue]))
			}
		})
	})

	// RetryOneLoop: while Receives fail, one loop retries, with the
	// backoff doubling from 50 ms; the other waits for its success, so
	// the calls after the first two (the loops' first, possibly at once)
	// keep the doubling gaps. The gaps are lower bounds, which load cannot
	// break.
	t.Run("RetryOneLoop", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 2, prefetch: 2, receives: 2})
		const failures = 5
		b.backend.receiveErr = func(call int) error {
			if call <= failures {
				return errReceive
			}
			return nil
		}
		b.backend.push(testQueue, 1)
		b.start()
		waitFor(t, "the job acked after the failures", func() bool { return b.acked() == 1 })
		b.stop(t)
		b.backend.snapshot(func() {
			times := b.backend.receiveTimes
			if len(times) < failures+1 {
				t.Fatalf("%d Receive calls, want at least %d", len(times), failures+1)
			}
			want := 50 * time.Millisecond
			for i := 2; i <= failures; i++ {
				if gap := times[i].Sub(times[i-1]); gap < want {
					t.Errorf("Receive %d came %v after Receive %d, want at least %v", i+1, gap, i, want)
				}
				want *= 2
			}
		})
	})
}
