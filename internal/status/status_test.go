package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/jobctx"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// clock is the tests' time: fixed, so records can be compared whole.
var clock = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

// writes counts the writes a store is asked for.
type writes struct {
	driver.Store
	n atomic.Int64
}

func (w *writes) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	w.n.Add(1)
	return w.Store.Create(ctx, key, value, ttl)
}

func (w *writes) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	w.n.Add(1)
	return w.Store.Update(ctx, key, value, rev, ttl)
}

// newStore returns the memory backend's store, counting its writes.
func newStore(t *testing.T) *writes {
	t.Helper()
	b, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	d, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	return &writes{Store: d}
}

// newTracker returns a Tracker of every queue over d.
func newTracker(d driver.Store, worker string) *Tracker {
	return New(Config{
		Store: kv.Of(d, kv.Status), All: true, Retention: time.Hour, Worker: worker,
		Timeout: 5 * time.Second, Poll: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now:    func() time.Time { return clock },
	})
}

// flush waits for tk's ends to be written.
func flush(t *testing.T, tk *Tracker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := tk.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

func get(t *testing.T, tk *Tracker, id string) Record {
	t.Helper()
	r, err := tk.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get(%q): %v", id, err)
	}
	return r
}

// deliver takes a delivery of j through Begin and Running; it fails the
// test when the job is not tracked or was cancelled.
func deliver(t *testing.T, tk *Tracker, j Job) *Track {
	t.Helper()
	ctx := context.Background()
	tr, cancelled := tk.Begin(ctx, j)
	if tr == nil || cancelled {
		t.Fatalf("Begin(%+v) = %v, cancelled %v; want a track", j, tr, cancelled)
	}
	if tr.Running(ctx) {
		t.Fatalf("Running(%+v): cancelled", j)
	}
	return tr
}

// The stored bytes are the ones every version of the platform reads and
// writes: a record decodes from them and encodes to them unchanged.
func TestRecordFormat(t *testing.T) {
	t.Parallel()
	for _, stored := range []string{
		`{"id":"j1","queue":"q","type":"t","state":"dead_lettered","tries":3,"failures":2,"crashes":1,"reason":"retries_exceeded","error":"boom","result":"cg==","result_size":1,"retry_at":"2026-11-29T10:00:00Z","enqueued_at":"2026-11-29T09:00:00Z","started_at":"2026-11-29T09:59:00Z","updated_at":"2026-11-29T10:00:00Z","worker":"w","cancel_requested":true,"copy":4}`,
		`{"id":"j2","queue":"","type":"","state":"waiting","tries":0,"failures":0,"crashes":0,"updated_at":"2026-11-29T10:00:00Z"}`,
		`{"id":"j3","queue":"q","type":"t","state":"retrying","tries":1,"failures":1,"crashes":0,"updated_at":"2026-11-29T10:00:00Z","history":{"changes":[{"state":"waiting","at":"2026-11-29T09:00:00Z"},{"state":"running","at":"2026-11-29T09:59:00Z","try":1},{"state":"retrying","at":"2026-11-29T10:00:00Z","try":1,"reason":"boom"}],"dropped":2}}`,
	} {
		var r Record
		if err := json.Unmarshal([]byte(stored), &r); err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != stored {
			t.Errorf("record encodes as\n%s\nwant\n%s", b, stored)
		}
	}
}

