package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/pause"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// crashNote ends the history line of a delivery that ended with no outcome.
const crashNote = ": no outcome (the worker died or lost its lease)"

// maxCrashes bounds a job's crash count, whatever a broker reports.
const maxCrashes = 1 << 30

// decode decodes a delivery's job and adds the crashes its earlier
// deliveries imply (see driver: every outcome but Ack writes a new copy, so
// each earlier delivery of this copy ended with no outcome). Each of those
// crashes gets a line in the error history. names, when set, holds the
// registered types' names.
func (x *Executor[V]) decode(d *driver.Delivery, j *Job, names map[string]string) error {
	body, err := x.cfg.Codec.Open(d.Body)
	if err != nil {
		return err
	}
	*j = Job{Queue: d.Queue}
	if err := wire.DecodeJob(body, &j.Job, names); err != nil {
		return err
	}
	if g := j.Headers[wire.GroupHeader]; g != "" {
		// Any writer to the broker writes this header: a name that is no
		// group name is no group (the job is never held), and said so.
		if err := wire.CheckGroup(g); err != nil {
			x.cfg.Log.Warn("asyncplatform: a job's group header is not a group name; the job has no group", "queue", d.Queue, "id", j.ID, "type", j.Type, "error", err)
		} else {
			j.Group = g
		}
	}
	if x.cfg.Levels != nil {
		j.Priority = x.cfg.Levels[d.Queue]
	}
	// The count comes from the broker (on some, partly from a header any
	// writer sets): bound it, and write lines only for the crashes the
	// history keeps, never one loop turn per claimed delivery.
	extra := min(max(d.Deliveries-1, 0), maxCrashes-j.Crashes)
	first := j.Crashes + 1
	j.Crashes += extra
	j.Suspect = j.Suspect || extra > 0
	for c := max(first, j.Crashes-x.cfg.ErrorHistory+1); c <= j.Crashes; c++ {
		j.Errors = wire.AppendHistory(j.Errors, fmt.Sprintf("try %d%s", j.Failures+c, crashNote), x.cfg.ErrorHistory)
	}
	j.TryCount = j.Failures + j.Crashes
	return nil
}

// cleared marks j as having reported an outcome since its crash (a
// suspect's isolated run was rejected): its next copy is no suspect.
func cleared(j *Job) {
	if !j.Suspect {
		return
	}
	j.Suspect = false
	if last := len(j.Errors) - 1; last >= 0 { // its crash's line
		j.Errors = append(j.Errors[:last:last], j.Errors[last]+"; it then ran alone and reported an outcome")
	}
}

// settle settles the delivery as d says; j is the job the next copy or the
// dead letter is built from, text the handler's error for a dead letter,
// result the handler's on success. Every decision ends here, whoever made
// it, so the output report and the status are written the same way for
// each. A delivery claimed ahead and handed back unrun (a stop, a pause, a
// suspect's isolation) is no decision: it goes to HandBack, without a report
// or a status write.
func (x *Executor[V]) settle(f *Delivery[V], j *Job, d decide.Decision, text string, result []byte) (err error) {
	j, d = x.report(f, j, d, text, result) // an end is reported to the output queue before it is settled
	defer func() {
		if err == nil {
			f.Job.Track.Settled(context.Background(), d, f.Job.Job.TryCount, result, wire.FirstLine(text))
		} else {
			f.Job.Track.Unsettled(context.Background())
		}
	}()
	switch d.Outcome {
	case decide.Succeeded:
		err := f.Settle(x.cfg.Backend, x.cfg.Log, true, nil, nil)
		if err == nil {
			if x.cfg.Payloads != nil && j.PayloadRef != "" {
				x.cfg.Payloads.Drop(context.Background(), j.ID, j.PayloadRef)
			}
			if x.cfg.Release != nil {
				x.cfg.Release(j, false)
			}
		}
		return err
	case decide.HandedBack:
		return x.HandBack(f)
	case decide.Requeued:
		j.Unhandled = d.Unhandled
		x.cfg.Log.Debug("asyncplatform: no handler; requeued", "queue", j.Queue, "id", j.ID, "type", j.Type, "requeues", j.Unhandled)
		return x.requeue(f, j, d.RetryAt)
	case decide.Rejected:
		err := x.requeue(f, j, d.RetryAt)
		x.cfg.Health.Recheck()
		return err
	case decide.Retried:
		j.Failures = d.Failures
		return x.requeue(f, j, d.RetryAt)
	case decide.DeadLettered:
		j.Failures = d.Failures
		if text == "" {
			text = d.Why
		}
		return x.dead(f, j, d.Reason, text, nil)
	case decide.Deferred:
		x.cfg.Log.Debug("asyncplatform: a job that may not run yet waits, no try spent", "queue", j.Queue, "type", j.Type, "id", j.ID, "until", d.RetryAt)
		err := x.requeue(f, j, d.RetryAt)
		if err != nil && !errors.Is(err, driver.ErrLeaseLost) {
			x.cfg.Log.Warn("asyncplatform: requeueing a job that may not run yet failed; it comes back after its lease", "queue", j.Queue, "type", j.Type, "id", j.ID, "error", err)
		}
		return err
	case decide.Parked:
		j.Copy++ // the held copy is the job's next copy, bound to the queue it goes back to
		msg := driver.Message{ID: wire.MessageID(j.ID, j.Copy), Dedupe: x.cfg.Codec.DedupeKey(&j.Job), Body: x.cfg.Codec.Encode(j.Queue, &j.Job), NotBefore: j.NotBefore}
		err := x.cfg.Groups.Park(context.Background(), j.Queue, j.Group, j.ID, msg, func() error { return f.Settle(x.cfg.Backend, x.cfg.Log, true, nil, nil) })
		if errors.Is(err, pause.ErrNotParked) { // it comes again, and the pause is read again
			j.Copy--
			x.cfg.Log.Warn("asyncplatform: setting aside a job of a paused group failed; it comes back later", "queue", j.Queue, "group", j.Group, "id", j.ID, "error", err)
			d.Outcome, d.RetryAt = decide.Deferred, time.Now().Add(x.cfg.GroupPoll)
			return x.requeue(f, j, d.RetryAt)
		}
		return err
	}
	return fmt.Errorf("asyncplatform: no way to settle outcome %v", d.Outcome)
}

