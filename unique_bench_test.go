package asyncplatform_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/backend/redis"
	"github.com/asyncplatform/asyncplatform/driver"
)

// BenchmarkEnqueueUnique measures what a unique key costs an Enqueue (one
// store Create), against the same Enqueue without one, on the in-process
// broker and on Redis (ASYNCPLATFORM_REDIS_ADDR, default 127.0.0.1:6379).
func BenchmarkEnqueueUnique(b *testing.B) {
	ctx := context.Background()
	backends := map[string]func(b *testing.B) driver.Backend{
		"memory": func(b *testing.B) driver.Backend { return memory.NewBroker().Connect() },
		"redis": func(b *testing.B) driver.Backend {
			addr := os.Getenv("ASYNCPLATFORM_REDIS_ADDR")
			if addr == "" {
				addr = "127.0.0.1:6379"
			}
			c := goredis.NewClient(&goredis.Options{Addr: addr})
			if err := c.Ping(ctx).Err(); err != nil {
				b.Skip("no Redis at", addr, err)
			}
			be, err := redis.New(ctx, redis.Config{Client: c, Prefix: fmt.Sprintf("bench-unique-%d", time.Now().UnixNano())})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = be.DeleteQueue(ctx, "bench"); _ = be.Close(); _ = c.Close() })
			return be
		},
	}
	for _, name := range []string{"memory", "redis"} {
		for _, unique := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/unique=%v", name, unique), func(b *testing.B) {
				p, err := ap.New(backends[name](b), ap.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					b.Fatal(err)
				}
				payload := make([]byte, 100)
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					j := &ap.Job{Type: "t", Queue: "bench", Payload: payload}
					if unique {
						j.UniqueKey, j.UniqueWindow = "k"+strconv.Itoa(i), time.Minute
					}
					if err := p.Enqueue(ctx, j); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
		}
	}
}