// Each decision a delivery is settled by leads to its state, with the
// counters, the error, the result and the time of the settle.
func TestSettledStates(t *testing.T) {
	t.Parallel()
	retryAt := clock.Add(time.Minute)
	big := bytes.Repeat([]byte("x"), MaxResult+1)
	tests := []struct {
		name   string
		d      decide.Decision
		result []byte
		want   Record // the fields the settle sets
		why    string // the reason of the end's change in the history
	}{
		{name: "Succeeded", d: decide.Decision{Outcome: decide.Succeeded}, result: []byte("ok"),
			want: Record{State: Succeeded, Result: []byte("ok"), ResultSize: 2}},
		{name: "SucceededResultTooLarge", d: decide.Decision{Outcome: decide.Succeeded}, result: big,
			want: Record{State: Succeeded, ResultSize: len(big)}},
		{name: "Retried", d: decide.Decision{Outcome: decide.Retried, RetryAt: retryAt, Failures: 2},
			want: Record{State: Retrying, RetryAt: retryAt, Failures: 2}, why: "boom"},
		{name: "Rejected", d: decide.Decision{Outcome: decide.Rejected, RetryAt: retryAt},
			want: Record{State: Scheduled, RetryAt: retryAt}, why: "rejected"},
		{name: "Requeued", d: decide.Decision{Outcome: decide.Requeued, RetryAt: retryAt},
			want: Record{State: Scheduled, RetryAt: retryAt}, why: "requeued"},
		{name: "HandedBack", d: decide.Decision{Outcome: decide.HandedBack},
			want: Record{State: Waiting}, why: "handed_back"},
		{name: "DeadLettered", d: decide.Decision{Outcome: decide.DeadLettered, Reason: decide.Permanent, Failures: 2, Crashes: 1},
			want: Record{State: DeadLettered, Reason: string(decide.Permanent), Failures: 2, Crashes: 1}, why: "permanent"},
		{name: "Cancelled", d: decide.Decision{Outcome: decide.DeadLettered, Reason: decide.Cancelled},
			want: Record{State: Cancelled, Reason: string(decide.Cancelled)}, why: "cancelled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tk := newTracker(newStore(t), "w1")
			tr := deliver(t, tk, Job{ID: "j1", Queue: "q", Type: "t", Copy: 3, TryCount: 1, Failures: 1, EnqueuedAt: clock.Add(-time.Hour)})
			tr.Settled(context.Background(), tt.d, 2, tt.result, "boom")
			want := tt.want
			want.ID, want.Queue, want.Type, want.Copy, want.Tries, want.Error = "j1", "q", "t", 3, 2, "boom"
			want.EnqueuedAt, want.StartedAt, want.UpdatedAt, want.Worker = clock.Add(-time.Hour), clock, clock, "w1"
			want.History.Changes = []Change{{State: Running, At: clock, Try: 2}, {State: want.State, At: clock, Try: 2, Reason: tt.why}}
			got := get(t, tk, "j1")
			gb, _ := json.Marshal(got)
			wb, _ := json.Marshal(want)
			if !bytes.Equal(gb, wb) {
				t.Errorf("record\n%s\nwant\n%s", gb, wb)
			}
		})
	}
}

// The status written at Enqueue, after the job is stored, never replaces
// the state a worker that took the job meanwhile wrote; a redriven job (a
// newer copy) does replace its old end.
func TestEnqueuedRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tk := newTracker(newStore(t), "w1")
	tr := deliver(t, tk, Job{ID: "j1", Queue: "q", Type: "t"})
	tr.Settled(ctx, decide.Decision{Outcome: decide.Succeeded}, 1, nil, "")
	tk.Enqueued(ctx, []Job{{ID: "j1", Queue: "q", Type: "t"}}) // the producer, late
	if r := get(t, tk, "j1"); r.State != Succeeded {
		t.Errorf("after a late enqueue write: %+v; want the worker's succeeded kept", r)
	}
	tk.Enqueued(ctx, []Job{{ID: "j1", Queue: "q", Type: "t", Copy: 1}}) // a redrive
	if r := get(t, tk, "j1"); r.State != Waiting || r.Copy != 1 {
		t.Errorf("after a redrive: %+v; want waiting, copy 1", r)
	}
	tk.Enqueued(ctx, []Job{{ID: "j2", Queue: "q", Type: "t", NotBefore: clock.Add(time.Hour)}})
	if r := get(t, tk, "j2"); r.State != Scheduled || !r.RetryAt.Equal(clock.Add(time.Hour)) {
		t.Errorf("a job due later: %+v; want scheduled at its NotBefore", r)
	}
}

