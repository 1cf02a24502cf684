package asyncplatform_test

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// BenchmarkWorkflow runs workflows on the memory backend: a chain of 10
// steps (cost per step and per edge, one edge a step) and a fan-in of 100
// parents into one (100 edges, 101 steps). It reports ns/step and
// ns/edge.
func BenchmarkWorkflow(b *testing.B) {
	for _, shape := range []struct {
		name         string
		steps, edges int
		build        func() *ap.Workflow
	}{
		{"chain10", 10, 9, func() *ap.Workflow {
			w := ap.NewWorkflow("chain")
			w.Add("s0", &ap.Job{Type: "s"})
			for i := 1; i < 10; i++ {
				w.Add("s"+strconv.Itoa(i), &ap.Job{Type: "s"}, "s"+strconv.Itoa(i-1))
			}
			return w
		}},
		{"fanin100", 101, 100, func() *ap.Workflow {
			w := ap.NewWorkflow("fan-in")
			deps := make([]string, 100)
			for i := range deps {
				deps[i] = "p" + strconv.Itoa(i)
				w.Add(deps[i], &ap.Job{Type: "s"})
			}
			return w.Add("join", &ap.Job{Type: "s"}, deps...)
		}},
	} {
		b.Run(shape.name, func(b *testing.B) {
			ctx := context.Background()
			backend, err := memory.New(ctx, memory.Config{})
			if err != nil {
				b.Fatal(err)
			}
			defer backend.Close()
			p, err := ap.New(backend, ap.Config{Logger: slog.New(slog.DiscardHandler), Queues: map[string]ap.QueueConfig{ap.DefaultQueue: {Concurrency: 8}}})
			if err != nil {
				b.Fatal(err)
			}
			_ = p.Handle("s", func(context.Context, *ap.Job) error { return nil })
			if err := p.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer p.Stop(ctx)
			b.ResetTimer()
			for range b.N {
				w := shape.build()
				if err := p.EnqueueWorkflow(ctx, w); err != nil {
					b.Fatal(err)
				}
				for {
					st, err := p.WorkflowStatus(ctx, w.ID)
					if err != nil {
						b.Fatal(err)
					}
					if st.Done() {
						break
					}
					time.Sleep(time.Millisecond)
				}
			}
			per := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(per/float64(shape.steps), "ns/step")
			b.ReportMetric(per/float64(shape.edges), "ns/edge")
		})
	}
}
