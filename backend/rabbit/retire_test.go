package rabbit

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// retireRounds is how many times the retire tests play their scenario,
// each on its own queue: before the barrier, 2 runs in 3 lost acks.
const retireRounds = 3

// retireCtx bounds one retire test: a drain waits up to 20 s for its
// first message on a loaded broker.
func retireCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// enqueueN stores n messages with IDs and bodies "0" to "n-1" in q.
func enqueueN(t *testing.T, ctx context.Context, b *Backend, q string, n int) {
	t.Helper()
	msgs := make([]driver.Message, n)
	for i := range msgs {
		msgs[i] = driver.Message{ID: fmt.Sprint(i), Body: []byte(fmt.Sprint(i))}
	}
	if err := b.Enqueue(ctx, q, msgs); err != nil {
		t.Fatal(err)
	}
}

// tally counts what a drain saw: bodies, how often, and how many came
// with a delivery counted.
type tally struct {
	seen    map[string]int
	counted int
}

func (ty *tally) add(ds []*driver.Delivery) {
	for _, d := range ds {
		ty.seen[string(d.Body)]++
		if d.Deliveries != 1 {
			ty.counted++
		}
	}
}

func (ty *tally) dups() int {
	n := 0
	for _, c := range ty.seen {
		n += c - 1
	}
	return n
}

// drain receives and acks everything left in q on a new Backend, until two
// seconds pass with nothing. The first wait is longer: a loaded broker may
// take seconds to show messages handed back by a closed channel.
func drain(t *testing.T, ctx context.Context, q string) *tally {
	t.Helper()
	b := newBackend(t, Config{})
	ty := &tally{seen: map[string]int{}}
	for {
		wait := 2 * time.Second
		if len(ty.seen) == 0 {
			wait = 20 * time.Second
		}
		rctx, cancel := context.WithTimeout(ctx, wait)
		got, _ := b.Receive(rctx, q, 100, time.Minute)
		cancel()
		if len(got) == 0 {
			return ty
		}
		ty.add(got)
		for _, d := range got {
			if err := b.Ack(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// holdOneOf enqueues n messages to a new queue of a Backend with prefetch
// n and returns the Backend, the queue and one delivery Receive handed
// out, held; the consumer buffers the other n-1.
func holdOneOf(t *testing.T, ctx context.Context, n int) (*Backend, string, *driver.Delivery) {
	t.Helper()
	b := newBackend(t, Config{Prefetch: n})
	q := queueName(t, newBackend(t, Config{})) // deleted after b closes
	enqueueN(t, ctx, b, q, n)
	got, err := b.Receive(ctx, q, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return b, q, got[0]
}

// TestReleaseHeldAcksApplied: a release while a handler holds a delivery
// with a lower tag than the buffered ones (Stop with a job running) acks
// the originals of its copies one frame each, and the handler's ack at
// once after closes the retired channel. RabbitMQ 3.10 drops the settles
// it held back at that close: 27 of 60 originals came back counted beside
// their copies, and the handler's acked message came again, in 2 runs of
// 3. Every settle must be applied before the channel closes.
func TestReleaseHeldAcksApplied(t *testing.T) {
	t.Parallel()
	const n = 61
	for round := range retireRounds {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			t.Parallel()
			ctx := retireCtx(t)
			b, q, held := holdOneOf(t, ctx, n)
			if err := b.Release(ctx, q); err != nil {
				t.Fatal(err)
			}
			if err := b.Ack(ctx, held); err != nil {
				t.Fatal(err)
			}
			ty := drain(t, ctx, q)
			if len(ty.seen) != n-1 || ty.seen[string(held.Body)] > 0 || ty.dups() > 0 || ty.counted > 0 {
				t.Errorf("after the release and the ack: %d messages (want the %d not acked), acked one seen %d times, %d duplicates, %d with a delivery counted",
					len(ty.seen), n-1, ty.seen[string(held.Body)], ty.dups(), ty.counted)
			}
		})
	}
}

// TestCloseHeldAcksApplied: Close while a handler holds a delivery releases
// the consumer (its buffer goes back as copies, the originals acked one
// frame each, since a lower tag is held) and then closes the connection.
// The acks must be applied before that: 27 originals came back counted
// beside their copies, twice. The held delivery comes back, counted.
func TestCloseHeldAcksApplied(t *testing.T) {
	t.Parallel()
	const n = 61
	for round := range retireRounds {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			t.Parallel()
			ctx := retireCtx(t)
			b, q, held := holdOneOf(t, ctx, n)
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			ty := drain(t, ctx, q)
			heldCounted := 0
			if ty.seen[string(held.Body)] > 0 {
				heldCounted = 1
			}
			if len(ty.seen) != n || ty.dups() > 0 || ty.counted != heldCounted {
				t.Errorf("after Close: %d of %d messages, %d duplicates, %d with a delivery counted (want only the held one)",
					len(ty.seen), n, ty.dups(), ty.counted)
			}
		})
	}
}

// TestRetiredManySettlesApplied: handlers that hold many deliveries when
// the consumer is released settle them: every other one first, together
// (one frame each, since the tags between them are held), then the rest.
// The last settle closes the retired channel, which must not drop the
// settles before it.
func TestRetiredManySettlesApplied(t *testing.T) {
	t.Parallel()
	for round := range retireRounds {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			t.Parallel()
			manySettles(t)
		})
	}
}

