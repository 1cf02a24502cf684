package asyncplatform

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/admit"
	"github.com/asyncplatform/asyncplatform/internal/enqueue"
	"github.com/asyncplatform/asyncplatform/internal/executor"
	"github.com/asyncplatform/asyncplatform/internal/health"
	"github.com/asyncplatform/asyncplatform/internal/history"
	"github.com/asyncplatform/asyncplatform/internal/pause"
	"github.com/asyncplatform/asyncplatform/internal/payload"
	"github.com/asyncplatform/asyncplatform/internal/redrive"
	"github.com/asyncplatform/asyncplatform/internal/runner"
	"github.com/asyncplatform/asyncplatform/internal/schedule"
	"github.com/asyncplatform/asyncplatform/internal/status"
	"github.com/asyncplatform/asyncplatform/internal/unique"
	"github.com/asyncplatform/asyncplatform/internal/wire"
	"github.com/asyncplatform/asyncplatform/internal/workers"
)

// Defaults of Config and QueueConfig.
const (
	DefaultConcurrency      = 10
	DefaultLease            = 30 * time.Second
	DefaultRejectDelay      = 5 * time.Second
	DefaultUnhandledRetries = 5
	DefaultUnhandledDelay   = 10 * time.Second
	DefaultErrorHistory     = 20
	DefaultHealthInterval   = 10 * time.Second
	DefaultMaxMessage       = 32 << 20
	DefaultMaxHeaders       = 100
	DefaultMaxHeaderBytes   = 64 << 10
	DefaultMaxErrorText     = 64 << 10

	// maxHeadersLimit is the highest Config.MaxHeaders: a worker refuses to
	// decode a message with more headers (or error-history lines) than
	// wire.MaxHeaders as not a job, and the platform adds up to
	// platformHeaders of its own after Enqueue counted the job's (the
	// unique claim, the status nonce, the queue binding and signing time).
	maxHeadersLimit = wire.MaxHeaders - platformHeaders
	platformHeaders = 4
)

