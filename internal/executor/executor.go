// Package executor takes each delivery of a job through the platform's
// pipeline: decode → gate → admit → run → decide → settle. What becomes of a
// delivery is decided by decide.Decide alone, and every decision, whoever
// made it (the gate, admission, the handler's verdict), is settled by one
// function, settle, which writes the output report, the next copy or the
// dead letter, and the status the same way for each.
//
// The executor works on the envelope as delivered (Job); the handler works
// on its own view of it (the V of Work, the root package's Job), which the
// executor never reads: the next copy and a dead letter are built from the
// job as delivered, whatever the handler did to its view.
package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/admit"
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/health"
	"github.com/asyncplatform/asyncplatform/internal/jobctx"
	"github.com/asyncplatform/asyncplatform/internal/runner"
	"github.com/asyncplatform/asyncplatform/internal/status"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// Job is a delivered job as the executor works it.
type Job struct {
	wire.Job        // the envelope, with the crashes its deliveries imply
	Queue    string // the queue it was delivered from
	Group    string // its group, from wire.GroupHeader
	Priority int    // its level, from the queue it was delivered from
	TryCount int    // Failures + Crashes, and then this attempt
}

// Work is one delivery's state: the job as delivered and the handler's view
// of it.
type Work[V any] struct {
	// Job is the job as delivered while Process works the delivery, nil
	// before and after: the executor's own, used again for later
	// deliveries, so no one keeps it past Process (the view and the
	// dead-letter record are copies).
	Job  *Job
	View *V // the handler's job, made by Handler.Run; nil until then
	// Payload is the payload for the handler: the delivered bytes, which
	// the handler must not share (Job's envelope is built from them again
	// for a retry, a hand-back or a redelivery), or, when the job's
	// PayloadRef is set, bytes of its own fetched from the PayloadStore.
	Payload []byte
	Track   *status.Track // the job's status record, nil when untracked
}

// Delivery is one delivery held by the platform.
type Delivery[V any] = runner.Delivery[Work[V]]

// Queue is one runner of the platform.
type Queue[V any] = runner.Queue[Work[V]]

// Registry holds the handlers, by job type.
type Registry[V any] interface {
	// Handler returns the handler of typ, or nil when none is registered.
	Handler(typ string) Handler[V]
	// Names holds each registered type's own string, for the decoder to
	// reuse.
	Names() map[string]string
}

// Handler runs one job type's handler.
type Handler[V any] interface {
	// Run makes w.View from w.Job and w.Payload (copying a delivered
	// payload, one not fetched from the PayloadStore) and calls the user's
	// handler with it, turning a panic into an error. It returns the
	// handler's result and error.
	Run(ctx context.Context, w *Work[V]) (result []byte, err error)
}

// Groups are the paused groups.
type Groups interface {
	// Group says whether the group of job id on queue is paused.
	Group(ctx context.Context, queue, group, id string) decide.Group
	// Park writes msg on the group's held queue then calls ack; an error
	// matching pause.ErrNotParked means nothing was written or
	// acknowledged.
	Park(ctx context.Context, queue, group, id string, msg driver.Message, ack func() error) error
}

// Payloads is the store of offloaded payloads.
type Payloads interface {
	// Get returns the payload of job jobID's reference; an error matching
	// Gone when it is not there.
	Get(ctx context.Context, jobID, ref string) ([]byte, error)
	// Drop deletes a payload nothing points at any more.
	Drop(ctx context.Context, jobID, ref string)
	// Gone is the error Get's error matches when the payload is absent.
	Gone() error
}

// Attempt is what one handler call came to, for Config.AfterAttempt.
type Attempt struct {
	Decision decide.Decision
	Err      error         // the handler's error
	Duration time.Duration // how long the handler ran
	Isolated bool          // it ran alone, as a suspect
	Result   []byte        // the handler's result, on success
	Settle   error         // the settle's error: nil, runner.ErrSettled, or the backend's
}

