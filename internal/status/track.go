package status

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/jobctx"
)

// Track is one delivery of a tracked job held by this worker: its record as
// last read or written, and its handler's context while it runs. Its hooks
// are called in the delivery's order (Begin, Running, Started, Ended, then
// Settled or Unsettled) by the one goroutine that processes it; each does
// nothing on a nil Track, and nothing after Settled or Unsettled dropped it
// (a delivery that Begin did not bind runs untracked).
//
// The running state is not written by Running: the store holds it only
// once the handler has run for a poll interval (Tracker.Poll writes it), or
// when the delivery ends without a settle (Unsettled). A handler that ends
// sooner costs one write, its end's; while it runs, Tracker.Get in this
// process shows it running.
type Track struct {
	t         *Tracker
	key       string
	queue, id string // the job's, for logs: set by Begin, never written again

	tries, failures, crashes int // the counters of the try Begin was given

	wmu     sync.Mutex // orders the record's writes: the poll's and the delivery's
	rec     Record     // as last read or written
	rev     string     // the record's revision; empty: none read or written
	run     Record     // the running state not written yet (pending)
	pending bool
	since   time.Time // when Running was called
	dropped bool      // settled, or given up: nothing more is written

	mu        sync.Mutex
	ctx       *jobctx.Context // the running handler's; nil before and after
	cancelled bool
}

// Begin returns the Track of a delivered job of a tracked queue, and
// whether Cancel marked it. It reads no record: the job's nonce and copy
// come with it and are checked against its record when a state is written
// (a delivery whose nonce is not the record's, or more than MaxCopyLead
// copies ahead, writes nothing: see the package doc), and its cancel mark
// is looked up in the latest listing of the marks (see MarkAge); only a
// job with a mark has its record read, to confirm the mark is its
// enqueue's. It returns a nil Track for a job of an untracked queue, when
// the marks cannot be listed (the job runs untracked this time), and for a
// marked job whose record holds a later attempt (a duplicate: cancelled
// as the record says) or another enqueue.
func (t *Tracker) Begin(ctx context.Context, j Job) (tr *Track, cancelled bool) {
	if !t.Tracks(j.Queue) {
		return nil, false
	}
	k := key(j.ID)
	r := Record{ID: j.ID, Queue: j.Queue, Type: j.Type, EnqueuedAt: j.EnqueuedAt, Copy: j.Copy, Nonce: j.Nonce}
	tr = &Track{t: t, key: k, queue: j.Queue, id: j.ID, tries: j.TryCount + 1, failures: j.Failures, crashes: j.Crashes}
	marked, err := t.marked(ctx, k)
	if err != nil {
		t.cfg.Logger.Warn("asyncplatform: reading cancellations failed; a job runs untracked this time", "queue", j.Queue, "id", j.ID, "error", err)
		return nil, false
	}
	if marked {
		ctx, cancel := t.bound(ctx)
		defer cancel()
		cur, _, err := t.read(ctx, k)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			t.cfg.Logger.Warn("asyncplatform: reading a job's status failed; it runs untracked this time", "queue", j.Queue, "id", j.ID, "error", err)
			return nil, false
		case cur.Nonce != "" && cur.Nonce != j.Nonce:
			return nil, false
		case refuse(&cur, &Record{Copy: j.Copy, Tries: j.TryCount + 1, Nonce: cur.Nonce}) != nil:
			return nil, cur.CancelRequested
		default:
			r.CancelRequested = cur.CancelRequested
		}
	}
	tr.rec = r
	return tr, r.CancelRequested
}

// Running makes the job cancellable here before the handler runs, and
// keeps the running state of the try Begin was given, to be written later
// (see Track). It reports whether Cancel came first (Begin read the mark):
// the caller then ends the job as cancelled instead of running it. A
// Cancel after Begin's read reaches the handler through the poll.
func (tr *Track) Running(context.Context) (cancelled bool) {
	if tr == nil {
		return false
	}
	if tr.rec.CancelRequested {
		return true
	}
	t := tr.t
	now := t.cfg.Now()
	r := tr.rec
	r.State, r.Tries, r.Failures, r.Crashes = Running, tr.tries, tr.failures, tr.crashes
	r.StartedAt, r.UpdatedAt, r.Worker, r.RetryAt, r.Reason = now, now, t.cfg.Worker, time.Time{}, ""
	r.record(Change{State: Running, At: now, Try: tr.tries})
	tr.wmu.Lock()
	tr.run, tr.pending, tr.since = r, true, time.Now()
	tr.wmu.Unlock()
	t.holdMu.Lock()
	if old, ok := t.running.Swap(tr.key, tr); ok && old != tr {
		t.beside.Store(old, struct{}{}) // still running: still cancelled and written
	}
	t.holdMu.Unlock()
	t.n.Add(1)
	return false
}

