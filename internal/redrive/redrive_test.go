package redrive

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/enqueue"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/status"
	"github.com/asyncplatform/asyncplatform/internal/unique"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

var quiet = slog.New(slog.DiscardHandler)

// failing is a memory backend whose Enqueue fails while fail is set.
type failing struct {
	*memory.Backend
	fail     atomic.Bool
	enqueues atomic.Int32
}

var errInjected = errors.New("injected store failure")

func (f *failing) Enqueue(ctx context.Context, queue string, msgs []driver.Message) error {
	if f.enqueues.Add(1) > 1 && f.fail.Load() {
		return errInjected
	}
	return f.Backend.Enqueue(ctx, queue, msgs)
}

// bundle is a redrive engine over a failing memory backend, with a status
// tracker that does not track queue "q" (an operator's tool) and one that
// does (the workers').
type bundle struct {
	b       *failing
	rd      *Engine
	workers *status.Tracker
}

func setup(t *testing.T) bundle {
	t.Helper()
	m, err := memory.New(context.Background(), memory.Config{Broker: memory.NewBroker()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	b := &failing{Backend: m}
	st, err := driver.StoreOf(m)
	if err != nil {
		t.Fatal(err)
	}
	tracker := func(all bool) *status.Tracker {
		return status.New(status.Config{Store: kv.Of(st, kv.Status), All: all, Retention: time.Hour, Logger: quiet})
	}
	codec := wire.Codec{MaxBody: 1 << 20}
	own := tracker(false)
	enq := enqueue.New(enqueue.Config{Backend: b, Codec: codec, Status: own, Claims: unique.New(unique.Config{NoStore: driver.ErrNoStore})})
	rd := New(Config{Backend: b, Codec: codec, Enqueue: enq, Status: own, Log: quiet})
	return bundle{b: b, rd: rd, workers: tracker(true)}
}

// dead writes a dead letter of job id on queue "q" and returns it.
func (tb bundle) dead(t *testing.T, id string) Letter {
	t.Helper()
	ctx := context.Background()
	j := wire.Job{ID: id, Type: "t", EnqueuedAt: time.Now(), Failures: 3}
	if err := tb.b.Backend.Enqueue(ctx, "q", []driver.Message{{ID: id, Body: wire.EncodeJob(&j)}}); err != nil {
		t.Fatal(err)
	}
	ds, err := tb.b.Receive(ctx, "q", 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	rec := wire.Dead{Reason: "permanent", Queue: "q", DeadAt: time.Now(), Job: j}
	if err := tb.b.DeadLetter(ctx, ds[0], driver.DeadMessage{ID: id, Body: wire.EncodeDead(&rec)}); err != nil {
		t.Fatal(err)
	}
	return Letter{ID: id, Job: j}
}

func (tb bundle) deadIDs(t *testing.T) []string {
	t.Helper()
	recs, _, err := tb.b.ListDead(context.Background(), "q", "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	slices.Sort(ids)
	return ids
}

func (tb bundle) ready(t *testing.T) int64 {
	t.Helper()
	s, err := tb.b.Stats(context.Background(), "q")
	if err != nil {
		t.Fatal(err)
	}
	return s.Ready
}

// A mixed chunk (one job the workers track, one they do not) whose second
// group fails to store: the first group's record is gone with its job
// stored, the second's stays with its job not stored, and the redrive
// retried stores each job once.
func TestChunkMixedFailureNoDuplicate(t *testing.T) {
	ctx := context.Background()
	tb := setup(t)
	plain, tracked := tb.dead(t, "plain"), tb.dead(t, "tracked")
	tb.workers.Enqueued(ctx, []status.Job{{ID: "tracked", Queue: "q", Type: "t", EnqueuedAt: time.Now()}})

	tb.b.fail.Store(true)
	n, err := tb.rd.Chunk(ctx, "q", []Letter{plain, tracked})
	if !errors.Is(err, errInjected) {
		t.Fatalf("Chunk: %d, %v; want the injected failure", n, err)
	}
	if n != 1 {
		t.Errorf("Chunk counted %d jobs enqueued; want 1 (the untracked group)", n)
	}
	if got := tb.deadIDs(t); !slices.Equal(got, []string{"tracked"}) {
		t.Errorf("records after the failure: %v; want [tracked] (the stored job's record deleted)", got)
	}
	if r := tb.ready(t); r != 1 {
		t.Errorf("ready after the failure: %d; want 1", r)
	}

	tb.b.fail.Store(false)
	var left []Letter // a retried redrive takes the records that stay
	for _, l := range []Letter{plain, tracked} {
		if slices.Contains(tb.deadIDs(t), l.ID) {
			left = append(left, l)
		}
	}
	if _, err := tb.rd.Chunk(ctx, "q", left); err != nil {
		t.Fatalf("retried Chunk: %v", err)
	}
	if got := tb.deadIDs(t); len(got) != 0 {
		t.Errorf("records after the retry: %v; want none", got)
	}
	if r := tb.ready(t); r != 2 {
		t.Errorf("ready after the retry: %d; want 2 (each job once)", r)
	}
	if rec, err := tb.workers.Get(ctx, "tracked"); err != nil || rec.State != status.Waiting {
		t.Errorf("status of the tracked job: %+v, %v; want waiting", rec, err)
	}
}

// A chunk's jobs come back fresh: counters reset, a new copy, a passed
// deadline cleared, and their records deleted.
func TestChunkResetsJobs(t *testing.T) {
	ctx := context.Background()
	tb := setup(t)
	l := tb.dead(t, "a")
	l.Job.Deadline = time.Now().Add(-time.Minute)
	l.Job.NotBefore = time.Now().Add(time.Hour)
	if n, err := tb.rd.Chunk(ctx, "q", []Letter{l}); err != nil || n != 1 {
		t.Fatalf("Chunk: %d, %v", n, err)
	}
	ds, err := tb.b.Receive(ctx, "q", 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var j wire.Job
	if err := wire.DecodeJob(ds[0].Body, &j, nil); err != nil {
		t.Fatal(err)
	}
	if j.Failures != 0 || j.Copy != 1 || !j.Deadline.IsZero() || !j.NotBefore.IsZero() {
		t.Errorf("redriven job: failures %d, copy %d, deadline %v, not before %v; want 0, 1, zero, zero", j.Failures, j.Copy, j.Deadline, j.NotBefore)
	}
	if got := tb.deadIDs(t); len(got) != 0 {
		t.Errorf("records left: %v", got)
	}
}
