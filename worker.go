package asyncplatform

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// queueRunner works one queue: a fetcher claims up to Concurrency+Prefetch
// jobs and Concurrency workers run them.
type queueRunner struct {
	p      *Platform
	name   string
	policy Policy
	max    int
	slots  chan struct{} // one token per free claim slot
	jobs   chan *inflight

	mu   sync.Mutex
	held map[*inflight]struct{} // claimed and not yet released
}

// inflight is one delivery held by this platform.
type inflight struct {
	d   *driver.Delivery
	job Job // the worker's decoded job; the handler gets &job

	ctx jobContext // the handler's context, set before started

	mu      sync.Mutex // serialises backend calls on d
	renewed time.Time  // when the lease was last started or extended
	started bool       // ctx is set: cancelHandler cancels it
	freed   bool       // its claim slot was given back before release (worker goroutine only)
	done    bool       // settled (or given up): no more backend calls on d
	lost    bool       // the lease was lost while held
}

// cancelHandler cancels the handler's context if it has started; f.mu is
// held.
func (f *inflight) cancelHandler() {
	if f.started {
		f.ctx.cancel(context.Canceled)
	}
}

func newQueueRunner(p *Platform, name string, qc QueueConfig) *queueRunner {
	q := &queueRunner{
		p:      p,
		name:   name,
		policy: qc.Policy,
		max:    qc.Concurrency + *qc.Prefetch,
		held:   map[*inflight]struct{}{},
	}
	q.slots = make(chan struct{}, q.max)
	for range q.max {
		q.slots <- struct{}{}
	}
	q.jobs = make(chan *inflight, q.max)
	return q
}

// fetch claims jobs while there are free slots, until ctx ends; then it
// closes the work channel.
func (q *queueRunner) fetch(ctx context.Context) {
	defer close(q.jobs)
	p := q.p
	retry := 50 * time.Millisecond
	for {
		rctx := p.health.wait(ctx)
		if rctx == nil {
			return
		}
		select {
		case <-q.slots:
		case <-rctx.Done():
			continue
		}
		n := 1
	more:
		for n < q.max {
			select {
			case <-q.slots:
				n++
			default:
				break more
			}
		}
		ds, err := p.backend.Receive(rctx, q.name, n, p.cfg.Lease)
		for range n - len(ds) {
			q.slots <- struct{}{}
		}
		now := time.Now()
		for _, d := range ds {
			f := &inflight{d: d, renewed: now}
			q.mu.Lock()
			q.held[f] = struct{}{}
			q.mu.Unlock()
			q.jobs <- f
		}
		switch {
		case err == nil:
			retry = 50 * time.Millisecond
		case ctx.Err() != nil:
			return
		case rctx.Err() != nil:
			continue // health lost: wait for it to return
		case errors.Is(err, driver.ErrClosed):
			p.log.Error("asyncplatform: backend closed; this queue stops taking jobs", "queue", q.name, "error", err)
			return
		default:
			p.log.Warn("asyncplatform: receive failed; retrying", "queue", q.name, "error", err, "in", retry)
			select {
			case <-time.After(retry):
			case <-ctx.Done():
				return
			}
			retry = min(retry*2, 5*time.Second)
		}
	}
}

func (q *queueRunner) work() {
	w := &worker{}
	defer w.stop()
	for f := range q.jobs {
		q.runOne(w, f)
	}
}

// runOne processes one delivery. A panic outside the handler (a hook, or a
// bug here) is logged and the worker goes on; a handler that calls
// runtime.Goexit ends this goroutine, so a replacement is started. Either
// way the delivery is let go unsettled: its lease lapses and it comes back
// with a crash counted, so a job that does this every time ends poisoned.
func (q *queueRunner) runOne(w *worker, f *inflight) {
	normal := false
	defer func() {
		v := recover()
		if v != nil {
			q.p.log.Error("asyncplatform: panic while processing a job; it comes back after its lease", "queue", q.name, "panic", v, "stack", string(debug.Stack()))
		}
		if !normal { // the handler's context must not outlive its attempt
			w.end()
			f.mu.Lock()
			f.cancelHandler()
			f.mu.Unlock()
		}
		q.release(f)
		if v == nil && !normal { // runtime.Goexit
			q.p.log.Error("asyncplatform: a handler called runtime.Goexit; its job comes back after its lease", "queue", q.name)
			q.p.workers.Add(1)
			go func() {
				defer q.p.workers.Done()
				q.work()
			}()
		}
	}()
	q.p.process(q, w, f)
	normal = true
}

