package asyncplatform_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	goredis "github.com/redis/go-redis/v9"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/azure"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	apnats "github.com/asyncplatform/asyncplatform/backend/nats"
	"github.com/asyncplatform/asyncplatform/backend/rabbit"
	"github.com/asyncplatform/asyncplatform/backend/redis"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/pgstore"
)

// BenchmarkEnqueueUnique measures what a unique key costs an Enqueue (one
// store Create before the write), against the same Enqueue without one, on
// every backend: the in-process broker, and the machine's Redis, RabbitMQ
// (its keys in the PostgreSQL companion store), NATS and Azurite
// (ASYNCPLATFORM_AZURE_CONNECTION_STRING; skipped when unset). A server
// that does not answer skips its backend. Each enqueue is one call, one at
// a time:
//
//	go test -run '^$' -bench EnqueueUnique -benchtime 2000x -count 5 .
//
// The unique=false runs use only what the platform had before unique keys,
// so this file builds against an older tree with the line that
// sets the key deleted: docs/benchmarks.md compares the two binaries.
func BenchmarkEnqueueUnique(b *testing.B) {
	ctx := context.Background()
	tag := fmt.Sprintf("bench-unique-%d", time.Now().UnixNano())
	open := map[string]func(b *testing.B) driver.Backend{
		"memory": func(b *testing.B) driver.Backend { return memory.NewBroker().Connect() },
		"redis": func(b *testing.B) driver.Backend {
			c := goredis.NewClient(&goredis.Options{Addr: envOr("ASYNCPLATFORM_REDIS_ADDR", "127.0.0.1:6379")})
			if err := c.Ping(ctx).Err(); err != nil {
				b.Skip("no Redis:", err)
			}
			be, err := redis.New(ctx, redis.Config{Client: c, Prefix: tag})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = c.Close() })
			return be
		},
		"rabbit": func(b *testing.B) driver.Backend {
			table, pg := strings.ReplaceAll(tag, "-", "_"), envOr("ASYNCPLATFORM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
			st, err := pgstore.New(ctx, pgstore.Config{URL: pg, Table: table})
			if err != nil {
				b.Skip("no PostgreSQL for RabbitMQ's companion store:", err)
			}
			b.Cleanup(func() {
				_ = st.Close()
				if conn, err := pgx.Connect(ctx, pg); err == nil {
					_, _ = conn.Exec(ctx, "DROP TABLE IF EXISTS "+table+"; DROP SEQUENCE IF EXISTS "+table+"_rev")
					_ = conn.Close(ctx)
				}
			})
			be, err := rabbit.New(ctx, rabbit.Config{URL: envOr("ASYNCPLATFORM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), Prefix: tag, Store: st})
			if err != nil {
				b.Skip("no RabbitMQ:", err)
			}
			return be
		},
		"nats": func(b *testing.B) driver.Backend {
			url, stream := envOr("ASYNCPLATFORM_NATS_URL", "nats://127.0.0.1:4222"), "BENCHUNIQUE"+strconv.FormatInt(time.Now().UnixNano(), 36)
			be, err := apnats.New(ctx, apnats.Config{URL: url, Stream: stream})
			if err != nil {
				b.Skip("no NATS:", err)
			}
			b.Cleanup(func() { deleteStreams(url, stream) })
			return be
		},
		"azure": func(b *testing.B) driver.Backend {
			cs := os.Getenv("ASYNCPLATFORM_AZURE_CONNECTION_STRING")
			if cs == "" {
				b.Skip("ASYNCPLATFORM_AZURE_CONNECTION_STRING is unset")
			}
			be, err := azure.New(ctx, azure.Config{ConnectionString: cs, Prefix: "bu" + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)})
			if err != nil {
				b.Fatal(err)
			}
			return be
		},
	}
	for _, name := range []string{"memory", "redis", "rabbit", "nats", "azure"} {
		for _, unique := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/unique=%v", name, unique), func(b *testing.B) {
				be := open[name](b)
				queue := "bench"
				b.Cleanup(func() {
					if d, ok := be.(driver.QueueDeleter); ok {
						_ = d.DeleteQueue(ctx, queue)
					}
					_ = be.Close()
				})
				p, err := ap.New(be, ap.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					b.Fatal(err)
				}
				payload := make([]byte, 100)
				if err := p.Enqueue(ctx, &ap.Job{Type: "t", Queue: queue, Payload: payload}); err != nil {
					b.Fatal(err) // the queue's declaration, out of the loop
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					j := &ap.Job{Type: "t", Queue: queue, Payload: payload}
					if unique {
						j.UniqueKey, j.UniqueWindow = tag+"/"+strconv.Itoa(i), time.Minute
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

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// deleteStreams removes a NATS backend's streams (work, delay, dead).
func deleteStreams(url, stream string) {
	nc, err := gonats.Connect(url)
	if err != nil {
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name := range js.StreamNames(ctx).Name() {
		if strings.HasPrefix(name, stream) {
			_ = js.DeleteStream(ctx, name)
		}
	}
}
