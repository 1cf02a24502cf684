package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// The benchmarks measure draining a queue of b.N jobs already enqueued
// (enqueueing is outside the timer), on the machine's PostgreSQL:
//
//	go test -run '^$' -bench Facade -benchtime 5000x -count 6 ./backend/postgres/
//
// BenchmarkFacade goes end to end through asyncplatform (claim with lease
// and delivery count, decode, no-op handler, ack: three committed
// transactions per job). Compare medians over several counts, with the
// load average beside them.

var benchConcurrency = []int{10, 50}

const benchPayload = 64

func BenchmarkFacade(b *testing.B) {
	reachable(b)
	prefix := testPrefix(b, "bench")
	for _, c := range benchConcurrency {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			ctx := context.Background()
			be, err := New(ctx, Config{URL: testURL(), Prefix: prefix, MaxConns: int32(c + 10)})
			if err != nil {
				b.Fatal(err)
			}
			q := fmt.Sprintf("bench-%d-%d", c, b.N)
			b.Cleanup(func() {
				_ = be.DeleteQueue(ctx, q)
				be.Close()
			})
			p, err := ap.New(be, ap.Config{Queues: map[string]ap.QueueConfig{q: {Concurrency: c}}, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			var done atomic.Int64
			all := make(chan struct{})
			n := int64(b.N)
			if err := p.Handle("bench", func(ctx context.Context, job *ap.Job) error {
				if done.Add(1) == n {
					close(all)
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			payload := make([]byte, benchPayload)
			for i := 0; i < b.N; i += 1000 {
				batch := make([]*ap.Job, 0, 1000)
				for j := i; j < min(i+1000, b.N); j++ {
					batch = append(batch, &ap.Job{Type: "bench", Queue: q, Payload: payload})
				}
				if err := p.EnqueueBatch(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			start := time.Now()
			if err := p.Start(ctx); err != nil {
				b.Fatal(err)
			}
			select {
			case <-all:
			case <-time.After(5 * time.Minute):
				b.Fatalf("handled %d of %d jobs", done.Load(), n)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
			b.ReportMetric(0, "ns/op")
			if err := p.Stop(ctx); err != nil {
				b.Fatal(err)
			}
		})
	}
}
