package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/azure"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	apnats "github.com/asyncplatform/asyncplatform/backend/nats"
	"github.com/asyncplatform/asyncplatform/backend/rabbit"
	apredis "github.com/asyncplatform/asyncplatform/backend/redis"
	"github.com/asyncplatform/asyncplatform/backend/sqlite"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/pgstore"
)

// quiet discards the logs of the systems under test.
var quiet = slog.New(slog.DiscardHandler)

// servers are the addresses of the brokers.
type servers struct {
	Redis string // host:port
	AMQP  string // amqp:// URL
	NATS  string // nats:// URL
	Azure string // connection string
	// Postgres is a postgres:// URL: RabbitMQ's companion store, and the
	// server of the PostgreSQL backend, its raw loop and River.
	Postgres string
}

// openBackend opens our backend for name; cleanup closes what it opened
// besides the backend, and, when owner is set, removes the streams it made
// beyond the queue itself.
func openBackend(ctx context.Context, name, tag string, owner bool, srv servers) (be driver.Backend, cleanup func(), err error) {
	cleanup = func() {}
	switch name {
	case "memory":
		return memory.NewBroker().Connect(), cleanup, nil
	case "redis":
		rdb := goredis.NewClient(&goredis.Options{Addr: srv.Redis, PoolSize: 100})
		b, err := apredis.New(ctx, apredis.Config{Client: rdb, Prefix: "bench", Logger: quiet})
		if err != nil {
			rdb.Close()
			return nil, nil, err
		}
		return b, func() { rdb.Close() }, nil
	case "rabbit":
		// PostgreSQL is RabbitMQ's companion store, where its dead letters
		// live; one table per run, dropped by its owner.
		if srv.Postgres == "" {
			b, err := rabbit.New(ctx, rabbit.Config{URL: srv.AMQP, Prefix: "bench", Logger: quiet})
			return b, cleanup, err
		}
		table := "bench_rabbit_" + notTableByte.ReplaceAllString(tag, "_")
		table = table[:min(len(table), 63)]
		st, err := pgstore.New(ctx, pgstore.Config{URL: withPool(srv.Postgres, 32), Table: table, Logger: quiet})
		if err != nil {
			return nil, nil, err
		}
		cleanup = func() {
			st.Close()
			if owner {
				_ = dropTable(srv.Postgres, table)
			}
		}
		b, err := rabbit.New(ctx, rabbit.Config{URL: srv.AMQP, Prefix: "bench", Logger: quiet, Store: st})
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		return b, cleanup, nil
	case "nats":
		stream := "bench-" + tag
		b, err := apnats.New(ctx, apnats.Config{URL: srv.NATS, Stream: stream, Logger: quiet})
		if err != nil {
			return nil, nil, err
		}
		if !owner {
			return b, cleanup, nil
		}
		return b, func() {
			deleteStreams(srv.NATS, stream, stream+"_DELAY", stream+"_DEAD", stream+"_CLAIM", stream+"_HOLD", "KV_"+stream+"_STORE")
		}, nil
	case "postgres":
		b, cleanup, err := openPostgres(ctx, tag, owner, srv)
		if err != nil {
			return nil, nil, err
		}
		return b, cleanup, nil
	case "azure":
		if srv.Azure == "" {
			return nil, nil, fmt.Errorf("%w: no Azurite connection string", errUnavailable)
		}
		b, err := azure.New(ctx, azure.Config{ConnectionString: srv.Azure, Prefix: "bench", Logger: quiet})
		return b, cleanup, err
	case "sqlite":
		return openSQLite(ctx, tag, owner)
	}
	return nil, nil, fmt.Errorf("unknown backend %q", name)
}

// facade is our platform over one backend. Enqueues go through one platform
// that never starts; each consume starts a platform of its own.
type facade struct {
	be      driver.Backend
	queue   string
	enq     *ap.Platform
	cleanup func()
	// prefetch, when positive, sets each consume's QueueConfig.Prefetch
	// to prefetch times its concurrency; otherwise the default.
	prefetch int
}

func newFacade(ctx context.Context, backend, tag string, srv servers) (*facade, error) {
	be, cleanup, err := openBackend(ctx, backend, tag, true, srv)
	if err != nil {
		return nil, err
	}
	f := &facade{be: be, queue: "bench-" + tag, cleanup: cleanup}
	f.enq, err = ap.New(be, ap.Config{Queues: map[string]ap.QueueConfig{f.queue: {}}, Logger: quiet})
	if err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

func (f *facade) enqueue(ctx context.Context, payload []byte) error {
	return f.enq.Enqueue(ctx, &ap.Job{Type: "bench", Queue: f.queue, Payload: payload})
}

func (f *facade) enqueueBatch(ctx context.Context, payloads [][]byte) error {
	jobs := make([]*ap.Job, len(payloads))
	for i, p := range payloads {
		jobs[i] = &ap.Job{Type: "bench", Queue: f.queue, Payload: p}
	}
	return f.enq.EnqueueBatch(ctx, jobs)
}

func (f *facade) consume(ctx context.Context, c int, handle func([]byte)) (func(), error) {
	qc := ap.QueueConfig{Concurrency: c}
	if f.prefetch > 0 {
		qc.Prefetch = ap.Limit(f.prefetch * c)
	}
	p, err := ap.New(f.be, ap.Config{Queues: map[string]ap.QueueConfig{f.queue: qc}, Logger: quiet})
	if err != nil {
		return nil, err
	}
	if err := p.Handle("bench", func(_ context.Context, j *ap.Job) error {
		handle(j.Payload)
		return nil
	}); err != nil {
		return nil, err
	}
	if err := p.Start(ctx); err != nil {
		return nil, err
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = p.Stop(sctx)
	}, nil
}

func (f *facade) close() error {
	var err error
	if d, ok := f.be.(driver.QueueDeleter); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err = d.DeleteQueue(ctx, f.queue)
		cancel()
	}
	err = errors.Join(err, f.be.Close())
	f.cleanup()
	return err
}

// notTableByte matches what a tag has that a table name must not.
var notTableByte = regexp.MustCompile(`[^A-Za-z0-9_]`)

// withPool returns the PostgreSQL URL with a pool of n connections, unless
// it sets its own.
func withPool(u string, n int) string {
	if strings.Contains(u, "pool_max_conns") {
		return u
	}
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return fmt.Sprintf("%s%spool_max_conns=%d", u, sep, n)
}

// openSQLite opens the SQLite backend on a file of the run's own in the
// temporary directory (named from tag, so the run's processes share it);
// its owner removes the file.
func openSQLite(ctx context.Context, tag string, owner bool) (driver.Backend, func(), error) {
	path := filepath.Join(os.TempDir(), "asyncplatform-bench-"+notTableByte.ReplaceAllString(tag, "_")+".db")
	b, err := sqlite.New(ctx, sqlite.Config{Path: path, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	return b, func() {
		if owner {
			for _, suffix := range []string{"", "-wal", "-shm", "-writer.lock"} {
				os.Remove(path + suffix)
			}
		}
	}, nil
}