// Config configures a Platform. The zero value is usable: every field has a
// documented default.
type Config struct {
	// Limits bound the jobs of each job type named: per process, across
	// processes, and by rate (see TypeLimit). Defaults to none.
	Limits map[string]TypeLimit

	// LimitDelay is about how long a job over a concurrency limit waits
	// before it is offered again (±50 %). Defaults to DefaultLimitDelay.
	LimitDelay time.Duration

	levels map[string]level // the queues of priority levels worked here (priority.go); set by withDefaults

	// Pools work several queues of Queues with one set of handlers, in
	// strict priority order or by weight (see Pool). Defaults to none:
	// every queue has handlers of its own.
	Pools []Pool

	// Queues are the queues this platform works, with their settings. A
	// platform that only enqueues does not need any. Defaults to
	// {"default": {}} (DefaultQueue with default settings).
	Queues map[string]QueueConfig

	// Policy is the platform-wide failure-handling policy, the last level
	// before the defaults (see Policy). Defaults to the zero Policy.
	Policy Policy

	// Lease is how long a worker holds a job before the backend may hand it
	// to another worker. The platform extends it while the handler runs, so
	// a handler may run far longer; it only bounds how soon the job of a
	// dead worker comes back. Defaults to DefaultLease.
	Lease time.Duration

	// RejectDelay is how long a job that returned Reject waits before it is
	// offered again. Defaults to DefaultRejectDelay.
	RejectDelay time.Duration

	// UnhandledRetries is how many times a job with no registered handler is
	// requeued (a rolling deploy may be adding the handler) before it is
	// dead-lettered with reason ReasonUnhandled. Use Limit(0) to dead-letter
	// at once. Defaults to DefaultUnhandledRetries.
	UnhandledRetries *int

	// UnhandledDelay is how long such a job waits between requeues.
	// Defaults to DefaultUnhandledDelay.
	UnhandledDelay time.Duration

	// ErrorHistory bounds the error history kept with a job (the most
	// recent lines are kept). Defaults to DefaultErrorHistory.
	ErrorHistory int

	// WorkerName names this worker in dead-letter records. Defaults to
	// "host:pid".
	WorkerName string

	// Logger receives the platform's logs; per-job events are at Debug.
	// Defaults to slog.Default().
	Logger *slog.Logger

	// HealthChecks are named checks (a database ping, say). While any of
	// them fails, the platform takes no new jobs from any queue; in-flight
	// jobs keep running, and taking resumes when every check passes.
	// Defaults to none.
	HealthChecks map[string]HealthCheck

	// HealthInterval is how often the health checks run; a Reject triggers
	// a run at once, and while a check fails they run again sooner (after
	// 250 ms, doubling up to HealthInterval), so taking resumes soon after
	// what failed is back. Defaults to DefaultHealthInterval.
	HealthInterval time.Duration

	// WarnTries, when positive, logs a warning (with the job's ID, type and
	// queue) each time a job is delivered for its WarnTries-th attempt or
	// later: the "dequeued a significant number of times" alert. Defaults to
	// 0: off.
	WarnTries int

	// WarnCrashes, when positive, logs a warning each time a job is delivered
	// with WarnCrashes or more crashes behind it. Defaults to 0: off.
	WarnCrashes int

	// PayloadStore, when set, keeps payloads too large for the backend's
	// messages (see PayloadStore and OffloadThreshold). Defaults to none:
	// Enqueue then refuses them with ErrPayloadTooLarge.
	PayloadStore PayloadStore

	// OffloadThreshold is the payload size above which, with a
	// PayloadStore, the payload is offloaded; it is lowered to what the
	// backend can carry. Defaults to DefaultOffloadThreshold.
	OffloadThreshold int

	// MaxMessage bounds the message written for a job, in bytes, on a
	// backend whose own limit is higher or absent (memory and Redis set
	// none): Enqueue refuses a larger job with ErrPayloadTooLarge, or
	// offloads its payload when a PayloadStore is set. Defaults to
	// DefaultMaxMessage.
	MaxMessage int

	// MaxHeaders bounds a job's header count; Enqueue refuses more with an
	// error matching ErrInvalidJob (a *LimitError). At most 9,996 (New
	// refuses more: a worker decodes no message with more than 10,000
	// headers, and the platform adds up to 4 of its own).
	// Defaults to DefaultMaxHeaders.
	MaxHeaders int

	// MaxHeaderBytes bounds the total size of a job's header keys and
	// values, refused likewise. Defaults to DefaultMaxHeaderBytes.
	MaxHeaderBytes int

	// MaxErrorText bounds the handler's error text (with a panic's stack)
	// kept in a dead letter; the rest is cut, saying so. Log lines keep the
	// first line of an error, at most 1 KiB. Defaults to
	// DefaultMaxErrorText.
	MaxErrorText int

	// SigningKey, when set, signs every message this platform writes
	// (HMAC-SHA256 over the envelope), and makes its workers dead-letter,
	// as ReasonInvalid with "bad signature" in the error and the raw bytes
	// kept, every delivered message that is not signed with it (or with
	// one of VerifyKeys). For brokers other teams can write to. Dead-letter
	// records are signed too: one that fails the check is shown as Raw and
	// is never redriven. Defaults to none: messages are not signed, and
	// signed ones are accepted unchecked.
	SigningKey []byte

	// VerifyKeys are further keys a delivered message may be signed with,
	// for rotating SigningKey: add the new key here on every worker, then
	// make it the SigningKey everywhere, then drop the old one. Ignored
	// without a SigningKey. Defaults to none.
	VerifyKeys [][]byte

	// A job this platform signs is bound to the queue it is written to:
	// its workers dead-letter (ReasonInvalid, "bad signature") a signed job
	// delivered from another queue, and Redrive leaves a signed dead letter
	// read from another queue than its own. A job signed by an earlier
	// version carries no binding and is accepted, so that a rolling upgrade
	// dead-letters nothing.
	//
	// RequireBoundSignatures refuses, as above, a signed job that carries
	// no queue binding. Set it once every worker runs this version and the
	// jobs signed by earlier ones have drained (a retry scheduled far ahead
	// included), as when rotating keys. Ignored without a SigningKey.
	// Defaults to false.
	RequireBoundSignatures bool

	// UniqueClaimsInEnqueue takes a unique job's key in the same round
	// trip as its enqueue where the backend is its own store and can
	// (driver.ClaimingEnqueuer: Redis on one server, memory): one round
	// trip instead of two. Such a claim carries no store revision, and a
	// worker of a release before this one cannot release it: the key
	// would stay held until its UniqueWindow ends. Set it once every
	// worker runs this version. Defaults to false.
	UniqueClaimsInEnqueue bool

	// ReplayWindow, when positive, makes workers refuse, as above, a signed
	// job due more than ReplayWindow ago: due when it was signed (each
	// retry, hand-back or redrive signs anew), or at its NotBefore when
	// later. It bounds how long a copied message can be replayed; within
	// the window a replay still runs. A job that waits in a backlog longer
	// than ReplayWindow is refused too, so set it well above the longest
	// wait; it implies RequireBoundSignatures. Needs a SigningKey. Defaults
	// to 0: off.
	ReplayWindow time.Duration

	// DisableIsolation turns off the isolation of suspects. A suspect is a
	// delivered job whose last delivery ended with no outcome (it was held
	// by a worker that died) and that has reported none since. By default the platform runs a suspect alone: it
	// stops taking jobs on every queue, hands back uncounted the jobs it
	// claimed ahead, waits for the running handlers to finish, runs the
	// suspect, then resumes. So a job that kills its worker is charged every
	// crash it causes, and the jobs beside it none after the first: an
	// innocent job comes back once with Crashes 1, runs alone once and
	// succeeds. The cost falls only after a crash: its suspects run one at a
	// time, each after the handlers running beside it have finished.
	// Turning it off keeps full concurrency after a crash, and lets jobs
	// that keep landing beside a poison job reach the poison limit with it.
	// Defaults to false: suspects are isolated.
	DisableIsolation bool

	// Middleware wraps every handler, the first element outermost. Defaults
	// to none.
	Middleware []Middleware

	// EnqueueMiddleware wraps Enqueue and EnqueueBatch, the first element
	// outermost. Defaults to none.
	EnqueueMiddleware []EnqueueMiddleware

	// Hooks are called on outcomes. Defaults to none.
	Hooks Hooks

	// Schedules are periodic jobs this platform's scheduler fires between
	// Start and Stop (see Schedule and Platform.Schedule). Defaults to
	// none.
	Schedules []Schedule

	// TrackStatus keeps the status of every job of every queue in the
	// backend's store, for Platform.Status and Platform.Cancel (see
	// QueueConfig.TrackStatus for one queue). It costs about one store
	// write per state change of a job. Defaults to false.
	TrackStatus bool

	// StatusRetention is how long a tracked job's status is kept after
	// its last change. Defaults to DefaultStatusRetention.
	StatusRetention time.Duration

	// WorkflowRetention is how long a workflow's records (EnqueueWorkflow)
	// are kept in the backend's store after each one's last write. A step
	// redriven after its workflow's records expired is dead-lettered
	// invalid, naming the missing record. Defaults to
	// DefaultWorkflowRetention.
	WorkflowRetention time.Duration

	// WorkerHeartbeat is how often a started platform writes its worker
	// record (Platform.Workers) and its throughput counts
	// (Platform.History) to the backend's store; without a store it
	// writes neither. Defaults to DefaultWorkerHeartbeat.
	WorkerHeartbeat time.Duration
}