// A retry's copy can run, and end, before the attempt that scheduled it has
// written its own end (the retrying state). That late write must not replace
// the later copy's state: a status left at retrying would never turn
// terminal. The same holds for an earlier try of the same copy.
func TestLateSettleOfOlderCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tk := newTracker(newStore(t), "w1")
	retried := decide.Decision{Outcome: decide.Retried, RetryAt: clock.Add(time.Minute), Failures: 1}

	first := deliver(t, tk, Job{ID: "j1", Queue: "q", Type: "t", Copy: 1, TryCount: 1})
	second := deliver(t, tk, Job{ID: "j1", Queue: "q", Type: "t", Copy: 2, TryCount: 2})
	second.Settled(ctx, decide.Decision{Outcome: decide.Succeeded}, 3, nil, "")
	first.Settled(ctx, retried, 2, nil, "late") // copy 1's end, late
	if r := get(t, tk, "j1"); r.State != Succeeded || r.Copy != 2 {
		t.Errorf("after a late write of copy 1's end: %+v; want copy 2 succeeded", r)
	}

	earlier := deliver(t, tk, Job{ID: "j2", Queue: "q", Type: "t", Copy: 1, TryCount: 1})
	later := deliver(t, tk, Job{ID: "j2", Queue: "q", Type: "t", Copy: 1, TryCount: 2}) // a redelivery after a lost lease
	later.Settled(ctx, decide.Decision{Outcome: decide.Succeeded}, 3, nil, "")
	earlier.Settled(ctx, retried, 2, nil, "late")
	if r := get(t, tk, "j2"); r.State != Succeeded || r.Tries != 3 {
		t.Errorf("after a late write of an earlier try: %+v; want try 3 succeeded", r)
	}
}

// An older copy that comes again after a later copy ended writes nothing:
// its attempt leaves the later copy's end in place. The hooks of an
// untracked delivery (a nil Track) do nothing.
func TestDuplicateOlderCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tk := newTracker(newStore(t), "w1")
	deliver(t, tk, Job{ID: "j1", Queue: "q", Type: "t", Copy: 2, TryCount: 1}).
		Settled(ctx, decide.Decision{Outcome: decide.Succeeded}, 2, nil, "")
	flush(t, tk)
	tr := deliver(t, tk, Job{ID: "j1", Queue: "q", Type: "t", Copy: 1})
	if r := get(t, tk, "j1"); r.State != Succeeded || r.Copy != 2 {
		t.Errorf("status while an old copy runs again: %+v; want copy 2's succeeded kept", r)
	}
	tr.Ended(ctx, true)
	tr.Settled(ctx, decide.Decision{Outcome: decide.Retried}, 1, nil, "")
	if r := get(t, tk, "j1"); r.State != Succeeded || r.Copy != 2 {
		t.Errorf("status after an old copy ran again, here: %+v; want copy 2's succeeded kept", r)
	}
	flush(t, tk)
	if r := get(t, tk, "j1"); r.State != Succeeded || r.Copy != 2 {
		t.Errorf("status after an old copy ran again: %+v; want copy 2's succeeded kept", r)
	}

	var none *Track
	if none.Running(ctx) || none.Ended(ctx, true) {
		t.Error("a nil Track reported a cancellation")
	}
	none.Started(&jobctx.Context{Parent: ctx})
	none.Settled(ctx, decide.Decision{Outcome: decide.Retried}, 1, nil, "")
	none.Unsettled(ctx)
}

