package nats

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestConcurrentReceivesOneQueue: the Receives that Capabilities'
// ConcurrentReceives lets the platform keep in flight on one queue of one
// Backend hand each message to one of them only, uncounted, also when some
// of them are cancelled (their late messages handed back).
func TestConcurrentReceivesOneQueue(t *testing.T) {
	t.Parallel()
	url := realURL(t)
	q := queueName(t)
	b := newBackend(t, url, q)
	if n := b.Capabilities().ConcurrentReceives; n < 2 {
		t.Skipf("ConcurrentReceives %d: Receive is not called concurrently", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 300
	msgs := make([]driver.Message, n)
	for i := range msgs {
		msgs[i] = driver.Message{ID: fmt.Sprint(q, "-", i), Body: fmt.Append(nil, i)}
	}
	// Enqueued a few at a time, so that the Receives often wait on an
	// empty queue and are cancelled while they wait.
	var producer sync.WaitGroup
	producer.Go(func() {
		for i := 0; i < n; i += 3 {
			if err := b.Enqueue(ctx, q, msgs[i:min(i+3, n)]); err != nil {
				t.Errorf("Enqueue: %v", err)
				return
			}
			time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
		}
	})
	defer producer.Wait()
	var mu sync.Mutex
	seen := map[string]int{}
	counted := 0 // deliveries with Deliveries > 1
	total := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	var wg sync.WaitGroup
	for range b.Capabilities().ConcurrentReceives {
		wg.Go(func() {
			for ctx.Err() == nil && total() < n {
				rctx, rcancel := context.WithTimeout(ctx, time.Duration(5+rand.IntN(60))*time.Millisecond)
				ds, err := b.Receive(rctx, q, 1+rand.IntN(4), 10*time.Second)
				rcancel()
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Receive: %v", err)
					return
				}
				for _, d := range ds {
					mu.Lock()
					seen[string(d.Body)]++
					if d.Deliveries > 1 {
						counted++
					}
					mu.Unlock()
					if err := b.Ack(ctx, d); err != nil {
						t.Errorf("Ack: %v", err)
					}
				}
			}
		})
	}
	wg.Wait()
	if got := total(); got != n {
		t.Fatalf("%d of %d messages delivered", got, n)
	}
	mu.Lock()
	defer mu.Unlock()
	for body, c := range seen {
		if c != 1 {
			t.Errorf("message %s delivered %d times", body, c)
		}
	}
	if counted != 0 {
		t.Errorf("%d deliveries counted a crash (Deliveries > 1)", counted)
	}
}