// QueueConfig configures one queue of Config.Queues.
type QueueConfig struct {
	// Concurrency is how many handlers run at once for this queue. A
	// worker reports a job's outcome while the next job's handler runs,
	// so up to twice as many jobs may be settling (not on a backend whose
	// Capabilities.LocalSettle is set, such as memory).
	// Defaults to DefaultConcurrency.
	Concurrency int

	// Prefetch is how many jobs are claimed ahead of the running ones, so a
	// free handler never waits for a round trip to the broker. Each one is
	// held under a lease, like a running job. Use Limit(0) for none.
	// Defaults to Concurrency.
	Prefetch *int

	// Policy is the queue's failure-handling policy (see Policy). Defaults
	// to the zero Policy.
	Policy Policy

	// TrackStatus keeps the status of this queue's jobs (see
	// Config.TrackStatus), on every platform that enqueues or works them:
	// set it alike on producers and workers. Defaults to false.
	TrackStatus bool

	// Priorities makes the queue take jobs by Job.Priority: its levels'
	// queues (PriorityQueue) are worked with it as a strict Pool, highest
	// level first, with this queue's settings, Concurrency and Prefetch.
	// Defaults to false: only the queue itself (level 0) is worked.
	Priorities bool

	// Output names an output queue: every job of this queue that ends
	// (succeeds, or is dead-lettered) is reported there, as a job of type
	// ReportType carrying an OutcomeReport, before its own message is
	// acknowledged or dead-lettered (see OutcomeReport for the at-least-once
	// rule and deduplication). It must not be the queue itself. Defaults
	// to none.
	Output string
}

// HealthCheck reports whether something the handlers need is healthy.
type HealthCheck func(ctx context.Context) error

// Middleware wraps a handler.
type Middleware func(next Handler) Handler

// EnqueueFunc enqueues jobs; it is what EnqueueMiddleware wraps.
type EnqueueFunc func(ctx context.Context, jobs []*Job) error

// EnqueueMiddleware wraps Enqueue and EnqueueBatch (to add trace headers, for
// example).
type EnqueueMiddleware func(next EnqueueFunc) EnqueueFunc

// Outcome is what became of one attempt.
type Outcome string

// The outcomes reported to Hooks.AfterAttempt.
const (
	OutcomeSucceeded    Outcome = "succeeded"     // acknowledged
	OutcomeRetried      Outcome = "retried"       // failed; retried at Attempt.RetryAt
	OutcomeRejected     Outcome = "rejected"      // Reject: requeued uncounted
	OutcomeDeadLettered Outcome = "dead_lettered" // see Attempt.Reason
	OutcomeHandedBack   Outcome = "handed_back"   // shutdown: requeued uncounted
	OutcomeLeaseLost    Outcome = "lease_lost"    // the outcome could not be reported (lease or connection lost): the job will be delivered again
)

// Attempt describes one handler call, for Hooks.AfterAttempt.
type Attempt struct {
	Job      *Job          // the job as attempted (counters included)
	Outcome  Outcome       // what became of it
	Err      error         // the handler's error, nil on success
	Reason   Reason        // the dead-letter reason, for OutcomeDeadLettered
	Duration time.Duration // how long the handler ran
	RetryAt  time.Time     // when it will be offered again, for retries and rejects
	Isolated bool          // the job ran alone, as a suspect (see Config.DisableIsolation)
	Result   []byte        // the handler's result (Job.SetResult), on success
}

