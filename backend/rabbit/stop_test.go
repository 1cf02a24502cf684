package rabbit

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform"
)

// TestStopThenCloseUncounted is the SIGTERM path of a worker: Stop with
// handlers still running (they are handed back), then Close. Messages the
// broker pushed into the consumer's buffer meanwhile (the hand-back frees
// the prefetch window) were never handed out, and must come back uncounted.
func TestStopThenCloseUncounted(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.DiscardHandler)
	b1 := newBackend(t, Config{Logger: quiet})
	q := queueName(t, b1)
	ctx := testCtx(t)
	cfg := asyncplatform.Config{Queues: map[string]asyncplatform.QueueConfig{q: {Concurrency: 4, Prefetch: asyncplatform.Limit(0)}}, Logger: quiet, Lease: time.Second}
	p1, err := asyncplatform.New(b1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan string, 8)
	p1.Handle("s", func(ctx context.Context, j *asyncplatform.Job) error {
		started <- j.ID
		<-ctx.Done()
		return ctx.Err()
	})
	var jobs []*asyncplatform.Job
	for i := range 8 {
		jobs = append(jobs, &asyncplatform.Job{ID: fmt.Sprint("j", i), Type: "s", Queue: q})
	}
	if err := p1.EnqueueBatch(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	if err := p1.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		<-started
	}
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	p1.Stop(sctx)
	cancel()
	b1.Close()

	b2 := newBackend(t, Config{Logger: quiet})
	seen := 0
	for seen < 8 {
		ds, err := b2.Receive(ctx, q, 8, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			seen++
			if d.Deliveries != 1 {
				t.Errorf("a message came back with Deliveries %d after Stop and Close, want 1: %.80q", d.Deliveries, d.Body)
			}
			b2.Ack(ctx, d)
		}
	}
}

// TestStopReleasesFirst: Stop with a handler running releases the
// backend's consumer before the platform hands back the jobs it claimed
// ahead, so their copies go to the queue after basic.cancel and never to
// the consumer being released. In the other order the copies (each
// hand-back's ack opened the window) were delivered to that consumer, which
// handed them back once more, and one arriving after cancel-ok came back
// counted (Stop/HandsBackUncounted on the cluster).
func TestStopReleasesFirst(t *testing.T) {
	t.Parallel()
	for round := range 3 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			t.Parallel()
			log := &handBackLog{}
			b := newBackend(t, Config{Logger: slog.New(log)})
			q := queueName(t, b)
			ctx := retireCtx(t)
			cfg := asyncplatform.Config{Queues: map[string]asyncplatform.QueueConfig{q: {Concurrency: 1, Prefetch: asyncplatform.Limit(2)}},
				Logger: slog.New(slog.DiscardHandler)}
			p, err := asyncplatform.New(b, cfg)
			if err != nil {
				t.Fatal(err)
			}
			started := make(chan struct{}, 3)
			p.Handle("s", func(ctx context.Context, j *asyncplatform.Job) error {
				started <- struct{}{}
				<-ctx.Done()
				return ctx.Err()
			})
			jobs := []*asyncplatform.Job{{Type: "s", Queue: q}, {Type: "s", Queue: q}, {Type: "s", Queue: q}}
			if err := p.EnqueueBatch(ctx, jobs); err != nil {
				t.Fatal(err)
			}
			if err := p.Start(ctx); err != nil {
				t.Fatal(err)
			}
			<-started
			time.Sleep(200 * time.Millisecond) // the platform claims the other two ahead
			sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			p.Stop(sctx)
			cancel()
			if n := log.total.Load(); n != 0 {
				t.Errorf("the release handed back %d messages: the platform's own hand-back copies reached the consumer being released", n)
			}
		})
	}
}

// handBackLog is a slog.Handler that sums the messages a release reports
// handed back.
type handBackLog struct{ total atomic.Int64 }

func (h *handBackLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *handBackLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *handBackLog) WithGroup(string) slog.Handler            { return h }
func (h *handBackLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "handed back buffered messages" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "messages" {
				h.total.Add(a.Value.Int64())
			}
			return true
		})
	}
	return nil
}
