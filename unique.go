package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/unique"
)

// UniqueRelease says when a unique job gives up its key before its window
// ends (see Job.UniqueKey). The window's end always releases it.
type UniqueRelease uint8

// The release policies of a unique job.
const (
	// ReleaseOnFinish releases the key when the job succeeds or is
	// dead-lettered, whichever comes first: while it waits, is scheduled,
	// runs or waits for a retry, it holds the key. The default.
	ReleaseOnFinish UniqueRelease = iota

	// ReleaseOnSuccess releases the key when the job succeeds only: a
	// dead-lettered job keeps it until its window ends (or it is redriven,
	// and succeeds).
	ReleaseOnSuccess

	// ReleaseOnWindow never releases the key early: it is held for the
	// whole window, whatever became of the job (at most one job per key
	// and window, a debounce).
	ReleaseOnWindow
)

// String returns the policy's name, "on-finish" say.
func (r UniqueRelease) String() string {
	switch r {
	case ReleaseOnFinish:
		return "on-finish"
	case ReleaseOnSuccess:
		return "on-success"
	case ReleaseOnWindow:
		return "on-window"
	}
	return "UniqueRelease(" + strconv.Itoa(int(r)) + ")"
}

// DefaultUniqueWindow is the window of a unique job whose UniqueWindow is
// zero: the longest its key is held, whatever became of the job.
const DefaultUniqueWindow = 24 * time.Hour

// UniqueHeader is the header a unique job carries its claim in (its key,
// the claim's revision, its window and its release policy), through every
// retry, hand-back and dead letter. It is the platform's: Enqueue replaces it
// on a job with a UniqueKey and drops it from a job without one (a delivered
// job enqueued again, say).
const UniqueHeader = unique.Header

// ErrDuplicate is matched (errors.Is) by the error of Enqueue, EnqueueBatch
// and Redrive for a job whose UniqueKey is held by another live job. The
// job was not stored. The error is a *UniqueError naming the key and the
// holder.
var ErrDuplicate = errors.New("unique key held by another job")

// UniqueError is the error for a job refused because another job holds its
// key. It matches ErrDuplicate.
type UniqueError struct {
	Key    string // the job's UniqueKey
	JobID  string // the refused job's ID
	Holder string // the ID of the job holding the key (empty if unknown)
}

// Error names the job, the key and the holder.
func (e *UniqueError) Error() string {
	held := ""
	if e.Holder != "" {
		held = " by job " + e.Holder
	}
	return fmt.Sprintf("asyncplatform: job %s: unique key %q is held%s", e.JobID, e.Key, held)
}

// Is reports whether target is ErrDuplicate.
func (e *UniqueError) Is(target error) bool { return target == ErrDuplicate }

// BatchError is the error of EnqueueBatch when some of its jobs were refused
// one by one (a held unique key) and the others stored: Errs has one entry
// per job of the batch, in order, nil for each job stored. errors.Is and
// errors.As reach every entry.
type BatchError struct {
	Errs []error
}

// Error counts the jobs not stored and names the first error.
func (e *BatchError) Error() string {
	n, first := 0, error(nil)
	for _, err := range e.Errs {
		if err != nil {
			if n == 0 {
				first = err
			}
			n++
		}
	}
	return fmt.Sprintf("asyncplatform: %d of %d jobs not stored; the first: %v", n, len(e.Errs), first)
}