// Hooks are called synchronously by the worker that handled the job; keep
// them fast. A hook may run while the queue's next job runs, and beside
// another job's hook, even at Concurrency 1: a job's outcome is reported
// after its handler has given its turn to the next job (contract §3).
type Hooks struct {
	// AfterAttempt is called after every handler call, once its outcome is
	// reported to the backend.
	AfterAttempt func(ctx context.Context, a Attempt)

	// OnDeadLetter is called whenever a job is dead-lettered, whatever the
	// reason (poisoned, expired and unhandled jobs included, which never
	// reach a handler).
	OnDeadLetter func(ctx context.Context, dl DeadLetter)
}

// QueueStats are the depths of one queue; -1 where the backend cannot tell.
type QueueStats struct {
	Ready     int64 // deliverable now
	Scheduled int64 // delayed or waiting for a retry
	InFlight  int64 // held by workers
	Dead      int64 // in the dead-letter queue

	// Paused is whether the queue is paused (Platform.Pause): its jobs
	// wait, and no worker claims them.
	Paused bool

	// OldestReady is when the ready job that has waited longest became
	// deliverable (enqueued, came due, or its lease ran out), as the
	// backend reports it (driver.Stats.OldestReady). Zero when no job is
	// ready, and when the backend cannot tell: ReadyAge tells the two
	// apart.
	OldestReady time.Time
}

// ReadyAge returns how long the oldest ready job has waited at now: zero
// when no job is ready, and ok false when jobs are ready (or the backend
// cannot tell how many) but it cannot tell since when. A time ahead of now
// counts as zero.
func (s QueueStats) ReadyAge(now time.Time) (age time.Duration, ok bool) {
	switch {
	case !s.OldestReady.IsZero():
		return max(now.Sub(s.OldestReady), 0), true
	case s.Ready == 0:
		return 0, true
	}
	return 0, false
}

type handlerEntry struct {
	typ    string
	h      Handler
	policy Policy
}

// registry is the handlers, replaced whole by Handle (workers read it
// without a lock).
type registry struct {
	byType map[string]*handlerEntry
	names  map[string]string // each type's own string, for the decoder to reuse
}

func newRegistry(byType map[string]*handlerEntry) *registry {
	r := &registry{byType: byType, names: make(map[string]string, len(byType))}
	for t, e := range byType {
		r.names[t] = e.typ
	}
	return r
}

// Platform is the facade: it enqueues jobs, runs their handlers with the
// failure semantics of the behaviour contract, and administers dead letters,
// over any driver.Backend.
type Platform struct {
	backend  driver.Backend
	caps     driver.Capabilities
	codec    wire.Codec // SigningKey then VerifyKeys; MaxBody: the backend's limit or Config.MaxMessage
	cfg      Config
	log      *slog.Logger
	enqueue  EnqueueFunc
	handlers atomic.Pointer[registry]
	health   health.Gate
	payloads *payload.Payloads        // offloaded payloads; nil without a PayloadStore
	exec     *executor.Executor[Job]  // runs and settles deliveries (internal/executor)
	status   *status.Tracker          // job status tracking and cancellation (internal/status)
	pz       *pause.Engine            // paused queues and groups (internal/pause)
	lim      *admit.Gate              // job-type limits (internal/admit)
	claims   *unique.Claims           // unique-key claims (internal/unique)
	enq      *enqueue.Engine          // stores new jobs (internal/enqueue)
	rd       *redrive.Engine          // redrives dead letters (internal/redrive)
	sched    *schedule.Scheduler[Job] // periodic jobs (internal/schedule)
	reg      *workers.Registry        // this worker's record (workers.go)
	hist     *history.Counter         // throughput history (workers.go)

	mu      sync.Mutex // guards handlers writes and the fields below
	started bool
	stopped bool
	queues  []*runner.Queue[executor.Work[Job]]

	fetchCancel context.CancelFunc      // stops the fetchers
	workCtx     context.Context         // parent of handler contexts
	workCancel  context.CancelCauseFunc // cancels running handlers at Stop's deadline
	bgCancel    context.CancelFunc      // stops the lease keeper and health loop
	fetchers    sync.WaitGroup          // fetch loops
	workers     sync.WaitGroup          // worker loops
	background  sync.WaitGroup          // lease keeper, health loop
	stopDone    chan struct{}           // closed when workers have all returned
	startedAt   time.Time
}

var errShutdown = errors.New("platform stopping")

