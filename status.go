package asyncplatform

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/jobctx"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// DefaultStatusRetention is how long a job's status is kept after its last
// change, by default (Config.StatusRetention).
const DefaultStatusRetention = 7 * 24 * time.Hour

// JobState is where a tracked job is in its life (see JobStatus).
type JobState string

// The states of a tracked job.
const (
	StateWaiting      JobState = "waiting"       // enqueued (or handed back, or rejected), due now
	StateScheduled    JobState = "scheduled"     // waiting for NotBefore, a Reject's delay or a handler
	StateRunning      JobState = "running"       // a handler runs it (or ran it and its worker died)
	StateRetrying     JobState = "retrying"      // failed; due again at RetryAt
	StateSucceeded    JobState = "succeeded"     // done, with its Result
	StateDeadLettered JobState = "dead_lettered" // in the dead-letter queue, for Reason
	StateCancelled    JobState = "cancelled"     // Platform.Cancel ended it: dead-lettered, ReasonCancelled
)

// Terminal reports whether a job in state s will not run again (unless its
// dead letter is redriven).
func (s JobState) Terminal() bool {
	return s == StateSucceeded || s == StateDeadLettered || s == StateCancelled
}

// JobStatus is what Platform.Status tells of a job whose queue tracks status
// (Config.TrackStatus, QueueConfig.TrackStatus).
type JobStatus struct {
	ID    string   `json:"id"`
	Queue string   `json:"queue"`
	Type  string   `json:"type"`
	State JobState `json:"state"`
	// Tries, Failures and Crashes are the job's counters as of State.
	Tries    int `json:"tries"`
	Failures int `json:"failures"`
	Crashes  int `json:"crashes"`
	// Reason is the dead-letter reason, for StateDeadLettered and
	// StateCancelled.
	Reason Reason `json:"reason,omitempty"`
	// Error is the first line of the last error (at most 1 KiB).
	Error string `json:"error,omitempty"`
	// Result is the handler's result (Job.SetResult), for StateSucceeded.
	Result []byte `json:"result,omitempty"`
	// ResultSize is the result's size; it is larger than len(Result) when
	// the result was too large to keep in the status (over
	// MaxStatusResult bytes).
	ResultSize int `json:"result_size,omitempty"`
	// RetryAt is when a retrying or scheduled job is due.
	RetryAt time.Time `json:"retry_at,omitzero"`
	// EnqueuedAt is when the job was enqueued; StartedAt when its latest
	// attempt began; UpdatedAt when the status last changed.
	EnqueuedAt time.Time `json:"enqueued_at,omitzero"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	UpdatedAt  time.Time `json:"updated_at"`
	// Worker names the worker that last ran or settled the job
	// (Config.WorkerName).
	Worker string `json:"worker,omitempty"`
	// CancelRequested: Platform.Cancel was called for the job.
	CancelRequested bool `json:"cancel_requested,omitempty"`
	// Copy is the number of the job's copy the status is about
	// (Job.CopyNumber): a redrive starts a new one.
	Copy uint64 `json:"copy,omitempty"`
}

// MaxStatusResult is the largest result kept in a job's status; a larger
// one is left out (JobStatus.ResultSize still says how large it was).
const MaxStatusResult = driver.MaxValueLen - 8<<10

// ErrJobNotFound is returned by Platform.Status and Platform.Cancel for a
// job with no status: unknown, on a queue that does not track status, or
// ended longer than Config.StatusRetention ago.
var ErrJobNotFound = errors.New("asyncplatform: no status for this job (unknown, untracked, or past its retention)")

// cancelPoll is how often a worker running tracked jobs looks for
// cancellations: one store List per tick, whatever the number of jobs.
const cancelPoll = 300 * time.Millisecond

// outcomes is the platform's state for status tracking and cancellation.
type outcomes struct {
	store   *Store       // nil: no queue tracks status and the backend has no store
	running sync.Map     // status key → *tracked, for the jobs running here
	n       atomic.Int32 // entries in running
}

// tracked is a tracked job held by this worker: its status as last
// written, and its handler's context while it runs.
type tracked struct {
	rec JobStatus
	rev string // the record's revision; empty: none read or written

	mu        sync.Mutex
	ctx       *jobctx.Context // the running handler's; nil before and after
	cancelled bool
}

// cancel ends the handler's context with ErrJobCancelled (now, or as soon
// as it starts).
func (t *tracked) cancel() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cancelled = true
	if t.ctx != nil {
		t.ctx.Cancel(ErrJobCancelled)
	}
}

// started is called by run with the handler's context before the handler.
func (t *tracked) started(ctx *jobctx.Context) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ctx = ctx
	if t.cancelled {
		ctx.Cancel(ErrJobCancelled)
	}
}

// statusKey is a job ID as a store key segment: itself when it fits the key
// grammar, else a hash of it.
func statusKey(id string) string {
	if id != "" && len(id) <= 200 && !strings.Contains(id, "/") && driver.CheckKey(id) == nil && !strings.HasPrefix(id, "sha-") {
		return id
	}
	h := sha256.Sum256([]byte(id))
	return "sha-" + hex.EncodeToString(h[:20])
}

// tracks reports whether queue's jobs have their status tracked.
func (p *Platform) tracks(queue string) bool {
	return p.cfg.TrackStatus || p.cfg.Queues[queue].TrackStatus
}

// initOutcomes finds the store status tracking and cancellation use; with
// tracking configured, a backend without one is a configuration error.
func (p *Platform) initOutcomes() error {
	need := p.cfg.TrackStatus
	for _, q := range p.cfg.Queues {
		need = need || q.TrackStatus
	}
	d, err := driver.StoreOf(p.backend)
	if err != nil {
		if need {
			return fmt.Errorf("%w: TrackStatus needs the backend's store: %w", ErrInvalidConfig, err)
		}
		return nil
	}
	p.oc.store = &Store{s: kv.Of(d, kv.Status)} // job/<id> (a JobStatus) and cancel/<id>
	return nil
}

func (p *Platform) statusStore() (*Store, error) {
	if p == nil || p.backend == nil {
		return nil, ErrNotNew
	}
	if p.oc.store == nil {
		_, err := driver.StoreOf(p.backend)
		return nil, fmt.Errorf("asyncplatform: job status: %w", err)
	}
	return p.oc.store, nil
}

// Status returns the status of the job with the given ID, on a queue that
// tracks status (Config.TrackStatus or QueueConfig.TrackStatus). A job with
// no status gives an error matching ErrJobNotFound. Job IDs are unique, so
// the ID alone finds the job, whatever its queue.
func (p *Platform) Status(ctx context.Context, id string) (JobStatus, error) {
	s, err := p.statusStore()
	if err != nil {
		return JobStatus{}, err
	}
	st, _, err := readStatus(ctx, s, statusKey(id))
	return st, err
}

func readStatus(ctx context.Context, s *Store, key string) (JobStatus, string, error) {
	b, rev, err := s.Get(ctx, "job/"+key)
	if errors.Is(err, ErrKeyNotFound) {
		return JobStatus{}, "", ErrJobNotFound
	}
	if err != nil {
		return JobStatus{}, "", err
	}
	var st JobStatus
	if err := json.Unmarshal(b, &st); err != nil {
		return JobStatus{}, "", fmt.Errorf("asyncplatform: the status of job key %q is not a status: %w", key, err)
	}
	return st, rev, nil
}

// errStaleStatus reports a status write given up because the record holds
// a later attempt's state: a later copy of the job (a retry that ran before
// this attempt's end was written), or a later try of the same copy (a
// redelivery after a lost lease).
var errStaleStatus = errors.New("asyncplatform: a later attempt's status is recorded")

// newerStatus reports whether cur records a later attempt than st.
func newerStatus(cur, st *JobStatus) bool {
	return cur.Copy > st.Copy || cur.Copy == st.Copy && cur.Tries > st.Tries
}

// writeStatus writes st at rev (empty: create), and on a conflict (Cancel
// wrote meanwhile, or the record is older or newer than thought) reads the
// record again, keeps its CancelRequested, and writes again. When the record
// holds a later attempt's state, it leaves it and returns errStaleStatus.
// It returns the new revision.
func (p *Platform) writeStatus(ctx context.Context, st *JobStatus, rev string) (string, error) {
	s, key := p.oc.store, "job/"+statusKey(st.ID)
	b, _ := json.Marshal(st)
	var written string
	err := kv.Retry(ctx, func() error {
		var err error
		if rev == "" {
			written, err = s.Create(ctx, key, b, p.cfg.StatusRetention)
		} else {
			written, err = s.Update(ctx, key, b, rev, p.cfg.StatusRetention)
		}
		if err == nil || !(errors.Is(err, ErrKeyExists) || errors.Is(err, ErrRevision)) {
			return err
		}
		cur, r, gerr := readStatus(ctx, s, statusKey(st.ID))
		switch {
		case errors.Is(gerr, ErrJobNotFound):
			rev = ""
		case gerr != nil:
			return gerr
		case newerStatus(&cur, st):
			return errStaleStatus
		default:
			rev = r
			if cur.CancelRequested && !st.CancelRequested {
				st.CancelRequested = true
				b, _ = json.Marshal(st)
			}
		}
		return kv.ErrRetry
	})
	if err != nil {
		return "", err
	}
	return written, nil
}

// statusEnqueued writes the waiting (or scheduled) status of newly stored
// jobs of a tracked queue. The jobs are stored already: a failed write is
// logged, not returned (the worker writes the status when it takes the job).
func (p *Platform) statusEnqueued(ctx context.Context, queue string, jobs []*Job) {
	if p.oc.store == nil || !p.tracks(queue) {
		return
	}
	now := time.Now()
	for _, j := range jobs {
		st := JobStatus{ID: j.ID, Queue: queue, Type: j.Type, State: StateWaiting, EnqueuedAt: j.EnqueuedAt, UpdatedAt: now, Copy: j.copyNo}
		if j.NotBefore.After(now) {
			st.State, st.RetryAt = StateScheduled, j.NotBefore
		}
		if err := p.createStatus(ctx, &st); err != nil {
			p.log.Warn("asyncplatform: writing a job's status failed", "queue", queue, "id", j.ID, "error", err)
		}
	}
}

// createStatus writes the status of a job just stored. A worker may have
// taken the job and written a newer state of the same copy first: that one
// stays. A record of an older copy (the job's life before a redrive) is
// replaced.
func (p *Platform) createStatus(ctx context.Context, st *JobStatus) error {
	s, key := p.oc.store, "job/"+statusKey(st.ID)
	b, _ := json.Marshal(st)
	return kv.Retry(ctx, func() error {
		_, err := s.Create(ctx, key, b, p.cfg.StatusRetention)
		if !errors.Is(err, ErrKeyExists) {
			return err
		}
		cur, rev, err := readStatus(ctx, s, statusKey(st.ID))
		switch {
		case errors.Is(err, ErrJobNotFound):
			return kv.ErrRetry
		case err != nil:
			return err
		case cur.Copy >= st.Copy:
			return nil // the worker's newer state of this copy
		}
		_, err = s.Update(ctx, key, b, rev, p.cfg.StatusRetention)
		if errors.Is(err, ErrRevision) {
			return kv.ErrRetry
		}
		return err
	})
}

// statusBegin reads a delivered job's status (a tracked queue) and tells the
// decision whether it was cancelled. It reports whether it asked the store.
func (p *Platform) statusBegin(j *Job, in *decide.Input) bool {
	if p.oc.store == nil || !p.tracks(j.Queue) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Lease)
	defer cancel()
	st, rev, err := readStatus(ctx, p.oc.store, statusKey(j.ID))
	switch {
	case errors.Is(err, ErrJobNotFound):
		st = JobStatus{ID: j.ID, EnqueuedAt: j.EnqueuedAt}
	case err != nil:
		p.log.Warn("asyncplatform: reading a job's status failed; it runs untracked this time", "queue", j.Queue, "id", j.ID, "error", err)
		return true
	}
	in.Cancelled = st.CancelRequested
	if newerStatus(&st, &JobStatus{Copy: j.copyNo, Tries: j.TryCount + 1}) {
		// A later copy's status: this is an older copy come again (a
		// duplicate; a crash between storing a copy and settling the one
		// before). It runs untracked, and the record stays the later one's.
		return true
	}
	st.Queue, st.Type, st.Copy = j.Queue, j.Type, j.copyNo
	j.track = &tracked{rec: st, rev: rev}
	return true
}

// statusRunning writes the running status before the handler runs and makes
// the job cancellable here. When Cancel came first, it dead-letters the job
// as cancelled and returns false.
func (p *Platform) statusRunning(f *inflight, in decide.Input) bool {
	j := &f.Job
	tr := j.track
	if tr == nil {
		return true
	}
	st := tr.rec
	now := time.Now()
	st.State, st.Tries, st.Failures, st.Crashes = StateRunning, j.TryCount+1, j.Failures, j.Crashes
	st.StartedAt, st.UpdatedAt, st.Worker, st.RetryAt, st.Reason = now, now, p.cfg.WorkerName, time.Time{}, ""
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Lease)
	defer cancel()
	rev, err := p.writeStatus(ctx, &st, tr.rev)
	if errors.Is(err, errStaleStatus) { // an older copy run again: the record follows the newer one
		j.track = nil
		return true
	}
	if err != nil {
		p.log.Warn("asyncplatform: writing a job's status failed; it runs untracked this time", "queue", j.Queue, "id", j.ID, "error", err)
		j.track = nil
		return true
	}
	tr.rec, tr.rev = st, rev
	if st.CancelRequested {
		in.Cancelled, in.Now = true, time.Now()
		p.apply(f, j, decide.Decide(in), "")
		return false
	}
	key := statusKey(j.ID)
	p.oc.running.Store(key, tr)
	p.oc.n.Add(1)
	return true
}

// statusEnded is called when the handler has returned herr: the job is no
// longer cancellable here. It reports whether it was cancelled. The poll
// for cancellations runs every cancelPoll, so a handler that fails soon
// after a Cancel may end before the poll sees it: a failed attempt that the
// poll has not marked looks for the cancellation itself (one store read),
// so the failure is not taken for one to retry.
func (p *Platform) statusEnded(j *Job, herr error) bool {
	tr := j.track
	if tr == nil {
		return false
	}
	if p.oc.running.CompareAndDelete(statusKey(j.ID), tr) { // not another delivery's of the same job
		p.oc.n.Add(-1)
	}
	tr.mu.Lock()
	tr.ctx = nil
	cancelled := tr.cancelled
	tr.mu.Unlock()
	if cancelled || herr == nil {
		return cancelled
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Lease)
	defer cancel()
	_, _, err := p.oc.store.Get(ctx, "cancel/"+statusKey(j.ID))
	switch {
	case err == nil:
		return true
	case !errors.Is(err, ErrKeyNotFound):
		p.log.Warn("asyncplatform: looking for a job's cancellation failed; its failure is taken as it is", "queue", j.Queue, "id", j.ID, "error", err)
	}
	return false
}

// statusSettled writes the status a settled decision leads to.
func (p *Platform) statusSettled(f *inflight, j *Job, d decide.Decision, text string, serr error) {
	tr := f.Job.track
	if tr == nil || serr != nil {
		return
	}
	f.Job.track = nil
	if p.oc.running.CompareAndDelete(statusKey(f.Job.ID), tr) { // settled without statusEnded (a panic in a hook, say)
		p.oc.n.Add(-1)
	}
	if d.Outcome == decide.Deferred && tr.rec.State == StateRunning {
		return // another delivery of the job runs it (a duplicate refused by a limit): its record is that one's
	}
	st := tr.rec
	now := time.Now()
	st.UpdatedAt, st.Worker, st.RetryAt = now, p.cfg.WorkerName, time.Time{}
	st.Tries, st.Failures, st.Crashes = f.Job.TryCount, d.Failures, d.Crashes
	if text != "" {
		st.Error = firstLine(text)
	}
	switch d.Outcome {
	case decide.Succeeded:
		st.State, st.Result, st.ResultSize = StateSucceeded, nil, len(f.Job.result)
		if len(f.Job.result) <= MaxStatusResult {
			st.Result = f.Job.result
		}
	case decide.Retried:
		st.State, st.RetryAt = StateRetrying, d.RetryAt
	case decide.Rejected, decide.Requeued:
		st.State, st.RetryAt = StateScheduled, d.RetryAt
	case decide.HandedBack:
		st.State = StateWaiting
	case decide.Deferred:
		st.State, st.RetryAt = StateScheduled, d.RetryAt
	case decide.DeadLettered:
		st.State, st.Reason = StateDeadLettered, Reason(d.Reason)
		if d.Reason == decide.Cancelled {
			st.State = StateCancelled
		}
	default:
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Lease)
	defer cancel()
	_, err := p.writeStatus(ctx, &st, tr.rev)
	if errors.Is(err, errStaleStatus) { // a later copy ran (and may have ended) first
		return
	}
	if err != nil {
		p.log.Warn("asyncplatform: writing a job's status failed", "queue", j.Queue, "id", f.Job.ID, "state", st.State, "error", err)
	}
	if st.CancelRequested && st.State.Terminal() {
		_ = p.oc.store.Delete(ctx, "cancel/"+statusKey(f.Job.ID), "")
	}
}

// startOutcomes starts the cancellation poller when a queue tracks status.
func (p *Platform) startOutcomes(ctx context.Context) {
	if p.oc.store == nil {
		return
	}
	p.every(ctx, cancelPoll, func(ctx context.Context) {
		if p.oc.n.Load() > 0 {
			p.pollCancels(ctx)
		}
	})
}

// pollCancels cancels the running jobs that Platform.Cancel named: one List
// of the cancellations per page, whatever the number of running jobs.
func (p *Platform) pollCancels(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(cancelPoll, time.Second))
	defer cancel()
	cursor := ""
	for {
		page, err := p.oc.store.List(ctx, "cancel/", cursor, MaxListLimit)
		if err != nil {
			p.log.Warn("asyncplatform: reading cancellations failed", "error", err)
			return
		}
		for _, k := range page.Keys {
			if v, ok := p.oc.running.Load(strings.TrimPrefix(k, "cancel/")); ok {
				v.(*tracked).cancel()
			}
		}
		if page.Next == "" {
			return
		}
		cursor = page.Next
	}
}
