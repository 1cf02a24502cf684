package asyncplatform_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"log/slog"

	goredis "github.com/redis/go-redis/v9"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/backend/redis"
	"github.com/asyncplatform/asyncplatform/driver"
)

// BenchmarkOutcomes measures what an output queue (QueueConfig.Output: one
// report enqueued per job) and status tracking (TrackStatus: a status read
// and about three writes per job, in the backend's store) cost a job, end
// to end: b.N jobs enqueued, then worked at concurrency 10 by a no-op
// handler, on the in-process broker and on Redis
// (ASYNCPLATFORM_REDIS_ADDR, default 127.0.0.1:6379). It reports jobs/s
// and µs/job; the difference between rows is the feature's cost.
//
//	go test -run '^$' -bench BenchmarkOutcomes -benchtime 5000x -count 6 .
func BenchmarkOutcomes(b *testing.B) {
	ctx := context.Background()
	backends := map[string]func(b *testing.B, queues ...string) driver.Backend{
		"memory": func(b *testing.B, _ ...string) driver.Backend { return memory.NewBroker().Connect() },
		"redis": func(b *testing.B, queues ...string) driver.Backend {
			addr := os.Getenv("ASYNCPLATFORM_REDIS_ADDR")
			if addr == "" {
				addr = "127.0.0.1:6379"
			}
			c := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: 40})
			if err := c.Ping(ctx).Err(); err != nil {
				b.Skip("no Redis at", addr, err)
			}
			be, err := redis.New(ctx, redis.Config{Client: c, Prefix: fmt.Sprintf("bench-outcomes-%d", time.Now().UnixNano())})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				for _, q := range queues {
					_ = be.DeleteQueue(ctx, q)
				}
				_ = be.Close()
				_ = c.Close()
			})
			return be
		},
	}
	for _, name := range []string{"memory", "redis"} {
		for _, v := range []struct {
			name           string
			output, status bool
		}{{"none", false, false}, {"output", true, false}, {"status", false, true}, {"both", true, true}} {
			b.Run(name+"/"+v.name, func(b *testing.B) {
				qc := ap.QueueConfig{Concurrency: 10, TrackStatus: v.status}
				if v.output {
					qc.Output = "bench-out"
				}
				p, err := ap.New(backends[name](b, "bench", "bench-out"), ap.Config{
					Queues:          map[string]ap.QueueConfig{"bench": qc},
					StatusRetention: time.Minute,
					Logger:          slog.New(slog.DiscardHandler),
				})
				if err != nil {
					b.Fatal(err)
				}
				var done atomic.Int64
				all := make(chan struct{})
				n := int64(b.N)
				if err := p.Handle("noop", func(context.Context, *ap.Job) error {
					if done.Add(1) == n {
						close(all)
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
				payload := make([]byte, 100)
				for i := 0; i < b.N; i += 1000 {
					batch := make([]*ap.Job, 0, 1000)
					for j := i; j < min(i+1000, b.N); j++ {
						batch = append(batch, &ap.Job{Type: "noop", Queue: "bench", Payload: payload})
					}
					if err := p.EnqueueBatch(ctx, batch); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
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
				b.ReportMetric(float64(elapsed.Microseconds())/float64(b.N), "µs/job")
				b.ReportMetric(0, "ns/op")
				if err := p.Stop(ctx); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
