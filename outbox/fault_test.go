package outbox_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	ap "github.com/asyncplatform/asyncplatform"
	_ "github.com/asyncplatform/asyncplatform/backend/all"
	"github.com/asyncplatform/asyncplatform/backend/postgres"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/childproc"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
	"github.com/asyncplatform/asyncplatform/internal/wire"
	"github.com/asyncplatform/asyncplatform/outbox"
)

// childEnv tells a child process of TestRelayKilled to run a relay: its
// value is the source URL and the target URL, separated by a space.
const childEnv = "ASYNCPLATFORM_OUTBOX_RELAY_CHILD"

func pgURL() string {
	return testenv.Getenv(postgres.URLEnv, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// runChild is a relay process: it runs until killed (or its stdin
// closes).
func runChild(t *testing.T, value string) {
	from, to, _ := strings.Cut(value, " ")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // a closed stdin (the parent's end) stops the relay
		_, _ = os.Stdin.Read(make([]byte, 1))
		cancel()
	}()
	src, err := ap.Open(ctx, from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := ap.Open(ctx, to)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	r, err := outbox.New(outbox.Config{Source: src.(outbox.Source), Target: dst, Batch: 50,
		IdleWait: 20 * time.Millisecond, RetryWait: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("relaying")
	_ = r.Run(ctx)
}

// TestRelayKilled is the relay's fault test: 10,000 jobs committed to a
// PostgreSQL outbox in transactions of 1 to 20 over 4 queues, while 3
// relay processes are killed with SIGKILL at random and restarted. Every
// job arrives on the target; a job that arrives twice arrives as the same
// copy (its ID and body); each queue's first arrivals are in commit order.
// The duplicates are counted and logged.
func TestRelayKilled(t *testing.T) {
	if v := os.Getenv(childEnv); v != "" {
		runChild(t, v)
		return
	}
	for _, tc := range []struct{ name, target string }{
		{"redis", "redis://" + testenv.Getenv("ASYNCPLATFORM_REDIS_ADDR", "127.0.0.1:6379") + "/0?prefix="},
		{"rabbit", "amqp://guest:guest@127.0.0.1:5672/?prefix="},
		{"nats", "nats://127.0.0.1:4222?stream="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if v := os.Getenv(childEnv); v != "" {
				runChild(t, v)
				return
			}
			relayKilled(t, tc.target)
		})
	}
}

func relayKilled(t *testing.T, target string) {
	const (
		total  = 10000
		relays = 3
	)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, pgURL()+"&pool_max_conns=4")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		testenv.Unreachable(t, "PostgreSQL", err)
		return
	}
	tag := "obk_" + strings.ToLower(rand.Text()[:10])
	from := pgURL() + "&pool_max_conns=4&prefix=" + tag
	to := target + tag
	src, err := postgres.New(ctx, postgres.Config{Pool: pool, Prefix: tag})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		src.Close()
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+tag+`_jobs, `+tag+`_dead, `+tag+`_queues, `+tag+`_migrations, `+tag+`_store, `+tag+`_outbox, `+tag+`_outbox_aside;
			DROP SEQUENCE IF EXISTS `+tag+`_token, `+tag+`_store_rev`)
	}()
	dst, err := ap.Open(ctx, to)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	queues := []string{"k0", "k1", "k2", "k3"}
	defer func() {
		for _, q := range queues {
			if d, ok := dst.(driver.QueueDeleter); ok {
				_ = d.DeleteQueue(context.Background(), q)
			}
		}
	}()
	p, err := ap.New(src, ap.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}

	// The relays, killed and restarted at random.
	var mu sync.Mutex
	procs := make([]*childproc.Proc, relays)
	start := func(i int) {
		c, err := childproc.Start(childproc.Config{Test: t.Name(), Env: childEnv, Value: from + " " + to, Timeout: 9 * time.Minute})
		if err != nil {
			t.Error(err)
			return
		}
		procs[i] = c
	}
	for i := range relays {
		start(i)
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range procs {
			if c != nil {
				c.Stop(10 * time.Second)
			}
		}
	}()
	kills := 0
	stopKilling := make(chan struct{})
	killerDone := make(chan struct{})
	go func() {
		defer close(killerDone)
		for {
			select {
			case <-stopKilling:
				return
			case <-time.After(time.Duration(100+mrand.IntN(500)) * time.Millisecond):
			}
			i := mrand.IntN(relays)
			mu.Lock()
			if procs[i] != nil {
				procs[i].Kill()
				kills++
			}
			start(i)
			mu.Unlock()
		}
	}()

	// The producer: transactions of 1 to 20 jobs.
	want := map[string][]string{}
	bodies := map[string]string{}
	for n := 0; n < total; {
		k := min(1+mrand.IntN(20), total-n)
		var jobs []*ap.Job
		for i := range k {
			jobs = append(jobs, &ap.Job{Type: "k", Queue: queues[mrand.IntN(len(queues))], Payload: []byte(fmt.Sprint(n + i))})
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return p.EnqueueBatch(postgres.OutboxTx(ctx, tx), jobs)
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs {
			want[j.Queue] = append(want[j.Queue], j.ID)
		}
		n += k
	}
	t.Logf("%d jobs committed", total)

	// Wait for the outbox to empty, relays still being killed, then stop
	// killing and let the live ones finish.
	empty := func() bool {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+tag+`_outbox`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	}
	for !empty() {
		if ctx.Err() != nil {
			t.Fatal("the outbox did not empty in time")
		}
		time.Sleep(200 * time.Millisecond)
	}
	close(stopKilling)
	<-killerDone

	// Read everything back from the target.
	type arrival struct{ id, body string }
	got := map[string][]arrival{}
	for _, q := range queues {
		distinct := map[string]bool{}
		last := time.Now()
		// Until every job came and the queue is empty, or 30s without a new
		// job (the missing ones are then lost).
		for (len(distinct) < len(want[q]) || !drained(ctx, t, dst, q)) && time.Since(last) < 30*time.Second {
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			ds, err := dst.Receive(rctx, q, 500, time.Minute)
			rcancel()
			if err != nil && ctx.Err() != nil {
				t.Fatalf("queue %s: %d of %d received: %v", q, len(distinct), len(want[q]), err)
			}
			for _, d := range ds {
				var j wire.Job
				if err := wire.DecodeJob(d.Body, &j, nil); err != nil {
					t.Fatalf("queue %s: a body that does not decode: %v", q, err)
				}
				got[q] = append(got[q], arrival{j.ID, fmt.Sprintf("copy %d of %q", j.Copy, d.Body)})
				if !distinct[j.ID] {
					distinct[j.ID], last = true, time.Now()
				}
				if err := dst.Ack(ctx, d); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	lost, dup, bad := 0, 0, 0
	for _, q := range queues {
		seen := map[string]int{}
		var first []string
		for _, a := range got[q] {
			if prev, ok := bodies[a.id]; ok && prev != a.body {
				bad++
			}
			bodies[a.id] = a.body
			if seen[a.id] == 0 {
				first = append(first, a.id)
			} else {
				dup++
			}
			seen[a.id]++
		}
		for _, id := range want[q] {
			if seen[id] == 0 {
				lost++
			}
		}
		if len(first) == len(want[q]) {
			for i := range first {
				if first[i] != want[q][i] {
					t.Errorf("queue %s: first arrival %d is %s, want %s (commit order)", q, i, first[i], want[q][i])
					break
				}
			}
		}
		if len(seen) != len(want[q]) {
			t.Errorf("queue %s: %d distinct jobs arrived, want %d (unexpected jobs)", q, len(seen), len(want[q]))
		}
	}
	t.Logf("%d jobs, %d relay kills: %d lost, %d duplicated (same ID and copy), %d changed copies", total, kills, lost, dup, bad)
	if lost > 0 || bad > 0 {
		t.Errorf("%d lost, %d duplicates that were not the same copy", lost, bad)
	}
}

// drained reports whether the target's queue has nothing ready.
func drained(ctx context.Context, t *testing.T, b driver.Backend, q string) bool {
	st, err := b.Stats(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	return st.Ready == 0
}
