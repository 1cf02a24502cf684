package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/admit"
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/health"
	"github.com/asyncplatform/asyncplatform/internal/pause"
	"github.com/asyncplatform/asyncplatform/internal/status"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// view is the handler's job in these tests.
type view struct{ ID string }

// calls records what the executor asked of its dependencies.
type calls struct {
	mu       sync.Mutex
	released []string // "id dead=…"
	reported []decide.Outcome
	dead     []*wire.Dead
	parked   []driver.Message
	park     error // what Park returns
}

func (c *calls) Group(context.Context, string, string, string) decide.Group { return decide.GroupOpen }

func (c *calls) Park(_ context.Context, _, _, _ string, msg driver.Message, ack func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.park != nil {
		return c.park
	}
	c.parked = append(c.parked, msg)
	return ack()
}

// harness is an Executor over a memory backend, with every dependency
// recorded.
type harness struct {
	b     driver.Backend
	x     *Executor[view]
	calls *calls
}

func newHarness(t *testing.T, maxBody int) *harness {
	t.Helper()
	b, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	var g health.Gate
	g.Init(nil)
	gate, err := admit.New(admit.Config{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c := &calls{}
	h := &harness{b: b, calls: c}
	h.x = New(Config[view]{
		Backend: b, Codec: wire.Codec{MaxBody: maxBody}, Log: quiet, Health: &g,
		Worker: "w", Lease: time.Minute, ErrorHistory: 20, MaxErrorText: 64 << 10, MinDeadError: 256,
		GroupPoll: time.Second, Base: decide.Input{RejectDelay: time.Second},
		Status: status.New(status.Config{}), Admission: gate, Groups: c,
		Report: func(j *Job, d decide.Decision, _ string, _ []byte) error {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.reported = append(c.reported, d.Outcome)
			return nil
		},
		Release: func(j *Job, dead bool) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.released = append(c.released, j.ID+map[bool]string{true: " dead", false: " done"}[dead])
		},
		OnDead: func(_ string, rec *wire.Dead) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.dead = append(c.dead, rec)
		},
	})
	return h
}

// deliver enqueues j on queue q and returns its delivery, decoded.
func (h *harness) deliver(t *testing.T, j *wire.Job) *Delivery[view] {
	t.Helper()
	ctx := context.Background()
	if err := h.b.Enqueue(ctx, "q", []driver.Message{{ID: wire.MessageID(j.ID, j.Copy), Body: h.x.cfg.Codec.Encode("q", j)}}); err != nil {
		t.Fatal(err)
	}
	ds, err := h.b.Receive(ctx, "q", 1, time.Second)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive: %d deliveries, %v", len(ds), err)
	}
	f := &Delivery[view]{D: ds[0]}
	f.Job.Job = new(Job)
	if err := h.x.decode(f.D, f.Job.Job, nil); err != nil {
		t.Fatal(err)
	}
	return f
}

// next takes the queue's next message (ready or not yet due) and decodes it.
func (h *harness) next(t *testing.T) (*Job, bool) {
	t.Helper()
	ds, err := h.b.Receive(context.Background(), "q", 1, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) == 0 {
		return nil, false
	}
	var j Job
	if err := h.x.decode(ds[0], &j, nil); err != nil {
		t.Fatal(err)
	}
	return &j, true
}