// release forgets a delivery and frees its claim slot.
func (q *queueRunner) release(f *inflight) {
	q.mu.Lock()
	delete(q.held, f)
	q.mu.Unlock()
	q.freeSlot(f)
}

// freeSlot gives f's claim slot back, once. The worker calls it as soon as
// the handler returns, so the fetcher claims the next jobs while the outcome
// is reported instead of after: a claim and a settle overlap rather than
// follow each other. The deliveries held at once are then at most
// Concurrency + Prefetch, plus one being settled per worker.
func (q *queueRunner) freeSlot(f *inflight) {
	if !f.freed {
		f.freed = true
		q.slots <- struct{}{}
	}
}

// handBackQueued hands back, at once, the jobs claimed ahead and not started.
func (q *queueRunner) handBackQueued() {
	for {
		select {
		case f, ok := <-q.jobs:
			if !ok {
				return
			}
			q.p.handBack(f)
			q.release(f)
		default:
			return
		}
	}
}

func (q *queueRunner) snapshot() []*inflight {
	q.mu.Lock()
	defer q.mu.Unlock()
	fs := make([]*inflight, 0, len(q.held))
	for f := range q.held {
		fs = append(fs, f)
	}
	return fs
}

// decodeDelivery decodes a delivery's job and adds the crashes its earlier
// deliveries imply (see driver: every outcome but Ack writes a new copy, so
// each earlier delivery of this copy ended with no outcome).
// Each of those crashes gets a line in the error history.
func (p *Platform) decodeDelivery(d *driver.Delivery, j *Job, types map[string]*handlerEntry) error {
	if err := decodeJob(d.Body, j, types); err != nil {
		return err
	}
	j.Queue = d.Queue
	for range d.Deliveries - 1 {
		j.Crashes++
		j.Errors = appendHistory(j.Errors, fmt.Sprintf("try %d: no outcome (the worker died or lost its lease)", j.Failures+j.Crashes), p.cfg.ErrorHistory)
	}
	j.TryCount = j.Failures + j.Crashes
	return nil
}

