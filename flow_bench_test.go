package asyncplatform_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/backend/redis"
	"github.com/asyncplatform/asyncplatform/driver"
)

// BenchmarkFlow measures what flow control costs a job end to end (enqueue
// in batches of 100, claim, a no-op handler, ack) at concurrency 10: with
// none configured; with the queue in a pool of two (strict order, the other
// queue empty); with a per-process limit, a cluster-wide concurrency limit
// and a cluster-wide rate on the job type, each high enough never to hold
// a job back, so what is measured is the bookkeeping (store round trips
// for the cluster-wide ones); and with TrackStatus (a record written at
// the enqueue and at each state change). On the in-process broker and the machine's
// Redis (skipped when it does not answer):
//
//	go test -run '^$' -bench Flow -benchtime 20000x -count 5 .
func BenchmarkFlow(b *testing.B) {
	ctx := context.Background()
	backends := map[string]func(b *testing.B) driver.Backend{
		"memory": func(b *testing.B) driver.Backend { return memory.NewBroker().Connect() },
		"redis": func(b *testing.B) driver.Backend {
			c := goredis.NewClient(&goredis.Options{Addr: envOr("ASYNCPLATFORM_REDIS_ADDR", "127.0.0.1:6379")})
			if err := c.Ping(ctx).Err(); err != nil {
				b.Skip("no Redis:", err)
			}
			be, err := redis.New(ctx, redis.Config{Client: c, Prefix: fmt.Sprintf("bench-flow-%d", time.Now().UnixNano())})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = c.Close() })
			return be
		},
	}
	modes := []struct {
		name string
		set  func(c *ap.Config)
		key  bool // every job has a UniqueKey
	}{
		{"none", func(*ap.Config) {}, false},
		{"pool", func(c *ap.Config) {
			c.Queues["bench-low"] = ap.QueueConfig{}
			c.Queues["bench"] = ap.QueueConfig{}
			c.Pools = []ap.Pool{{Queues: []string{"bench", "bench-low"}, Concurrency: 10}}
		}, false},
		{"local-limit", func(c *ap.Config) { c.Limits = map[string]ap.TypeLimit{"noop": {Concurrency: 1000}} }, false},
		{"cluster-limit", func(c *ap.Config) { c.Limits = map[string]ap.TypeLimit{"noop": {ClusterConcurrency: 1000}} }, false},
		{"rate", func(c *ap.Config) { c.Limits = map[string]ap.TypeLimit{"noop": {Rate: 1e6, Burst: 1000}} }, false},
		{"status", func(c *ap.Config) { c.TrackStatus = true }, false},
		{"unique", func(*ap.Config) {}, true},
	}
	for _, bk := range []string{"memory", "redis"} {
		for _, m := range modes {
			b.Run(bk+"/"+m.name, func(b *testing.B) {
				be := backends[bk](b)
				defer be.Close()
				cfg := ap.Config{
					Queues: map[string]ap.QueueConfig{"bench": {Concurrency: 10}},
					Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				}
				m.set(&cfg)
				p, err := ap.New(be, cfg)
				if err != nil {
					b.Fatal(err)
				}
				var done atomic.Int64
				finished := make(chan struct{})
				target := int64(b.N)
				_ = p.Handle("noop", func(context.Context, *ap.Job) error {
					if done.Add(1) == target {
						close(finished)
					}
					return nil
				})
				if err := p.Start(ctx); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				batch := make([]*ap.Job, 0, 100)
				for i := 0; i < b.N; i++ {
					j := &ap.Job{Type: "noop", Queue: "bench"}
					if m.key {
						j.UniqueKey = "k" + strconv.Itoa(i)
					}
					batch = append(batch, j)
					if len(batch) == cap(batch) || i == b.N-1 {
						if err := p.EnqueueBatch(ctx, batch); err != nil {
							b.Fatal(err)
						}
						batch = batch[:0]
					}
				}
				<-finished
				b.StopTimer()
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
				_ = p.Stop(ctx)
			})
		}
	}
}
