package asyncplatform

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/jobctx"
	"github.com/asyncplatform/asyncplatform/internal/pause"
	"github.com/asyncplatform/asyncplatform/internal/runner"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// inflight is one delivery held by this platform, with its decoded job.
type inflight = runner.Delivery[Job]

// decodeDelivery decodes a delivery's job and adds the crashes its earlier
// deliveries imply (see driver: every outcome but Ack writes a new copy, so
// each earlier delivery of this copy ended with no outcome).
// Each of those crashes gets a line in the error history.
func (p *Platform) decodeDelivery(d *driver.Delivery, j *Job, reg *registry) error {
	var names map[string]string
	if reg != nil {
		names = reg.names
	}
	body, err := p.unwrap(d.Body)
	if err != nil {
		return err
	}
	if err := decodeJob(body, j, names); err != nil {
		return err
	}
	j.Queue = d.Queue
	if len(j.Headers) > 0 {
		j.Group = j.Headers[GroupHeader]
	}
	if p.cfg.levels != nil {
		j.Priority = p.cfg.levels[d.Queue].level
	}
	// The count comes from the broker (on some, partly from a header any
	// writer sets): bound it, and write lines only for the crashes the
	// history keeps, never one loop turn per claimed delivery.
	extra := min(max(d.Deliveries-1, 0), maxCrashes-j.Crashes)
	first := j.Crashes + 1
	j.Crashes += extra
	j.suspect = j.suspect || extra > 0
	for c := max(first, j.Crashes-p.cfg.ErrorHistory+1); c <= j.Crashes; c++ {
		j.Errors = appendHistory(j.Errors, fmt.Sprintf("try %d%s", j.Failures+c, crashNote), p.cfg.ErrorHistory)
	}
	j.TryCount = j.Failures + j.Crashes
	return nil
}

// crashNote ends the history line of a delivery that ended with no outcome.
const crashNote = ": no outcome (the worker died or lost its lease)"

// maxCrashes bounds a job's crash count, whatever a broker reports.
const maxCrashes = 1 << 30

// suspect reports whether j was in a process that died and has not reported
// an outcome since. The envelope carries it as a flag; the history's lines
// are for people and are never read back.
func suspect(j *Job) bool { return j.suspect }

// cleared marks j as having reported an outcome since its crash (a
// suspect's isolated run was rejected): its next copy is no suspect.
func cleared(j *Job) {
	if !j.suspect {
		return
	}
	j.suspect = false
	if last := len(j.Errors) - 1; last >= 0 { // its crash's line
		j.Errors = append(j.Errors[:last:last], j.Errors[last]+"; it then ran alone and reported an outcome")
	}
}