// TestSettleTable: every decision a delivery can end with is settled by one
// function, and each row says what it writes: the next copy (and when it is
// due), the dead letter, the output report, the unique key's release and
// the dead-letter hook.
func TestSettleTable(t *testing.T) {
	t.Parallel()
	type want struct {
		copyDue   time.Duration // the next copy is due after about this; -1: no next copy
		failures  int           // the next copy's or the dead letter's
		unhandled int
		dead      decide.Reason // a dead letter with this reason
		reported  bool          // an output report was published first
		released  string        // the unique key's release: "", "done" or "dead"
	}
	rows := []struct {
		name string
		d    decide.Decision
		want want
	}{
		{"Succeeded", decide.Decision{Outcome: decide.Succeeded}, want{copyDue: -1, reported: true, released: "done"}},
		{"Retried", decide.Decision{Outcome: decide.Retried, Failures: 3, RetryAt: time.Now().Add(time.Hour)}, want{copyDue: time.Hour, failures: 3}},
		{"Rejected", decide.Decision{Outcome: decide.Rejected, Failures: 2, RetryAt: time.Now().Add(time.Minute)}, want{copyDue: time.Minute, failures: 2}},
		{"Requeued", decide.Decision{Outcome: decide.Requeued, Unhandled: 4, RetryAt: time.Now().Add(time.Minute)}, want{copyDue: time.Minute, failures: 2, unhandled: 4}},
		{"HandedBack", decide.Decision{Outcome: decide.HandedBack}, want{copyDue: 0, failures: 2}},
		{"Deferred", decide.Decision{Outcome: decide.Deferred, RetryAt: time.Now().Add(time.Minute)}, want{copyDue: time.Minute, failures: 2}},
		{"DeadLettered", decide.Decision{Outcome: decide.DeadLettered, Reason: decide.RetriesExceeded, Failures: 5, Why: "why"}, want{copyDue: -1, failures: 5, dead: decide.RetriesExceeded, reported: true, released: "dead"}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, 1<<20)
			f := h.deliver(t, &wire.Job{ID: "job", Type: "t", Failures: 2, Copy: 1, EnqueuedAt: time.Now()})
			before := time.Now()
			if err := h.x.settle(f, f.Job.Job, r.d, "", nil); err != nil {
				t.Fatalf("settle: %v", err)
			}
			st, err := h.b.Stats(context.Background(), "q")
			if err != nil {
				t.Fatal(err)
			}
			if st.InFlight != 0 {
				t.Errorf("%d deliveries still held after the settle", st.InFlight)
			}
			switch {
			case r.want.copyDue < 0 && st.Ready+st.Scheduled != 0:
				t.Errorf("a next copy was written (%d ready, %d scheduled)", st.Ready, st.Scheduled)
			case r.want.copyDue == 0:
				if st.Ready != 1 {
					t.Fatalf("%d ready, %d scheduled; want the next copy ready now", st.Ready, st.Scheduled)
				}
				j, ok := h.next(t)
				if !ok || j.Copy != 2 || j.Failures != r.want.failures || j.Crashes != 0 {
					t.Errorf("the next copy: %+v (found %v), want copy 2, %d failures, no crash", j, ok, r.want.failures)
				}
			case r.want.copyDue > 0:
				if st.Scheduled != 1 {
					t.Fatalf("%d scheduled, want the next copy scheduled", st.Scheduled)
				}
				recs, _, _ := h.b.ListDead(context.Background(), "q", "", 10)
				if len(recs) != 0 {
					t.Errorf("a dead letter was written for %s", r.name)
				}
			}
			if r.want.copyDue > 0 {
				// The next copy's NotBefore is set to the decision's time:
				// read it through the copy a requeue encodes.
				j := *f.Job.Job
				if due := j.NotBefore.Sub(before); due < r.want.copyDue-time.Second || due > r.want.copyDue+time.Second {
					t.Errorf("the next copy is due after %v, want about %v", due, r.want.copyDue)
				}
				if j.Copy != 2 || j.Failures != r.want.failures || j.Unhandled != r.want.unhandled {
					t.Errorf("the next copy: copy %d, %d failures, %d unhandled; want 2, %d, %d", j.Copy, j.Failures, j.Unhandled, r.want.failures, r.want.unhandled)
				}
			}
			recs, _, err := h.b.ListDead(context.Background(), "q", "", 10)
			if err != nil {
				t.Fatal(err)
			}
			if r.want.dead != "" {
				if len(recs) != 1 || len(h.calls.dead) != 1 {
					t.Fatalf("%d dead letters, %d hook calls; want 1 and 1", len(recs), len(h.calls.dead))
				}
				var rec wire.Dead
				if err := wire.DecodeDead(recs[0].Body, &rec); err != nil {
					t.Fatal(err)
				}
				if rec.Reason != string(r.want.dead) || rec.Job.Failures != r.want.failures || rec.Error != "why" || rec.Worker != "w" || recs[0].ID != "job.1" {
					t.Errorf("dead letter %s: reason %q, %d failures, error %q, worker %q", recs[0].ID, rec.Reason, rec.Job.Failures, rec.Error, rec.Worker)
				}
			} else if len(recs) != 0 || len(h.calls.dead) != 0 {
				t.Errorf("%d dead letters, %d hook calls; want none", len(recs), len(h.calls.dead))
			}
			if got := len(h.calls.reported) == 1; got != r.want.reported {
				t.Errorf("reported %v, want a report %v", h.calls.reported, r.want.reported)
			}
			wantRel := []string(nil)
			if r.want.released != "" {
				wantRel = []string{"job " + r.want.released}
			}
			if strings.Join(h.calls.released, ",") != strings.Join(wantRel, ",") {
				t.Errorf("unique key released %q, want %q", h.calls.released, wantRel)
			}
		})
	}
}

