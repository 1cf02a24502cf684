package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/executor"
	"github.com/asyncplatform/asyncplatform/internal/runner"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// inflight is one delivery held by this platform.
type inflight = executor.Delivery[Job]

// newExecutor wires the executor of p: the engines, the handlers and the
// conversions between the envelope and the public types (Job, Attempt,
// DeadLetter, OutcomeReport), which the executor does not know.
func newExecutor(p *Platform) *executor.Executor[Job] {
	cfg := executor.Config[Job]{
		Backend: p.backend, Codec: p.codec, Log: p.log, Health: &p.health,
		Worker: p.cfg.WorkerName, Lease: p.cfg.Lease,
		ErrorHistory: p.cfg.ErrorHistory, MaxErrorText: p.cfg.MaxErrorText, MinDeadError: minDeadError,
		WarnTries: p.cfg.WarnTries, WarnCrashes: p.cfg.WarnCrashes, Isolate: !p.cfg.DisableIsolation,
		GroupPoll: PausePoll,
		Base: decide.Input{
			UnhandledRetries: *p.cfg.UnhandledRetries, UnhandledDelay: p.cfg.UnhandledDelay,
			RejectDelay: p.cfg.RejectDelay, GroupPoll: PausePoll, LimitDelay: p.cfg.LimitDelay,
		},
		Handlers:    func() executor.Registry[Job] { return p.handlers.Load() },
		Policies:    executor.Policies{Queues: make(map[string]wire.Policy, len(p.cfg.Queues)), Platform: wire.Policy(p.cfg.Policy), Defaults: defaultPolicy},
		Classify:    classify,
		ErrorDetail: errorDetail,
		Groups:      p.pz,
		Status:      p.status,
		Admission:   p.lim,
		Release: func(j *executor.Job, dead bool) {
			p.claims.ReleaseLater(j.Queue, j.ID, j.Headers[UniqueHeader], dead)
		},
	}
	for name, q := range p.cfg.Queues {
		cfg.Policies.Queues[name] = wire.Policy(q.Policy)
	}
	if p.cfg.levels != nil {
		cfg.Levels = make(map[string]int, len(p.cfg.levels))
		for name, lv := range p.cfg.levels {
			cfg.Levels[name] = lv.level
		}
	}
	if p.payloads != nil {
		cfg.Payloads = p.payloads
	}
	rep := &executor.Reporter{
		Outputs: map[string]string{}, Worker: p.cfg.WorkerName, MaxErrorText: p.cfg.MaxErrorText, Lease: p.cfg.Lease,
		Enqueue: func(ctx context.Context, id, out string, b []byte, nonce string) error {
			return p.enqueue(ctx, []*Job{{ID: id, Type: ReportType, Queue: out, Payload: b, statusNonce: nonce}})
		},
	}
	for name, q := range p.cfg.Queues {
		if q.Output != "" {
			rep.Outputs[name] = q.Output
			cfg.Report = rep.Report
		}
	}
	cfg.AfterAttempt = func(w *executor.Work[Job], a executor.Attempt) {
		p.countAttempt(w, a)
		if hook := p.cfg.Hooks.AfterAttempt; hook != nil {
			hook(context.Background(), attemptOf(w, a))
		}
	}
	cfg.OnDead = func(id string, rec *wire.Dead) {
		p.workflowDead(rec)
		if hook := p.cfg.Hooks.OnDeadLetter; hook != nil {
			dl := deadLetterOf(id, rec)
			dl.Job.Priority = p.cfg.levels[rec.Queue].level
			hook(context.Background(), dl)
		}
	}
	return executor.New(cfg)
}

// Handler implements executor.Registry.
func (r *registry) Handler(typ string) executor.Handler[Job] {
	if e := r.byType[typ]; e != nil {
		return e
	}
	return nil
}

// Names implements executor.Registry.
func (r *registry) Names() map[string]string { return r.names }

