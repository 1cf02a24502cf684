package main

// The store rows: Get, Create and compare-and-swap through
// asyncplatform.Store, the portable type users hold, on each backend's
// store, and on PostgreSQL (pgstore) for RabbitMQ, which keeps no state and
// takes a companion store. Like every system of the report, each store runs
// in a child process of its own.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/azure"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	apnats "github.com/asyncplatform/asyncplatform/backend/nats"
	apredis "github.com/asyncplatform/asyncplatform/backend/redis"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/pgstore"
)

// storeSystem names the store child in a childSpec.
const storeSystem = "store"

// storeOps are the operations measured, in the table's order.
var storeOps = []string{"Get", "Create", "CAS"}

// storeConc is how many goroutines call the store at once, on one
// connection (client, pool) per store: 4 per CPU, as storetest.Bench runs,
// so the figures compare with its.
func storeConc() int { return 4 * runtime.GOMAXPROCS(0) }

// storeResult is what one store child reports.
type storeResult struct {
	Backend string
	Store   string // what serves it
	Conc    int
	Ops     map[string]storeOp
	Load    float64
	Err     string
}

// storeOp is one operation's figures.
type storeOp struct {
	Rate     float64 // operations/s
	N        int
	P50, P99 time.Duration
}

// storeBackends are the stores of the backends o measures: the backend's
// own, or for RabbitMQ the PostgreSQL companion.
func storeBackends(o options) []string {
	var out []string
	for _, b := range o.Backends {
		if b == "azure" && o.Srv.Azure == "" || b == "postgres" {
			continue // PostgreSQL's store is pgstore, measured as RabbitMQ's
		}
		out = append(out, b)
	}
	return out
}

// measureStore runs one backend's store in a child process.
func measureStore(backend string, o options) storeResult {
	r := storeResult{Backend: backend}
	spec := childSpec{Backend: backend, System: storeSystem, Srv: o.Srv, StoreDur: o.StoreDur}
	if err := runJSONChild(spec, time.Duration(len(storeOps))*o.StoreDur+5*time.Minute, &r); err != nil {
		r.Err = err.Error()
	}
	return r
}

// runStoreChild measures one store and prints its result as JSON.
func runStoreChild(spec childSpec) {
	r := storeResult{Backend: spec.Backend, Conc: storeConc(), Ops: map[string]storeOp{}, Load: loadAvg()}
	ctx := context.Background()
	d, label, cleanup, err := openStore(ctx, spec.Backend, fmt.Sprint(os.Getpid()), spec.Srv)
	r.Store = label
	if err == nil {
		var s *ap.Store
		if s, err = ap.NewStore(d, "bench"); err == nil {
			for _, op := range storeOps {
				var m storeOp
				if m, err = storeLoop(ctx, s, op, r.Conc, spec.StoreDur); err != nil {
					err = fmt.Errorf("%s: %w", op, err)
					break
				}
				r.Ops[op] = m
			}
		}
		err = errors.Join(err, cleanup())
	}
	if err != nil {
		r.Err = err.Error()
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}

// openStore opens the store of backend, named after tag where the server
// is shared; cleanup closes it and removes everything the store made, keys
// included: at once where they have a home of their own (Redis keys, a
// NATS bucket, a PostgreSQL table), else one by one.
func openStore(ctx context.Context, backend, tag string, srv servers) (d driver.Store, label string, cleanup func() error, err error) {
	switch backend {
	case "memory":
		return memory.NewBroker().Connect(), "memory (in process)", func() error { return nil }, nil
	case "redis":
		prefix := "bench-store-" + tag
		rdb := goredis.NewClient(&goredis.Options{Addr: srv.Redis, PoolSize: 100})
		b, err := apredis.New(ctx, apredis.Config{Client: rdb, Prefix: prefix, Logger: quiet})
		if err != nil {
			rdb.Close()
			return nil, "", nil, err
		}
		return b, "Redis: keys + Lua", func() error {
			k := "{" + prefix + "}:store:"
			err := errors.Join(b.Close(), rdb.Del(context.Background(), k+"data", k+"idx", k+"exp", k+"rev").Err())
			return errors.Join(err, rdb.Close())
		}, nil
	case "nats":
		stream := "bench-store-" + tag
		b, err := apnats.New(ctx, apnats.Config{URL: srv.NATS, Stream: stream, Logger: quiet})
		if err != nil {
			return nil, "", nil, err
		}
		return b, "NATS: JetStream KV", func() error {
			err := b.Close()
			deleteStreams(srv.NATS, stream, stream+"_DELAY", stream+"_DEAD", "KV_"+stream+"_STORE")
			return err
		}, nil
	case "azure":
		if srv.Azure == "" {
			return nil, "", nil, fmt.Errorf("%w: no Azurite connection string", errUnavailable)
		}
		b, err := azure.New(ctx, azure.Config{ConnectionString: srv.Azure, Prefix: "bstore", Logger: quiet})
		if err != nil {
			return nil, "", nil, err
		}
		return b, "Azurite: Blob Storage, conditional writes", func() error {
			s, err := ap.NewStore(b, "bench")
			if err == nil {
				err = emptyStore(s)
			}
			return errors.Join(err, b.Close())
		}, nil
	case "rabbit":
		table := "bench_store_" + tag
		s, err := pgstore.New(ctx, pgstore.Config{URL: srv.Postgres, Table: table, Logger: quiet})
		if err != nil {
			return nil, "", nil, err
		}
		return s, "PostgreSQL " + pgVersion(ctx, srv.Postgres) + ": pgstore (the companion)", func() error {
			s.Close()
			return dropTable(srv.Postgres, table)
		}, nil
	}
	return nil, "", nil, fmt.Errorf("no store for the backend %q", backend)
}

// pgVersion is the server's version, or "?".
func pgVersion(ctx context.Context, url string) string {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "?"
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "?"
	}
	return strings.Fields(v)[0]
}