// A job a limit keeps refusing costs one status write, not one per refusal;
// a refusal of a job whose record says running (another delivery runs it)
// costs none.
func TestDeferredWritesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	tk := newTracker(d, "w1")
	j := Job{ID: "j1", Queue: "q", Type: "t"}
	tk.Enqueued(ctx, []Job{j})
	refuse := func(wait time.Duration) {
		tr, _ := tk.Begin(ctx, j)
		tr.Settled(ctx, decide.Decision{Outcome: decide.Deferred, RetryAt: clock.Add(wait)}, 0, nil, "")
		flush(t, tk)
	}
	before := d.n.Load()
	refuse(time.Minute)
	if n := d.n.Load() - before; n != 1 {
		t.Errorf("the first refusal wrote %d times, want 1", n)
	}
	r := get(t, tk, "j1")
	if r.State != Scheduled || !r.RetryAt.Equal(clock.Add(time.Minute)) {
		t.Errorf("after the first refusal: %+v; want scheduled, due in a minute", r)
	}
	before = d.n.Load()
	for i := range 5 {
		refuse(time.Duration(i+2) * time.Minute)
	}
	if n := d.n.Load() - before; n != 0 {
		t.Errorf("5 more refusals wrote %d times, want 0", n)
	}
	if got := get(t, tk, "j1"); !got.RetryAt.Equal(r.RetryAt) {
		t.Errorf("RetryAt %v after more refusals, want the first's %v", got.RetryAt, r.RetryAt)
	}

	running := deliver(t, tk, Job{ID: "j2", Queue: "q", Type: "t"})
	defer running.Ended(ctx, false)
	tr, _ := tk.Begin(ctx, Job{ID: "j2", Queue: "q", Type: "t"}) // a duplicate delivery, refused
	before = d.n.Load()
	tr.Settled(ctx, decide.Decision{Outcome: decide.Deferred, RetryAt: clock.Add(time.Minute)}, 0, nil, "")
	flush(t, tk)
	if n := d.n.Load() - before; n != 0 {
		t.Errorf("refusing a duplicate of a running job wrote %d times, want 0", n)
	}
	if r := get(t, tk, "j2"); r.State != Running {
		t.Errorf("record %+v; want the running delivery's", r)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	tk := newTracker(d, "w1")
	if err := tk.Cancel(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Cancel of an unknown job: %v, want ErrNotFound", err)
	}
	j := Job{ID: "j1", Queue: "q", Type: "t"}
	tk.Enqueued(ctx, []Job{j})
	for range 2 { // twice is no error
		if err := tk.Cancel(ctx, "j1"); err != nil {
			t.Fatal(err)
		}
	}
	if r := get(t, tk, "j1"); !r.CancelRequested || r.State != Waiting {
		t.Errorf("cancelled waiting job: %+v; want waiting, cancel requested", r)
	}
	tr, cancelled := tk.Begin(ctx, j)
	if !cancelled {
		t.Error("Begin of a cancelled job did not say so")
	}
	if !tr.Running(ctx) {
		t.Error("Running of a cancelled job did not say so")
	}
	tr.Settled(ctx, decide.Decision{Outcome: decide.DeadLettered, Reason: decide.Cancelled}, 0, nil, "")
	flush(t, tk)
	if r := get(t, tk, "j1"); r.State != Cancelled {
		t.Errorf("record %+v, want cancelled", r)
	}
	if _, _, err := d.Get(ctx, kv.Status.Prefix()+"cancel/j1"); !errors.Is(err, driver.ErrKeyNotFound) {
		t.Errorf("the cancel mark of a cancelled job: %v, want it deleted", err)
	}
	if err := tk.Cancel(ctx, "j1"); !errors.Is(err, ErrFinished) {
		t.Errorf("Cancel of a finished job: %v, want ErrFinished", err)
	}
}

// A Cancel after Begin's read does not stop Running: the job is running
// from Begin on, and the poll ends its handler. Get keeps the mark.
func TestCancelAfterBegin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tk := newTracker(newStore(t), "w1")
	j := Job{ID: "j1", Queue: "q", Type: "t"}
	tk.Enqueued(ctx, []Job{j})
	tr, cancelled := tk.Begin(ctx, j)
	if cancelled {
		t.Fatal("cancelled before Cancel")
	}
	if err := tk.Cancel(ctx, "j1"); err != nil {
		t.Fatal(err)
	}
	if tr.Running(ctx) {
		t.Error("Running after Begin's read said cancelled: the poll carries a later Cancel")
	}
	if r := get(t, tk, "j1"); r.State != Running || !r.CancelRequested {
		t.Errorf("record %+v; want running with the cancel mark kept", r)
	}
	hctx := &jobctx.Context{Parent: ctx}
	tr.Started(hctx)
	tk.pollOnce(ctx)
	if !errors.Is(context.Cause(hctx), ErrCancelled) {
		t.Errorf("after a poll the handler's context is %v, want ErrCancelled", context.Cause(hctx))
	}
}