// Config is an Executor's dependencies. Fields marked optional may be nil.
type Config[V any] struct {
	Backend driver.Backend
	Codec   wire.Codec
	Log     *slog.Logger
	Health  *health.Gate

	Worker       string         // names this worker in dead letters
	Lease        time.Duration  // bounds the store calls made for one delivery
	ErrorHistory int            // history lines kept with a job
	MaxErrorText int            // error text kept in a dead letter
	MinDeadError int            // error text a dead letter always has room for
	WarnTries    int            // log from this attempt on (0: off)
	WarnCrashes  int            // log from this many crashes on (0: off)
	Isolate      bool           // run suspects alone
	Levels       map[string]int // each priority level's queue → its level
	GroupPoll    time.Duration  // how soon a job whose group could not be set aside comes again
	Base         decide.Input   // the decision's settings: UnhandledRetries, delays

	// Handlers returns the handlers registered now.
	Handlers func() Registry[V]
	// Policies resolve each job's failure policy.
	Policies Policies
	// Classify turns a handler's error into the decision's input.
	Classify func(err error) (decide.Result, time.Duration)
	// ErrorDetail is what a dead letter keeps after a handler's error text:
	// a panic's stack, or nothing. Optional.
	ErrorDetail func(err error) string

	Status    *status.Tracker // status records
	Admission *admit.Gate     // type limits
	Groups    Groups          // paused groups
	Payloads  Payloads        // optional: offloaded payloads

	// Report publishes the report of a decision that ends j (success or
	// dead letter) on its queue's output queue, if it has one, before the
	// delivery is settled; an error leaves the job to end again. Optional.
	Report func(j *Job, d decide.Decision, text string, result []byte) error
	// Release releases j's unique key, when it has one, as its end says.
	// Optional.
	Release func(j *Job, dead bool)
	// AfterAttempt is called after every handler call. Optional.
	AfterAttempt func(w *Work[V], a Attempt)
	// OnDead is called with every dead letter written. Optional.
	OnDead func(id string, rec *wire.Dead)
}

// Executor runs the pipeline for the platform's runners.
type Executor[V any] struct {
	cfg Config[V]

	stopping atomic.Bool
	stopCtx  context.Context // ends when the platform starts stopping
	stop     context.CancelFunc
	suspect  sync.Mutex // held while a suspect runs alone
	workCtx  context.Context
	queues   []*Queue[V]
	jobs     sync.Pool // *Job: Work.Job of the deliveries being processed
}

// New returns an Executor. Start gives it its runners.
func New[V any](cfg Config[V]) *Executor[V] {
	x := &Executor[V]{cfg: cfg, workCtx: context.Background()}
	x.stopCtx, x.stop = context.WithCancel(context.Background())
	return x
}

// Start sets the runners (for isolating suspects) and the parent of the
// handlers' contexts; it is called before any delivery is processed.
func (x *Executor[V]) Start(workCtx context.Context, queues []*Queue[V]) {
	x.workCtx, x.queues = workCtx, queues
}

// Stopping marks the platform as stopping: deliveries claimed ahead are
// handed back unrun, and a job refused now is handed back.
func (x *Executor[V]) Stopping() {
	x.stopping.Store(true)
	x.stop()
}

// IsStopping reports whether Stopping was called.
func (x *Executor[V]) IsStopping() bool { return x.stopping.Load() }

