package asyncplatform

import (
	"context"
	"fmt"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/status"
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
	// RetryAt is when a retrying or scheduled job is due. A job its type's
	// limit keeps refusing keeps the RetryAt of its first refusal: its
	// status is not written again for each refusal.
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
	// History is the job's state changes since its enqueue, oldest first:
	// the latest MaxStatusHistory, HistoryDropped counting those before.
	// It is written with the state itself (no write of its own); a status
	// written by a version without histories has none until its next
	// change. A redrive is a new enqueue, with a new history.
	History        []StateChange `json:"history,omitempty"`
	HistoryDropped int           `json:"history_dropped,omitempty"`
	// Deliveries, for a job Platform.Jobs read from the broker
	// (SourceBroker), is how many times its current copy was handed out
	// so far (-1: the broker cannot tell); zero for a status record.
	Deliveries int `json:"deliveries,omitempty"`
}

// StateChange is one change of a tracked job's state (JobStatus.History).
type StateChange struct {
	State JobState  `json:"state"`
	At    time.Time `json:"at"`
	// Try is the job's try count as it entered State: 0 before its first
	// run, then the try that ran or ended.
	Try int `json:"try,omitempty"`
	// Reason says why: the dead-letter reason (StateDeadLettered,
	// StateCancelled), the first line of the error (StateRetrying, cut to
	// MaxStateChangeReason bytes), or what scheduled the job again
	// (StateScheduled: "rejected", "requeued" for want of a handler,
	// "deferred" by its type's limit; StateWaiting: "handed_back" at a
	// shutdown).
	Reason string `json:"reason,omitempty"`
}

// Bounds of JobStatus.History.
const (
	// MaxStatusHistory is how many state changes a job's status keeps: the
	// latest.
	MaxStatusHistory = status.MaxHistory
	// MaxStateChangeReason is the longest StateChange.Reason, in bytes.
	MaxStateChangeReason = status.MaxChangeReason
)

// MaxStatusResult is the largest result kept in a job's status; a larger
// one is left out (JobStatus.ResultSize still says how large it was).
const MaxStatusResult = driver.MaxValueLen - 8<<10

// ErrJobNotFound is returned by Platform.Status and Platform.Cancel for a
// job with no status: unknown, on a queue that does not track status, or
// ended longer than Config.StatusRetention ago.
var ErrJobNotFound = status.ErrNotFound

// newTracker returns the status tracker of a platform over backend; with
// tracking configured, a backend without a store is a configuration error.
func newTracker(backend driver.Backend, cfg Config) (*status.Tracker, error) {
	sc := status.Config{All: cfg.TrackStatus, Retention: cfg.StatusRetention, Worker: cfg.WorkerName, Timeout: cfg.Lease, Logger: cfg.Logger}
	for name, q := range cfg.Queues {
		if q.TrackStatus {
			sc.Queues = append(sc.Queues, name)
		}
	}
	d, err := driver.StoreOf(backend)
	switch {
	case err != nil && (sc.All || len(sc.Queues) > 0):
		return nil, fmt.Errorf("%w: TrackStatus needs the backend's store: %w", ErrInvalidConfig, err)
	case err != nil:
		sc.NoStore = err
	default:
		sc.Store = kv.Of(d, kv.Status) // job/<id> (a status.Record) and cancel/<id>
	}
	return status.New(sc), nil
}

// Status returns the status of the job with the given ID, on a queue that
// tracks status (Config.TrackStatus or QueueConfig.TrackStatus). A job with
// no status gives an error matching ErrJobNotFound. Job IDs are unique, so
// the ID alone finds the job, whatever its queue.
func (p *Platform) Status(ctx context.Context, id string) (JobStatus, error) {
	if p == nil || p.backend == nil {
		return JobStatus{}, ErrNotNew
	}
	r, err := p.status.Get(ctx, id)
	if err != nil {
		return JobStatus{}, err
	}
	return jobStatus(&r), nil
}

// jobStatus is the public form of a status record.
func jobStatus(r *status.Record) JobStatus {
	return JobStatus{
		ID: r.ID, Queue: r.Queue, Type: r.Type, State: JobState(r.State),
		Tries: r.Tries, Failures: r.Failures, Crashes: r.Crashes,
		Reason: Reason(r.Reason), Error: r.Error, Result: r.Result, ResultSize: r.ResultSize,
		RetryAt: r.RetryAt, EnqueuedAt: r.EnqueuedAt, StartedAt: r.StartedAt, UpdatedAt: r.UpdatedAt,
		Worker: r.Worker, CancelRequested: r.CancelRequested, Copy: r.Copy,
		History: stateChanges(r.History.Changes), HistoryDropped: r.History.Dropped,
	}
}

// stateChanges is the public form of a record's changes.
func stateChanges(cs []status.Change) []StateChange {
	if len(cs) == 0 {
		return nil
	}
	out := make([]StateChange, len(cs))
	for i, c := range cs {
		out[i] = StateChange{State: JobState(c.State), At: c.At, Try: c.Try, Reason: c.Reason}
	}
	return out
}

// JobsQuery selects jobs for Platform.Jobs; an empty Queue, State or Type
// selects every one.
type JobsQuery struct {
	Queue string
	State JobState
	Type  string
	// Limit is the most jobs a page holds. Defaults to 50; at most 500.
	Limit int
	// Cursor is the Next of the page before (of the same query and
	// source); empty: from the first.
	Cursor string
	// Source is where the jobs are read from. Defaults to SourceAuto.
	Source JobsSource
}