// process takes one delivery through the pipeline: decode → gate → run →
// decide → settle. What becomes of it is decided by decide.Decide alone.
func (p *Platform) process(q *runner.Queue[Job], qp Policy, t *jobctx.Timer, f *inflight) {
	reg := p.handlers.Load()
	j := &f.Job
	if err := p.decodeDelivery(f.D, j, reg); err != nil { // decode
		p.deadRaw(f, err)
		return
	}
	if p.stopping.Load() || !p.health.OK() || q.Paused(f.D.Queue) { // claimed ahead, before the stop, the failed check or the pause
		p.handBack(f) // not an end: nothing is reported, its status stays
		return
	}
	h := reg.byType[j.Type]
	in := p.input(j, h, qp)
	p.warnTries(j)
	// A job of a paused group is set aside whatever its status says, so
	// its status is neither read nor written.
	in.Group = p.pz.Group(context.Background(), j.Queue, j.Group, j.ID)
	if in.Group == decide.GroupOpen {
		j.track, in.Cancelled = p.status.Begin(context.Background(), statusJob(j))
	}
	if in.Group != decide.GroupOpen || p.status.Tracks(j.Queue) {
		in.Now = time.Now() // after a store round trip
	}
	if d := decide.Decide(in); d.Outcome != decide.Run { // gate
		p.apply(f, j, d, "")
		return
	}
	ticket, wait, ok := p.lim.Admit(p.stopCtx, j.Type, j.ID, q.Concurrency())
	if !ok { // admission: the gate again, with the type's limits
		in.OverLimit, in.LimitWait, in.Jitter = true, wait, rand.Float64()
		in.Stopping, in.Now = p.stopping.Load(), time.Now()
		p.apply(f, j, decide.Decide(in), "")
		return
	}
	defer ticket.Release(context.Background())
	isolated := false
	if suspect(j) && !p.cfg.DisableIsolation { // it was in a process that died: it runs alone
		if !p.isolate(f) {
			return
		}
		defer p.endIsolation()
		isolated = true
	}
	if !p.loadPayload(f, j, in) {
		return
	}
	if j.track.Running(context.Background()) { // Cancel came first: it never runs
		in.Cancelled, in.Now = true, time.Now()
		p.apply(f, j, decide.Decide(in), "")
		return
	}
	id := j.ID
	res, ok := p.run(t, f, h, in.Policy.Timeout) // run
	if !ok {
		return
	}
	herr, start, dur, timedOut := res.err, res.start, res.dur, res.timedOut
	if j.ID != id { // the handler changed it; the payload and the log go by the job's own
		j.ID = id
	}
	f.Ctx.Cancel(context.Canceled)
	q.FreeSlot(f)

	// The next copy and any dead letter are built from the job as
	// delivered, not from whatever the handler did to *Job.
	var next Job
	if herr != nil {
		_ = p.decodeDelivery(f.D, &next, reg) // it decoded once already
		next.TryCount = j.TryCount
	}
	in.Result, in.RejectAfter = classify(herr) // decide
	in.Stopping = p.workCtx.Err() != nil
	in.Cancelled = j.track.Ended(context.Background(), herr != nil)
	in.Now = start.Add(dur) // the handler's end, without another clock read
	in.Jitter = rand.Float64()
	d := decide.Decide(in)
	if isolated && d.Outcome == decide.Rejected {
		cleared(&next)
	}
	a := Attempt{Job: j, Err: herr, Duration: dur, RetryAt: d.RetryAt, Isolated: isolated}
	if d.Outcome == decide.Succeeded {
		a.Result = j.result
	}
	text, settled := "", j
	if herr != nil {
		text = herr.Error()
		if timedOut {
			text = fmt.Sprintf("timed out after %v: %s", in.Policy.Timeout, text)
		}
		if in.Result != decide.Rejection && !in.Stopping {
			next.suspect = false // it reported an outcome: a failure
			next.Errors = appendHistory(next.Errors, fmt.Sprintf("try %d at %s: %s", next.TryCount, start.UTC().Format(time.RFC3339), firstLine(text)), p.cfg.ErrorHistory)
		}
		var pe *PanicError
		if errors.As(herr, &pe) {
			text += "\n" + string(pe.Stack)
		}
		settled = &next
	}
	a.Outcome, a.Reason = outcomeOf(d)
	serr := p.apply(f, settled, d, text) // settle
	switch {
	case serr == nil:
	case errors.Is(serr, runner.ErrSettled):
		a.Outcome = OutcomeHandedBack // Stop handed it back first
	default:
		a.Outcome = OutcomeLeaseLost
	}
	if hook := p.cfg.Hooks.AfterAttempt; hook != nil {
		hook(context.Background(), a)
	}
}

// isolate makes f's job, a suspect, the only delivery this platform holds:
// it closes the gate (no queue takes jobs), hands back uncounted the
// deliveries claimed ahead (the platform's and those a backend buffered:
// driver.Releaser), and waits for the running handlers to finish and
// settle. If the suspect then kills the process, the crash is charged to it
// alone. Only one suspect is isolated at a time: another is handed back and
// comes again. It returns false when f was handed back instead (another
// suspect is running alone, or the platform is stopping); on false, and on
// a panic, the isolation is undone here.
func (p *Platform) isolate(f *inflight) (ok bool) {
	if !p.suspect.TryLock() {
		p.handBack(f)
		return false
	}
	p.health.Hold()
	defer func() {
		if !ok {
			p.endIsolation()
		}
	}()
	j := &f.Job
	since, warned := time.Now(), false
	for {
		for _, q := range p.queues {
			q.HandBackQueued(p.handBack)
		}
		held, receiving := 0, false
		for _, q := range p.queues {
			h, r := q.Quiet()
			held, receiving = held+h, receiving || r
		}
		if held <= 1 && !receiving {
			break
		}
		if p.stopping.Load() {
			p.handBack(f)
			return false
		}
		if !warned && time.Since(since) > p.cfg.Lease {
			warned = true
			p.log.Warn("asyncplatform: a suspect waits for the handlers beside it to finish before it runs alone", "queue", j.Queue, "id", j.ID, "type", j.Type, "held", held-1)
		}
		time.Sleep(time.Millisecond)
	}
	if r, isReleaser := p.backend.(driver.Releaser); isReleaser {
		for _, q := range p.queues {
			for _, name := range q.Names() {
				if err := r.Release(context.Background(), name); err != nil {
					p.log.Warn("asyncplatform: releasing the backend's buffered messages before a suspect runs failed; they come back after their lease", "queue", name, "error", err)
				}
			}
		}
	}
	p.log.Warn("asyncplatform: running a suspect alone (a worker holding it died)", "queue", j.Queue, "id", j.ID, "type", j.Type, "crashes", j.Crashes)
	return true
}

