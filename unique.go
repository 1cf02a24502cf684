package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
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
const UniqueHeader = "asyncplatform-unique"

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

func (e *UniqueError) Error() string {
	held := ""
	if e.Holder != "" {
		held = " by job " + e.Holder
	}
	return fmt.Sprintf("asyncplatform: job %s: unique key %q is held%s", e.JobID, e.Key, held)
}

func (e *UniqueError) Is(target error) bool { return target == ErrDuplicate }

// BatchError is the error of EnqueueBatch when some of its jobs were refused
// one by one (a held unique key) and the others stored: Errs has one entry
// per job of the batch, in order, nil for each job stored. errors.Is and
// errors.As reach every entry.
type BatchError struct {
	Errs []error
}

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

func (e *BatchError) Unwrap() []error {
	var out []error
	for _, err := range e.Errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// claim is a unique job's hold on its key, as its header carries it.
type claim struct {
	key     string
	rev     string
	window  time.Duration
	release UniqueRelease
}

func (c claim) header() string {
	v := url.Values{}
	v.Set("k", c.key)
	v.Set("r", c.rev)
	v.Set("w", strconv.FormatInt(c.window.Milliseconds(), 10))
	v.Set("p", strconv.Itoa(int(c.release)))
	return v.Encode()
}

// claimOf reads the claim a job carries; ok is false when it carries none.
func claimOf(j *Job) (c claim, ok bool) {
	h, ok := j.Headers[UniqueHeader]
	if !ok {
		return c, false
	}
	v, err := url.ParseQuery(h)
	if err != nil {
		return c, false
	}
	ms, err1 := strconv.ParseInt(v.Get("w"), 10, 64)
	rel, err2 := strconv.Atoi(v.Get("p"))
	c = claim{key: v.Get("k"), rev: v.Get("r"), window: time.Duration(ms) * time.Millisecond, release: UniqueRelease(rel)}
	if err1 != nil || err2 != nil || driver.CheckKey(c.key) != nil || c.rev == "" {
		return c, false
	}
	return c, true
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

// uniqueStore is the store of unique keys, or an error matching ErrNoStore.
func (p *Platform) uniqueStore() (*Store, error) {
	d, err := driver.StoreOf(p.backend)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: unique jobs need the backend's store: %w", err)
	}
	return &Store{s: kv.Of(d, kv.Unique)}, nil
}

// claimKeys takes the keys of the unique jobs among jobs (prepared, in
// order) and returns the jobs to store, each a copy carrying its claim in
// UniqueHeader (or without the header when it has no key), and one error
// per job refused (nil for the others); errs is nil when none was refused.
// A store error fails the whole call, after giving back the keys taken.
func (p *Platform) claimKeys(ctx context.Context, jobs []*Job) (out []*Job, claims []claim, errs []error, err error) {
	var st *Store
	out = make([]*Job, 0, len(jobs))
	for i, j := range jobs {
		_, stale := j.Headers[UniqueHeader]
		if j.UniqueKey == "" {
			if stale { // a delivered job enqueued again: its claim is not its own
				c := *j
				c.Headers = cloneHeaders(j.Headers)
				delete(c.Headers, UniqueHeader)
				j = &c
			}
			out = append(out, j)
			continue
		}
		if st == nil {
			if st, err = p.uniqueStore(); err != nil {
				p.giveBack(ctx, st, claims)
				return nil, nil, nil, err
			}
		}
		c := claim{key: j.UniqueKey, window: j.UniqueWindow, release: j.UniqueRelease}
		if c.window == 0 {
			c.window = DefaultUniqueWindow
		}
		c.rev, err = st.Create(ctx, c.key, []byte(j.ID), c.window)
		if errors.Is(err, ErrKeyExists) {
			holder, _, _ := st.Get(ctx, c.key)
			if errs == nil {
				errs = make([]error, len(jobs))
			}
			errs[i] = &UniqueError{Key: c.key, JobID: j.ID, Holder: string(holder)}
			continue
		}
		if err != nil {
			p.giveBack(ctx, st, claims)
			return nil, nil, nil, fmt.Errorf("asyncplatform: taking unique key %q of job %s: %w", c.key, j.ID, err)
		}
		cp := *j
		cp.Headers = cloneHeaders(j.Headers)
		cp.Headers[UniqueHeader] = c.header()
		out = append(out, &cp)
		claims = append(claims, c)
	}
	return out, claims, errs, nil
}

// giveBack releases keys taken for jobs that were not stored.
func (p *Platform) giveBack(ctx context.Context, st *Store, claims []claim) {
	if st == nil {
		return
	}
	for _, c := range claims {
		if err := st.Delete(context.WithoutCancel(ctx), c.key, c.rev); err != nil && !errors.Is(err, ErrRevision) {
			p.log.WarnContext(ctx, "asyncplatform: giving back a unique key failed; it is held until its window ends", "key", c.key, "error", err)
		}
	}
}

// enqueueUnique is enqueueJobs for a batch with unique keys or stale claims
// among its jobs (prepared). A single job refused gets its *UniqueError; a
// batch with refusals gets a *BatchError after the others are stored.
func (p *Platform) enqueueUnique(ctx context.Context, jobs []*Job) error {
	out, claims, errs, err := p.claimKeys(ctx, jobs)
	if err != nil {
		return err
	}
	if errs != nil && len(jobs) == 1 {
		return errs[0]
	}
	if err := p.putGrouped(ctx, out); err != nil {
		st, _ := p.uniqueStore()
		p.giveBack(ctx, st, claims)
		return err
	}
	if errs != nil {
		return &BatchError{Errs: errs}
	}
	return nil
}

// putGrouped stores jobs with one backend call per queue, in order.
func (p *Platform) putGrouped(ctx context.Context, jobs []*Job) error {
	byQueue := map[string][]*Job{}
	var order []string
	for _, j := range jobs {
		if _, ok := byQueue[j.Queue]; !ok {
			order = append(order, j.Queue)
		}
		byQueue[j.Queue] = append(byQueue[j.Queue], j)
	}
	for _, q := range order {
		if err := p.put(ctx, q, byQueue[q], true); err != nil {
			return err
		}
	}
	return nil
}

// needsUnique reports whether a prepared batch has a unique key or a stale
// claim, so that enqueueJobs takes the unique path.
func needsUnique(jobs []*Job) bool {
	for _, j := range jobs {
		if j.UniqueKey != "" {
			return true
		}
		if _, ok := j.Headers[UniqueHeader]; ok {
			return true
		}
	}
	return false
}

// released says whether a job's claim ends with this outcome.
func (c claim) releasedBy(dead bool) bool {
	switch c.release {
	case ReleaseOnFinish:
		return true
	case ReleaseOnSuccess:
		return !dead
	}
	return false
}

// releaseUnique gives up the key of a job that succeeded (dead false) or was
// dead-lettered (dead true), when its release policy says so. A key taken
// since by another job (its window ended) is left alone: the delete is at
// the claim's revision.
func (p *Platform) releaseUnique(j *Job, dead bool) {
	c, ok := claimOf(j)
	if !ok || !c.releasedBy(dead) {
		return
	}
	st, err := p.uniqueStore()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Lease)
		err = st.Delete(ctx, c.key, c.rev)
		cancel()
	}
	if err != nil && !errors.Is(err, ErrRevision) {
		p.log.Warn("asyncplatform: releasing a unique key failed; it is held until its window ends", "queue", j.Queue, "id", j.ID, "key", c.key, "error", err)
	}
}