// view is the handler's Job with room beside it for a small payload's copy:
// one allocation where a Job and its payload would take two. 128 bytes
// keep a view within 512 bytes, the largest size the Go allocator serves
// without a header of its own.
type view struct {
	Job
	payload [128]byte
}

// Run implements executor.Handler: the handler gets a Job of its own, made
// from the job as delivered.
func (e *handlerEntry) Run(ctx context.Context, w *executor.Work[Job]) ([]byte, error) {
	v := new(view)
	j := &v.Job
	w.View = j
	fromWire(&w.Job.Job, j)
	if len(j.Headers) > 0 {
		// The handler's headers are its own: what it does to them reaches
		// nothing the platform reads after it (the unique claim released,
		// the group, the output report). The enqueue nonce is the
		// platform's (status, deduplication keys), not the handler's.
		j.Headers = maps.Clone(j.Headers)
		delete(j.Headers, wire.StatusHeader)
	}
	j.Queue, j.Group, j.Priority, j.TryCount, j.Payload = w.Job.Queue, w.Job.Group, w.Job.Priority, w.Job.TryCount, w.Payload
	if n := len(w.Payload); n > 0 && w.Job.PayloadRef == "" { // the handler's own copy of the delivered bytes
		if n <= len(v.payload) {
			j.Payload = v.payload[:n:n]
			copy(j.Payload, w.Payload)
		} else {
			j.Payload = append([]byte(nil), w.Payload...)
		}
	}
	err := call(ctx, e.h, j)
	if j.ID != w.Job.ID { // the hooks go by the job's own ID, whatever the handler did
		j.ID = w.Job.ID // written only then: a handler may keep its *Job
	}
	return j.result, err
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

// Policy implements the executor's type policy: the policy given to
// Handle.
func (e *handlerEntry) Policy() wire.Policy { return wire.Policy(e.policy) }

// classify turns a handler's error into the decision's input.
func classify(err error) (decide.Result, time.Duration) {
	if err == nil {
		return decide.OK, 0
	}
	if r, ok := classifyStep(err); ok {
		return r, 0
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

// asReject returns the RejectError in err's chain, or nil.
func asReject(err error) *RejectError {
	var rej *RejectError
	if errors.As(err, &rej) {
		return rej
	}
	return nil
}

// errorDetail is what a dead letter keeps after a handler's error text: a
// panic's stack.
func errorDetail(err error) string {
	var pe *PanicError
	if errors.As(err, &pe) {
		return "\n" + string(pe.Stack)
	}
	return ""
}

// attemptOf is the Attempt of one handler call, for Hooks.AfterAttempt.
func attemptOf(w *executor.Work[Job], a executor.Attempt) Attempt {
	out := Attempt{Job: w.View, Err: a.Err, Duration: a.Duration, RetryAt: a.Decision.RetryAt, Isolated: a.Isolated, Result: a.Result}
	out.Outcome, out.Reason = outcomeOf(a.Decision)
	switch {
	case a.Settle == nil:
	case errors.Is(a.Settle, runner.ErrSettled):
		out.Outcome = OutcomeHandedBack // Stop handed it back first
	default:
		out.Outcome = OutcomeLeaseLost
	}
	return out
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

// deadLetterOf is the DeadLetter of a record the executor wrote.
func deadLetterOf(id string, rec *wire.Dead) DeadLetter {
	dl := DeadLetter{ID: id, Queue: rec.Queue, Reason: Reason(rec.Reason), Error: rec.Error, DeadAt: rec.DeadAt, Worker: rec.Worker, Raw: rec.Raw}
	if rec.Raw != nil {
		dl.Job = Job{ID: rec.Job.ID, Queue: rec.Queue}
		return dl
	}
	fromWire(&rec.Job, &dl.Job)
	dl.Job.Queue = rec.Queue
	dl.Job.Group = rec.Job.Headers[GroupHeader]
	dl.Job.TryCount = dl.Job.Failures + dl.Job.Crashes
	dl.PayloadRef = rec.Job.PayloadRef
	return dl
}