// The running state costs no write while the handler is quick: a delivery
// settled before a poll interval writes once, its end. This process shows
// it running meanwhile; another sees the enqueue's state until the poll
// writes running (a handler running a poll interval), and a duplicate
// delivery here sees it running.
func TestRunningWrittenLate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	tk, other := newTracker(d, "w1"), newTracker(d, "w2")
	tk.cfg.Poll = time.Hour // a loaded machine's pause is no poll interval
	j := Job{ID: "j1", Queue: "q", Type: "t", TryCount: 1}
	tk.Enqueued(ctx, []Job{j})

	before := d.n.Load()
	tr := deliver(t, tk, j)
	if r := get(t, tk, "j1"); r.State != Running || r.Tries != 2 || r.Worker != "w1" {
		t.Errorf("here, while it runs: %+v; want running, try 2, worker w1", r)
	}
	if r := get(t, other, "j1"); r.State != Waiting {
		t.Errorf("elsewhere, before the poll: %+v; want waiting", r)
	}
	if n := d.n.Load() - before; n != 0 {
		t.Errorf("Begin and Running wrote %d times, want 0", n)
	}
	tk.flushRunning(ctx) // a poll before the interval has passed: nothing
	if n := d.n.Load() - before; n != 0 {
		t.Errorf("a poll within the interval wrote %d times, want 0", n)
	}
	tr.Started(&jobctx.Context{Parent: ctx})
	tr.Ended(ctx, false)
	tr.Settled(ctx, decide.Decision{Outcome: decide.Succeeded}, 2, nil, "")
	flush(t, tk)
	if n := d.n.Load() - before; n != 1 {
		t.Errorf("a quick delivery wrote %d times, want 1 (its end)", n)
	}
	if r := get(t, other, "j1"); r.State != Succeeded || r.Tries != 2 || !r.StartedAt.Equal(clock) {
		t.Errorf("after the settle: %+v; want succeeded, try 2, started at the clock", r)
	}

	j2 := Job{ID: "j2", Queue: "q", Type: "t"}
	tk.Enqueued(ctx, []Job{j2})
	long := deliver(t, tk, j2)
	long.wmu.Lock()
	long.since = time.Now().Add(-time.Hour) // it has run for an interval
	long.wmu.Unlock()
	before = d.n.Load()
	tk.flushRunning(ctx)
	tk.flushRunning(ctx)
	if r := get(t, other, "j2"); r.State != Running || r.Worker != "w1" {
		t.Errorf("elsewhere, after the poll: %+v; want running on w1", r)
	}
	long.Settled(ctx, decide.Decision{Outcome: decide.Succeeded}, 1, nil, "")
	flush(t, tk)
	if n := d.n.Load() - before; n != 2 {
		t.Errorf("a long delivery wrote %d times, want 2 (running once, its end)", n)
	}
}

// A delivery that ends without a settle (its lease lost) leaves the running
// state its try would have left, for the next attempt to write over.
func TestUnsettledWritesRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tk := newTracker(newStore(t), "w1")
	j := Job{ID: "j1", Queue: "q", Type: "t", TryCount: 2}
	tk.Enqueued(ctx, []Job{j})
	tr := deliver(t, tk, j)
	tr.Ended(ctx, false)
	tr.Unsettled(ctx)
	tr.Settled(ctx, decide.Decision{Outcome: decide.Succeeded}, 3, nil, "") // dropped: no write
	if r := get(t, tk, "j1"); r.State != Running || r.Tries != 3 {
		t.Errorf("after a delivery unsettled: %+v; want running, try 3", r)
	}
}

// A running job's context ends with ErrCancelled when another process
// cancels it; the poll stops with its context.
func TestCancelRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	worker, other := newTracker(d, "w1"), newTracker(d, "w2")
	pollCtx, stop := context.WithCancel(ctx)
	polled := make(chan struct{})
	go func() { defer close(polled); worker.Poll(pollCtx) }()
	defer func() {
		stop()
		select {
		case <-polled:
		case <-time.After(10 * time.Second):
			t.Error("Poll did not return when its context ended")
		}
	}()

	id := strings.Repeat("long/id ", 40) // not a key segment: hashed
	worker.Enqueued(ctx, []Job{{ID: id, Queue: "q", Type: "t"}})
	tr := deliver(t, worker, Job{ID: id, Queue: "q", Type: "t"})
	hctx := &jobctx.Context{Parent: ctx}
	tr.Started(hctx)
	if err := other.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hctx.Done():
		if !errors.Is(hctx.Err(), ErrCancelled) || !errors.Is(hctx.Err(), context.Canceled) {
			t.Errorf("handler context ended with %v, want ErrCancelled", hctx.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the running job's context did not end")
	}
	if !tr.Ended(ctx, false) {
		t.Error("Ended of a cancelled job did not say so")
	}
	if n := worker.n.Load(); n != 0 {
		t.Errorf("%d jobs held as running after Ended, want 0", n)
	}
}