// view returns the running state not written yet, if any.
func (tr *Track) view() (Record, bool) {
	tr.wmu.Lock()
	defer tr.wmu.Unlock()
	return tr.run, tr.pending && !tr.dropped
}

// flushRunning writes the running state not written yet when Running was
// called at or before cutoff. A failed write is logged and drops the Track
// (the job ends untracked); a stale one drops it too (the record follows a
// newer copy).
func (tr *Track) flushRunning(ctx context.Context, cutoff time.Time) {
	tr.wmu.Lock()
	defer tr.wmu.Unlock()
	if !tr.pending || tr.dropped || tr.since.After(cutoff) {
		return
	}
	tr.writeRunning(ctx)
}

// writeRunning writes the pending running state; tr.wmu is held.
func (tr *Track) writeRunning(ctx context.Context) {
	t, r := tr.t, tr.run
	tr.pending = false
	ctx, cancel := t.bound(ctx)
	defer cancel()
	rev := tr.rev
	var err error
	if rev == "" { // Begin read nothing: read the record, to write at its revision
		rev, err = t.revOf(ctx, tr.key, &r)
	}
	if err == nil {
		rev, err = t.write(ctx, &r, rev)
	}
	if err != nil {
		if !errors.Is(err, errStale) { // stale: an older copy run again, the record follows the newer one
			t.cfg.Logger.Warn("asyncplatform: writing a job's status failed; it runs untracked this time", "queue", r.Queue, "id", r.ID, "error", err)
		}
		tr.dropped = true
		return
	}
	r.fresh = 0 // written
	tr.rec, tr.rev = r, rev
}

// Started is called with the handler's context before the handler runs:
// a cancellation seen before or after ends it with ErrCancelled.
func (tr *Track) Started(ctx *jobctx.Context) {
	if tr == nil {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.ctx = ctx
	if tr.cancelled {
		ctx.Cancel(ErrCancelled)
	}
}

// cancel ends the handler's context with ErrCancelled (now, or as soon as
// it starts).
func (tr *Track) cancel() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.cancelled = true
	if tr.ctx != nil {
		tr.ctx.Cancel(ErrCancelled)
	}
}

// unhold removes tr from the jobs running here.
func (tr *Track) unhold() {
	t := tr.t
	t.holdMu.Lock()
	defer t.holdMu.Unlock()
	if t.running.CompareAndDelete(tr.key, tr) {
		t.n.Add(-1)
	} else if _, ok := t.beside.LoadAndDelete(tr); ok {
		t.n.Add(-1)
	}
}

// Ended is called when the handler has returned (failed: with an error):
// the job is no longer cancellable here. It reports whether it was
// cancelled. Cancellations are polled every Config.Poll, so a handler that
// fails soon after a Cancel may end before the poll sees it: a failed
// attempt the poll has not marked looks for the cancel mark itself (one
// store read; a second, of the record, when there is one, to confirm the
// mark is its enqueue's), so that the failure is not taken for one to
// retry.
func (tr *Track) Ended(ctx context.Context, failed bool) (cancelled bool) {
	if tr == nil {
		return false
	}
	tr.unhold()
	tr.mu.Lock()
	tr.ctx = nil
	cancelled = tr.cancelled
	tr.mu.Unlock()
	if cancelled || !failed {
		return cancelled
	}
	t := tr.t
	mctx, cancel := t.bound(ctx)
	_, _, err := t.cfg.Store.Get(mctx, "cancel/"+tr.key)
	cancel()
	switch {
	case errors.Is(err, driver.ErrKeyNotFound):
		return false
	case err != nil:
		t.cfg.Logger.Warn("asyncplatform: looking for a job's cancellation failed; its failure is taken as it is", "queue", tr.queue, "id", tr.id, "error", err)
		return false
	}
	ours, err := tr.cancelRequested(ctx)
	if err != nil {
		t.cfg.Logger.Warn("asyncplatform: reading a marked job's status failed; its failure is taken for a cancellation", "queue", tr.queue, "id", tr.id, "error", err)
		return true
	}
	return ours
}

