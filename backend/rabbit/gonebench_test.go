package rabbit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// BenchmarkReleaseRedelivered measures one release of a consumer whose
// window of 20 holds messages that came back counted (their first consumer
// closed without settling them), as a suspect's isolation after a crash
// releases them: without a Store (no gone marks) and with the PostgreSQL
// companion store (a lookup of each, and a mark per hand-back).
func BenchmarkReleaseRedelivered(b *testing.B) {
	const n = 20
	for _, store := range []bool{false, true} {
		b.Run(map[bool]string{false: "nostore", true: "store"}[store], func(b *testing.B) {
			cfg := Config{Prefetch: n}
			if store {
				cfg.Store = pgCompanion(b)
			}
			be := newBackend(b, cfg)
			ctx := longCtx(b)
			q := queueName(b, be)
			var msgs []driver.Message
			for i := range n {
				msgs = append(msgs, driver.Message{ID: fmt.Sprint(i), Body: []byte(fmt.Sprint(i))})
			}
			if err := be.Enqueue(ctx, q, msgs); err != nil {
				b.Fatal(err)
			}
			var took time.Duration
			for range b.N {
				b.StopTimer()
				// A first consumer takes the window and dies: every message
				// comes back counted, to be looked up.
				first := newBackend(b, Config{Prefetch: n})
				got := 0
				for got < n {
					ds, err := first.Receive(ctx, q, n, time.Minute)
					if err != nil {
						b.Fatal(err)
					}
					got += len(ds)
				}
				first.Close()
				// The next fills its window, then is released.
				ds, err := be.Receive(ctx, q, 1, time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				if err := be.Requeue(ctx, ds[0], driver.Message{ID: "0", Body: ds[0].Body}); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				if err := be.Release(context.Background(), q); err != nil {
					b.Fatal(err)
				}
				took += time.Since(start)
			}
			b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "ms/release")
		})
	}
}