// A handler that fails before the poll sees its cancellation is still
// cancelled: Ended looks for the mark itself. One that succeeds is not.
func TestEndedLooksForTheMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tk := newTracker(newStore(t), "w1") // never polls
	tk.Enqueued(ctx, []Job{{ID: "j1", Queue: "q", Type: "t"}})
	for i, failed := range []bool{true, false} {
		tr := deliver(t, tk, Job{ID: "j1", Queue: "q", Type: "t", Copy: uint64(i)})
		tr.Started(&jobctx.Context{Parent: ctx})
		if err := tk.Cancel(ctx, "j1"); err != nil {
			t.Fatal(err)
		}
		if got := tr.Ended(ctx, failed); got != failed {
			t.Errorf("Ended(failed=%v) = %v, want %v", failed, got, failed)
		}
		tr.Settled(ctx, decide.Decision{Outcome: decide.Succeeded}, 1, nil, "")
		tk.Enqueued(ctx, []Job{{ID: "j1", Queue: "q", Type: "t", Copy: uint64(i + 1)}}) // a new life, for the next turn
	}
}

// Only the queues configured are tracked; without a store none is, and Get
// and Cancel say why.
func TestTracks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	tk := New(Config{Store: kv.Of(d, kv.Status), Queues: []string{"a"}, Retention: time.Hour})
	if !tk.Tracks("a") || tk.Tracks("b") {
		t.Errorf("Tracks(a), Tracks(b) = %v, %v; want true, false", tk.Tracks("a"), tk.Tracks("b"))
	}
	tk.Enqueued(ctx, []Job{{ID: "j1", Queue: "b"}})
	if tr, _ := tk.Begin(ctx, Job{ID: "j1", Queue: "b"}); tr != nil {
		t.Error("Begin on an untracked queue gave a Track")
	}
	if _, err := tk.Get(ctx, "j1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of a job of an untracked queue: %v, want ErrNotFound", err)
	}

	none := New(Config{All: true})
	if none.Tracks("a") {
		t.Error("a Tracker without a store tracks a queue")
	}
	if _, err := none.Get(ctx, "j1"); !errors.Is(err, driver.ErrNoStore) {
		t.Errorf("Get without a store: %v, want ErrNoStore", err)
	}
	if err := none.Cancel(ctx, "j1"); !errors.Is(err, driver.ErrNoStore) {
		t.Errorf("Cancel without a store: %v, want ErrNoStore", err)
	}
	none.Poll(ctx) // returns at once
}

// A record is bound to its enqueue: a delivery naming the job's ID with
// another nonce (or none), or a copy number far ahead of the record's,
// writes nothing and cannot be cancelled through the record; the real
// copies still write it. A forged delivery that came before the enqueue
// loses the record to it.
func TestForgedCopyIgnored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tk := newTracker(newStore(t), "w1")
	tk.Enqueued(ctx, []Job{{ID: "j1", Queue: "q", Type: "t", Nonce: "real"}})
	for _, forged := range []Job{
		{ID: "j1", Queue: "q", Type: "t", Copy: 1 << 62, Nonce: "forged"},
		{ID: "j1", Queue: "q", Type: "t", Copy: 1 << 62},
		{ID: "j1", Queue: "q", Type: "t", Copy: 1, Nonce: "forged"},
		{ID: "j1", Queue: "q", Type: "t", Copy: 1},
		{ID: "j1", Queue: "q", Type: "t", Copy: MaxCopyLead + 1, Nonce: "real"}, // the nonce read off the broker
	} {
		if tr, _ := tk.Begin(ctx, forged); tr != nil {
			tr.Running(ctx)
			tr.Settled(ctx, decide.Decision{Outcome: decide.Succeeded}, 1, []byte("forged"), "")
		}
		flush(t, tk)
		if r := get(t, tk, "j1"); r.State != Waiting || r.Copy != 0 || r.Result != nil {
			t.Fatalf("after a forged copy %d (nonce %q): %+v; want the enqueue's waiting record", forged.Copy, forged.Nonce, r)
		}
	}
	if err := tk.Cancel(ctx, "j1"); err != nil {
		t.Fatalf("Cancel after forged copies: %v", err)
	}
	real, cancelled := tk.Begin(ctx, Job{ID: "j1", Queue: "q", Type: "t", Copy: MaxCopyLead, Nonce: "real"})
	if real == nil || !cancelled {
		t.Fatalf("the real copy: Begin = %v, cancelled %v; want its track, cancelled", real, cancelled)
	}
	real.Settled(ctx, decide.Decision{Outcome: decide.DeadLettered, Reason: decide.Cancelled}, 1, nil, "")
	flush(t, tk)
	if r := get(t, tk, "j1"); r.State != Cancelled || r.Nonce != "real" || r.Copy != MaxCopyLead {
		t.Fatalf("the real copy's end: %+v", r)
	}

	// A forged delivery before the enqueue writes a record; the enqueue
	// replaces it.
	if tr, _ := tk.Begin(ctx, Job{ID: "j2", Queue: "q", Type: "t", Copy: 1 << 62, Nonce: "forged"}); tr != nil {
		tr.Running(ctx)
		tr.Settled(ctx, decide.Decision{Outcome: decide.Succeeded}, 1, []byte("forged"), "")
	}
	flush(t, tk)
	tk.Enqueued(ctx, []Job{{ID: "j2", Queue: "q", Type: "t", Nonce: "real"}})
	if r := get(t, tk, "j2"); r.State != Waiting || r.Nonce != "real" || r.Copy != 0 {
		t.Fatalf("the enqueue after a forged record: %+v; want its waiting record", r)
	}
}