// Unwrap returns the errors of the jobs not stored.
func (e *BatchError) Unwrap() []error {
	var out []error
	for _, err := range e.Errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// checkUnique validates a job's unique settings (prepare calls it).
func checkUnique(j *Job) error {
	if j.UniqueKey == "" {
		if j.UniqueWindow != 0 || j.UniqueRelease != ReleaseOnFinish {
			return fmt.Errorf("%w: job of type %q has UniqueWindow or UniqueRelease but no UniqueKey", ErrInvalidJob, j.Type)
		}
		return nil
	}
	if err := driver.CheckKey(j.UniqueKey); err != nil {
		return fmt.Errorf("%w: job of type %q: UniqueKey: %w", ErrInvalidJob, j.Type, err)
	}
	if j.UniqueWindow < 0 || j.UniqueWindow > driver.MaxTTL || (j.UniqueWindow > 0 && j.UniqueWindow < time.Millisecond) {
		return fmt.Errorf("%w: job of type %q: UniqueWindow %v: want 0 (DefaultUniqueWindow) or 1ms to %v", ErrInvalidJob, j.Type, j.UniqueWindow, driver.MaxTTL)
	}
	if j.UniqueRelease > ReleaseOnWindow {
		return fmt.Errorf("%w: job of type %q: unknown UniqueRelease %d", ErrInvalidJob, j.Type, j.UniqueRelease)
	}
	return nil
}

// newClaims returns the engine of unique keys over the backend's store.
func newClaims(b driver.Backend, log *slog.Logger, lease time.Duration) *unique.Claims {
	cfg := unique.Config{Log: log, ReleaseTimeout: lease}
	if d, err := driver.StoreOf(b); err == nil {
		cfg.Store = kv.Of(d, kv.Unique)
	} else {
		cfg.NoStore = err
	}
	return unique.New(cfg)
}

// claimingEnqueuer returns the backend's driver.ClaimingEnqueuer when it
// has one that claims with its enqueue in the store the platform's claims
// live in (the backend is its own store), else nil.
func claimingEnqueuer(b driver.Backend) driver.ClaimingEnqueuer {
	ce, ok := b.(driver.ClaimingEnqueuer)
	if !ok || !ce.ClaimsWithEnqueue() {
		return nil
	}
	if st, err := driver.StoreOf(b); err != nil || any(st) != any(b) {
		return nil
	}
	return ce
}

// uniqueError is the public form of the engine's refusal.
func uniqueError(h *unique.HeldError) *UniqueError {
	return &UniqueError{Key: h.Key, JobID: h.JobID, Holder: h.Holder}
}

// retakeKeys has each dead letter with a unique claim take its key again
// before it is redriven (unique.Claims.Retake). It returns the letters to
// redrive, their claims rewritten; a *UniqueError for each letter refused
// because a newer job holds its key; and, for each letter whose claim
// header is not a claim the platform could have written (a writer to the
// broker forged it, or the record was corrupted: a malformed header, a
// window outside driver.MinTTL to MaxTTL), an error matching
// ErrInvalidJob. Those letters stay; the others go on.
func retakeKeys(ctx context.Context, c *unique.Claims, letters []DeadLetter) (out []DeadLetter, refused, skipped []error, err error) {
	out = letters[:0:0]
	for _, dl := range letters {
		h, has := dl.Job.Headers[UniqueHeader]
		if !has {
			out = append(out, dl)
			continue
		}
		cl, err := unique.CheckHeader(h)
		if err == nil {
			cl, err = c.Retake(ctx, cl, dl.Job.ID)
		}
		var held *unique.HeldError
		switch {
		case errors.As(err, &held):
			refused = append(refused, uniqueError(held))
			continue
		case errors.Is(err, unique.ErrBadClaim):
			skipped = append(skipped, fmt.Errorf("%w: dead letter %s (job %s): its %s header: %w", ErrInvalidJob, dl.ID, dl.Job.ID, UniqueHeader, err))
			continue
		case err != nil:
			return nil, nil, nil, fmt.Errorf("asyncplatform: %w", err)
		}
		dl.Job.Headers = cloneHeaders(dl.Job.Headers)
		dl.Job.Headers[UniqueHeader] = cl.Header()
		out = append(out, dl)
	}
	return out, refused, skipped, nil
}

// cloneHeaders copies h, with room for one more header.
func cloneHeaders(h map[string]string) map[string]string {
	c := make(map[string]string, len(h)+1)
	for k, v := range h {
		c[k] = v
	}
	return c
}