func (p *Platform) endIsolation() {
	p.health.Release()
	p.suspect.Unlock()
}

// input gathers what the decision depends on, before the handler runs.
func (p *Platform) input(j *Job, h *handlerEntry, qp Policy) decide.Input {
	pol := j.Policy
	if h != nil {
		pol = pol.merge(h.policy)
	}
	return decide.Input{
		Failures: j.Failures, Crashes: j.Crashes, Unhandled: j.unhandled,
		Type: j.Type, Deadline: j.Deadline, HasHandler: h != nil,
		Policy:           pol.merge(qp).merge(p.cfg.Policy).resolve(),
		UnhandledRetries: *p.cfg.UnhandledRetries, UnhandledDelay: p.cfg.UnhandledDelay,
		RejectDelay: p.cfg.RejectDelay, GroupPoll: PausePoll, LimitDelay: p.cfg.LimitDelay,
		Now: time.Now(),
	}
}

// classify turns a handler's error into the decision's input.
func classify(err error) (decide.Result, time.Duration) {
	if err == nil {
		return decide.OK, 0
	}
	if rej := asReject(err); rej != nil {
		return decide.Rejection, rej.Delay
	}
	var inv *InvalidError
	var perm *PermanentError
	switch {
	case errors.As(err, &inv):
		return decide.InvalidInput, 0
	case errors.As(err, &perm):
		return decide.PermanentFailure, 0
	}
	return decide.Failed, 0
}

// outcomeOf names a decision for Hooks.AfterAttempt.
func outcomeOf(d decide.Decision) (Outcome, Reason) {
	switch d.Outcome {
	case decide.Succeeded:
		return OutcomeSucceeded, ""
	case decide.Retried:
		return OutcomeRetried, ""
	case decide.Rejected:
		return OutcomeRejected, ""
	case decide.HandedBack, decide.Requeued, decide.Deferred, decide.Parked:
		return OutcomeHandedBack, ""
	case decide.DeadLettered:
		return OutcomeDeadLettered, Reason(d.Reason)
	}
	panic(fmt.Sprintf("asyncplatform: no attempt outcome for %v", d.Outcome))
}