// A paused group's job is set aside as its next copy; when that fails it
// comes again later instead, uncounted.
func TestSettleParked(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1<<20)
	f := h.deliver(t, &wire.Job{ID: "job", Type: "t", Failures: 1, EnqueuedAt: time.Now()})
	if err := h.x.settle(f, f.Job.Job, decide.Decision{Outcome: decide.Parked}, "", nil); err != nil {
		t.Fatal(err)
	}
	if len(h.calls.parked) != 1 || h.calls.parked[0].ID != "job.1" {
		t.Fatalf("parked %+v, want the job's copy 1", h.calls.parked)
	}
	if st, _ := h.b.Stats(context.Background(), "q"); st.InFlight+st.Ready+st.Scheduled != 0 {
		t.Errorf("the parked job's delivery was not acknowledged: %+v", st)
	}

	h = newHarness(t, 1<<20)
	h.calls.park = fmt.Errorf("%w: the broker refused the write", pause.ErrNotParked)
	f = h.deliver(t, &wire.Job{ID: "job", Type: "t", Failures: 1, EnqueuedAt: time.Now()})
	if err := h.x.settle(f, f.Job.Job, decide.Decision{Outcome: decide.Parked}, "", nil); err != nil {
		t.Fatal(err)
	}
	if st, _ := h.b.Stats(context.Background(), "q"); st.Scheduled != 1 {
		t.Errorf("a job that could not be set aside: %+v, want its next copy scheduled", st)
	}
	if j := *f.Job.Job; j.Copy != 1 || j.Failures != 1 {
		t.Errorf("its next copy: copy %d, %d failures; want copy 1 (the failed park's number given back, then one), 1", j.Copy, j.Failures)
	}
}

// A failed output report leaves the job to end again: requeued uncounted,
// as delivered.
func TestSettleReportFails(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1<<20)
	h.x.cfg.Report = func(*Job, decide.Decision, string, []byte) error { return errors.New("output down") }
	f := h.deliver(t, &wire.Job{ID: "job", Type: "t", Failures: 1, EnqueuedAt: time.Now()})
	if err := h.x.settle(f, f.Job.Job, decide.Decision{Outcome: decide.DeadLettered, Reason: decide.Invalid, Failures: 2}, "bad", nil); err != nil {
		t.Fatal(err)
	}
	st, _ := h.b.Stats(context.Background(), "q")
	if st.Scheduled != 1 || len(h.calls.dead) != 0 || len(h.calls.released) != 0 {
		t.Errorf("%+v, %d dead, released %v; want the job back uncounted, nothing ended", st, len(h.calls.dead), h.calls.released)
	}
}