// manySettles plays one round of TestRetiredManySettlesApplied.
func manySettles(t *testing.T) {
	const n, hold = 100, 80
	ctx := retireCtx(t)
	b := newBackend(t, Config{Prefetch: n})
	q := queueName(t, newBackend(t, Config{}))
	enqueueN(t, ctx, b, q, n)
	var held []*driver.Delivery
	for len(held) < hold {
		got, err := b.Receive(ctx, q, hold-len(held), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, got...)
	}
	if err := b.Release(ctx, q); err != nil {
		t.Fatal(err)
	}
	for parity := range 2 {
		var wg sync.WaitGroup
		for i, d := range held {
			if i%2 == parity {
				wg.Go(func() {
					if err := b.Ack(ctx, d); err != nil {
						t.Error(err)
					}
				})
			}
		}
		wg.Wait()
	}
	ty := drain(t, ctx, q)
	again := 0
	for _, d := range held {
		again += ty.seen[string(d.Body)]
	}
	if len(ty.seen) != n-hold || again > 0 || ty.dups() > 0 || ty.counted > 0 {
		t.Errorf("after the release and %d acks: %d messages (want %d), %d acked ones again, %d duplicates, %d with a delivery counted",
			hold, len(ty.seen), n-hold, again, ty.dups(), ty.counted)
	}
}

// TestReceiveDuringReleaseUncounted: a Receive that comes while a release
// of the queue's consumer runs starts its consumer on a new channel, so
// what it buffers stays uncounted. On the releasing one, retired under it,
// the consumer's whole buffer came back counted once the Receive's
// deliveries were acked (398 of 398 messages, 200 counted, 3 runs in 3).
func TestReceiveDuringReleaseUncounted(t *testing.T) {
	t.Parallel()
	const n, prefetch = 398, 200
	ctx := retireCtx(t)
	b := newBackend(t, Config{Prefetch: prefetch})
	q := queueName(t, newBackend(t, Config{}))
	enqueueN(t, ctx, b, q, n)
	acked := &tally{seen: map[string]int{}}
	first, err := b.Receive(ctx, q, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	acked.add(first)
	if err := b.Ack(ctx, first[0]); err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() { released <- b.Release(ctx, q) }()
	time.Sleep(2 * time.Millisecond)
	got, err := b.Receive(ctx, q, prefetch, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	acked.add(got)
	for _, d := range got {
		if err := b.Ack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	ty := drain(t, ctx, q)
	for body, c := range acked.seen {
		ty.seen[body] += c
	}
	if len(ty.seen) != n || ty.dups() > 0 || ty.counted > 0 || acked.counted > 0 {
		t.Errorf("%d of %d messages, %d duplicates, %d with a delivery counted (%d of them handed out before Close)",
			len(ty.seen), n, ty.dups(), ty.counted+acked.counted, acked.counted)
	}
}

// TestMarkerNotHandedOut: a settle barrier's marker that reaches a waiting
// consumer (it expires at once only where none waits) is acked, never
// handed out as a job.
func TestMarkerNotHandedOut(t *testing.T) {
	t.Parallel()
	ctx := retireCtx(t)
	b := newBackend(t, Config{})
	q := queueName(t, b)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	type result struct {
		ds  []*driver.Delivery
		err error
	}
	got := make(chan result, 1)
	go func() {
		ds, err := b.Receive(ctx, q, 10, time.Minute)
		got <- result{ds, err}
	}()
	waitUntil(t, b, "the consumer", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.cons[q] != nil
	})
	time.Sleep(100 * time.Millisecond) // its basic.consume answered
	conn, err := b.connection(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for range 3 {
		if err := b.publishMarker(ctx, &qchan{ch: ch, queue: q}); err != nil {
			t.Fatal(err)
		}
	}
	enqueueN(t, ctx, b, q, 1)
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	for _, d := range r.ds {
		if string(d.Body) != "0" {
			t.Errorf("Receive handed out %q (a marker?), want only the job %q", d.Body, "0")
		}
		if err := b.Ack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := b.Stats(ctx, q); err != nil || n.Ready != 0 {
		t.Errorf("after the Receive: %+v, %v; want nothing ready", n, err)
	}
}
