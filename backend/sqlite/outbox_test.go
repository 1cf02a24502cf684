package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

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

func countRows(t *testing.T, b *Backend, table string) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow(`SELECT count(*) FROM ` + b.cfg.Prefix + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestOutboxTx: jobs enqueued under OutboxTx exist in the outbox once the
// transaction commits, never after a rollback, and not on the backend's
// own queue; a relay publishes them in commit order with their IDs, and
// moves a bad row aside without holding up the rows after it.
func TestOutboxTx(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := New(ctx, Config{Path: filepath.Join(t.TempDir(), "outbox.db"), MaxBody: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p, err := ap.New(b, ap.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	inTx := func(commit bool, n int) []string {
		tx, err := b.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for i := range n {
			j := &ap.Job{Type: "t", Queue: "ob", Payload: []byte(fmt.Sprint(i))}
			if err := p.Enqueue(OutboxTx(ctx, tx), j); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, j.ID)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	inTx(false, 3)
	if n := countRows(t, b, "_outbox"); n != 0 {
		t.Fatalf("%d outbox rows after a rollback, want 0", n)
	}
	want := inTx(true, 3)
	if _, err := b.db.ExecContext(ctx, `INSERT INTO `+b.cfg.Prefix+`_outbox (queue, id, dedupe, body) VALUES ('ob', 'big', '', ?)`, strings.Repeat("x", 65<<10)); err != nil {
		t.Fatal(err)
	}
	want = append(want, inTx(true, 2)...)
	if st, err := b.Stats(ctx, "ob"); err != nil || st.Ready != 0 {
		t.Fatalf("the backend's own queue: %+v, %v; want nothing on it", st, err)
	}
	target := newRecorder(t)
	r, err := outbox.New(outbox.Config{Source: b, Target: target, Batch: 2, Logger: slog.New(slog.DiscardHandler)})
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
	if n := countRows(t, b, "_outbox"); n != 0 {
		t.Errorf("%d outbox rows after the relay, want 0", n)
	}
	var why string
	if err := b.db.QueryRow(`SELECT reason FROM ` + b.cfg.Prefix + `_outbox_aside WHERE id = 'big'`).Scan(&why); err != nil || !strings.Contains(why, "past Config.MaxBody") {
		t.Errorf("the big row aside: %q, %v", why, err)
	}
}

// TestOutboxLease: a queue leased by one relay is refused to another
// until released or until its ttl passes without a renewal; a lapsed
// lease deletes nothing.
func TestOutboxLease(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := New(ctx, Config{Path: filepath.Join(t.TempDir(), "lease.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.db.ExecContext(ctx, `INSERT INTO `+b.cfg.Prefix+`_outbox (queue, id, dedupe, body) VALUES ('h', 'a', '', 'x')`); err != nil {
		t.Fatal(err)
	}
	l, err := b.TakeOutbox(ctx, "h", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TakeOutbox(ctx, "h", time.Minute); !errors.Is(err, outbox.ErrHeld) {
		t.Fatalf("a second TakeOutbox: %v, want ErrHeld", err)
	}
	var l2 outbox.Lease
	for l2 == nil { // the first lease lapses
		if l2, err = b.TakeOutbox(ctx, "h", time.Minute); err != nil && !errors.Is(err, outbox.ErrHeld) {
			t.Fatal(err)
		}
		if ctx.Err() != nil {
			t.Fatal("the lease never lapsed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	rows, err := l.Next(ctx, 10)
	if err != nil || len(rows) != 1 {
		t.Fatalf("Next: %v, %v", rows, err)
	}
	if err := l.Delete(ctx, []int64{rows[0].Seq}); !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("Delete on a lapsed lease: %v, want ErrLeaseLost", err)
	}
	if n := countRows(t, b, "_outbox"); n != 1 {
		t.Errorf("%d rows after a refused Delete, want 1", n)
	}
	if err := l2.Delete(ctx, []int64{rows[0].Seq}); err != nil {
		t.Errorf("Delete by the new holder: %v", err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestOutboxUpgrade: a file of schema version 1 (no outbox tables) opens,
// keeps its jobs, and takes outbox jobs.
func TestOutboxUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v1.db")
	b, err := New(ctx, Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Enqueue(ctx, "up", []driver.Message{{Body: []byte("kept")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.ExecContext(ctx, `DROP TABLE asyncplatform_outbox; DROP TABLE asyncplatform_outbox_aside; DROP TABLE asyncplatform_outbox_lease;
		UPDATE asyncplatform_schema SET version = 1`); err != nil {
		t.Fatal(err)
	}
	b.Close()
	b, err = New(ctx, Config{Path: path})
	if err != nil {
		t.Fatalf("opening a version 1 file: %v", err)
	}
	defer b.Close()
	var v int
	if err := b.db.QueryRow(`SELECT version FROM asyncplatform_schema`).Scan(&v); err != nil || v != SchemaVersion {
		t.Errorf("schema version %d, %v; want %d", v, err, SchemaVersion)
	}
	if st, err := b.Stats(ctx, "up"); err != nil || st.Ready != 1 {
		t.Errorf("Stats %+v, %v; want the job kept", st, err)
	}
	tx, err := b.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	if err := b.Enqueue(OutboxTx(ctx, tx), "up", []driver.Message{{ID: "x", Body: []byte("o")}}); err != nil {
		t.Errorf("outbox enqueue after the upgrade: %v", err)
	}
	var _ *sql.Tx = tx
}

// TestOutboxQueuesBounded: the outbox table is untrusted. OutboxQueues
// returns at most outbox.MaxQueues names, each cut past
// driver.MaxQueueLen; the relay leaves the rows of a name too long to
// address in the table (logged) and relays the others.
func TestOutboxQueuesBounded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := New(ctx, Config{Path: filepath.Join(t.TempDir(), "obq.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	long := strings.Repeat("q", 5000)
	ins := `INSERT INTO ` + b.cfg.Prefix + `_outbox (queue, id, dedupe, body) VALUES (?, ?, '', 'x')`
	for _, q := range []string{long, "ok"} {
		if _, err := b.db.ExecContext(ctx, ins, q, "j-"+q[:2]); err != nil {
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
	var logs strings.Builder
	target := newRecorder(t)
	r, err := outbox.New(outbox.Config{Source: b, Target: target, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if got := target.got("ok"); len(got) != 1 {
		t.Errorf("relayed %v to ok, want its one row", got)
	}
	if n := countRows(t, b, "_outbox"); n != 1 {
		t.Errorf("%d outbox rows left, want the long-named one", n)
	}
	if !strings.Contains(logs.String(), "over the limit") {
		t.Errorf("the long name was not logged: %s", logs.String())
	}
	for i := range outbox.MaxQueues + 200 {
		if _, err := b.db.ExecContext(ctx, ins, "q"+strconv.Itoa(i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	if qs, err := b.OutboxQueues(ctx); err != nil || len(qs) != outbox.MaxQueues {
		t.Errorf("OutboxQueues over %d queues: %d names, %v; want %d", outbox.MaxQueues+201, len(qs), err, outbox.MaxQueues)
	}
}
