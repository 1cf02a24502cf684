package asyncplatform

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/executor"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// DefaultQueue is the queue a job goes to when Job.Queue is empty.
const DefaultQueue = "default"

// Job is one unit of background work.
//
// The fields above the line are set by the caller of Enqueue; the counters
// below it are set by the platform and are visible to the handler.
type Job struct {
	// ID is unique; Enqueue generates one (a UUIDv7 string) when it is empty.
	ID string

	// Type selects the handler registered with Platform.Handle. Required.
	Type string

	// Queue is the queue the job waits in. Defaults to DefaultQueue.
	Queue string

	// Payload is opaque to the platform: any bytes, empty and non-UTF-8
	// included.
	Payload []byte

	// Headers carry user metadata and trace context. Keys must not be empty.
	// A handler's Job holds its own copy: what a handler does to it reaches
	// nothing the platform reads (the unique claim's release, the output
	// report, a retry).
	Headers map[string]string

	// NotBefore delays the job: it is not attempted before this time. The
	// zero value means now.
	NotBefore time.Time

	// Deadline, when set, is the time after which the job is no longer worth
	// running: a job that could not start before it is dead-lettered with
	// reason ReasonExpired, without running.
	Deadline time.Time

	// Policy overrides the job type's, queue's and platform's settings for
	// this job alone. The zero value overrides nothing.
	Policy Policy

	// UniqueKey, when set, makes the job unique: while a live job holds the
	// key (waiting, scheduled, running, or waiting for a retry), Enqueue of
	// another job with the same key stores nothing and returns an error
	// matching ErrDuplicate. Keys follow the Store's key grammar and are
	// shared by every queue of the backend. A unique job needs the
	// backend's store (Platform.Store). See UniqueHeader.
	UniqueKey string

	// UniqueWindow is the longest the key is held: at its end the key is
	// free whatever became of the job. Defaults to DefaultUniqueWindow.
	UniqueWindow time.Duration

	// UniqueRelease says whether the key is released before the window
	// ends: when the job succeeds or is dead-lettered (ReleaseOnFinish),
	// when it succeeds (ReleaseOnSuccess), or never (ReleaseOnWindow).
	// Defaults to ReleaseOnFinish.
	UniqueRelease UniqueRelease

	// Priority, from 0 (the default) to MaxPriority, is the job's level in
	// its queue: Enqueue stores a job of level n > 0 on PriorityQueue(Queue,
	// n) and sets Queue to that name. Workers whose QueueConfig.Priorities
	// is set take the higher levels first; a worker reads it back from the
	// queue it took the job from.
	Priority int

	// Group, when set, puts the job in a group (a customer, a tenant, a
	// batch) that can be paused on its own queue while the queue's other
	// jobs flow (Platform.PauseGroup). 1 to MaxGroupLen bytes of
	// [A-Za-z0-9_-]. It rides in the GroupHeader header, which a worker
	// reads back into Group when it is a valid group name (a header that
	// is not is no group, and the worker logs a warning: any writer to the
	// broker writes headers). Defaults to none.
	Group string

	// ---- set by the platform ----

	// EnqueuedAt is when the job was first enqueued (kept across retries and
	// redrives).
	EnqueuedAt time.Time

	// TryCount is the number of attempts so far, the current one included:
	// 0 when enqueued, 1 on the first attempt. It is Failures + Crashes + 1
	// inside a handler.
	TryCount int

	// Failures counts attempts whose handler returned an error, panicked or
	// timed out.
	Failures int

	// Crashes counts deliveries that ended with no outcome at all: the
	// worker died or lost its lease.
	Crashes int

	// Errors is the error history: one line per failed attempt, oldest
	// first, bounded (see Config.ErrorHistory).
	Errors []string

	// copyNo numbers the copies of the job written by retries and redrives.
	copyNo uint64
	// statusNonce binds the job's status record to this enqueue (a tracked
	// queue's; internal/status); kept so that Enqueue retried with the same
	// Job writes the same message.
	statusNonce string
	// delivered marks a job decoded off the broker (a delivery or a dead
	// letter): Enqueue of it writes a new copy, with a new copy number.
	delivered bool
	// unhandled counts requeues for want of a handler.
	unhandled int
	// suspect marks a job whose newest delivery ended with no outcome (a
	// worker holding it died or lost its lease) and that has reported no
	// outcome since: it runs alone (see Config.DisableIsolation).
	suspect bool
	// payloadRef points at the payload in the PayloadStore when it was
	// offloaded; the message then carries no payload.
	payloadRef string
	// result is what the handler recorded with SetResult (never encoded).
	result []byte
}

// CopyNumber numbers the copy of the job being handled: 0 for the copy Enqueue
// wrote, then one more for every copy written since (a retry, a rejection, a
// shutdown hand-back, a redrive, an Enqueue of a job a handler or a dead
// letter gave). Delivery is at least once, so
// one copy can be handled twice: a copy written twice (a write re-sent after
// a lost confirm) comes with the same counters; an acknowledgement lost in a
// connection cut or a broker restart brings the copy back with one more
// crash counted. Either way ID and CopyNumber are the same, which tells a
// duplicate delivery from a new attempt; side effects should be idempotent
// on ID.
func (j *Job) CopyNumber() uint64 { return j.copyNo }

