package asyncplatform

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// TestPoolSentinelsKeepLeases: a pool of three idle queues with one
// handler has a standing Receive on each; a job lands on each at once and
// each is claimed, but only one runs at a time, each for two leases. The
// jobs waiting their turn are held (their leases extended), so each runs
// once, at try 1, charged no crash: a claimed job never waits unheld for a
// handler (its lease would lapse and it would come back with a crash).
func TestPoolSentinelsKeepLeases(t *testing.T) {
	ctx := context.Background()
	lease := 600 * time.Millisecond
	p, err := New(memory.NewBroker().Connect(), Config{Logger: quietLog, Lease: lease,
		Queues: map[string]QueueConfig{"a": {}, "b": {}, "c": {}},
		Pools:  []Pool{{Queues: []string{"a", "b", "c"}, Concurrency: 1, Prefetch: Limit(0)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string][]int{}
	done := make(chan struct{}, 3)
	_ = p.Handle("t", func(ctx context.Context, j *Job) error {
		mu.Lock()
		runs[j.Queue] = append(runs[j.Queue], j.TryCount)
		mu.Unlock()
		time.Sleep(2 * lease)
		done <- struct{}{}
		return nil
	})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	time.Sleep(3*poolProbe + firstProbeWait) // every queue found empty: sentinels stand
	for _, q := range []string{"a", "b", "c"} {
		if err := p.Enqueue(ctx, &Job{Type: "t", Queue: q}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("not every job ran: %v", runs)
		}
	}
	time.Sleep(2 * lease) // a job that lost its lease would come again
	mu.Lock()
	defer mu.Unlock()
	for _, q := range []string{"a", "b", "c"} {
		if tries := runs[q]; len(tries) != 1 || tries[0] != 1 {
			t.Errorf("queue %s ran with tries %v, want once at try 1", q, tries)
		}
	}
}

// firstProbeWait is the pool's first probe of a queue (runner.firstProbe).
const firstProbeWait = 3 * 500 * time.Millisecond