// retakeKeys has each dead letter with a unique claim take its key again
// before it is redriven: a key that is free (or still held by the letter's
// own job) is taken anew for the claim's window; a key a newer job holds
// refuses the letter. It returns the letters to redrive, their claims
// rewritten, and a *UniqueError for each letter refused.
func (p *Platform) retakeKeys(ctx context.Context, letters []DeadLetter) ([]DeadLetter, []error, error) {
	var st *Store
	var refused []error
	out := letters[:0:0]
	for _, dl := range letters {
		c, ok := claimOf(&dl.Job)
		if !ok {
			out = append(out, dl)
			continue
		}
		if st == nil {
			var err error
			if st, err = p.uniqueStore(); err != nil {
				return nil, nil, err
			}
		}
		rev, held, err := retake(ctx, st, c, dl.Job.ID)
		if held != "" {
			refused = append(refused, &UniqueError{Key: c.key, JobID: dl.Job.ID, Holder: held})
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("asyncplatform: retaking unique key %q of job %s: %w", c.key, dl.Job.ID, err)
		}
		c.rev = rev
		dl.Job.Headers = cloneHeaders(dl.Job.Headers)
		dl.Job.Headers[UniqueHeader] = c.header()
		out = append(out, dl)
	}
	return out, refused, nil
}

// retake takes c's key for job id: anew when it is free, at a new revision
// when the job's own claim still holds it. held names the job that holds
// it otherwise.
func retake(ctx context.Context, st *Store, c claim, id string) (rev, held string, err error) {
	err = kv.Retry(ctx, func() error {
		var err error
		rev, err = st.Create(ctx, c.key, []byte(id), c.window)
		if !errors.Is(err, ErrKeyExists) {
			return err
		}
		holder, cur, err := st.Get(ctx, c.key)
		switch {
		case errors.Is(err, ErrKeyNotFound): // expired between Create and Get
			return kv.ErrRetry
		case err != nil:
			return err
		case string(holder) != id:
			rev, held = "", string(holder)
			return nil
		}
		rev, err = st.Update(ctx, c.key, holder, cur, c.window) // its own claim, kept (ReleaseOnSuccess, ReleaseOnWindow)
		if errors.Is(err, ErrRevision) {
			return kv.ErrRetry
		}
		return err
	})
	switch {
	case errors.Is(err, kv.ErrContended):
		return "", "", fmt.Errorf("unique key %q: %w", c.key, err)
	case err != nil:
		return "", "", err
	}
	return rev, held, nil
}

func cloneHeaders(h map[string]string) map[string]string {
	c := make(map[string]string, len(h)+1)
	for k, v := range h {
		c[k] = v
	}
	return c
}