// Policy holds the failure-handling settings that can be given at four levels:
// the job (Job.Policy), the job type (Platform.Handle), the queue
// (Config.Queues) and the platform (Config.Policy). For each field the most
// specific level that sets it wins, and the default applies when none does.
// A nil pointer or a zero duration is "not set".
type Policy struct {
	// RetryLimit is how many failures are allowed before the job is
	// dead-lettered with reason ReasonRetriesExceeded: a job whose handler
	// always fails runs RetryLimit+1 times. Use Limit(n) to set it; Limit(0)
	// means no retry. Defaults to DefaultRetryLimit.
	RetryLimit *int

	// PoisonLimit is how many crashes (deliveries with no outcome) are
	// allowed before the job is dead-lettered with reason ReasonPoisoned,
	// without calling its handler: a job that kills its worker every time
	// is attempted PoisonLimit+1 times. Defaults to DefaultPoisonLimit.
	PoisonLimit *int

	// BackoffBase is the delay before the first retry; the n-th retry waits
	// a random duration up to BackoffBase·2^(n-1), capped at BackoffCap
	// (exponential backoff with full jitter). Defaults to DefaultBackoffBase.
	BackoffBase time.Duration

	// BackoffCap bounds the backoff delay. Defaults to DefaultBackoffCap.
	BackoffCap time.Duration

	// Timeout bounds one attempt: past it the handler's context is
	// cancelled and the attempt counts as a failure. A negative value means
	// no timeout. Defaults to DefaultTimeout.
	Timeout time.Duration
}

// Defaults of Policy.
const (
	DefaultRetryLimit  = 10
	DefaultPoisonLimit = 3
	DefaultBackoffBase = time.Second
	DefaultBackoffCap  = 10 * time.Minute
	DefaultTimeout     = time.Minute
)

// Limit returns a pointer to n, for Policy.RetryLimit and Policy.PoisonLimit.
func Limit(n int) *int { return &n }

// merge returns p with every unset field taken from q.
func (p Policy) merge(q Policy) Policy { return Policy(executor.Merge(wire.Policy(p), wire.Policy(q))) }

// validate names the first bad setting of p, prefixed with where it was given.
func (p Policy) validate(where string) error {
	switch {
	case p.RetryLimit != nil && (*p.RetryLimit < 0 || *p.RetryLimit > math.MaxInt32):
		return fmt.Errorf("%w: %s: RetryLimit is %d, it must be 0 to %d", ErrInvalidConfig, where, *p.RetryLimit, math.MaxInt32)
	case p.PoisonLimit != nil && *p.PoisonLimit > math.MaxInt32:
		return fmt.Errorf("%w: %s: PoisonLimit is %d, at most %d", ErrInvalidConfig, where, *p.PoisonLimit, math.MaxInt32)
	case p.RetryLimit != nil && *p.RetryLimit < 0:
		return fmt.Errorf("%w: %s: RetryLimit is %d, it must be 0 or more", ErrInvalidConfig, where, *p.RetryLimit)
	case p.PoisonLimit != nil && *p.PoisonLimit < 0:
		return fmt.Errorf("%w: %s: PoisonLimit is %d, it must be 0 or more", ErrInvalidConfig, where, *p.PoisonLimit)
	case p.BackoffBase < 0:
		return fmt.Errorf("%w: %s: BackoffBase is %v, it must not be negative", ErrInvalidConfig, where, p.BackoffBase)
	case p.BackoffCap < 0:
		return fmt.Errorf("%w: %s: BackoffCap is %v, it must not be negative", ErrInvalidConfig, where, p.BackoffCap)
	}
	return nil
}

// defaultPolicy is the Policy defaults, resolved.
var defaultPolicy = decide.Policy{
	RetryLimit:  DefaultRetryLimit,
	PoisonLimit: DefaultPoisonLimit,
	BackoffBase: DefaultBackoffBase,
	BackoffCap:  DefaultBackoffCap,
	Timeout:     DefaultTimeout,
}

// resolve fills in the defaults of every unset field.
func (p Policy) resolve() decide.Policy { return executor.Resolve(wire.Policy(p), defaultPolicy) }

// Handler runs one attempt of a job. Its outcome decides what happens next:
// nil acknowledges the job; Invalid, Permanent and Reject classify the error;
// any other error (or a panic, or running past the timeout) is a failure that
// is retried with backoff until the retry limit. See the package doc.
type Handler func(ctx context.Context, job *Job) error

// JSON adapts a function taking a decoded JSON payload to a Handler. A payload
// that does not decode into T is dead-lettered at once with reason
// ReasonInvalid.
func JSON[T any](fn func(ctx context.Context, job *Job, args T) error) Handler {
	return func(ctx context.Context, job *Job) error {
		var args T
		if err := json.Unmarshal(job.Payload, &args); err != nil {
			return Invalid(fmt.Errorf("decoding %s payload as %T: %w", job.Type, args, err))
		}
		return fn(ctx, job, args)
	}
}

// NewJSONJob returns a job of the given type whose payload is v encoded as
// JSON.
func NewJSONJob(jobType string, v any) (*Job, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding %s payload: %w", jobType, err)
	}
	return &Job{Type: jobType, Payload: b}, nil
}