// JobsSource says where Platform.Jobs reads jobs from.
type JobsSource string

// The sources of Platform.Jobs.
const (
	// SourceAuto reads the broker (SourceBroker) for a query that names
	// a queue this Platform does not track the status of and a state the
	// broker holds (waiting, scheduled, retrying, running), when the
	// backend can browse; the status records (SourceStatus) otherwise.
	SourceAuto JobsSource = ""
	// SourceStatus reads the status records (Config.TrackStatus).
	SourceStatus JobsSource = "status"
	// SourceBroker reads the queue's messages on the broker without
	// consuming them (driver.Browser): the query needs a Queue and one
	// of the states waiting, scheduled, retrying and running.
	SourceBroker JobsSource = "broker"
)

// JobsPage is one page of Platform.Jobs.
type JobsPage struct {
	Jobs []JobStatus
	// Next is the cursor of the next page; empty when the records ran
	// out. A page can be short, or empty, and still have a Next: each page
	// reads at most MaxJobsScan records.
	Next string
	// Scanned is how many status records (or broker messages) the page
	// read; Unreadable how many of those were not status records (or
	// jobs: undecodable, or over driver.MaxBrowseBody bytes), skipped.
	Scanned, Unreadable int
	// Source is where the page was read from: SourceStatus or
	// SourceBroker.
	Source JobsSource
	// Partial, for a page read from the broker: the broker shows only
	// part of the state (Azure's peek of the first 32 messages), so
	// there may be more jobs than the pages hold.
	Partial bool
}

// Bounds of Platform.Jobs and Platform.JobCounts.
const (
	// MaxJobsScan is the most status records one page of Platform.Jobs
	// reads.
	MaxJobsScan = status.MaxListScan
	// MaxCountScan is the most status records one Platform.JobCounts
	// reads.
	MaxCountScan = status.MaxCountScan
)

// ErrBadCursor is matched by the error of Platform.Jobs given a cursor it
// did not return.
var ErrBadCursor = status.ErrBadCursor

// Jobs lists the jobs that q selects, from where q.Source says (see
// SourceAuto).
//
// From the status records (see Status): only the jobs of queues that
// track status are there, as last written to the store, in the order of
// their IDs (not of time). The store keeps no index by queue, state or
// type: a page reads at most MaxJobsScan records and filters them.
//
// From the broker: the queue's messages in the state, in the broker's
// order (the order workers receive them, soonest due, soonest lease end),
// read without consuming them. A waiting message has state waiting; one
// not yet due is retrying when it has failed before, else scheduled; one
// handed out is running. Each is decoded from its envelope, which anyone
// who can write to the broker can forge: its ID and type are for display
// only. A page can be short, or empty, and still have a Next (the type
// filter, skipped messages).
func (p *Platform) Jobs(ctx context.Context, q JobsQuery) (JobsPage, error) {
	if p == nil || p.backend == nil {
		return JobsPage{}, ErrNotNew
	}
	switch q.Source {
	case SourceStatus:
	case SourceBroker:
		return p.browseJobs(ctx, q)
	case SourceAuto:
		if _, ok := browseState(q.State); ok && q.Queue != "" && !p.status.Tracks(q.Queue) {
			if _, ok := p.backend.(driver.Browser); ok {
				return p.browseJobs(ctx, q)
			}
		}
	default:
		return JobsPage{}, fmt.Errorf("%w: unknown jobs source %q", ErrInvalidConfig, q.Source)
	}
	pg, err := p.status.List(ctx, status.Filter{Queue: q.Queue, State: status.State(q.State), Type: q.Type}, q.Cursor, q.Limit)
	if err != nil {
		return JobsPage{}, err
	}
	out := JobsPage{Jobs: make([]JobStatus, len(pg.Records)), Next: pg.Next, Scanned: pg.Scanned, Unreadable: pg.Unreadable, Source: SourceStatus}
	for i := range pg.Records {
		out.Jobs[i] = jobStatus(&pg.Records[i])
	}
	return out, nil
}

// JobCounts is how many tracked jobs each queue has in each state.
type JobCounts struct {
	ByQueue map[string]map[JobState]int
	// Scanned is how many status records were read; Unreadable how many
	// of those were not status records. Complete: every record was read;
	// else the counts are of the first MaxCountScan records in the order
	// of their IDs.
	Scanned, Unreadable int
	Complete            bool
}

// JobCounts counts the tracked jobs by queue and state (of queue alone,
// when it is not empty) from their status records, reading at most
// MaxCountScan of them.
func (p *Platform) JobCounts(ctx context.Context, queue string) (JobCounts, error) {
	if p == nil || p.backend == nil {
		return JobCounts{}, ErrNotNew
	}
	c, err := p.status.Count(ctx, queue)
	if err != nil {
		return JobCounts{}, err
	}
	out := JobCounts{ByQueue: make(map[string]map[JobState]int, len(c.ByQueue)), Scanned: c.Scanned, Unreadable: c.Unreadable, Complete: c.Complete}
	for q, m := range c.ByQueue {
		mm := make(map[JobState]int, len(m))
		for s, n := range m {
			mm[JobState(s)] = n
		}
		out.ByQueue[q] = mm
	}
	return out, nil
}