// process decides and reports the outcome of one delivery.
func (p *Platform) process(q *queueRunner, w *worker, f *inflight) {
	handlers := *p.handlers.Load()
	j := &f.job
	if err := p.decodeDelivery(f.d, j, handlers); err != nil {
		p.deadRaw(f, err)
		return
	}
	if p.stopping.Load() || !p.health.ok() { // claimed ahead, before the stop or the failed check
		p.handBack(f)
		return
	}
	h := handlers[j.Type]
	pol := j.Policy
	if h != nil {
		pol = pol.merge(h.policy)
	}
	r := pol.merge(q.policy).merge(p.cfg.Policy).resolve()
	now := time.Now()
	if w := p.cfg.WarnTries; (w > 0 && j.TryCount+1 >= w) || (p.cfg.WarnCrashes > 0 && j.Crashes >= p.cfg.WarnCrashes) {
		p.log.Warn("asyncplatform: job delivered a significant number of times",
			"queue", j.Queue, "id", j.ID, "type", j.Type, "try", j.TryCount+1, "failures", j.Failures, "crashes", j.Crashes)
	}

	switch {
	case !j.Deadline.IsZero() && !now.Before(j.Deadline):
		p.dead(f, j, ReasonExpired, fmt.Sprintf("deadline %s passed before the job could run", j.Deadline.Format(time.RFC3339Nano)), nil)
		return
	case j.Crashes > r.poisonLimit:
		p.dead(f, j, ReasonPoisoned, fmt.Sprintf("the job's worker crashed or lost it %d times; the poison limit is %d", j.Crashes, r.poisonLimit), nil)
		return
	case h == nil:
		if j.unhandled < *p.cfg.UnhandledRetries {
			j.unhandled++
			p.log.Debug("asyncplatform: no handler; requeued", "queue", j.Queue, "id", j.ID, "type", j.Type, "requeues", j.unhandled)
			p.requeue(f, j, now.Add(p.cfg.UnhandledDelay))
			return
		}
		p.dead(f, j, ReasonUnhandled, fmt.Sprintf("no handler registered for job type %q after %d requeues", j.Type, j.unhandled), nil)
		return
	}

	if j.payloadRef != "" {
		if !p.fetchPayload(f, j) {
			return
		}
	} else if len(j.Payload) > 0 {
		// The payload aliases the delivered bytes, which must stay as they
		// were (a retry, a hand-back or a redelivery is built from them).
		j.Payload = bytes.Clone(j.Payload)
	}

	j.TryCount++ // this attempt
	f.ctx = jobContext{parent: p.workCtx}
	if r.timeout > 0 {
		f.ctx.deadline = time.Now().Add(r.timeout)
	}
	ctx := &f.ctx
	f.mu.Lock()
	f.started = true
	lost := f.lost
	f.mu.Unlock()
	if lost { // its lease lapsed while it waited: another worker has it now
		return
	}
	if p.workCtx.Err() != nil { // Stop gave up waiting before started was set
		ctx.cancel(context.Canceled)
	}
	if p.log.Enabled(ctx, slog.LevelDebug) {
		p.log.Debug("asyncplatform: attempt", "queue", j.Queue, "id", j.ID, "type", j.Type, "try", j.TryCount)
	}
	w.begin(ctx)
	start := time.Now()
	herr := call(ctx, h.h, j)
	a := Attempt{Job: j, Err: herr, Duration: time.Since(start)}
	w.end()
	timedOut := herr != nil && errors.Is(ctx.Err(), context.DeadlineExceeded)
	ctx.cancel(context.Canceled)
	q.freeSlot(f)

	// Retries and dead letters are built from the job as delivered, not
	// from whatever the handler did to *Job.
	var next Job
	if herr != nil {
		_ = p.decodeDelivery(f.d, &next, handlers) // it decoded once already
		next.TryCount = j.TryCount
	}
	var serr error
	switch rej := asReject(herr); {
	case herr == nil:
		a.Outcome = OutcomeSucceeded
		if serr = p.settle(f, true, nil, nil); serr == nil {
			p.dropPayload(context.Background(), j.payloadRef)
		}
	case p.workCtx.Err() != nil:
		a.Outcome = OutcomeHandedBack
		serr = p.handBack(f)
	case rej != nil:
		delay := rej.Delay
		if delay <= 0 {
			delay = p.cfg.RejectDelay
		}
		a.Outcome, a.RetryAt = OutcomeRejected, time.Now().Add(delay)
		serr = p.requeue(f, &next, a.RetryAt)
		p.health.recheck()
	default:
		text := herr.Error()
		if timedOut {
			text = fmt.Sprintf("timed out after %v: %s", r.timeout, text)
		}
		next.Failures++
		next.Errors = appendHistory(next.Errors, fmt.Sprintf("try %d at %s: %s", next.TryCount, start.UTC().Format(time.RFC3339), firstLine(text)), p.cfg.ErrorHistory)
		var pe *PanicError
		if errors.As(herr, &pe) {
			text += "\n" + string(pe.Stack)
		}
		var inv *InvalidError
		var perm *PermanentError
		switch {
		case errors.As(herr, &inv):
			a.Reason = ReasonInvalid
		case errors.As(herr, &perm):
			a.Reason = ReasonPermanent
		case next.Failures > r.retryLimit:
			a.Reason = ReasonRetriesExceeded
		default:
			a.Outcome, a.RetryAt = OutcomeRetried, time.Now().Add(backoff(r, next.Failures))
			serr = p.requeue(f, &next, a.RetryAt)
		}
		if a.Reason != "" {
			a.Outcome = OutcomeDeadLettered
			serr = p.dead(f, &next, a.Reason, text, nil)
		}
	}
	switch {
	case serr == nil:
	case errors.Is(serr, errSettled):
		a.Outcome = OutcomeHandedBack // Stop handed it back first
	default:
		a.Outcome = OutcomeLeaseLost
	}
	if hook := p.cfg.Hooks.AfterAttempt; hook != nil {
		hook(context.Background(), a)
	}
}

// fetchPayload loads an offloaded payload into j. When it cannot, it settles
// the delivery itself (dead letter or uncounted requeue) and returns false.
func (p *Platform) fetchPayload(f *inflight, j *Job) bool {
	store := p.cfg.PayloadStore
	if store == nil {
		p.dead(f, j, ReasonPayloadMissing, fmt.Sprintf("the payload was offloaded (reference %q) but this worker has no PayloadStore configured", j.payloadRef), nil)
		return false
	}
	ctx, cancel := context.WithTimeout(p.workCtx, p.cfg.Lease)
	defer cancel()
	b, err := store.Get(ctx, j.payloadRef)
	switch {
	case err == nil:
		j.Payload = b
		return true
	case errors.Is(err, ErrPayloadNotFound):
		p.dead(f, j, ReasonPayloadMissing, fmt.Sprintf("the offloaded payload is gone from the store (reference %q): %v", j.payloadRef, err), nil)
	default: // the store is unreachable: not the job's fault
		p.log.Warn("asyncplatform: fetching an offloaded payload failed; requeued uncounted", "queue", j.Queue, "id", j.ID, "ref", j.payloadRef, "error", err)
		p.requeue(f, j, time.Now().Add(p.cfg.RejectDelay))
		p.health.recheck()
	}
	return false
}

