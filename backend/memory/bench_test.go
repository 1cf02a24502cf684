package memory_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// BenchmarkEndToEnd measures jobs through the facade on the memory backend:
// enqueue (in batches of 100), claim, a no-op handler, ack. It reports jobs/s
// and, through -benchmem, allocations per job (one op is one job).
func BenchmarkEndToEnd(b *testing.B) {
	for _, conc := range []int{10, 50} {
		b.Run(fmt.Sprintf("concurrency=%d", conc), func(b *testing.B) { endToEnd(b, conc, nil) })
	}
}

// BenchmarkEndToEndHeaders is BenchmarkEndToEnd with two headers on every
// job (a trace context's size): what the handler's own copy of them costs.
func BenchmarkEndToEndHeaders(b *testing.B) {
	headers := map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tenant":      "acme",
	}
	for _, conc := range []int{10, 50} {
		b.Run(fmt.Sprintf("concurrency=%d", conc), func(b *testing.B) { endToEnd(b, conc, headers) })
	}
}

func endToEnd(b *testing.B, conc int, headers map[string]string) {
	be, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	var done atomic.Int64
	finished := make(chan struct{})
	target := int64(b.N)
	p, err := ap.New(be, ap.Config{
		Queues: map[string]ap.QueueConfig{"bench": {Concurrency: conc}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Handle("noop", func(context.Context, *ap.Job) error {
		if done.Add(1) == target {
			close(finished)
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 100)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	batch := make([]*ap.Job, 0, 100)
	for i := 0; i < b.N; i++ {
		batch = append(batch, &ap.Job{Type: "noop", Queue: "bench", Payload: payload, Headers: headers})
		if len(batch) == cap(batch) || i == b.N-1 {
			if err := p.EnqueueBatch(ctx, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	<-finished
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
	if err := p.Stop(ctx); err != nil {
		b.Fatal(err)
	}
}
