package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/outbox"
)

// recorder is a target backend that records every message published to
// it, in order, per queue.
type recorder struct {
	driver.Backend
	mu   sync.Mutex
	msgs map[string][]driver.Message
}

func newRecorder(t *testing.T) *recorder {
	m, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return &recorder{Backend: m, msgs: map[string][]driver.Message{}}
}

func (r *recorder) Enqueue(ctx context.Context, queue string, msgs []driver.Message) error {
	r.mu.Lock()
	r.msgs[queue] = append(r.msgs[queue], msgs...)
	r.mu.Unlock()
	return r.Backend.Enqueue(ctx, queue, msgs)
}

func (r *recorder) got(queue string) []driver.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]driver.Message(nil), r.msgs[queue]...)
}

func setupOutbox(t *testing.T, role string, cfg Config) (*Backend, *ap.Platform, *pgxpool.Pool) {
	t.Helper()
	reachable(t)
	pool, err := pgxpool.New(context.Background(), testURL()+"&pool_max_conns=10")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg.Pool, cfg.Prefix = pool, testPrefix(t, role)
	b, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	p, err := ap.New(b, ap.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return b, p, pool
}

func outboxCount(t *testing.T, pool *pgxpool.Pool, b *Backend, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+b.cfg.Prefix+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestOutboxTx: jobs enqueued under OutboxTx (pgx) and OutboxSQLTx exist
// in the outbox once the transaction commits, never after a rollback, and
// are not on the backend's own queue; a relay publishes them in order with
// their IDs and empties the outbox.
func TestOutboxTx(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, p, pool := setupOutbox(t, "obtx", Config{})
	enqueue := func(c context.Context, n int, tag string) []string {
		var ids []string
		for i := range n {
			j := &ap.Job{Type: "t", Queue: "ob", Payload: []byte(fmt.Sprintf("%s-%d", tag, i))}
			if err := p.Enqueue(c, j); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, j.ID)
		}
		return ids
	}
	// Rolled back: nothing.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	enqueue(OutboxTx(ctx, tx), 3, "rolled")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := outboxCount(t, pool, b, "_outbox"); n != 0 {
		t.Fatalf("%d outbox rows after a rollback, want 0", n)
	}
	// Committed, through pgx and through database/sql.
	var want []string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		want = append(want, enqueue(OutboxTx(ctx, tx), 3, "pgx")...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, enqueue(OutboxSQLTx(ctx, stx), 3, "sql")...)
	if err := stx.Commit(); err != nil {
		t.Fatal(err)
	}
	if st, err := b.Stats(ctx, "ob"); err != nil || st.Ready != 0 {
		t.Fatalf("the backend's own queue: %+v, %v; want nothing on it", st, err)
	}
	target := newRecorder(t)
	r, err := outbox.New(outbox.Config{Source: b, Target: target, Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	got := target.got("ob")
	if len(got) != len(want) {
		t.Fatalf("relayed %d jobs, want %d", len(got), len(want))
	}
	for i, m := range got {
		if m.ID != want[i] {
			t.Errorf("job %d relayed with ID %q, want %q (in commit order)", i, m.ID, want[i])
		}
	}
	if n := outboxCount(t, pool, b, "_outbox"); n != 0 {
		t.Errorf("%d outbox rows after the relay, want 0", n)
	}
	// The relayed jobs run on the target under a platform of their own.
	tp, err := ap.New(target, ap.Config{Queues: map[string]ap.QueueConfig{"ob": {Concurrency: 2}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan string, len(want))
	if err := tp.Handle("t", func(_ context.Context, j *ap.Job) error { ran <- j.ID; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := tp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer tp.Stop(context.Background())
	for range want {
		select {
		case <-ran:
		case <-ctx.Done():
			t.Fatal("the relayed jobs did not all run on the target")
		}
	}
}

// TestOutboxBadRows: a row with a body past MaxBody, one with an ID past
// its bound and one of a queue name the platform refuses are moved aside
// with their reason; the rows after them are relayed, in order.
func TestOutboxBadRows(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, _, pool := setupOutbox(t, "obbad", Config{MaxBody: 64})
	_, err := pool.Exec(ctx, `INSERT INTO `+b.cfg.Prefix+`_outbox (queue, id, dedupe, body) VALUES
		('q', 'a', '', 'ok'), ('q', 'big', '', $1), ('q', $2, '', 'x'), ('q', 'b', '', 'ok'),
		('bad queue!', 'c', '', 'ok')`, []byte(strings.Repeat("x", 65)), strings.Repeat("i", maxOutboxID+1))
	if err != nil {
		t.Fatal(err)
	}
	target := newRecorder(t)
	r, err := outbox.New(outbox.Config{Source: b, Target: target, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	got := target.got("q")
	if len(got) != 2 || got[0].ID != "a" || got[1].ID != "b" {
		t.Errorf("relayed %v, want a and b", got)
	}
	rows, err := pool.Query(ctx, `SELECT queue, reason FROM `+b.cfg.Prefix+`_outbox_aside ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	reasons, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var q, why string
		err := r.Scan(&q, &why)
		return q + ": " + why, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(reasons) != 3 || !strings.Contains(reasons[0], "past Config.MaxBody") ||
		!strings.Contains(reasons[1], "ID or Dedupe") || !strings.Contains(reasons[2], "bad queue") {
		t.Errorf("aside: %q, want the big body, the long ID and the bad queue", reasons)
	}
	if n := outboxCount(t, pool, b, "_outbox"); n != 0 {
		t.Errorf("%d outbox rows left, want 0", n)
	}
	if s := r.Stats(); s.Aside != 3 || s.Published != 2 {
		t.Errorf("Stats %+v, want 2 published, 3 aside", s)
	}
}

// TestOutboxRelaysShare: three relays running at once over four queues
// publish every job exactly once (no fault: a duplicate would be two
// relays on one queue), each queue in commit order.
func TestOutboxRelaysShare(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, p, pool := setupOutbox(t, "obshare", Config{})
	queues := []string{"s0", "s1", "s2", "s3"}
	want := map[string][]string{}
	target := newRecorder(t)
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var relays []*outbox.Relay
	for range 3 {
		r, err := outbox.New(outbox.Config{Source: b, Target: target, Batch: 7, IdleWait: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		relays = append(relays, r)
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(rctx) }()
	}
	const perQueue = 300
	for i := range perQueue / 10 { // the relays run while jobs commit
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, q := range queues {
				for k := range 10 {
					j := &ap.Job{Type: "t", Queue: q, Payload: []byte(fmt.Sprint(i*10 + k))}
					if err := p.Enqueue(OutboxTx(ctx, tx), j); err != nil {
						return err
					}
					want[q] = append(want[q], j.ID)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for ctx.Err() == nil {
		done := 0
		for _, q := range queues {
			if len(target.got(q)) >= perQueue {
				done++
			}
		}
		if done == len(queues) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // room for a doubled publish to show
	stop()
	wg.Wait()
	for _, q := range queues {
		got := target.got(q)
		if len(got) != perQueue {
			t.Errorf("queue %s: %d published, want %d exactly", q, len(got), perQueue)
			continue
		}
		for i, m := range got {
			if m.ID != want[q][i] {
				t.Errorf("queue %s: job %d is %q, want %q", q, i, m.ID, want[q][i])
				break
			}
		}
	}
	shared := 0
	for _, r := range relays {
		if r.Stats().Published > 0 {
			shared++
		}
	}
	t.Logf("%d of 3 relays published", shared)
}

// TestOutboxLeaseHeld: a queue leased by one relay is refused to another
// (ErrHeld) until released; a released lease deletes nothing.
func TestOutboxLeaseHeld(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, _, _ := setupOutbox(t, "obheld", Config{})
	l, err := b.TakeOutbox(ctx, "h", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TakeOutbox(ctx, "h", time.Minute); !errors.Is(err, outbox.ErrHeld) {
		t.Fatalf("a second TakeOutbox: %v, want ErrHeld", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Delete(ctx, []int64{1}); !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("Delete after Release: %v, want ErrLeaseLost", err)
	}
	l2, err := b.TakeOutbox(ctx, "h", time.Minute)
	if err != nil {
		t.Fatalf("TakeOutbox after Release: %v", err)
	}
	_ = l2.Release(ctx)
}

// TestOutboxQueuesBounded: the outbox table is untrusted. OutboxQueues
// returns at most outbox.MaxQueues names, each cut past
// driver.MaxQueueLen; the relay leaves the rows of a name too long to
// address in the table and relays the others.
func TestOutboxQueuesBounded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, _, pool := setupOutbox(t, "obq", Config{})
	ins := `INSERT INTO ` + b.cfg.Prefix + `_outbox (queue, id, dedupe, body) VALUES ($1, $2, '', 'x')`
	for _, q := range []string{strings.Repeat("q", 5000), "ok"} {
		if _, err := pool.Exec(ctx, ins, q, "j-"+q[:2]); err != nil {
			t.Fatal(err)
		}
	}
	qs, err := b.OutboxQueues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if len(q) > driver.MaxQueueLen+1 {
			t.Errorf("OutboxQueues returned a name of %d bytes, want at most %d", len(q), driver.MaxQueueLen+1)
		}
	}
	target := newRecorder(t)
	r, err := outbox.New(outbox.Config{Source: b, Target: target, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if got := target.got("ok"); len(got) != 1 {
		t.Errorf("relayed %v to ok, want its one row", got)
	}
	if n := outboxCount(t, pool, b, "_outbox"); n != 1 {
		t.Errorf("%d outbox rows left, want the long-named one", n)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+b.cfg.Prefix+`_outbox (queue, id, dedupe, body)
		SELECT 'q' || i, 'x', '', 'x' FROM generate_series(1, $1) i`, outbox.MaxQueues+200); err != nil {
		t.Fatal(err)
	}
	if qs, err := b.OutboxQueues(ctx); err != nil || len(qs) != outbox.MaxQueues {
		t.Errorf("OutboxQueues over %d queues: %d names, %v; want %d", outbox.MaxQueues+201, len(qs), err, outbox.MaxQueues)
	}
}