// Process takes one delivery of q through the pipeline.
func (x *Executor[V]) Process(q *Queue[V], t *jobctx.Timer, f *Delivery[V]) {
	reg := x.cfg.Handlers()
	w := &f.Job
	j := x.job()
	w.Job = j
	defer x.putJob(w)
	if err := x.decode(f.D, j, reg.Names()); err != nil { // decode
		x.deadRaw(f, err)
		return
	}
	h := reg.Handler(j.Type)
	in := x.Input(j, h)
	if err := x.cfg.Codec.Bound(f.D.Queue, &j.Job, in.Now); err != nil { // a signed job moved or replayed
		x.deadRaw(f, err)
		return
	}
	if x.stopping.Load() || !x.cfg.Health.OK() || q.Paused(f.D.Queue) { // claimed ahead, before the stop, the failed check or the pause
		x.HandBack(f) // not an end: nothing is reported, its status stays
		return
	}
	x.warnTries(j)
	// A job of a paused group is set aside whatever its status says, so
	// its status is neither read nor written.
	in.Group = x.cfg.Groups.Group(context.Background(), j.Queue, j.Group, j.ID)
	if in.Group == decide.GroupOpen {
		w.Track, in.Cancelled = x.cfg.Status.Begin(context.Background(), statusJob(j))
	}
	if in.Group != decide.GroupOpen || x.cfg.Status.Tracks(j.Queue) {
		in.Now = time.Now() // after a store round trip
	}
	if d := decide.Decide(in); d.Outcome != decide.Run { // gate
		x.settle(f, j, d, "", nil)
		return
	}
	ticket, wait, ok := x.cfg.Admission.Admit(x.stopCtx, j.Type, j.ID, q.Concurrency())
	if !ok { // admission: the gate again, with the type's limits
		in.OverLimit, in.LimitWait, in.Jitter = true, wait, rand.Float64()
		in.Stopping, in.Now = x.stopping.Load(), time.Now()
		x.settle(f, j, decide.Decide(in), "", nil)
		return
	}
	// The ticket is given back as soon as the handler returns, before the
	// worker's turn (FreeSlot): the next job's Admit must find the places
	// this one held free, not held through its settle.
	released := false
	defer func() {
		if !released {
			ticket.Release(context.Background())
		}
	}()
	isolated := false
	if j.Suspect && x.cfg.Isolate { // it was in a process that died: it runs alone
		if !x.isolate(f) {
			return
		}
		defer x.endIsolation()
		isolated = true
	}
	if !x.loadPayload(f, in) {
		return
	}
	if !x.running(f, in) {
		return
	}
	r, ok := x.run(t, f, h, in.Policy.Timeout) // run
	if !ok {
		return
	}
	f.Ctx.Cancel(context.Canceled)
	released = true
	ticket.Release(context.Background())
	q.FreeSlot(f)

	in.Result, in.RejectAfter = x.cfg.Classify(r.err) // decide
	in.Stopping = x.workCtx.Err() != nil
	in.Cancelled = w.Track.Ended(context.Background(), r.err != nil)
	in.Now = r.start.Add(r.dur) // the handler's end, without another clock read
	in.Jitter = rand.Float64()
	d := decide.Decide(in)
	text, settled := "", j
	if r.err != nil {
		// The next copy and the dead letter are built from the job as
		// delivered: decoded again, as the handler's view shares its maps.
		var next Job
		_ = x.decode(f.D, &next, nil) // it decoded once already
		next.TryCount = j.TryCount
		if isolated && d.Outcome == decide.Rejected {
			cleared(&next)
		}
		text = r.err.Error()
		if r.timedOut {
			text = fmt.Sprintf("timed out after %v: %s", in.Policy.Timeout, text)
		}
		if in.Result != decide.Rejection && !in.Stopping {
			next.Suspect = false // it reported an outcome: a failure
			next.Errors = wire.AppendHistory(next.Errors, fmt.Sprintf("try %d at %s: %s", next.TryCount, r.start.UTC().Format(time.RFC3339), wire.FirstLine(text)), x.cfg.ErrorHistory)
		}
		if x.cfg.ErrorDetail != nil {
			text += x.cfg.ErrorDetail(r.err)
		}
		settled = &next
	}
	var result []byte
	if d.Outcome == decide.Succeeded {
		result = r.result
	}
	serr := x.settle(f, settled, d, text, result) // settle
	if hook := x.cfg.AfterAttempt; hook != nil {
		hook(w, Attempt{Decision: d, Err: r.err, Duration: r.dur, Isolated: isolated, Result: result, Settle: serr})
	}
}

// job returns a Job for Work.Job; putJob gives it back. A delivery's job
// lives only while Process works it, so the held deliveries (claimed
// ahead, waiting for a worker) do not each carry one.
func (x *Executor[V]) job() *Job {
	if j, ok := x.jobs.Get().(*Job); ok {
		return j
	}
	return new(Job)
}

func (x *Executor[V]) putJob(w *Work[V]) {
	j := w.Job
	w.Job = nil
	*j = Job{} // keeps no payload or headers alive
	x.jobs.Put(j)
}

// Input gathers what the decision on j depends on, before the handler
// runs; h is its handler, nil when none is registered.
func (x *Executor[V]) Input(j *Job, h Handler[V]) decide.Input {
	in := x.cfg.Base
	in.Failures, in.Crashes, in.Unhandled = j.Failures, j.Crashes, j.Unhandled
	in.Type, in.Deadline, in.HasHandler = j.Type, j.Deadline, h != nil
	in.Policy = x.cfg.Policies.Of(j, h)
	in.Now = time.Now()
	return in
}