// A job is a suspect from a delivery with no outcome until it reports one:
// the envelope carries the mark, and the history's text is never read
// back (a line a writer forged makes no suspect; a forged line's absence
// clears none).
func TestSuspect(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1<<20)
	decode := func(j *wire.Job, deliveries int) *Job {
		t.Helper()
		var got Job
		if err := h.x.decode(&driver.Delivery{Queue: "q", Body: h.x.cfg.Codec.Encode("q", j), Deliveries: deliveries}, &got, nil); err != nil {
			t.Fatal(err)
		}
		return &got
	}
	j := decode(&wire.Job{ID: "x", Type: "t", EnqueuedAt: time.Now()}, 2)
	if !j.Suspect || j.Crashes != 1 || j.TryCount != 1 || len(j.Errors) != 1 || !strings.HasSuffix(j.Errors[0], crashNote) {
		t.Fatalf("a job back from a crash: suspect %v, %d crashes, try count %d, history %q", j.Suspect, j.Crashes, j.TryCount, j.Errors)
	}
	if again := decode(&j.Job, 1); !again.Suspect { // its copy, written without an outcome (parked, handed back)
		t.Error("a suspect's copy written with no outcome since is no suspect")
	}
	cleared(j)
	if j.Suspect || len(j.Errors) != 1 {
		t.Errorf("after its isolated run was rejected: suspect %v, history %q", j.Suspect, j.Errors)
	}
	if again := decode(&j.Job, 1); again.Suspect {
		t.Error("the copy of a suspect cleared by its outcome is a suspect again")
	}
	if forged := decode(&wire.Job{ID: "y", Type: "t", Crashes: 1, Errors: []string{"try 1" + crashNote}}, 1); forged.Suspect {
		t.Error("a history line that reads like a crash makes a suspect")
	}
	if marked := decode(&wire.Job{ID: "z", Type: "t", Suspect: true, Errors: []string{"anything"}}, 1); !marked.Suspect {
		t.Error("a marked copy whose newest line is no crash line is no suspect")
	}
}

// A broker that reports an absurd delivery count (on RabbitMQ and NATS a
// header any writer sets is part of it) costs no loop per delivery: the
// crashes are bounded and the history keeps its limit.
func TestDeliveryCountBounded(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1<<20)
	body := h.x.cfg.Codec.Encode("q", &wire.Job{ID: "x", Type: "t", EnqueuedAt: time.Now()})
	start := time.Now()
	var j Job
	if err := h.x.decode(&driver.Delivery{Queue: "q", Body: body, Deliveries: 1 << 50}, &j, nil); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second || j.Crashes != maxCrashes || len(j.Errors) != 20 || !j.Suspect {
		t.Errorf("took %v; crashes %d, %d history lines", took, j.Crashes, len(j.Errors))
	}
}

// A dead letter that does not fit even with its history gone and its error
// cut is written anyway (the backend says why it refuses) instead of
// re-encoding for ever: fitDead always ends. One that can fit does.
func TestFitDead(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4096)
	done := make(chan []byte, 1)
	go func() {
		done <- h.x.fitDead(&wire.Dead{Job: wire.Job{ID: "x", Type: "t", Payload: make([]byte, 8000), Errors: []string{"a", "b"}}, Error: strings.Repeat("é", 500)})
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("fitDead did not return for a record that cannot fit")
	}
	rec := &wire.Dead{Job: wire.Job{ID: "x", Type: "t", Payload: make([]byte, 2000), Errors: []string{strings.Repeat("e", 1000), strings.Repeat("f", 1000)}}, Error: strings.Repeat("é", 2000)}
	if b := h.x.fitDead(rec); len(b) > 4096 || len(rec.Job.Errors) != 0 || !strings.HasSuffix(rec.Error, "(cut to fit)") {
		t.Errorf("a record that can fit: %d bytes, %d history lines, error ends %q", len(b), len(rec.Job.Errors), rec.Error[max(0, len(rec.Error)-20):])
	}
}

