package rabbit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestReleaseAcksApplied: a released consumer hands back what it buffered
// as copies and acks the originals; every original must stay acked when
// the channel closes right after. RabbitMQ 3.10 holds a channel's settles
// to a quorum queue back once about 32 commands are unapplied and drops
// them when the channel closes: acked one by one, 27 of 60 originals came
// back with a delivery counted, beside their copies (on one node and on
// the cluster; 33 were applied, as in TestDeleteDeadAcksApplied).
func TestReleaseAcksApplied(t *testing.T) {
	t.Parallel()
	const n = 60
	b := newBackend(t, Config{Prefetch: n})
	ctx := testCtx(t)
	q := queueName(t, b)
	var msgs []driver.Message
	for i := range n {
		msgs = append(msgs, driver.Message{ID: fmt.Sprint(i), Body: []byte(fmt.Sprint(i))})
	}
	if err := b.Enqueue(ctx, q, msgs); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	// Starts a consumer and releases it at once: it collects the window,
	// hands it back, and closes its channel.
	if _, err := b.Receive(cctx, q, n, time.Minute); err == nil {
		t.Fatal("Receive on a cancelled context succeeded")
	}

	b2 := newBackend(t, Config{})
	seen := map[string]int{}
	counted := 0
	for {
		// The first wait is long: a loaded broker may take seconds to show
		// the handed-back messages; after them, a second of quiet ends it.
		wait := time.Second
		if len(seen) == 0 {
			wait = 30 * time.Second
		}
		rctx, cancel := context.WithTimeout(ctx, wait)
		got, _ := b2.Receive(rctx, q, n, time.Minute)
		cancel()
		if len(got) == 0 {
			break
		}
		for _, d := range got {
			seen[string(d.Body)]++
			if d.Deliveries != 1 {
				counted++
			}
			if err := b2.Ack(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
	}
	dups := 0
	for _, c := range seen {
		dups += c - 1
	}
	if len(seen) != n || dups > 0 || counted > 0 {
		t.Errorf("after the release: %d of the %d messages left, %d duplicates, %d with a delivery counted; want each once, uncounted", len(seen), n, dups, counted)
	}
}

// TestReceiveDuringRelease: a Receive that starts while its queue's
// consumer is being released starts its consumer on a channel of its own,
// and both end when their contexts do. On the releasing channel, its
// basic.consume raced the release's basic.cancel and channel.close (see
// detachLocked): in TestReleaseUnderReceives, and in a worker pool over the
// queues of a priority queue (Flow/PriorityWithinQueue), every Receive of
// the backend then hung.
func TestReceiveDuringRelease(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	ctx := testCtx(t)
	q := queueName(t, b)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	consumer := func() *consumer {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.cons[q]
	}
	// Each round: a Receive waits on the empty queue and is cancelled, so
	// its consumer is released (which takes two quiet rounds at least);
	// another Receive starts as soon as the release has begun.
	inWindow := 0
	for round := 0; round < 30 && inWindow < 3; round++ {
		actx, cancelA := context.WithCancel(ctx)
		aDone := make(chan struct{})
		go func() {
			defer close(aDone)
			b.Receive(actx, q, 1, time.Minute)
		}()
		waitUntil(t, b, "the first Receive's consumer", func() bool { return consumer() != nil })
		released := consumer()
		cancelA()
		waitUntil(t, b, "its release to begin", func() bool { return consumer() != released })
		bctx, cancelB := context.WithCancel(ctx)
		bDone := make(chan struct{})
		go func() {
			defer close(bDone)
			b.Receive(bctx, q, 1, time.Minute)
		}()
		select {
		case <-aDone: // the release ended before the second Receive began
		default:
			inWindow++
		}
		waitUntil(t, b, "the second Receive's consumer", func() bool {
			c := consumer()
			return c != nil && c != released
		})
		if c := consumer(); c.qchan == released.qchan {
			t.Errorf("round %d: the Receive that started during a release consumes on the releasing channel (generation %d)", round, c.gen)
		}
		cancelB()
		for _, r := range []struct {
			name string
			done chan struct{}
		}{{"released", aDone}, {"second", bDone}} {
			select {
			case <-r.done:
			case <-time.After(20 * time.Second):
				b.Close() // ends the hung calls, so that the cleanup can run
				t.Fatalf("round %d: the %s Receive had not returned 20s after its context ended", round, r.name)
			}
		}
	}
	if inWindow == 0 {
		t.Fatal("no second Receive began while a release ran: the case was not tested")
	}
}

// TestReleaseUnderReceives drives Receives cancelled by their contexts
// (short deadlines) and releases by the idle timer (a short lease), as a
// worker pool over several queues does, and checks that each message is
// received once, that every ack of a received message succeeds, and that
// no Receive outlives its context by more than a bound against a hang. A
// message may come back counted (the limit the package doc names: a
// delivery sent after basic.cancel-ok), never twice.
func TestReleaseUnderReceives(t *testing.T) {
	t.Parallel()
	const queues, each, readers = 4, 40, 2
	const lease = 30 * time.Millisecond
	b := newBackend(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	qs := make([]string, queues)
	for i := range qs {
		qs[i] = queueName(t, b)
		var msgs []driver.Message
		for j := range each {
			id := fmt.Sprintf("%d-%d", i, j)
			msgs = append(msgs, driver.Message{ID: id, Body: []byte(id)})
		}
		if err := b.Enqueue(ctx, qs[i], msgs); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	seen := map[string]int{}
	counted := 0
	var hung atomic.Bool
	var wg sync.WaitGroup
	for _, q := range qs {
		for range readers {
			wg.Go(func() {
				for ctx.Err() == nil && !hung.Load() {
					mu.Lock()
					all := len(seen) == queues*each
					mu.Unlock()
					if all {
						return
					}
					rctx, cancel := context.WithTimeout(ctx, rand.N(40*time.Millisecond))
					var ds []*driver.Delivery
					done := make(chan struct{})
					go func() {
						defer close(done)
						ds, _ = b.Receive(rctx, q, 1, lease)
					}()
					select {
					case <-done:
					case <-time.After(20 * time.Second):
						hung.Store(true)
						t.Errorf("a Receive on %s had not returned 20s after its context ended", q)
					}
					cancel()
					if hung.Load() {
						return
					}
					for _, d := range ds {
						mu.Lock()
						seen[string(d.Body)]++
						if d.Deliveries != 1 {
							counted++
						}
						mu.Unlock()
						if err := b.Ack(ctx, d); err != nil {
							t.Errorf("ack of %s: %v", d.Body, err)
						}
					}
					time.Sleep(rand.N(2 * lease)) // about half the time, past the idle release
				}
			})
		}
	}
	wg.Wait()
	if hung.Load() {
		b.Close() // ends the hung calls, so that the cleanup can run
		return
	}
	dups := 0
	for _, n := range seen {
		dups += n - 1
	}
	t.Logf("%d messages received, %d of them counted", len(seen), counted)
	if len(seen) != queues*each || dups > 0 {
		t.Errorf("%d of the %d messages received, %d duplicates; want each once", len(seen), queues*each, dups)
	}
}

// waitUntil polls cond until it holds. After a bound against a hang it
// closes b, which ends b's hung calls so that the test's cleanup can run,
// and fails the test.
func waitUntil(t *testing.T, b *Backend, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.Close()
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