func (x *Executor[V]) warnTries(j *Job) {
	if w := x.cfg.WarnTries; (w > 0 && j.TryCount+1 >= w) || (x.cfg.WarnCrashes > 0 && j.Crashes >= x.cfg.WarnCrashes) {
		x.cfg.Log.Warn("asyncplatform: job delivered a significant number of times",
			"queue", j.Queue, "id", j.ID, "type", j.Type, "try", j.TryCount+1, "failures", j.Failures, "crashes", j.Crashes)
	}
}

// running writes the running status of a tracked job. When Cancel came
// first, it dead-letters the job as cancelled and returns false.
func (x *Executor[V]) running(f *Delivery[V], in decide.Input) bool {
	if !f.Job.Track.Running(context.Background()) {
		return true
	}
	in.Cancelled, in.Now = true, time.Now()
	x.settle(f, f.Job.Job, decide.Decide(in), "", nil)
	return false
}

// statusJob is j as the status tracker sees it.
func statusJob(j *Job) status.Job {
	return status.Job{
		ID: j.ID, Queue: j.Queue, Type: j.Type, Copy: j.Copy, EnqueuedAt: j.EnqueuedAt, NotBefore: j.NotBefore,
		TryCount: j.TryCount, Failures: j.Failures, Crashes: j.Crashes, Nonce: j.Headers[wire.StatusHeader],
	}
}

// ran is what a handler call came to.
type ran struct {
	result   []byte
	err      error
	start    time.Time
	dur      time.Duration
	timedOut bool
}

// run calls the handler under its context. ok is false when the job must
// not run here (its lease lapsed while it waited).
func (x *Executor[V]) run(t *jobctx.Timer, f *Delivery[V], h Handler[V], timeout time.Duration) (r ran, ok bool) {
	w := &f.Job
	j := w.Job
	j.TryCount++        // this attempt
	start := time.Now() // the attempt's, and its timeout's, start: one clock read
	f.Ctx = jobctx.Context{Parent: x.workCtx, Delivery: f.D}
	if timeout > 0 {
		f.Ctx.Due = start.Add(timeout)
	}
	ctx := &f.Ctx
	w.Track.Started(ctx)
	if f.Start() { // its lease lapsed while it waited: another worker has it now
		w.Track.Ended(context.Background(), false) // not running here: its status is the other worker's
		return r, false
	}
	if x.workCtx.Err() != nil { // Stop gave up waiting before it was started
		ctx.Cancel(context.Canceled)
	}
	if x.cfg.Log.Enabled(ctx, slog.LevelDebug) {
		x.cfg.Log.Debug("asyncplatform: attempt", "queue", j.Queue, "id", j.ID, "type", j.Type, "try", j.TryCount)
	}
	t.Begin(ctx)
	r.start = start
	r.result, r.err = h.Run(ctx, w)
	r.dur = time.Since(r.start)
	t.End()
	r.timedOut = r.err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded)
	return r, true
}

// loadPayload finds the handler's payload: fetched from the store when it
// was offloaded, else the delivered bytes (Handler.Run copies them). When
// it cannot, it settles the delivery (dead letter or uncounted requeue) and
// returns false.
func (x *Executor[V]) loadPayload(f *Delivery[V], in decide.Input) bool {
	w := &f.Job
	j := w.Job
	if j.PayloadRef == "" {
		w.Payload = j.Payload
		return true
	}
	in.Now = time.Now()
	ps := x.cfg.Payloads
	if ps == nil {
		in.Result = decide.PayloadGone
		x.settle(f, j, decide.Decide(in), fmt.Sprintf("the payload was offloaded (reference %q) but this worker has no PayloadStore configured", j.PayloadRef), nil)
		return false
	}
	ctx, cancel := context.WithTimeout(x.workCtx, x.cfg.Lease)
	defer cancel()
	b, err := ps.Get(ctx, j.ID, j.PayloadRef)
	switch {
	case err == nil:
		w.Payload = b
		return true
	case errors.Is(err, ps.Gone()):
		in.Result = decide.PayloadGone
		x.settle(f, j, decide.Decide(in), fmt.Sprintf("the offloaded payload is gone from the store (reference %q): %v", j.PayloadRef, err), nil)
	default: // the store is unreachable: not the job's fault, so a rejection
		x.cfg.Log.Warn("asyncplatform: fetching an offloaded payload failed; requeued uncounted", "queue", j.Queue, "id", j.ID, "ref", j.PayloadRef, "error", err)
		in.Result = decide.Rejection
		x.settle(f, j, decide.Decide(in), "", nil)
	}
	return false
}