// call runs the handler, turning a panic into a *PanicError.
func call(ctx context.Context, h Handler, j *Job) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h(ctx, j)
}

// asReject returns the RejectError in err's chain, or nil. Only a non-nil
// err costs an allocation (errors.As takes the target's address).
func asReject(err error) *RejectError {
	if err == nil {
		return nil
	}
	var rej *RejectError
	if errors.As(err, &rej) {
		return rej
	}
	return nil
}

var errSettled = errors.New("delivery already settled")

// settle reports an outcome for the delivery, once: an Ack, or else a Requeue
// of msg, or else (rec non-nil) a DeadLetter of rec. It takes no deadline of
// its own: backends bound their own network calls, and a per-job timer
// costs more than the rest of the hot path.
func (p *Platform) settle(f *inflight, ack bool, msg *driver.Message, rec *driver.DeadMessage) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done {
		return errSettled
	}
	f.done = true
	if f.lost {
		return driver.ErrLeaseLost
	}
	ctx := context.Background()
	var err error
	switch {
	case ack:
		err = p.backend.Ack(ctx, f.d)
	case msg != nil:
		err = p.backend.Requeue(ctx, f.d, *msg)
	default:
		err = p.backend.DeadLetter(ctx, f.d, *rec)
	}
	switch {
	case err == nil:
	case errors.Is(err, driver.ErrLeaseLost):
		p.log.Warn("asyncplatform: lease lost before the outcome was reported; the job will be delivered again", "queue", f.d.Queue, "error", err)
	default:
		p.log.Error("asyncplatform: reporting an outcome failed; the job will come back after its lease", "queue", f.d.Queue, "error", err)
	}
	return err
}

// requeue replaces the delivery with the next copy of j, due at at.
func (p *Platform) requeue(f *inflight, j *Job, at time.Time) error {
	j.copyNo++
	j.NotBefore = time.Time{}
	if at.After(time.Now()) {
		j.NotBefore = at
	}
	msg := p.message(j)
	return p.settle(f, false, &msg, nil)
}

// handBack returns a delivery uncounted, for shutdown.
func (p *Platform) handBack(f *inflight) error {
	var j Job
	if err := p.decodeDelivery(f.d, &j, nil); err != nil {
		return err // not a job: it comes back after its lease and is dead-lettered then
	}
	err := p.requeue(f, &j, time.Time{})
	if err == nil {
		p.log.Debug("asyncplatform: handed back at shutdown", "queue", j.Queue, "id", j.ID, "type", j.Type)
	}
	return err
}

// dead dead-letters the delivery as j, or as raw bytes when raw is non-nil.
func (p *Platform) dead(f *inflight, j *Job, reason Reason, text string, raw []byte) error {
	j.TryCount = j.Failures + j.Crashes
	dl := DeadLetter{Job: *j, Queue: f.d.Queue, Reason: reason, Error: text, DeadAt: time.Now(), Worker: p.cfg.WorkerName, Raw: raw}
	dl.ID = messageID(j)
	rec := driver.DeadMessage{ID: dl.ID, Body: p.fitDead(&dl)}
	err := p.settle(f, false, nil, &rec)
	if err != nil {
		return err
	}
	p.log.Warn("asyncplatform: dead-lettered", "queue", dl.Queue, "id", j.ID, "type", j.Type, "reason", reason, "tries", j.TryCount, "error", firstLine(text))
	if hook := p.cfg.Hooks.OnDeadLetter; hook != nil {
		hook(context.Background(), dl)
	}
	return nil
}