// isCancelled reports whether tr's handler was cancelled.
func (tr *Track) isCancelled() bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.cancelled
}

// cancelRequested reads the job's record and reports whether Cancel marked
// it for the enqueue tr's delivery is of: a cancel mark left by an earlier
// life of the job (its end's write lost, then a redrive) cancels nothing.
func (tr *Track) cancelRequested(ctx context.Context) (bool, error) {
	ctx, cancel := tr.t.bound(ctx)
	defer cancel()
	cur, _, err := tr.t.read(ctx, tr.key)
	switch {
	case errors.Is(err, ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return cur.CancelRequested && (cur.Nonce == "" || cur.Nonce == tr.rec.Nonce), nil
}

// Settled hands the state the settled decision d leads to to the Tracker's
// writer, and drops the Track. tries is the job's try count as settled,
// result the handler's result, errLine the first line of its error (empty:
// none). It is called only when the settle succeeded. It returns without
// waiting for the write (unless MaxPendingEnds wait already): Get in this
// process shows the state at once, other processes once it is written
// (Flush waits for that). See ends.
//
// A deferred job (a limit refused it) is not written when the record says
// running (another delivery of the job runs it, here or written) or says
// scheduled with the same counters already (an earlier refusal wrote it):
// a job a limit keeps refusing costs one write, not one per refusal, and
// its RetryAt stays the one recorded (the first refusal's).
func (tr *Track) Settled(_ context.Context, d decide.Decision, tries int, result []byte, errLine string) {
	if tr == nil {
		return
	}
	tr.unhold()
	tr.wmu.Lock()
	defer tr.wmu.Unlock()
	if tr.dropped {
		return
	}
	tr.dropped = true
	t := tr.t
	r := tr.rec
	if tr.pending {
		r = tr.run
	}
	r.Tries, r.Failures, r.Crashes = tries, d.Failures, d.Crashes
	now := t.cfg.Now()
	r.UpdatedAt, r.Worker, r.RetryAt = now, t.cfg.Worker, time.Time{}
	if errLine != "" {
		r.Error = errLine
	}
	switch d.Outcome {
	case decide.Succeeded:
		r.State, r.Result, r.ResultSize = Succeeded, nil, len(result)
		if len(result) <= MaxResult {
			r.Result = result
		}
	case decide.Retried:
		r.State, r.RetryAt = Retrying, d.RetryAt
	case decide.Rejected, decide.Requeued, decide.Deferred:
		r.State, r.RetryAt = Scheduled, d.RetryAt
	case decide.HandedBack:
		r.State = Waiting
	case decide.DeadLettered:
		r.State, r.Reason = DeadLettered, string(d.Reason)
		if d.Reason == decide.Cancelled {
			r.State = Cancelled
		}
	default:
		return
	}
	r.record(Change{State: r.State, At: now, Try: tries, Reason: changeReason(d, errLine)})
	t.addEnd(&end{key: tr.key, r: r, rev: tr.rev, deferred: d.Outcome == decide.Deferred})
}

// Unsettled is called when the delivery ends without a settle (the settle
// failed: its lease was lost, say): the running state not written yet is
// written, as a worker that died would have left it, and the Track is
// dropped.
func (tr *Track) Unsettled(ctx context.Context) {
	if tr == nil {
		return
	}
	tr.unhold()
	tr.wmu.Lock()
	defer tr.wmu.Unlock()
	if tr.dropped {
		return
	}
	if tr.pending {
		tr.writeRunning(ctx)
	}
	tr.dropped = true
}

// sameCounts reports whether a and b hold the same counters.
func sameCounts(a, b *Record) bool {
	return a.Tries == b.Tries && a.Failures == b.Failures && a.Crashes == b.Crashes
}

// changeReason is the reason of the change the settled decision d makes
// (see Change.Reason); errLine is the handler's error's first line.
func changeReason(d decide.Decision, errLine string) string {
	switch d.Outcome {
	case decide.DeadLettered:
		return string(d.Reason)
	case decide.Retried:
		return errLine
	case decide.Succeeded:
		return ""
	}
	return d.Outcome.String()
}