// apply settles the delivery as d says; j is the job the next copy or the
// dead letter is built from, text the handler's error for a dead letter.
// Every decision ends here, whoever made it (the gate, admission, the
// handler's verdict), so the output report and the status are written the
// same way for each. A delivery claimed ahead and handed back unrun (a
// stop, a pause, a suspect's isolation) is no decision: it is handed back
// without a report or a status write.
func (p *Platform) apply(f *inflight, j *Job, d decide.Decision, text string) (err error) {
	j, d = p.report(f, j, d, text) // an end is reported to the output queue before it is settled (output.go)
	defer func() {
		if err == nil {
			f.Job.track.Settled(context.Background(), d, f.Job.TryCount, f.Job.result, firstLine(text))
		}
	}()
	switch d.Outcome {
	case decide.Succeeded:
		err := p.settle(f, true, nil, nil)
		if err == nil {
			p.dropPayload(context.Background(), j.ID, j.payloadRef)
			p.claims.Release(context.Background(), j.Queue, j.ID, j.Headers[UniqueHeader], false)
		}
		return err
	case decide.HandedBack:
		return p.handBack(f)
	case decide.Requeued:
		j.unhandled = d.Unhandled
		p.log.Debug("asyncplatform: no handler; requeued", "queue", j.Queue, "id", j.ID, "type", j.Type, "requeues", j.unhandled)
		return p.requeue(f, j, d.RetryAt)
	case decide.Rejected:
		err := p.requeue(f, j, d.RetryAt)
		p.health.Recheck()
		return err
	case decide.Retried:
		j.Failures = d.Failures
		return p.requeue(f, j, d.RetryAt)
	case decide.DeadLettered:
		j.Failures = d.Failures
		if text == "" {
			text = d.Why
		}
		return p.dead(f, j, Reason(d.Reason), text, nil)
	case decide.Deferred:
		p.log.Debug("asyncplatform: a job that may not run yet waits, no try spent", "queue", j.Queue, "type", j.Type, "id", j.ID, "until", d.RetryAt)
		err := p.requeue(f, j, d.RetryAt)
		if err != nil && !errors.Is(err, driver.ErrLeaseLost) {
			p.log.Warn("asyncplatform: requeueing a job that may not run yet failed; it comes back after its lease", "queue", j.Queue, "type", j.Type, "id", j.ID, "error", err)
		}
		return err
	case decide.Parked:
		j.copyNo++ // the held copy is the job's next copy
		err := p.pz.Park(context.Background(), j.Queue, j.Group, j.ID, p.message(j), func() error { return p.settle(f, true, nil, nil) })
		if errors.Is(err, pause.ErrNotParked) { // it comes again, and the pause is read again
			j.copyNo--
			p.log.Warn("asyncplatform: setting aside a job of a paused group failed; it comes back later", "queue", j.Queue, "group", j.Group, "id", j.ID, "error", err)
			d.Outcome, d.RetryAt = decide.Deferred, time.Now().Add(PausePoll)
			return p.requeue(f, j, d.RetryAt)
		}
		return err
	}
	return fmt.Errorf("asyncplatform: no way to settle outcome %v", d.Outcome)
}

func (p *Platform) warnTries(j *Job) {
	if w := p.cfg.WarnTries; (w > 0 && j.TryCount+1 >= w) || (p.cfg.WarnCrashes > 0 && j.Crashes >= p.cfg.WarnCrashes) {
		p.log.Warn("asyncplatform: job delivered a significant number of times",
			"queue", j.Queue, "id", j.ID, "type", j.Type, "try", j.TryCount+1, "failures", j.Failures, "crashes", j.Crashes)
	}
}

// loadPayload makes j's payload the handler's own: fetched from the store
// when it was offloaded, else a copy of the delivered bytes (which must stay
// as they were: a retry, a hand-back or a redelivery is built from them).
func (p *Platform) loadPayload(f *inflight, j *Job, in decide.Input) bool {
	if j.payloadRef != "" {
		return p.fetchPayload(f, j, in)
	}
	if len(j.Payload) > 0 {
		j.Payload = bytes.Clone(j.Payload)
	}
	return true
}

// ran is what a handler call came to.
type ran struct {
	err      error
	start    time.Time
	dur      time.Duration
	timedOut bool
}

// run calls the handler under its context. ok is false when the job must
// not run here (its lease lapsed while it waited).
func (p *Platform) run(t *jobctx.Timer, f *inflight, h *handlerEntry, timeout time.Duration) (r ran, ok bool) {
	j := &f.Job
	j.TryCount++ // this attempt
	f.Ctx = jobctx.Context{Parent: p.workCtx}
	if timeout > 0 {
		f.Ctx.Due = time.Now().Add(timeout)
	}
	ctx := &f.Ctx
	j.track.Started(ctx)
	if f.Start() { // its lease lapsed while it waited: another worker has it now
		return r, false
	}
	if p.workCtx.Err() != nil { // Stop gave up waiting before it was started
		ctx.Cancel(context.Canceled)
	}
	if p.log.Enabled(ctx, slog.LevelDebug) {
		p.log.Debug("asyncplatform: attempt", "queue", j.Queue, "id", j.ID, "type", j.Type, "try", j.TryCount)
	}
	t.Begin(ctx)
	r.start = time.Now()
	r.err = call(ctx, h.h, j)
	r.dur = time.Since(r.start)
	t.End()
	r.timedOut = r.err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded)
	return r, true
}