// New returns a Platform over the backend. It validates cfg and returns an
// error wrapping ErrInvalidConfig that names the bad setting. The caller
// keeps ownership of the backend and closes it after Stop.
func New(backend driver.Backend, cfg Config) (*Platform, error) {
	if backend == nil {
		return nil, fmt.Errorf("%w: backend is nil", ErrInvalidConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Platform{backend: backend, caps: backend.Capabilities(), cfg: cfg, log: cfg.Logger}
	p.codec.MaxBody = cfg.MaxMessage
	if p.caps.MaxBody > 0 && p.caps.MaxBody < p.codec.MaxBody {
		p.codec.MaxBody = p.caps.MaxBody
	}
	if cfg.SigningKey != nil { // copies: the caller's slices may change
		p.codec.Keys = [][]byte{bytes.Clone(cfg.SigningKey)}
		for _, k := range cfg.VerifyKeys {
			p.codec.Keys = append(p.codec.Keys, bytes.Clone(k))
		}
	}
	p.codec.RequireBound, p.codec.ReplayWindow = cfg.RequireBoundSignatures, cfg.ReplayWindow
	p.codec.Dedupe = p.caps.Deduplicates
	if p.caps.MinLease > 0 && cfg.Lease < p.caps.MinLease {
		return nil, fmt.Errorf("%w: Lease %v is shorter than the backend's shortest lease %v", ErrInvalidConfig, cfg.Lease, p.caps.MinLease)
	}
	p.payloads = payload.New(cfg.PayloadStore, p.log)
	p.handlers.Store(newRegistry(map[string]*handlerEntry{}))
	checks := make(map[string]health.Check, len(cfg.HealthChecks))
	for name, c := range cfg.HealthChecks {
		checks[name] = c
	}
	p.health.Init(checks)
	p.health.AddPinger(backend)
	if p.status, err = newTracker(backend, cfg); err != nil {
		return nil, err
	}
	p.claims = newClaims(backend, p.log, cfg.Lease)
	p.enq = newEnqueuer(p)
	p.rd = redrive.New(redrive.Config{Backend: backend, Codec: p.codec, Enqueue: p.enq, Status: p.status, Log: p.log, Payloads: p.payloads})
	p.pz = newPauses(p)
	if p.lim, err = newGate(backend, cfg); err != nil {
		return nil, err
	}
	p.enqueue = enqueueJobs(&p.cfg, p.enq)
	p.sched = newScheduler(p)
	newWorkers(p)
	p.exec = newExecutor(p)
	for i := len(cfg.EnqueueMiddleware) - 1; i >= 0; i-- {
		p.enqueue = cfg.EnqueueMiddleware[i](p.enqueue)
	}
	for _, s := range cfg.Schedules {
		if err := p.Schedule(s); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (c Config) withDefaults() (Config, error) {
	if len(c.Queues) == 0 {
		c.Queues = map[string]QueueConfig{DefaultQueue: {}}
	}
	if err := c.validatePools(); err != nil {
		return c, err
	}
	queues := make(map[string]QueueConfig, len(c.Queues))
	for name, q := range c.Queues {
		if err := ownQueue(name, 0); err != nil {
			return c, fmt.Errorf("%w: Queues: %w", ErrInvalidConfig, err)
		}
		where := fmt.Sprintf("Queues[%q]", name)
		if q.Concurrency < 0 {
			return c, fmt.Errorf("%w: %s.Concurrency is %d, it must be positive", ErrInvalidConfig, where, q.Concurrency)
		}
		if q.Concurrency == 0 {
			q.Concurrency = DefaultConcurrency
		}
		if q.Prefetch == nil {
			q.Prefetch = Limit(q.Concurrency)
		} else if *q.Prefetch < 0 {
			return c, fmt.Errorf("%w: %s.Prefetch is %d, it must be 0 or more", ErrInvalidConfig, where, *q.Prefetch)
		}
		if err := q.Policy.validate(where + ".Policy"); err != nil {
			return c, err
		}
		if q.Output != "" {
			if err := ownQueue(q.Output, 0); err != nil {
				return c, fmt.Errorf("%w: %s.Output: %w", ErrInvalidConfig, where, err)
			}
			if q.Output == name {
				return c, fmt.Errorf("%w: %s.Output is the queue itself (its reports would be reported, without end)", ErrInvalidConfig, where)
			}
		}
		queues[name] = q
	}
	c.Queues = queues
	levels, err := c.expandPriorities()
	if err != nil {
		return c, err
	}
	c.levels = levels
	if err := c.Policy.validate("Policy"); err != nil {
		return c, err
	}
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"Lease", &c.Lease, DefaultLease},
		{"RejectDelay", &c.RejectDelay, DefaultRejectDelay},
		{"UnhandledDelay", &c.UnhandledDelay, DefaultUnhandledDelay},
		{"LimitDelay", &c.LimitDelay, DefaultLimitDelay},
		{"HealthInterval", &c.HealthInterval, DefaultHealthInterval},
		{"StatusRetention", &c.StatusRetention, DefaultStatusRetention},
		{"WorkflowRetention", &c.WorkflowRetention, DefaultWorkflowRetention},
		{"WorkerHeartbeat", &c.WorkerHeartbeat, DefaultWorkerHeartbeat},
	}
	for _, d := range durations {
		if *d.v < 0 {
			return c, fmt.Errorf("%w: %s is %v, it must not be negative", ErrInvalidConfig, d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.UnhandledRetries == nil {
		c.UnhandledRetries = Limit(DefaultUnhandledRetries)
	} else if *c.UnhandledRetries < 0 {
		return c, fmt.Errorf("%w: UnhandledRetries is %d, it must be 0 or more", ErrInvalidConfig, *c.UnhandledRetries)
	}
	if c.OffloadThreshold < 0 {
		return c, fmt.Errorf("%w: OffloadThreshold is %d, it must be 0 (the default) or more", ErrInvalidConfig, c.OffloadThreshold)
	}
	if c.WarnTries < 0 || c.WarnCrashes < 0 {
		return c, fmt.Errorf("%w: WarnTries %d / WarnCrashes %d: thresholds must be 0 (off) or more", ErrInvalidConfig, c.WarnTries, c.WarnCrashes)
	}
	if c.ErrorHistory < 0 {
		return c, fmt.Errorf("%w: ErrorHistory is %d, it must be 0 or more", ErrInvalidConfig, c.ErrorHistory)
	}
	if c.ErrorHistory == 0 {
		c.ErrorHistory = DefaultErrorHistory
	}
	if c.ErrorHistory > wire.MaxErrors {
		return c, fmt.Errorf("%w: ErrorHistory is %d, the limit is %d", ErrInvalidConfig, c.ErrorHistory, wire.MaxErrors)
	}
	limits := []struct {
		name     string
		v        *int
		def, max int
	}{
		{"MaxMessage", &c.MaxMessage, DefaultMaxMessage, math.MaxInt},
		{"MaxHeaders", &c.MaxHeaders, DefaultMaxHeaders, maxHeadersLimit},
		{"MaxHeaderBytes", &c.MaxHeaderBytes, DefaultMaxHeaderBytes, math.MaxInt},
		{"MaxErrorText", &c.MaxErrorText, DefaultMaxErrorText, math.MaxInt},
	}
	for _, l := range limits {
		switch {
		case *l.v < 0:
			return c, fmt.Errorf("%w: %s is %d, it must be 0 (the default) or more", ErrInvalidConfig, l.name, *l.v)
		case *l.v == 0:
			*l.v = l.def
		case *l.v > l.max:
			return c, fmt.Errorf("%w: %s is %d, the limit is %d", ErrInvalidConfig, l.name, *l.v, l.max)
		}
	}
	if c.MaxErrorText < minDeadError {
		return c, fmt.Errorf("%w: MaxErrorText is %d, it must be at least %d", ErrInvalidConfig, c.MaxErrorText, minDeadError)
	}
	if c.SigningKey != nil && len(c.SigningKey) < minKey {
		return c, fmt.Errorf("%w: SigningKey has %d bytes; use at least %d random bytes (32 recommended)", ErrInvalidConfig, len(c.SigningKey), minKey)
	}
	if c.ReplayWindow < 0 || c.ReplayWindow > 0 && c.SigningKey == nil {
		return c, fmt.Errorf("%w: ReplayWindow is %v; it must be 0 (off), or positive with a SigningKey", ErrInvalidConfig, c.ReplayWindow)
	}
	for i, k := range c.VerifyKeys {
		if len(k) < minKey { // an unset variable after a rotation must not accept anything
			return c, fmt.Errorf("%w: VerifyKeys[%d] has %d bytes; every key needs at least %d", ErrInvalidConfig, i, len(k), minKey)
		}
	}
	if c.MaxMessage < minMaxMessage {
		return c, fmt.Errorf("%w: MaxMessage is %d, it must be at least %d", ErrInvalidConfig, c.MaxMessage, minMaxMessage)
	}
	if c.WorkerName == "" {
		host, _ := os.Hostname()
		c.WorkerName = host + ":" + strconv.Itoa(os.Getpid())
	}
	if len(c.WorkerName) > 200 {
		return c, fmt.Errorf("%w: WorkerName is %d bytes, the limit is 200", ErrInvalidConfig, len(c.WorkerName))
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	for name, check := range c.HealthChecks {
		if name == "" || check == nil {
			return c, fmt.Errorf("%w: HealthChecks: check %q is unnamed or nil", ErrInvalidConfig, name)
		}
	}
	return c, nil
}

// validQueue checks a queue name with driver.CheckQueue (the one
// definition of the grammar); the error matches ErrInvalidJob and
// driver.ErrBadQueue.
func validQueue(name string) error {
	if err := driver.CheckQueue(name); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidJob, err)
	}
	return nil
}

// Handle registers the handler for a job type, with an optional policy for
// that type (at most one). It may be called before or after Start; a type
// can be registered once.
func (p *Platform) Handle(jobType string, h Handler, policy ...Policy) error {
	if p.backend == nil {
		return ErrNotNew
	}
	if jobType == "" {
		return fmt.Errorf("%w: Handle: job type is empty", ErrInvalidConfig)
	}
	if h == nil {
		return fmt.Errorf("%w: Handle(%q): handler is nil", ErrInvalidConfig, jobType)
	}
	if len(policy) > 1 {
		return fmt.Errorf("%w: Handle(%q): %d policies given, at most one is allowed", ErrInvalidConfig, jobType, len(policy))
	}
	e := &handlerEntry{typ: jobType, h: h}
	if len(policy) == 1 {
		if err := policy[0].validate(fmt.Sprintf("Handle(%q) policy", jobType)); err != nil {
			return err
		}
		e.policy = policy[0]
	}
	for i := len(p.cfg.Middleware) - 1; i >= 0; i-- {
		e.h = p.cfg.Middleware[i](e.h)
	}
	e.h = p.stepHandler(e.h)
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.handlers.Load().byType
	if _, dup := old[jobType]; dup {
		return fmt.Errorf("%w: Handle(%q): a handler is already registered for this type", ErrInvalidConfig, jobType)
	}
	next := make(map[string]*handlerEntry, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[jobType] = e
	p.handlers.Store(newRegistry(next))
	return nil
}

// Enqueue stores one job durably. It fills in the job's ID, Queue and
// EnqueuedAt when they are empty. A job it refuses gets an error wrapping
// ErrInvalidJob or ErrPayloadTooLarge that names the problem. The queue
// names the platform derives from a queue's are reserved: a job's Queue
// may not contain ".held." (HeldQueue) nor end in ".prio" and digits
// (PriorityQueue; set Priority instead), unless it is its own Priority's
// level, as a delivered job enqueued again is; such names match
// driver.ErrBadQueue too.
func (p *Platform) Enqueue(ctx context.Context, job *Job) error {
	if p.enqueue == nil {
		return ErrNotNew
	}
	return p.enqueue(ctx, []*Job{job})
}

// EnqueueBatch stores several jobs, with one backend call per queue. Every
// job is validated before any is stored. On error some jobs may have been
// stored; enqueueing the same jobs again (their IDs are now set) is safe to
// retry on backends that deduplicate, and otherwise may duplicate.
func (p *Platform) EnqueueBatch(ctx context.Context, jobs []*Job) error {
	if p.enqueue == nil {
		return ErrNotNew
	}
	return p.enqueue(ctx, jobs)
}

// minKey is the shortest signing or verifying key, in bytes.
const minKey = 16

// minMaxMessage is the smallest Config.MaxMessage.
const minMaxMessage = 4096

// minDeadError is the error text a dead-letter record always has room for.
const minDeadError = 256

// MaxPayload returns the largest payload a job like j (its other fields as
// they are) can carry in a message: within the backend's limit and
// Config.MaxMessage.
func (p *Platform) MaxPayload(j Job) int {
	now := time.Now()
	if j.ID == "" {
		j.ID = wire.NewID(now)
	}
	if j.EnqueuedAt.IsZero() {
		j.EnqueuedAt = now
	}
	if j.Queue == "" {
		j.Queue = DefaultQueue
	}
	return p.enq.MaxPayload(enqueueJob(&j))
}

// Start declares the configured queues (failing with a clear error when the
// broker is unreachable or a queue is declared with incompatible arguments)
// and starts working them. ctx bounds the start-up only; Stop ends the work.
func (p *Platform) Start(ctx context.Context) error {
	if p.backend == nil {
		return ErrNotNew
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.stopped:
		return fmt.Errorf("asyncplatform: Start after Stop: %w", ErrStopped)
	case p.started:
		return errors.New("asyncplatform: Start called twice")
	}
	if pinger, ok := p.backend.(driver.Pinger); ok {
		if err := pinger.Ping(ctx); err != nil {
			return fmt.Errorf("asyncplatform: start: the broker is unreachable: %w", err)
		}
	}
	for name := range p.cfg.Queues {
		if err := p.enq.Declare(ctx, name); err != nil {
			return fmt.Errorf("asyncplatform: start: %w", err)
		}
	}
	fetchCtx, fetchCancel := context.WithCancel(context.Background())
	if err := p.pz.Start(ctx, fetchCtx); err != nil {
		fetchCancel()
		return fmt.Errorf("asyncplatform: start: %w", err)
	}
	p.started = true
	p.stopDone = make(chan struct{})
	p.fetchCancel = fetchCancel
	p.health.Start(fetchCtx)
	hctx, hcancel := context.WithTimeout(ctx, p.cfg.HealthInterval)
	p.health.Run(hctx, p.log) // no job is taken before the checks have passed once
	hcancel()
	p.workCtx, p.workCancel = context.WithCancelCause(context.Background())
	bgCtx, bgCancel := context.WithCancel(context.Background())
	p.bgCancel = bgCancel

	p.newRunners() // every queue exists before any goroutine reads p.queues
	p.exec.Start(p.workCtx, p.queues)
	for _, q := range p.queues {
		p.fetchers.Add(1)
		go func() {
			defer p.fetchers.Done()
			q.Fetch(fetchCtx)
		}()
		for range q.Workers() {
			p.workers.Add(1)
			go func() {
				defer p.workers.Done()
				q.Work()
			}()
		}
	}
	go func() {
		p.workers.Wait()
		close(p.stopDone)
	}()
	p.background.Add(2)
	go func() {
		defer p.background.Done()
		runner.KeepLeases(bgCtx, p.backend, p.cfg.Lease, p.log, p.queues)
	}()
	go func() {
		defer p.background.Done()
		p.health.Loop(bgCtx, p.cfg.HealthInterval, p.log)
	}()
	p.sched.Start(bgCtx)
	p.background.Go(func() { p.status.Poll(bgCtx) })
	p.background.Go(func() { p.pz.Run(bgCtx) })
	p.background.Go(func() { p.lim.Run(bgCtx) })
	p.startWorkers(bgCtx)
	p.log.InfoContext(ctx, "asyncplatform: started", "queues", len(p.queues), "worker", p.cfg.WorkerName)
	return nil
}

// Stop shuts down gracefully: it stops taking jobs, hands back at once the
// jobs claimed ahead but not started, and lets running handlers finish until
// ctx ends. Then it cancels the handlers still running and hands their jobs
// back uncounted: nothing is lost and no try is spent. It returns ctx.Err()
// in that case. A handler that ignores its context keeps running in the
// background until it returns; its result is discarded.
//
// Stop does not close the backend. Calling Stop again returns nil.
func (p *Platform) Stop(ctx context.Context) error {
	p.mu.Lock()
	if !p.started || p.stopped {
		p.stopped = true
		p.mu.Unlock()
		return nil
	}
	p.stopped = true
	p.mu.Unlock()

	p.exec.Stopping()
	p.fetchCancel()
	p.fetchers.Wait() // each fetcher closes its work channel on return
	// The backend releases its buffer before the claimed-ahead jobs are
	// handed back: a hand-back's copy then cannot reach the consumer being
	// released (RabbitMQ delivered it there, and one arriving after the
	// consumer's cancel came back counted: Stop/HandsBackUncounted).
	for _, q := range p.queues {
		if r, ok := p.backend.(driver.Releaser); ok {
			for _, name := range q.Names() {
				if err := r.Release(ctx, name); err != nil {
					p.log.WarnContext(ctx, "asyncplatform: releasing the backend's buffered messages failed; they come back after their lease", "queue", name, "error", err)
				}
			}
		}
		q.HandBackQueued(p.exec.HandBack)
	}
	var err error
	select {
	case <-p.stopDone:
	case <-ctx.Done():
		err = ctx.Err()
		p.workCancel(errShutdown)
		for _, q := range p.queues {
			for _, f := range q.Held() {
				f.CancelHandler()
				p.exec.HandBack(f)
			}
		}
	}
	// The ends of the deliveries settled are written before Stop returns:
	// from then on every process reads them (Outcomes/StatusAfterStop).
	if ferr := p.status.Flush(ctx); ferr != nil && err == nil {
		err = ferr
	}
	// So are the releases of their unique keys: a key its job released is
	// free for every process once Stop returns.
	if ferr := p.claims.Flush(ctx); ferr != nil && err == nil {
		err = ferr
	}
	p.bgCancel()
	p.sched.Stop()
	p.background.Wait()
	p.log.InfoContext(ctx, "asyncplatform: stopped", "worker", p.cfg.WorkerName)
	return err
}

// Stats returns the depths of a queue and whether it is paused.
func (p *Platform) Stats(ctx context.Context, queue string) (QueueStats, error) {
	if p.backend == nil {
		return QueueStats{}, ErrNotNew
	}
	if err := validQueue(queue); err != nil {
		return QueueStats{}, err
	}
	s, err := p.backend.Stats(ctx, queue)
	if err != nil {
		return QueueStats{}, fmt.Errorf("asyncplatform: stats of queue %q: %w", queue, err)
	}
	paused, err := p.pz.Paused(ctx, queue)
	if err != nil {
		return QueueStats{}, err
	}
	qs := QueueStats{Ready: s.Ready, Scheduled: s.Scheduled, InFlight: s.InFlight, Dead: s.Dead, Paused: paused}
	if s.Ready != 0 {
		qs.OldestReady = s.OldestReady
	}
	return qs, nil
}

// Healthy reports whether every health check passed on its last run.
func (p *Platform) Healthy() bool { return p.health.Healthy() }

// Health returns the last result of each health check: nil for a pass.
func (p *Platform) Health() map[string]error { return p.health.Results() }

// CheckHealth runs the health checks now and reports whether all pass.
func (p *Platform) CheckHealth(ctx context.Context) bool { return p.health.Run(ctx, p.log) }
