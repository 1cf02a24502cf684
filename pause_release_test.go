package asyncplatform

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// bufferingBackend is a memory backend that buffers as a RabbitMQ consumer
// does: a Receive that hands out jobs leaves its queue's consumer live (it
// would go on prefetching), and Release ends it, unless a Receive of the
// queue still runs: then Release does nothing. A Receive whose context ends
// returns late (a broker's round trip) with what arrived meanwhile.
type bufferingBackend struct {
	*memory.Backend
	late      time.Duration
	cancelled chan string // a Receive saw its context end

	mu        sync.Mutex
	receivers map[string]int
	live      map[string]bool
}

func newBufferingBackend(late time.Duration) *bufferingBackend {
	return &bufferingBackend{
		Backend: memory.NewBroker().Connect(), late: late,
		cancelled: make(chan string, 16),
		receivers: map[string]int{}, live: map[string]bool{},
	}
}

var _ driver.Releaser = (*bufferingBackend)(nil)

func (b *bufferingBackend) Receive(ctx context.Context, queue string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	b.mu.Lock()
	b.receivers[queue]++
	b.live[queue] = true
	b.mu.Unlock()
	inner, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		select {
		case b.cancelled <- queue:
		default:
		}
		time.AfterFunc(b.late, cancel)
	})
	defer stop()
	ds, err := b.Backend.Receive(inner, queue, max, lease)
	b.mu.Lock()
	b.receivers[queue]--
	if len(ds) == 0 && b.receivers[queue] == 0 {
		b.live[queue] = false // a cancelled consumer hands back its buffer itself
	}
	b.mu.Unlock()
	if len(ds) == 0 && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return ds, err
}

func (b *bufferingBackend) Release(_ context.Context, queue string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.receivers[queue] == 0 {
		b.live[queue] = false
	}
	return nil
}

// consuming reports whether queue's consumer is live.
func (b *bufferingBackend) consuming(queue string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.live[queue]
}

// TestPauseReleasesAfterReceive: a pause while the queue's Receive is
// blocked calls the backend's Release only once that Receive has returned.
// Here a job arrives as the pause cancels the Receive, which returns it
// late; Release called meanwhile did nothing (as RabbitMQ's does while a
// Receive reads the queue), and the consumer stayed live, prefetching the
// paused queue's jobs.
func TestPauseReleasesAfterReceive(t *testing.T) {
	b := newBufferingBackend(300 * time.Millisecond)
	const q = "paused"
	p, err := New(b, Config{Logger: quietLog, Queues: map[string]QueueConfig{q: {Concurrency: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan string, 1)
	if err := p.Handle("t", func(_ context.Context, j *Job) error {
		select {
		case ran <- j.ID:
		default:
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Stop(sctx)
	})
	waitUntil(t, "the fetcher to wait in Receive", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.receivers[q] > 0
	})
	if err := p.Pause(ctx, q); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.cancelled:
	case <-ctx.Done():
		t.Fatal("the pause never cancelled the queue's Receive")
	}
	if err := p.Enqueue(ctx, &Job{ID: "late", Type: "t", Queue: q}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the late job handed back", func() bool {
		s, err := b.Stats(ctx, q)
		return err == nil && s.Ready == 1
	})
	waitUntil(t, "the fetcher out of Receive", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.receivers[q] == 0
	})
	waitUntil(t, "the paused queue's consumer released (a Release that came while its Receive ran does nothing)", func() bool {
		return !b.consuming(q)
	})
	select {
	case id := <-ran:
		t.Errorf("job %q ran while its queue was paused", id)
	default:
	}
}