// dropTable drops pgstore's table and its sequence.
func dropTable(url, table string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP TABLE IF EXISTS "+table+"; DROP SEQUENCE IF EXISTS "+table+"_rev")
	return err
}

// storeLoop runs op from conc goroutines for dur and times every call.
// Get reads one present key; Create makes a new key each time (with a TTL
// of an hour, as a lock or a unique-job record would have); CAS is an
// Update at the revision the goroutine's previous write returned, one key
// per goroutine.
func storeLoop(ctx context.Context, s *ap.Store, op string, conc int, dur time.Duration) (storeOp, error) {
	if op == "Get" {
		if _, err := s.Create(ctx, "get", []byte("value"), 0); err != nil && !errors.Is(err, ap.ErrKeyExists) {
			return storeOp{}, err
		}
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		lat   []time.Duration
		fail  error
		stop  atomic.Bool
		value = []byte("value")
	)
	start := time.Now()
	time.AfterFunc(dur, func() { stop.Store(true) })
	for g := range conc {
		wg.Go(func() {
			var mine []time.Duration
			rev := ""
			for i := 0; !stop.Load(); i++ {
				t0 := time.Now()
				var err error
				switch op {
				case "Get":
					_, _, err = s.Get(ctx, "get")
				case "Create":
					_, err = s.Create(ctx, fmt.Sprintf("create/%d/%d", g, i), value, time.Hour)
				case "CAS":
					key := fmt.Sprintf("cas/%d", g)
					if rev == "" {
						if rev, err = s.Create(ctx, key, value, 0); err != nil {
							break
						}
						t0 = time.Now()
					}
					rev, err = s.Update(ctx, key, value, rev, 0)
				}
				if err != nil {
					mu.Lock()
					fail = errors.Join(fail, err)
					mu.Unlock()
					stop.Store(true)
					break
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if fail != nil {
		return storeOp{}, fail
	}
	return storeOp{Rate: rate(len(lat), elapsed), N: len(lat), P50: percentile(lat, 50), P99: percentile(lat, 99)}, nil
}

// emptyStore deletes every key of s, several at a time.
func emptyStore(s *ap.Store) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for {
		page, err := s.List(ctx, "", "", ap.MaxListLimit)
		if err != nil || len(page.Keys) == 0 {
			return err
		}
		keys := make(chan string)
		var wg sync.WaitGroup
		var failed atomic.Pointer[error]
		for range 16 {
			wg.Go(func() {
				for k := range keys {
					if err := s.Delete(ctx, k, ""); err != nil {
						failed.CompareAndSwap(nil, &err)
					}
				}
			})
		}
		for _, k := range page.Keys {
			keys <- k
		}
		close(keys)
		wg.Wait()
		if e := failed.Load(); e != nil {
			return fmt.Errorf("emptying the store: %w", *e)
		}
	}
}

func (r storeResult) summary() string {
	var parts []string
	for _, op := range storeOps {
		m := r.Ops[op]
		parts = append(parts, fmt.Sprintf("%s %.0f/s p50 %v", op, m.Rate, m.P50.Round(10*time.Microsecond)))
	}
	s := strings.Join(parts, ", ")
	if r.Err != "" {
		s += " ERROR " + r.Err
	}
	return s
}

// measureStores measures the store of every backend o names, one after
// another, logging each.
func measureStores(o options) []storeResult {
	var out []storeResult
	for _, b := range storeBackends(o) {
		r := measureStore(b, o)
		log.Printf("%s store: %s", b, r.summary())
		out = append(out, r)
	}
	return out
}

// writeStore writes the store table.
func (rep *report) writeStore(w func(string, ...any)) {
	if len(rep.Store) == 0 {
		return
	}
	conc := rep.Store[0].Conc
	w("## Shared state (the store)\n\n")
	w("Operations of `asyncplatform.Store` (limits checked, keys namespaced, as users call them) on each backend's store, from %d goroutines on one connection, %v each, in a process of its own: **Get** of one present key; **Create** of a new key each time (TTL 1 h); **CAS**, an `Update` at the revision the goroutine's previous write returned (one key per goroutine, so none is refused). RabbitMQ keeps no state: its row is the PostgreSQL companion (`pgstore`) on the machine's server. p50 and p99 are of single calls.\n\n", conc, rep.Options.StoreDur)
	w("| backend | store | Get/s | Get p50 | Create/s | Create p50 | CAS/s | CAS p50 | CAS p99 | load | |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range rep.Store {
		g, c, x := r.Ops["Get"], r.Ops["Create"], r.Ops["CAS"]
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f | %s |\n", r.Backend, r.Store,
			rateCell(g.Rate), durCell(g.P50), rateCell(c.Rate), durCell(c.P50), rateCell(x.Rate), durCell(x.P50), durCell(x.P99), r.Load, r.Err)
	}
	w("\n")
}
