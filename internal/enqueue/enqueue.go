// Package enqueue stores new jobs: it takes their unique keys, offloads
// payloads too large for a message, checks the backend's limit, writes the
// messages with one backend call per queue, and writes the jobs' status
// records. The root package validates a job and fills in its defaults
// (prepare) before it hands it here; what a job is stored as is decided
// here alone.
package enqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/payload"
	"github.com/asyncplatform/asyncplatform/internal/status"
	"github.com/asyncplatform/asyncplatform/internal/unique"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// ErrTooLarge is matched by the error for a job that does not fit in a
// backend message (the root package's ErrPayloadTooLarge).
var ErrTooLarge = errors.New("payload too large")

// Headroom is kept free below the backend's limit by MaxPayload: for the
// counters that grow as a job is retried, and for what a dead-letter record
// adds around the job (reason, worker, queue, time and a minimum of error
// text), so any job that fits can also be dead-lettered.
const Headroom = 1024

// DefaultOffloadThreshold is Config.OffloadThreshold's default.
const DefaultOffloadThreshold = 16 << 20

// Job is a prepared job as it is stored: its envelope, its queue, the
// nonce of this enqueue and its unique settings.
type Job struct {
	wire.Job
	Queue string
	// Nonce binds the job's status record and its deduplication keys to
	// this enqueue; made by Enqueue when the queue is tracked or the
	// backend deduplicates, and kept by the caller for a retried Enqueue.
	Nonce string
	// UniqueKey, when set, is taken for the job, for UniqueWindow (which
	// must be set), released as UniqueRelease says.
	UniqueKey     string
	UniqueWindow  time.Duration
	UniqueRelease unique.Release
}

// RefusedError is the error of Enqueue when held unique keys refused some
// of its jobs: Held has one entry per job, nil for each job stored.
type RefusedError struct {
	Held []*unique.HeldError
}

// Error counts the refusals.
func (e *RefusedError) Error() string {
	n := 0
	for _, h := range e.Held {
		if h != nil {
			n++
		}
	}
	return fmt.Sprintf("asyncplatform: %d of %d jobs refused: their unique key is held", n, len(e.Held))
}

// Config is an Engine's dependencies. Fields marked optional may be nil.
type Config struct {
	Backend driver.Backend
	Codec   wire.Codec      // MaxBody: the most a message may carry
	Status  *status.Tracker // status records of tracked queues
	Claims  *unique.Claims  // unique keys

	// Claimer takes unique keys in the enqueue's own call. Optional: nil
	// takes them first, then enqueues.
	Claimer driver.ClaimingEnqueuer
	// Payloads keeps offloaded payloads. Optional: nil offloads none.
	Payloads *payload.Payloads
	// OffloadThreshold is the payload size above which a payload is
	// offloaded. Defaults to DefaultOffloadThreshold.
	OffloadThreshold int
}

// Engine stores jobs.
type Engine struct {
	cfg      Config
	declared sync.Map // queue name → struct{}
}

// New returns an Engine.
func New(cfg Config) *Engine {
	if cfg.OffloadThreshold <= 0 {
		cfg.OffloadThreshold = DefaultOffloadThreshold
	}
	return &Engine{cfg: cfg}
}

// Declare declares queue on the backend, once per Engine.
func (e *Engine) Declare(ctx context.Context, queue string) error {
	if _, ok := e.declared.Load(queue); ok {
		return nil
	}
	if err := e.cfg.Backend.Declare(ctx, queue); err != nil {
		return fmt.Errorf("asyncplatform: declaring queue %q: %w", queue, err)
	}
	e.declared.Store(queue, struct{}{})
	return nil
}

// Enqueue stores prepared jobs, with one backend call per queue, in the
// order of each queue's first job. A job with a unique key is stored only
// when it takes its key: a job refused is not stored, and the error is a
// *RefusedError after the others are stored. Each job that needs a nonce
// gets it in jobs, so that the caller keeps it.
func (e *Engine) Enqueue(ctx context.Context, jobs []Job) error {
	for i := range jobs {
		if e.nonced(jobs[i].Queue, false) && jobs[i].Nonce == "" {
			jobs[i].Nonce = wire.NewNonce()
		}
	}
	if needsUnique(jobs) {
		if e.cfg.Claimer != nil {
			return e.enqueueClaiming(ctx, jobs)
		}
		return e.enqueueUnique(ctx, jobs)
	}
	return e.putGrouped(ctx, jobs)
}

// Put encodes jobs of one queue and stores them. check offloads their
// payloads and reports the limit as ErrTooLarge (for new jobs; copies were
// checked already). track writes their status records even where the
// queue is not tracked here (a redrive of jobs the workers tracked).
func (e *Engine) Put(ctx context.Context, queue string, jobs []Job, check, track bool) error {
	if err := e.Declare(ctx, queue); err != nil {
		return err
	}
	msgs, _, err := e.encode(ctx, jobs, check, e.nonced(queue, track))
	if err != nil {
		return err
	}
	if err := e.cfg.Backend.Enqueue(ctx, queue, msgs); err != nil {
		// Some jobs may be stored and point at their payloads: keep them all
		// (a leak in the store, never a lost payload).
		return enqueueError(queue, err)
	}
	switch {
	case e.cfg.Status.Tracks(queue):
		e.cfg.Status.Enqueued(ctx, statusJobs(jobs))
	case track:
		e.cfg.Status.Requeued(ctx, statusJobs(jobs))
	}
	return nil
}

// nonced reports whether the jobs of queue carry their enqueue's nonce.
func (e *Engine) nonced(queue string, track bool) bool {
	return track || e.cfg.Codec.Dedupe || e.cfg.Status.Tracks(queue)
}

