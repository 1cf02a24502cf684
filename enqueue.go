package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/enqueue"
	"github.com/asyncplatform/asyncplatform/internal/unique"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// newEnqueuer wires the enqueue engine of p (internal/enqueue): the
// backend, the codec, status, unique claims and offloaded payloads.
func newEnqueuer(p *Platform) *enqueue.Engine {
	cfg := enqueue.Config{
		Backend: p.backend, Codec: p.codec, Status: p.status, Claims: p.claims,
		Payloads: p.payloads, OffloadThreshold: p.cfg.OffloadThreshold,
	}
	if p.cfg.UniqueClaimsInEnqueue {
		cfg.Claimer = claimingEnqueuer(p.backend)
	}
	return enqueue.New(cfg)
}

// enqueueJobs is the end of Enqueue and EnqueueBatch, inside their
// middleware: it prepares each job, then stores them through e. Each job
// keeps the nonce of its enqueue, so that Enqueue retried with the same Job
// writes the same message under the same deduplication key.
func enqueueJobs(cfg *Config, e *enqueue.Engine) EnqueueFunc {
	return func(ctx context.Context, jobs []*Job) error {
		now := time.Now()
		for _, j := range jobs {
			if err := cfg.prepare(j, now); err != nil {
				return err
			}
		}
		ejs := make([]enqueue.Job, len(jobs))
		for i, j := range jobs {
			ejs[i] = enqueueJob(j)
		}
		err := e.Enqueue(ctx, ejs)
		for i, j := range jobs {
			j.statusNonce = ejs[i].Nonce
		}
		var refused *enqueue.RefusedError
		if !errors.As(err, &refused) {
			return err
		}
		errs := make([]error, len(refused.Held))
		for i, h := range refused.Held {
			if h != nil {
				errs[i] = uniqueError(h)
			}
		}
		if len(errs) == 1 {
			return errs[0]
		}
		return &BatchError{Errs: errs}
	}
}

// enqueueJob is j as the enqueue engine stores it.
func enqueueJob(j *Job) enqueue.Job {
	w := j.UniqueWindow
	if w == 0 {
		w = DefaultUniqueWindow
	}
	return enqueue.Job{
		Job: toWire(j), Queue: j.Queue, Nonce: j.statusNonce,
		UniqueKey: j.UniqueKey, UniqueWindow: w, UniqueRelease: unique.Release(j.UniqueRelease),
	}
}

// prepare validates a new job and fills in its defaults.
func (c *Config) prepare(j *Job, now time.Time) error {
	if j == nil {
		return fmt.Errorf("%w: job is nil", ErrInvalidJob)
	}
	if j.Type == "" {
		return fmt.Errorf("%w: job %q has no Type", ErrInvalidJob, j.ID)
	}
	if j.Queue == "" {
		j.Queue = DefaultQueue
	}
	if err := ownQueue(j.Queue, j.Priority); err != nil {
		return err
	}
	if err := setPriority(j); err != nil {
		return err
	}
	if err := setGroup(j); err != nil {
		return err
	}
	// The headers the platform writes itself at every enqueue (a delivered
	// job enqueued again carries them) are not the caller's: they are
	// replaced, and maxHeadersLimit leaves room for them.
	n, size := len(j.Headers), 0
	for k, v := range j.Headers {
		if k == "" {
			return fmt.Errorf("%w: job of type %q has a header with an empty key", ErrInvalidJob, j.Type)
		}
		if k == wire.StatusHeader || k == wire.QueueHeader || k == wire.SignedAtHeader {
			n--
			continue
		}
		size += len(k) + len(v)
	}
	if n > c.MaxHeaders {
		return &LimitError{Limit: "MaxHeaders", Type: j.Type, Got: n, Max: c.MaxHeaders}
	}
	if size > c.MaxHeaderBytes {
		return &LimitError{Limit: "MaxHeaderBytes", Type: j.Type, Got: size, Max: c.MaxHeaderBytes}
	}
	if !j.Deadline.IsZero() && !j.NotBefore.IsZero() && !j.Deadline.After(j.NotBefore) {
		return fmt.Errorf("%w: job of type %q has Deadline %v not after NotBefore %v", ErrInvalidJob, j.Type, j.Deadline, j.NotBefore)
	}
	if err := j.Policy.validate("Policy"); err != nil {
		return fmt.Errorf("%w: job of type %q: %w", ErrInvalidJob, j.Type, err)
	}
	if err := checkUnique(j); err != nil {
		return err
	}
	if j.ID == "" {
		j.ID = wire.NewID(now)
	}
	if j.EnqueuedAt.IsZero() {
		j.EnqueuedAt = now
	}
	j.TryCount, j.Failures, j.Crashes, j.suspect = 0, 0, 0, false
	// A job re-enqueued from a dead letter or a handler starts afresh: its
	// payload is offloaded again from Payload, and a new copy number keeps
	// its message ID apart from the old copies' on deduplicating backends,
	// and its status ahead of theirs (copy 0's too).
	j.payloadRef, j.unhandled = "", 0
	if j.copyNo > 0 || j.delivered {
		j.copyNo++
		j.statusNonce = "" // a new enqueue: a new status record and deduplication keys
	}
	return nil
}