// report publishes, for a queue with an output queue, the report of a
// decision that ends the job (success or dead letter), before the caller
// settles the delivery. It returns the job and decision to settle: the same
// ones, or, when the report could not be published, the job as delivered
// and a rejection (requeued uncounted after the reject delay): the input is
// never acknowledged before its report is stored.
func (x *Executor[V]) report(f *Delivery[V], j *Job, d decide.Decision, text string, result []byte) (*Job, decide.Decision) {
	if x.cfg.Report == nil || (d.Outcome != decide.Succeeded && d.Outcome != decide.DeadLettered) {
		return j, d
	}
	err := x.cfg.Report(j, d, text, result)
	if err == nil {
		return j, d
	}
	x.cfg.Log.Warn("asyncplatform: publishing an outcome report failed; the job is requeued uncounted and will end again",
		"queue", f.D.Queue, "id", j.ID, "error", err)
	var next Job
	if derr := x.decode(f.D, &next, nil); derr != nil { // it decoded once already
		return j, d
	}
	if d.Outcome == decide.Succeeded {
		next.Suspect = false // it ran and reported an outcome
	}
	back := decide.Decision{Outcome: decide.Rejected, RetryAt: time.Now().Add(x.cfg.Base.RejectDelay),
		Failures: next.Failures, Crashes: next.Crashes, Unhandled: next.Unhandled}
	return &next, back
}

// requeue replaces the delivery with the next copy of j, due at at when
// at is ahead; otherwise the copy keeps the job's NotBefore, which has
// passed.
func (x *Executor[V]) requeue(f *Delivery[V], j *Job, at time.Time) error {
	j.Copy++
	if at.After(time.Now()) {
		j.NotBefore = at
	}
	msg := driver.Message{ID: wire.MessageID(j.ID, j.Copy), Dedupe: x.cfg.Codec.DedupeKey(&j.Job), Body: x.cfg.Codec.Encode(f.D.Queue, &j.Job), NotBefore: j.NotBefore}
	return f.Settle(x.cfg.Backend, x.cfg.Log, false, &msg, nil)
}

// HandBack returns a delivery uncounted: claimed ahead and not run, at a
// stop, a pause or a suspect's isolation.
func (x *Executor[V]) HandBack(f *Delivery[V]) error {
	var j Job
	if err := x.decode(f.D, &j, nil); err != nil {
		x.deadRaw(f, err) // not a job: never leave it held
		return nil
	}
	err := x.requeue(f, &j, time.Time{})
	if err == nil {
		x.cfg.Log.Debug("asyncplatform: handed back", "queue", j.Queue, "id", j.ID, "type", j.Type)
	}
	return err
}