func enqueueError(queue string, err error) error {
	if errors.Is(err, driver.ErrTooLarge) {
		return fmt.Errorf("%w: queue %q: %w", ErrTooLarge, queue, err)
	}
	return fmt.Errorf("asyncplatform: enqueue to queue %q: %w", queue, err)
}

// encode encodes jobs as messages, with their payloads offloaded when
// check (refs: the payloads offloaded, one entry a job, zero where none)
// and their nonces when nonced. On error, the payloads offloaded are
// dropped.
func (e *Engine) encode(ctx context.Context, jobs []Job, check, nonced bool) ([]driver.Message, []payload.Key, error) {
	var refs []payload.Key
	msgs := make([]driver.Message, len(jobs))
	for i := range jobs {
		if nonced && jobs[i].Nonce == "" {
			jobs[i].Nonce = wire.NewNonce()
		}
		j := &jobs[i]
		if nonced {
			j = withNonce(j)
		}
		if check && e.cfg.Payloads != nil {
			off, err := e.offload(ctx, j) // a copy: the caller's job keeps its payload
			if err != nil {
				e.cfg.Payloads.DropAll(ctx, refs)
				return nil, nil, err
			}
			if off != j {
				if refs == nil {
					refs = make([]payload.Key, len(jobs))
				}
				refs[i] = payload.Key{Job: off.ID, Ref: off.PayloadRef}
				j = off
			}
		}
		msgs[i] = e.message(j)
		if check && len(msgs[i].Body) > e.cfg.Codec.MaxBody-Headroom {
			e.cfg.Payloads.DropAll(ctx, refs)
			return nil, nil, fmt.Errorf("%w: job %s of type %q has a %d-byte payload; this backend carries at most %d bytes for it (see MaxPayload)",
				ErrTooLarge, j.ID, j.Type, len(j.Payload), e.MaxPayload(*j))
		}
	}
	return msgs, refs, nil
}

// message encodes j as the backend message of its current copy. A copy
// that outgrew the backend's limit loses its oldest error lines until it
// fits.
func (e *Engine) message(j *Job) driver.Message {
	body := e.cfg.Codec.Encode(j.Queue, &j.Job)
	return driver.Message{ID: wire.MessageID(j.ID, j.Copy), Dedupe: e.cfg.Codec.DedupeKey(&j.Job), Body: body, NotBefore: j.NotBefore}
}

// withNonce returns j carrying its nonce in wire.StatusHeader: j itself
// when it does, else a copy (the caller's headers are not written to).
func withNonce(j *Job) *Job {
	if j.Headers[wire.StatusHeader] == j.Nonce {
		return j
	}
	cp := *j
	cp.Headers = cloneHeaders(j.Headers)
	cp.Headers[wire.StatusHeader] = j.Nonce
	return &cp
}

// offload returns j itself when its payload stays in the message, or else
// a copy whose payload was moved to the store: when it is over the
// threshold or over what the backend carries (MaxPayload). A generous
// bound on the envelope's size spares most calls MaxPayload's probe
// encoding.
func (e *Engine) offload(ctx context.Context, j *Job) (*Job, error) {
	if e.cfg.Payloads == nil || j.PayloadRef != "" {
		return j, nil
	}
	t := e.cfg.OffloadThreshold
	if len(j.Payload) <= t {
		bound := 256 + len(j.ID) + len(j.Type) + len(j.Payload)
		for k, v := range j.Headers {
			bound += len(k) + len(v) + 10
		}
		for _, s := range j.Errors {
			bound += len(s) + 5
		}
		if bound+e.cfg.Codec.Overhead() <= e.cfg.Codec.MaxBody-Headroom {
			return j, nil
		}
	}
	if m := e.MaxPayload(*j); m >= 0 && m < t {
		t = m
	}
	if len(j.Payload) <= t {
		return j, nil
	}
	ref, err := e.cfg.Payloads.Put(ctx, j.ID, j.Payload)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: offloading the %d-byte payload of job %s: %w", len(j.Payload), j.ID, err)
	}
	off := *j
	off.PayloadRef = ref
	return &off, nil
}

// MaxPayload returns the largest payload a job like j (its other fields as
// they are; ID, EnqueuedAt and Queue set) can carry in a message within
// the codec's MaxBody, less Headroom.
func (e *Engine) MaxPayload(j Job) int {
	j.Payload = nil
	if e.nonced(j.Queue, false) {
		if j.Nonce == "" {
			j.Nonce = wire.NewNonce()
		}
		j = *withNonce(&j) // the enqueue nonce Put adds
	}
	fixed := len(wire.EncodeJob(&j.Job)) - 1 + e.cfg.Codec.Overhead() // less the payload's one-byte length
	limit := e.cfg.Codec.MaxBody - Headroom
	n := limit - fixed
	for n > 0 && n+uvarintLen(n)+fixed > limit {
		n--
	}
	return max(n, 0)
}

func uvarintLen(n int) int {
	l := 1
	for ; n >= 0x80; n >>= 7 {
		l++
	}
	return l
}

// statusJobs is jobs as the status tracker sees them.
func statusJobs(jobs []Job) []status.Job {
	out := make([]status.Job, len(jobs))
	for i := range jobs {
		j := &jobs[i]
		out[i] = status.Job{
			ID: j.ID, Queue: j.Queue, Type: j.Type, Copy: j.Copy, EnqueuedAt: j.EnqueuedAt, NotBefore: j.NotBefore,
			Failures: j.Failures, Crashes: j.Crashes, Nonce: j.Nonce,
		}
	}
	return out
}

// cloneHeaders copies h, with room for one more header.
func cloneHeaders(h map[string]string) map[string]string {
	c := make(map[string]string, len(h)+1)
	for k, v := range h {
		c[k] = v
	}
	return c
}