// A message that is not a job is dead-lettered as invalid with its bytes.
func TestDeadRaw(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1<<20)
	ctx := context.Background()
	_ = h.b.Enqueue(ctx, "q", []driver.Message{{ID: "raw", Body: []byte("not a job")}})
	ds, _ := h.b.Receive(ctx, "q", 1, time.Second)
	if len(ds) != 1 {
		t.Fatal("no delivery")
	}
	f := &Delivery[view]{D: ds[0]}
	var j Job
	if err := h.x.decode(f.D, &j, nil); err == nil {
		t.Fatal("a message that is no job decoded")
	} else {
		h.x.deadRaw(f, err)
	}
	if len(h.calls.dead) != 1 || string(h.calls.dead[0].Raw) != "not a job" || h.calls.dead[0].Reason != string(decide.Invalid) {
		t.Errorf("dead letters %+v, want one invalid with the raw bytes", h.calls.dead)
	}
	if len(h.calls.released) != 0 {
		t.Errorf("a raw message released a unique key: %v", h.calls.released)
	}
}

// requeues records the messages Requeue is given.
type requeues struct {
	driver.Backend
	mu   sync.Mutex
	msgs []driver.Message
}

func (r *requeues) Requeue(ctx context.Context, d *driver.Delivery, msg driver.Message) error {
	r.mu.Lock()
	r.msgs = append(r.msgs, msg)
	r.mu.Unlock()
	return r.Backend.Requeue(ctx, d, msg)
}

// TestDedupeKeySameForEveryWorker: on a deduplicating backend, two workers
// that settle the same delivered copy (a lost ack, a SIGTERM mid-job) write
// its next copy under the same key, derived from the job's enqueue nonce,
// so the broker stores it once; another enqueue's job (another nonce) gets
// another key, and a job without a nonce none (the backend keys it by ID).
func TestDedupeKeySameForEveryWorker(t *testing.T) {
	t.Parallel()
	retry := func(nonce string) driver.Message {
		h := newHarness(t, 1<<20)
		rec := &requeues{Backend: h.b}
		h.x.cfg.Backend, h.x.cfg.Codec.Dedupe = rec, true
		j := &wire.Job{ID: "job", Type: "t", Copy: 3, EnqueuedAt: time.Now(), Headers: map[string]string{}}
		if nonce != "" {
			j.Headers[wire.StatusHeader] = nonce
		}
		f := h.deliver(t, j)
		if err := h.x.settle(f, f.Job.Job, decide.Decision{Outcome: decide.Retried, Failures: 1}, "", nil); err != nil {
			t.Fatal(err)
		}
		if len(rec.msgs) != 1 {
			t.Fatalf("requeued %d messages, want 1", len(rec.msgs))
		}
		return rec.msgs[0]
	}
	first, second := retry("nonce-a"), retry("nonce-a")
	if first.Dedupe == "" || first.Dedupe != second.Dedupe {
		t.Errorf("two workers wrote copy 4 of the same job under keys %q and %q; want one key", first.Dedupe, second.Dedupe)
	}
	if other := retry("nonce-b"); other.Dedupe == first.Dedupe {
		t.Errorf("another enqueue's copy 4 got the same key %q", other.Dedupe)
	}
	if old := retry(""); old.Dedupe != "" || old.ID != "job.4" {
		t.Errorf("a job without a nonce: ID %q, key %q; want job.4 and no key", old.ID, old.Dedupe)
	}
}

// A copy handed back (a stop, a pause, an unhealthy broker) keeps the
// job's NotBefore: the handler of the next copy sees the job as enqueued.
func TestHandBackKeepsNotBefore(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1<<20)
	nb := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	f := h.deliver(t, &wire.Job{ID: "job", Type: "t", EnqueuedAt: time.Now(), NotBefore: nb})
	if err := h.x.HandBack(f); err != nil {
		t.Fatal(err)
	}
	j, ok := h.next(t)
	if !ok {
		t.Fatal("the handed-back copy is not ready")
	}
	if j.Copy != 1 || !j.NotBefore.Equal(nb) {
		t.Errorf("handed back: copy %d NotBefore %v; want copy 1 NotBefore %v", j.Copy, j.NotBefore, nb)
	}
}