// fitDead encodes a dead-letter record within the backend's limit: the oldest
// error lines go first, then the error text is cut (never below
// minDeadError), then raw bytes are cut (saying so in the error). MaxPayload's
// headroom makes the first two enough for any job that could be enqueued.
func (p *Platform) fitDead(dl *DeadLetter) []byte {
	body := encodeDead(dl)
	for limit := p.caps.MaxBody; limit > 0 && len(body) > limit; body = encodeDead(dl) {
		excess := len(body) - limit
		switch {
		case len(dl.Job.Errors) > 0:
			dl.Job.Errors = dl.Job.Errors[1:]
		case len(dl.Error) > minDeadError:
			dl.Error = dl.Error[:max(minDeadError, len(dl.Error)-excess-32)] + " …(cut to fit)"
		case len(dl.Raw) > 0:
			keep := max(0, len(dl.Raw)-excess-128)
			dl.Error += fmt.Sprintf(" (the raw message had %d bytes; only the first %d fit in a dead letter)", len(dl.Raw), keep)
			dl.Raw = dl.Raw[:keep:keep]
		default:
			return body // nothing left to cut; the backend will refuse it and say why
		}
	}
	return body
}

// deadRaw dead-letters a message that is not a job, keeping its bytes.
func (p *Platform) deadRaw(f *inflight, cause error) {
	j := &Job{ID: newID(time.Now()), Queue: f.d.Queue}
	raw := append([]byte{}, f.d.Body...)
	p.dead(f, j, ReasonInvalid, "the message is not an asyncplatform job: "+cause.Error(), raw)
}

// keepLeases extends the lease of every held delivery whose lease is more than
// a third spent, until ctx ends.
func (p *Platform) keepLeases(ctx context.Context) {
	every := p.cfg.Lease / 3
	t := time.NewTicker(max(every/2, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, q := range p.queues {
				for _, f := range q.snapshot() {
					p.extend(f, now, every)
				}
			}
		}
	}
}

func (p *Platform) extend(f *inflight, now time.Time, every time.Duration) {
	if !f.mu.TryLock() {
		return // busy settling; never let one slow call hold up every lease
	}
	defer f.mu.Unlock()
	if f.done || f.lost || now.Sub(f.renewed) < every {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), every)
	defer cancel()
	err := p.backend.Extend(ctx, f.d, p.cfg.Lease)
	switch {
	case err == nil:
		f.renewed = now
	case errors.Is(err, driver.ErrLeaseLost):
		f.lost = true
		f.cancelHandler()
		p.log.Warn("asyncplatform: lease lost; the handler is cancelled and the job will be delivered again", "queue", f.d.Queue, "error", err)
	case now.Sub(f.renewed) >= p.cfg.Lease:
		// The lease has certainly lapsed: the job may be running elsewhere.
		f.lost = true
		f.cancelHandler()
		p.log.Warn("asyncplatform: could not extend a lease before it lapsed; the handler is cancelled and the job will be delivered again", "queue", f.d.Queue, "error", err)
	default:
		p.log.Warn("asyncplatform: extending a lease failed; will retry", "queue", f.d.Queue, "error", err)
	}
}

// backoff is exponential with full jitter: uniform in [0, min(cap, base·2^(n-1))].
func backoff(r resolved, failures int) time.Duration {
	d := min(r.backoffBase, r.backoffCap)
	for i := 1; i < failures && d < r.backoffCap; i++ {
		if d > r.backoffCap/2 {
			d = r.backoffCap
			break
		}
		d *= 2
	}
	if d <= 0 {
		return 0
	}
	return rand.N(min(d, math.MaxInt64-1) + 1)
}

func appendHistory(h []string, line string, limit int) []string {
	if len(line) > 1024 {
		line = line[:1024] + "…"
	}
	keep := h
	if len(keep) >= limit {
		keep = keep[len(keep)-limit+1:]
	}
	out := make([]string, len(keep), len(keep)+1)
	copy(out, keep)
	return append(out, line)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// newID returns a UUIDv7: time-ordered, with 74 random bits.
func newID(now time.Time) string {
	var b [16]byte
	ms := uint64(now.UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	r1, r2 := rand.Uint64(), rand.Uint64()
	for i := range 2 {
		b[6+i] = byte(r1 >> (8 * i))
	}
	for i := range 8 {
		b[8+i] = byte(r2 >> (8 * i))
	}
	b[6] = b[6]&0x0f | 0x70
	b[8] = b[8]&0x3f | 0x80
	const hexdigits = "0123456789abcdef"
	var s [36]byte
	j := 0
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			s[j] = '-'
			j++
		}
		s[j], s[j+1] = hexdigits[c>>4], hexdigits[c&0xf]
		j += 2
	}
	return string(s[:])
}