// dead dead-letters the delivery as j, or as raw bytes when raw is non-nil.
func (x *Executor[V]) dead(f *Delivery[V], j *Job, reason decide.Reason, text string, raw []byte) error {
	j.TryCount = j.Failures + j.Crashes
	rec := &wire.Dead{Job: j.Job, Queue: f.D.Queue, Reason: string(reason), Error: text, DeadAt: time.Now(), Worker: x.cfg.Worker, Raw: raw}
	id := wire.MessageID(j.ID, j.Copy)
	dm := driver.DeadMessage{ID: id, Body: x.fitDead(rec)}
	if err := f.Settle(x.cfg.Backend, x.cfg.Log, false, nil, &dm); err != nil {
		return err
	}
	if x.cfg.Release != nil && raw == nil {
		x.cfg.Release(j, true)
	}
	x.cfg.Log.Warn("asyncplatform: dead-lettered", "queue", f.D.Queue, "id", j.ID, "type", j.Type, "reason", reason, "tries", j.TryCount, "error", wire.FirstLine(text))
	if hook := x.cfg.OnDead; hook != nil {
		hook(id, rec)
	}
	return nil
}

// fitDead encodes a dead-letter record within the backend's limit: the oldest
// error lines go first, then the error text is cut (never below
// MinDeadError), then raw bytes are cut (saying so in the error). The
// platform keeps enough headroom under the payload limit that the first two
// are enough for any job that could be enqueued.
func (x *Executor[V]) fitDead(dl *wire.Dead) []byte {
	if len(dl.Error) > x.cfg.MaxErrorText {
		dl.Error = fmt.Sprintf("%s …(cut: the error had %d bytes; Config.MaxErrorText keeps %d)", wire.CutUTF8(dl.Error, x.cfg.MaxErrorText), len(dl.Error), x.cfg.MaxErrorText)
	}
	body := wire.EncodeDead(dl)
	for limit, last := x.cfg.Codec.MaxBody-x.cfg.Codec.Overhead(), len(body)+1; len(body) > limit && len(body) < last; last, body = len(body), wire.EncodeDead(dl) {
		excess := len(body) - limit
		switch {
		case len(dl.Job.Errors) > 0:
			dl.Job.Errors = dl.Job.Errors[1:]
		case len(dl.Error) > x.cfg.MinDeadError:
			const note = " …(cut to fit)"
			dl.Error = wire.CutUTF8(dl.Error, max(x.cfg.MinDeadError-len(note), len(dl.Error)-excess-32-len(note))) + note
		case len(dl.Raw) > 0:
			keep := max(0, len(dl.Raw)-excess-128)
			dl.Error += fmt.Sprintf(" (the raw message had %d bytes; only the first %d fit in a dead letter)", len(dl.Raw), keep)
			dl.Raw = dl.Raw[:keep:keep]
		default:
			return x.cfg.Codec.Seal(body) // nothing left to cut; the backend will refuse it and say why
		}
	}
	return x.cfg.Codec.Seal(body) // fits, or no cut made it smaller: the backend says why it refuses
}

// deadRaw dead-letters a message that is not a job, keeping its bytes.
func (x *Executor[V]) deadRaw(f *Delivery[V], cause error) {
	j := &Job{Job: wire.Job{ID: wire.NewID(time.Now())}, Queue: f.D.Queue}
	raw := append([]byte{}, f.D.Body...)
	text := "the message is not an asyncplatform job: " + cause.Error()
	if errors.Is(cause, wire.ErrUnsigned) || errors.Is(cause, wire.ErrBadSignature) ||
		errors.Is(cause, wire.ErrWrongQueue) || errors.Is(cause, wire.ErrUnbound) || errors.Is(cause, wire.ErrStale) {
		text = cause.Error()
	}
	_ = x.dead(f, j, decide.Invalid, text, raw)
}

// HeldCopy decodes a delivery of a held queue as a job and returns the ID
// of its message and the message that moves it back where it came from:
// its bytes unchanged, under the ID it was held with. The held copy is
// already the job's next copy (Park wrote it so), and unchanged it keeps
// its signature, which a platform without the SigningKey could not write
// again. A delivery that is not a job gives an error.
func (x *Executor[V]) HeldCopy(d *driver.Delivery) (id string, msg driver.Message, err error) {
	var j Job
	if err := x.decode(d, &j, nil); err != nil {
		return "", driver.Message{}, err
	}
	id = wire.MessageID(j.ID, j.Copy)
	body := d.Body
	if q, bound := j.Headers[wire.QueueHeader]; bound && x.cfg.Codec.Keys != nil {
		// Signed anew, for the queue it was bound to: held longer than a
		// ReplayWindow, the held signing time would have it refused.
		body = x.cfg.Codec.Encode(q, &j.Job)
	}
	return id, driver.Message{ID: id, Dedupe: x.cfg.Codec.DedupeKey(&j.Job), Body: body, NotBefore: j.NotBefore}, nil
}