// fetchPayload loads an offloaded payload into j. When it cannot, it settles
// the delivery itself (dead letter or uncounted requeue) and returns false.
func (p *Platform) fetchPayload(f *inflight, j *Job, in decide.Input) bool {
	in.Now = time.Now()
	store := p.cfg.PayloadStore
	if store == nil {
		in.Result = decide.PayloadGone
		p.apply(f, j, decide.Decide(in), fmt.Sprintf("the payload was offloaded (reference %q) but this worker has no PayloadStore configured", j.payloadRef))
		return false
	}
	ctx, cancel := context.WithTimeout(p.workCtx, p.cfg.Lease)
	defer cancel()
	b, err := p.getPayload(ctx, j.ID, j.payloadRef)
	switch {
	case err == nil:
		j.Payload = b
		return true
	case errors.Is(err, ErrPayloadNotFound):
		in.Result = decide.PayloadGone
		p.apply(f, j, decide.Decide(in), fmt.Sprintf("the offloaded payload is gone from the store (reference %q): %v", j.payloadRef, err))
	default: // the store is unreachable: not the job's fault, so a rejection
		p.log.Warn("asyncplatform: fetching an offloaded payload failed; requeued uncounted", "queue", j.Queue, "id", j.ID, "ref", j.payloadRef, "error", err)
		in.Result = decide.Rejection
		p.apply(f, j, decide.Decide(in), "")
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

// settle reports an outcome for the delivery, once (see runner.Delivery.Settle).
func (p *Platform) settle(f *inflight, ack bool, msg *driver.Message, rec *driver.DeadMessage) error {
	return f.Settle(p.backend, p.log, ack, msg, rec)
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
	if err := p.decodeDelivery(f.D, &j, nil); err != nil {
		p.deadRaw(f, err) // not a job: never leave it held
		return nil
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
	dl := DeadLetter{Job: *j, Queue: f.D.Queue, Reason: reason, Error: text, DeadAt: time.Now(), Worker: p.cfg.WorkerName, Raw: raw}
	dl.ID = messageID(j)
	rec := driver.DeadMessage{ID: dl.ID, Body: p.fitDead(&dl)}
	err := p.settle(f, false, nil, &rec)
	if err != nil {
		return err
	}
	p.claims.Release(context.Background(), j.Queue, j.ID, j.Headers[UniqueHeader], true)
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
	if len(dl.Error) > p.cfg.MaxErrorText {
		dl.Error = fmt.Sprintf("%s …(cut: the error had %d bytes; Config.MaxErrorText keeps %d)", cutUTF8(dl.Error, p.cfg.MaxErrorText), len(dl.Error), p.cfg.MaxErrorText)
	}
	body := encodeDead(dl)
	for limit, last := p.maxBody-p.signLen(), len(body)+1; len(body) > limit && len(body) < last; last, body = len(body), encodeDead(dl) {
		excess := len(body) - limit
		switch {
		case len(dl.Job.Errors) > 0:
			dl.Job.Errors = dl.Job.Errors[1:]
		case len(dl.Error) > minDeadError:
			const note = " …(cut to fit)"
			dl.Error = cutUTF8(dl.Error, max(minDeadError-len(note), len(dl.Error)-excess-32-len(note))) + note
		case len(dl.Raw) > 0:
			keep := max(0, len(dl.Raw)-excess-128)
			dl.Error += fmt.Sprintf(" (the raw message had %d bytes; only the first %d fit in a dead letter)", len(dl.Raw), keep)
			dl.Raw = dl.Raw[:keep:keep]
		default:
			return p.sign(body) // nothing left to cut; the backend will refuse it and say why
		}
	}
	return p.sign(body) // fits, or no cut made it smaller: the backend says why it refuses
}

// cutUTF8 returns s cut to at most n bytes, not inside a UTF-8 sequence.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// deadRaw dead-letters a message that is not a job, keeping its bytes.
func (p *Platform) deadRaw(f *inflight, cause error) {
	j := &Job{ID: newID(time.Now()), Queue: f.D.Queue}
	raw := append([]byte{}, f.D.Body...)
	text := "the message is not an asyncplatform job: " + cause.Error()
	if errors.Is(cause, wire.ErrUnsigned) || errors.Is(cause, wire.ErrBadSignature) {
		text = cause.Error()
	}
	p.dead(f, j, ReasonInvalid, text, raw)
}

func appendHistory(h []string, line string, limit int) []string {
	if len(line) > 1024 {
		line = cutUTF8(line, 1024) + "…"
	}
	keep := h
	if len(keep) >= limit {
		keep = keep[len(keep)-limit+1:]
	}
	out := make([]string, len(keep), len(keep)+1)
	copy(out, keep)
	return append(out, line)
}

// firstLine is the first line of s, at most 1 KiB of it, for a log line.
func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 1024 {
		return cutUTF8(s, 1024) + "…"
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