// The records of a batch are created together: one call where the store
// batches. A record present already is decided alone: a worker's later
// state of the same enqueue stays.
func TestEnqueuedBatchAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &batcher{Store: newStore(t)}
	tk := newTracker(b, "w1")
	jobs := make([]Job, 48)
	for i := range jobs {
		jobs[i] = Job{ID: fmt.Sprintf("j%d", i), Queue: "q", Type: "t", Nonce: "n"}
	}
	settle(t, tk, jobs[0]) // taken and ended before its enqueue's record is written
	flush(t, tk)
	b.mu.Lock()
	b.createEach = nil // the end's
	b.mu.Unlock()
	tk.Enqueued(ctx, jobs)
	if r := get(t, tk, "j0"); r.State != Succeeded {
		t.Errorf("record of j0: %+v; want the worker's succeeded kept", r)
	}
	for _, j := range jobs[1:] {
		if r := get(t, tk, j.ID); r.State != Waiting {
			t.Fatalf("record of %s: %+v; want waiting", j.ID, r)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.createEach) != 1 || b.createEach[0] != len(jobs) {
		t.Errorf("CreateEach calls of %v items, want one of %d", b.createEach, len(jobs))
	}
}

// cancelReadFails is a store whose reads of cancel marks fail.
type cancelReadFails struct{ driver.Store }

func (s cancelReadFails) Get(ctx context.Context, key string) ([]byte, string, error) {
	if strings.Contains(key, "cancel/") {
		return nil, "", errors.New("store unreachable")
	}
	return s.Store.Get(ctx, key)
}

// A failed attempt whose cancel-mark read fails logs the job while the
// poll writes its running state: the log reads nothing the poll writes
// (run with -race).
func TestEndedWarnsWhileThePollWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var logged bytes.Buffer
	tk := New(Config{
		Store: kv.Of(cancelReadFails{newStore(t)}, kv.Status), All: true, Retention: time.Hour, Worker: "w1",
		Timeout: 5 * time.Second, Poll: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logged, nil)),
		Now:    func() time.Time { return clock },
	})
	j := Job{ID: "j1", Queue: "q", Type: "t"}
	tk.Enqueued(ctx, []Job{j})
	tr := deliver(t, tk, j)
	tr.Started(&jobctx.Context{Parent: ctx})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		tr.flushRunning(ctx, time.Now().Add(time.Hour)) // the poll writes the running state
	}()
	if tr.Ended(ctx, true) {
		t.Error("Ended = cancelled, with no cancel mark readable")
	}
	<-polled
	if !strings.Contains(logged.String(), "id=j1") {
		t.Errorf("the warning does not name the job:\n%s", logged.String())
	}
}
