package redis

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// killLoad is the workload of the node-kill tests (Cluster and Sentinel):
// one Backend both enqueues 2,000 jobs one by one, about 50 a second (a
// failed Enqueue is retried with the same job ID until it succeeds: a
// failure may have stored it, so a duplicate then, never a loss), and works
// them at concurrency 10, while the test kills and restarts nodes. It
// counts every job handled, by ID.
type killLoad struct {
	t    *testing.T
	b    *timedBackend
	q    string
	p    *ap.Platform
	done chan struct{} // closed when the producer is over
	quit chan struct{} // closed at the end of the test: the producer stops

	mu   sync.Mutex
	seen map[string]int // job ID -> times handled

	amu      sync.Mutex
	acked    map[string]bool // job IDs whose Enqueue succeeded
	failures int             // Enqueue calls that failed (and were retried)
}

// startKillLoad starts the workload on b, on queue q, with the platform's
// HealthInterval set to health (0: the platform's default).
func startKillLoad(t *testing.T, b *timedBackend, q string, health time.Duration) *killLoad {
	ctx := context.Background()
	l := &killLoad{t: t, b: b, q: q, done: make(chan struct{}), quit: make(chan struct{}), seen: map[string]int{}, acked: map[string]bool{}}
	p, err := ap.New(b, ap.Config{
		Queues:         map[string]ap.QueueConfig{q: {Concurrency: 10}},
		Lease:          2 * time.Second,
		HealthInterval: health,
		Logger:         slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	l.p = p
	if err := p.Handle("k", func(ctx context.Context, j *ap.Job) error {
		time.Sleep(5 * time.Millisecond)
		l.mu.Lock()
		l.seen[j.ID]++
		l.mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(l.quit)
		<-l.done
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_ = p.Stop(cctx) // a no-op after finish's Stop
	})
	const n = 2000
	go func() {
		defer close(l.done)
		pause := func(d time.Duration) bool {
			select {
			case <-l.quit:
				return false
			case <-time.After(d):
				return true
			}
		}
		for i := range n {
			id := fmt.Sprintf("job-%04d", i)
			for {
				ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err := p.Enqueue(ectx, &ap.Job{ID: id, Type: "k", Queue: q})
				cancel()
				if err == nil {
					break
				}
				l.amu.Lock()
				l.failures++
				l.amu.Unlock()
				if !pause(100 * time.Millisecond) {
					return
				}
			}
			l.amu.Lock()
			l.acked[id] = true
			l.amu.Unlock()
			if !pause(20 * time.Millisecond) {
				return
			}
		}
	}()
	return l
}

// handled is how many jobs were handled at least once.
func (l *killLoad) handled() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}

// waitUntil polls cond every 20ms and fails the test after d.
func (l *killLoad) waitUntil(what string, d time.Duration, cond func() bool) {
	l.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			l.t.Fatalf("timed out after %v waiting for %s (handled %d)", d, what, l.handled())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// follow measures a kill at t0, made when at jobs were handled: it waits for
// an enqueue and a claim after t0 and for 200 more jobs handled, then until
// 15 s after the kill, logs the times to the first enqueue and claim after
// the kill and the longest stall of each within those 15 s, and returns the
// first two.
func (l *killLoad) follow(what string, port, at int, t0 time.Time) (enq, claim time.Duration) {
	l.t.Helper()
	b := l.b
	l.waitUntil("an enqueue and a claim after the kill of "+what, 60*time.Second, func() bool {
		return firstAfter(&b.mu, &b.enqueued, t0) >= 0 && firstAfter(&b.mu, &b.received, t0) >= 0
	})
	enq, claim = firstAfter(&b.mu, &b.enqueued, t0), firstAfter(&b.mu, &b.received, t0)
	l.waitUntil("200 more jobs handled", 60*time.Second, func() bool { return l.handled() >= at+200 })
	t1 := t0.Add(15 * time.Second)
	time.Sleep(time.Until(t1))
	l.t.Logf("kill of %s (port %d) with %d jobs handled: first enqueue after %v, first claim after %v; "+
		"longest stall within 15s: enqueues %v, claims %v",
		what, port, at, enq.Round(time.Millisecond), claim.Round(time.Millisecond),
		longestGap(&b.mu, &b.enqueued, t0, t1).Round(time.Millisecond), longestGap(&b.mu, &b.received, t0, t1).Round(time.Millisecond))
	// A health check (the Backend's Ping) that fails closes the platform's
	// gate: no job is claimed until a later check passes.
	if f := firstAfter(&b.mu, &b.pingFail, t0); f >= 0 {
		l.t.Logf("  a health check failed %v after the kill; the next one passed %v after it", f.Round(time.Millisecond),
			firstAfter(&b.mu, &b.pingOK, t0.Add(f)).Round(time.Millisecond))
	}
	return enq, claim
}

// finish waits for the producer and for every acknowledged job to be
// handled, stops the platform, deletes the queue and returns the jobs
// acknowledged, lost and duplicated, the Enqueue calls that failed, and the
// queue's stats before the delete (all zero when nothing was left behind).
func (l *killLoad) finish() (acked, lost, dup, failures int, st driver.Stats) {
	l.t.Helper()
	ctx := context.Background()
	<-l.done
	l.waitUntil("every acknowledged job handled", 120*time.Second, func() bool {
		l.amu.Lock()
		defer l.amu.Unlock()
		l.mu.Lock()
		defer l.mu.Unlock()
		for id := range l.acked {
			if l.seen[id] == 0 {
				return false
			}
		}
		return true
	})
	stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := l.p.Stop(stopCtx); err != nil {
		l.t.Error(err)
	}
	st, err := l.b.Stats(ctx, l.q)
	if err != nil {
		l.t.Fatal(err)
	}
	_ = l.b.DeleteQueue(ctx, l.q)
	l.amu.Lock()
	defer l.amu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.acked {
		switch l.seen[id] {
		case 0:
			lost++
		case 1:
		default:
			dup += l.seen[id] - 1
		}
	}
	return len(l.acked), lost, dup, l.failures, st
}
