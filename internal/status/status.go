// Package status tracks the status of the jobs of tracked queues and carries
// their cancellations. Each tracked job has a record in the store (key
// job/<id>), written when it is enqueued and at each step of each delivery;
// Cancel marks the record and leaves a cancel mark (key cancel/<id>) that the
// workers running the job poll for.
//
// What a delivery costs. Taking a job reads nothing (Begin): the cancel
// marks are listed once per poll interval for all the deliveries, and the
// job's nonce and copy, which it carries, are checked against its record
// when a state is written. The running state is written only for a handler
// still running at a poll. The end is handed to the Tracker's writer (see
// ends), which writes the ends of many deliveries together off their path:
// one read of their records (one round trip where the store batches), then
// their writes. Until it is written, an end is shown by Get in the process
// that settled it; Flush waits for the writes.
//
// The records are stored as JSON and read by every version of the platform:
// their fields and names never change.
//
// What a record trusts. A delivered job comes off the broker, where anyone
// who can write to it can put a message naming any job ID with any copy
// number. A record is bound to its enqueue: Enqueued writes a random nonce
// in it, which the job carries in its wire.StatusHeader through every
// copy, and a delivery whose nonce is not the record's writes nothing (it
// runs untracked), nor does one whose copy number is more than MaxCopyLead
// ahead of the record's. A writer that cannot read the broker cannot learn
// the nonce; one that can read it can copy it, which signing
// (Config.SigningKey) closes: a forged message never reaches the tracker.
// A record written before nonces (none in it) takes the nonce of the
// first delivery that writes it. A writer to the store can write any
// record.
//
// What a record remembers. Each record keeps the job's state changes
// (History: the latest MaxHistory, the count of those dropped), carried in
// the writes above and no others: a delivery's changes not written yet
// (its running state, its end) ride with its next write, which adds them
// to the changes of the record it is written over. Reading a record
// bounds and checks its history (see History).
package status

import (
	"context"
	"errors"
	"fmt"
	json "github.com/go-json-experiment/json/v1"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// State is where a tracked job is in its life.
type State string

// The states of a tracked job, as stored.
const (
	Waiting      State = "waiting"       // enqueued (or handed back, or rejected), due now
	Scheduled    State = "scheduled"     // waiting for NotBefore, a Reject's delay or a limit
	Running      State = "running"       // a handler runs it (or ran it and its worker died)
	Retrying     State = "retrying"      // failed; due again at RetryAt
	Succeeded    State = "succeeded"     // done, with its result
	DeadLettered State = "dead_lettered" // in the dead-letter queue, for Reason
	Cancelled    State = "cancelled"     // Cancel ended it: dead-lettered as cancelled
)

// Terminal reports whether a job in state s will not run again (unless its
// dead letter is redriven).
func (s State) Terminal() bool {
	return s == Succeeded || s == DeadLettered || s == Cancelled
}

// Record is a job's status as stored.
type Record struct {
	ID              string    `json:"id"`
	Queue           string    `json:"queue"`
	Type            string    `json:"type"`
	State           State     `json:"state"`
	Tries           int       `json:"tries"`
	Failures        int       `json:"failures"`
	Crashes         int       `json:"crashes"`
	Reason          string    `json:"reason,omitempty"` // the dead-letter reason
	Error           string    `json:"error,omitempty"`  // the first line of the last error
	Result          []byte    `json:"result,omitempty"`
	ResultSize      int       `json:"result_size,omitempty"`
	RetryAt         time.Time `json:"retry_at,omitzero"`
	EnqueuedAt      time.Time `json:"enqueued_at,omitzero"`
	StartedAt       time.Time `json:"started_at,omitzero"`
	UpdatedAt       time.Time `json:"updated_at"`
	Worker          string    `json:"worker,omitempty"`
	CancelRequested bool      `json:"cancel_requested,omitempty"`
	Copy            uint64    `json:"copy,omitempty"`
	// Nonce binds the record to its enqueue (see the package doc); empty in
	// a record written before nonces.
	Nonce string `json:"nonce,omitempty"`
	// History is the job's state changes since its enqueue; empty in a
	// record written before histories.
	History History `json:"history,omitzero"`

	// fresh is how many of History's last changes are this process's own,
	// not written yet: a write over another record keeps that record's
	// changes and adds these (see joinHistory).
	fresh int
}

// MaxCopyLead is how far ahead of its record a delivered copy may be and
// still write it: further ahead, it is taken for a forgery (a record taken
// by a huge copy number would ignore every real copy after it). A real
// job's copies run ahead of its record only by the requeues that write no
// record (a limit's deferrals), far fewer.
const MaxCopyLead = 1 << 20

// MaxResult is the largest result kept in a record; a larger one is left
// out (ResultSize still says how large it was).
const MaxResult = driver.MaxValueLen - 8<<10

// DefaultPoll is how often a worker running tracked jobs looks for
// cancellations: one store List per tick, whatever the number of jobs.
const DefaultPoll = 300 * time.Millisecond

// ErrNotFound is returned by Get and Cancel for a job with no record:
// unknown, on a queue that does not track status, or past its retention.
var ErrNotFound = errors.New("asyncplatform: no status for this job (unknown, untracked, or past its retention)")

// ErrFinished is returned by Cancel for a job that has ended already.
var ErrFinished = errors.New("asyncplatform: the job has finished")

// ErrCancelled is the error a cancelled job's handler context ends with; it
// matches context.Canceled too.
var ErrCancelled error = cancelledError{}

type cancelledError struct{}

func (cancelledError) Error() string { return "asyncplatform: job cancelled (Platform.Cancel)" }

func (cancelledError) Is(target error) bool { return target == context.Canceled }

// errStale reports a write given up because the record holds a later
// attempt's state: a later copy of the job (a retry that ran before this
// attempt's end was written), or a later try of the same copy (a
// redelivery after a lost lease).
var errStale = errors.New("asyncplatform: a later attempt's status is recorded")

// Config is what a Tracker needs.
type Config struct {
	// Store keeps the records and the cancel marks. Nil when the backend
	// has none: then no queue is tracked, and Get and Cancel return
	// NoStore.
	Store *kv.Store
	// NoStore is why Store is nil; it should match driver.ErrNoStore.
	NoStore error
	// All tracks every queue; Queues names the queues tracked besides.
	All    bool
	Queues []string
	// Retention is how long a record and a cancel mark are kept after
	// their last write.
	Retention time.Duration
	// Worker names this worker in the records it writes.
	Worker string
	// Timeout bounds the store calls of each delivery hook; zero: the
	// caller's context alone.
	Timeout time.Duration
	// Poll is how often Poll looks for cancellations; zero: DefaultPoll.
	Poll time.Duration
	// Logger takes the failures that are logged, not returned; nil:
	// slog.Default().
	Logger *slog.Logger
	// Now is the clock of the records' timestamps; nil: time.Now.
	Now func() time.Time
}

// Tracker keeps the records of the tracked queues' jobs, carries their
// cancellations, and holds the tracked jobs running in this process.
type Tracker struct {
	cfg     Config
	queues  map[string]bool
	running sync.Map // record key → *Track, for the jobs running here: the latest delivery of each
	// beside holds the other deliveries running here of a job whose latest
	// is in running (a duplicate, a copy of another enqueue): they are
	// cancelled and written like it. Usually empty.
	beside sync.Map     // *Track → struct{}
	holdMu sync.Mutex   // held while a Track enters or leaves running and beside
	n      atomic.Int32 // entries in running
	marks  marks        // the cancel marks as last listed
	ends   ends         // the deliveries' ends not written yet
}

// New returns the Tracker cfg describes.
func New(cfg Config) *Tracker {
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Store == nil && cfg.NoStore == nil {
		cfg.NoStore = driver.ErrNoStore
	}
	t := &Tracker{cfg: cfg, queues: make(map[string]bool, len(cfg.Queues))}
	for _, q := range cfg.Queues {
		t.queues[q] = true
	}
	return t
}

// Tracks reports whether the jobs of queue have their status tracked.
func (t *Tracker) Tracks(queue string) bool {
	return t.cfg.Store != nil && (t.cfg.All || t.queues[queue])
}

// key is the record key segment of a job ID.
func key(id string) string { return kv.Segment(id) }

func (t *Tracker) store() (*kv.Store, error) {
	if t.cfg.Store == nil {
		return nil, fmt.Errorf("asyncplatform: job status: %w", t.cfg.NoStore)
	}
	return t.cfg.Store, nil
}

// bound is ctx bounded by Config.Timeout.
func (t *Tracker) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if t.cfg.Timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, t.cfg.Timeout)
}

// Get returns the record of the job with the given ID; ErrNotFound when
// there is none. A job running in this process whose running state is not
// written yet (see Track) is shown running, and one whose end this
// process has not written yet (see Flush) is shown ended.
func (t *Tracker) Get(ctx context.Context, id string) (Record, error) {
	if _, err := t.store(); err != nil {
		return Record{}, err
	}
	k := key(id)
	// The end not written yet is looked up before the store is read: one
	// written meanwhile is then in the record read.
	ends := t.pendingEnds(k)
	r, _, err := t.read(ctx, k)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return r, err
	}
	found := err == nil
	if p, pending := pendingEnd(ends, &r, found); pending {
		if found {
			merge(&r, &p)
		}
		r, found = p, true
	}
	if t.local(k, &r, found) || found {
		return r, nil
	}
	return r, err
}

// local replaces *r, the record of key k as read (found: there is one), by
// the running state of the job's delivery running here when that state is
// not written yet and is not older than *r. It keeps r's CancelRequested,
// and reports whether it replaced it.
func (t *Tracker) local(k string, r *Record, found bool) bool {
	v, ok := t.running.Load(k)
	if !ok {
		return false
	}
	run, ok := v.(*Track).view()
	if !ok || found && newer(r, &run) {
		return false
	}
	run.CancelRequested = r.CancelRequested
	if found {
		joinHistory(r, &run)
	}
	*r = run
	return true
}

// Cancel marks the record of the job with the given ID as cancelled and
// leaves the cancel mark the workers poll for. A job with no record gives
// an error matching ErrNotFound, a finished one ErrFinished; a job marked
// already is no error.
func (t *Tracker) Cancel(ctx context.Context, id string) error {
	s, err := t.store()
	if err != nil {
		return err
	}
	k := key(id)
	err = kv.Retry(ctx, func() error {
		r, rev, err := t.read(ctx, k)
		if err != nil {
			return err
		}
		if p, ok := pendingEnd(t.pendingEnds(k), &r, true); ok && p.State.Terminal() {
			return fmt.Errorf("%w (%s)", ErrFinished, p.State) // ended here, not written yet
		}
		if r.State.Terminal() {
			return fmt.Errorf("%w (%s)", ErrFinished, r.State)
		}
		if r.CancelRequested {
			return nil
		}
		r.CancelRequested = true
		b := encode(&r)
		_, err = s.Update(ctx, "job/"+k, b, rev, t.cfg.Retention)
		if errors.Is(err, driver.ErrRevision) {
			return kv.ErrRetry // it changed meanwhile: read it again
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("asyncplatform: cancel %q: %w", id, err)
	}
	_, err = s.Create(ctx, "cancel/"+k, nil, t.cfg.Retention)
	if err != nil && !errors.Is(err, driver.ErrKeyExists) {
		return fmt.Errorf("asyncplatform: cancel %q: %w", id, err)
	}
	t.marks.add(k)
	return nil
}

// Job is a job as the tracker sees it.
type Job struct {
	ID, Queue, Type string
	// Copy is the job's copy number.
	Copy uint64
	// Nonce is the job's enqueue nonce, from its wire.StatusHeader; empty
	// for a job enqueued before nonces.
	Nonce string
	// EnqueuedAt is when the job was enqueued; NotBefore when it is due
	// (Enqueued: a later one makes it scheduled).
	EnqueuedAt, NotBefore time.Time
	// TryCount, Failures and Crashes are the job's counters as delivered
	// (Begin): the try it is delivered for is TryCount+1.
	TryCount, Failures, Crashes int
}

// EnqueueWriters is how many records Enqueued writes at once for a batch,
// one a call, where the store does not batch, and for the records found
// present already.
const EnqueueWriters = 16

// Enqueued writes the waiting (or scheduled) record of each newly stored job
// of a tracked queue and returns when all are written: those of a batch
// created together (one round trip where the store batches, see
// driver.CreateEach), a record found present (a worker's, or another
// enqueue's) then written one by one, up to EnqueueWriters at once. The
// jobs are stored already: a failed write is logged, not returned (the
// worker writes the record when it takes the job).
func (t *Tracker) Enqueued(ctx context.Context, jobs []Job) {
	now := t.cfg.Now()
	if len(jobs) == 1 {
		t.enqueued(ctx, &jobs[0], now)
		return
	}
	var items []driver.BatchItem
	var of []int // the job of each item
	seen := make(map[string]bool, len(jobs))
	var rest []int // the jobs written one by one
	for i := range jobs {
		j := &jobs[i]
		if !t.Tracks(j.Queue) {
			continue
		}
		k := "job/" + key(j.ID)
		if seen[k] || len(items) == driver.MaxBatch {
			rest = append(rest, i)
			continue
		}
		seen[k] = true
		r := waitingRecord(j, now)
		b := encode(&r)
		items = append(items, driver.BatchItem{Key: k, Value: b, TTL: t.cfg.Retention})
		of = append(of, i)
	}
	if len(items) > 1 {
		rs, err := t.cfg.Store.CreateEach(ctx, items)
		switch {
		case err != nil:
			t.cfg.Logger.Warn("asyncplatform: writing jobs' statuses together failed; they are written one by one", "jobs", len(items), "error", err)
			rest = append(rest, of...)
		default:
			for n, r := range rs {
				if r.Err != nil { // present: decided one by one
					rest = append(rest, of[n])
				}
			}
		}
	} else {
		rest = append(rest, of...)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, EnqueueWriters)
	for _, i := range rest {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			t.enqueued(ctx, &jobs[i], now)
		}()
	}
	wg.Wait()
}

// Recorded returns which of the IDs have a status record, whatever this
// tracker tracks: a platform that does not track a queue (an operator's
// tool) redriving its jobs writes the waiting state of those the workers
// tracked. A read that fails counts as no record. Without a store: none.
func (t *Tracker) Recorded(ctx context.Context, ids []string) map[string]bool {
	out := map[string]bool{}
	if t.cfg.Store == nil {
		return out
	}
	for _, id := range ids {
		if _, _, err := t.read(ctx, key(id)); err == nil {
			out[id] = true
		}
	}
	return out
}

// Requeued writes the waiting (or scheduled) record of each job, whatever
// this tracker tracks: the jobs are those Recorded found, stored again (a
// redrive). A failed write is logged, as Enqueued's.
func (t *Tracker) Requeued(ctx context.Context, jobs []Job) {
	if t.cfg.Store == nil {
		return
	}
	now := t.cfg.Now()
	for i := range jobs {
		r := waitingRecord(&jobs[i], now)
		if err := t.create(ctx, &r); err != nil {
			t.cfg.Logger.Warn("asyncplatform: writing a job's status failed", "queue", jobs[i].Queue, "id", jobs[i].ID, "error", err)
		}
	}
}

// waitingRecord is the record of j stored at now.
func waitingRecord(j *Job, now time.Time) Record {
	r := Record{ID: j.ID, Queue: j.Queue, Type: j.Type, State: Waiting, EnqueuedAt: j.EnqueuedAt, UpdatedAt: now, Copy: j.Copy, Nonce: j.Nonce}
	if j.NotBefore.After(now) {
		r.State, r.RetryAt = Scheduled, j.NotBefore
	}
	r.record(Change{State: r.State, At: now, Try: j.TryCount})
	return r
}

// enqueued writes the record of j, stored at now, when its queue is tracked.
func (t *Tracker) enqueued(ctx context.Context, j *Job, now time.Time) {
	if !t.Tracks(j.Queue) {
		return
	}
	r := waitingRecord(j, now)
	if err := t.create(ctx, &r); err != nil {
		t.cfg.Logger.Warn("asyncplatform: writing a job's status failed", "queue", j.Queue, "id", j.ID, "error", err)
	}
}

func (t *Tracker) read(ctx context.Context, k string) (Record, string, error) {
	b, rev, err := t.cfg.Store.Get(ctx, "job/"+k)
	if errors.Is(err, driver.ErrKeyNotFound) {
		return Record{}, "", ErrNotFound
	}
	if err != nil {
		return Record{}, "", err
	}
	r, err := decode(b)
	if err != nil {
		return Record{}, "", fmt.Errorf("asyncplatform: the status of job key %q is not a status: %w", k, err)
	}
	return r, rev, nil
}

// errTooLarge reports a record larger than a store value can be.
var errTooLarge = fmt.Errorf("asyncplatform: a status record is larger than %d bytes", driver.MaxValueLen)

// decode decodes a record as read from the store: at most
// driver.MaxValueLen bytes (no store writes more), its history bounded
// (see History).
func decode(b []byte) (Record, error) {
	var r Record
	if len(b) > driver.MaxValueLen {
		return r, errTooLarge
	}
	err := json.Unmarshal(b, &r)
	return r, err
}

// encode encodes a record as stored. The codec (go-json-experiment's v1,
// encoding/json's behaviour at a fraction of its cost) writes the bytes
// encoding/json writes and reads any record as it reads it
// (TestCodecMatchesStdlib, TestHostileRecordsReview9), but for two
// things: invalid UTF-8 is written as U+FFFD itself, not its escape (the
// same string read back), and a time spelled with JSON escapes is read as
// the string it spells, where encoding/json refuses it
// (TestEscapedTimesReview10). A Record always encodes.
func encode(r *Record) []byte {
	b, _ := json.Marshal(r)
	return b
}

// newer reports whether cur records a later attempt than r, or another
// enqueue's (a redrive since, say).
func newer(cur, r *Record) bool {
	return cur.Copy > r.Copy || cur.Copy == r.Copy && cur.Tries > r.Tries || cur.Nonce != "" && cur.Nonce != r.Nonce
}

// refuse returns errStale when r may not be written over cur: cur records
// a later attempt, or another enqueue (r's nonce is not cur's: a forgery or
// a copy from before a redrive), or r's copy is more than MaxCopyLead ahead
// of cur's (see the package doc).
func refuse(cur, r *Record) error {
	if newer(cur, r) || r.Copy > cur.Copy && r.Copy-cur.Copy > MaxCopyLead {
		return errStale
	}
	return nil
}

// merge keeps in r, a delivery's state about to be written over cur, what
// cur knows and the delivery does not: the cancel mark, the last error,
// the enqueue and start times, and the history (r's own changes follow
// cur's).
func merge(cur, r *Record) {
	joinHistory(cur, r)
	r.CancelRequested = r.CancelRequested || cur.CancelRequested
	if r.Error == "" {
		r.Error = cur.Error
	}
	if r.EnqueuedAt.IsZero() {
		r.EnqueuedAt = cur.EnqueuedAt
	}
	if r.StartedAt.IsZero() {
		r.StartedAt = cur.StartedAt
	}
}

// revOf reads the record of key k that r is to be written over: it
// returns its revision (empty: none) with the record merged into r, or
// errStale when r may not be written over it (see refuse).
func (t *Tracker) revOf(ctx context.Context, k string, r *Record) (string, error) {
	cur, rev, err := t.read(ctx, k)
	switch {
	case errors.Is(err, ErrNotFound):
		return "", nil
	case err != nil:
		return "", err
	case refuse(&cur, r) != nil:
		return "", errStale
	}
	merge(&cur, r)
	return rev, nil
}

// write writes r at rev (empty: create), and on a conflict (Cancel wrote
// meanwhile, or the record is older or newer than thought) reads the record
// again, merges it into r (see merge), and writes again. When the record
// may not be written over (see refuse), it leaves it and returns errStale.
// It returns the new revision.
func (t *Tracker) write(ctx context.Context, r *Record, rev string) (string, error) {
	s, k := t.cfg.Store, key(r.ID)
	b := encode(r)
	var written string
	err := kv.Retry(ctx, func() error {
		var err error
		if rev == "" {
			written, err = s.Create(ctx, "job/"+k, b, t.cfg.Retention)
		} else {
			written, err = s.Update(ctx, "job/"+k, b, rev, t.cfg.Retention)
		}
		if err == nil || !(errors.Is(err, driver.ErrKeyExists) || errors.Is(err, driver.ErrRevision)) {
			return err
		}
		cur, cr, err := t.read(ctx, k)
		switch {
		case errors.Is(err, ErrNotFound):
			rev = ""
		case err != nil:
			return err
		case refuse(&cur, r) != nil:
			return errStale
		default:
			rev = cr
			merge(&cur, r)
			b = encode(r)
		}
		return kv.ErrRetry
	})
	if err != nil {
		return "", err
	}
	return written, nil
}

// create writes the record of a job just stored. A worker may have taken the
// job and written a newer state of the same enqueue first: that one stays,
// and when it is of the same copy, its history gets the enqueue's change
// first (one more write, in that race only).
// A record of another enqueue (the job's life before a redrive, or one a
// forged delivery wrote before the job was enqueued) or of an older copy is
// replaced.
func (t *Tracker) create(ctx context.Context, r *Record) error {
	s, k := t.cfg.Store, key(r.ID)
	b := encode(r)
	return kv.Retry(ctx, func() error {
		_, err := s.Create(ctx, "job/"+k, b, t.cfg.Retention)
		if !errors.Is(err, driver.ErrKeyExists) {
			return err
		}
		cur, rev, err := t.read(ctx, k)
		switch {
		case errors.Is(err, ErrNotFound):
			return kv.ErrRetry
		case err != nil:
			return err
		case cur.Copy == r.Copy && cur.Nonce == r.Nonce && !startsHistory(&cur):
			// The worker's newer state of this copy, written first: it
			// stays, after the enqueue's change.
			cur.History = appendChanges(r.History, cur.History.Changes)
			b := encode(&cur)
			_, err = s.Update(ctx, "job/"+k, b, rev, t.cfg.Retention)
			if errors.Is(err, driver.ErrRevision) {
				return kv.ErrRetry
			}
			return err
		case cur.Copy >= r.Copy && cur.Nonce == r.Nonce:
			return nil // the worker's newer state of this copy
		}
		_, err = s.Update(ctx, "job/"+k, b, rev, t.cfg.Retention)
		if errors.Is(err, driver.ErrRevision) {
			return kv.ErrRetry
		}
		return err
	})
}

// startsHistory reports whether r's history begins with its enqueue's
// change (waiting or scheduled), or is full: nothing goes before it.
func startsHistory(r *Record) bool {
	h := r.History.Changes
	return len(h) >= MaxHistory || r.History.Dropped > 0 || len(h) > 0 && (h[0].State == Waiting || h[0].State == Scheduled)
}

// Poll cancels, every Config.Poll until ctx ends, the jobs running here that
// Cancel marked, and writes the running state of the jobs whose handler has
// run here for a poll interval. It returns at once when there is no store.
func (t *Tracker) Poll(ctx context.Context) {
	if t.cfg.Store == nil {
		return
	}
	tick := time.NewTicker(t.cfg.Poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if t.n.Load() > 0 {
			t.pollOnce(ctx)
			t.flushRunning(ctx)
		}
	}
}

// pollOnce lists the cancel marks (for Begin) and cancels the running jobs
// that have one: one List of the marks per page, whatever the number of
// running jobs.
func (t *Tracker) pollOnce(ctx context.Context) {
	set, err := t.listMarks(ctx)
	if err != nil {
		t.cfg.Logger.Warn("asyncplatform: reading cancellations failed", "error", err)
		return
	}
	var marked []*Track
	for k := range set {
		if v, ok := t.running.Load(k); ok {
			marked = append(marked, v.(*Track))
		}
	}
	t.beside.Range(func(v, _ any) bool {
		if tr := v.(*Track); set[tr.key] {
			marked = append(marked, tr)
		}
		return true
	})
	for _, tr := range marked {
		if tr.isCancelled() {
			continue
		}
		ours, err := tr.cancelRequested(ctx)
		switch {
		case err != nil:
			t.cfg.Logger.Warn("asyncplatform: reading a marked job's status failed; its cancellation waits for the next poll", "queue", tr.queue, "id", tr.id, "error", err)
		case ours:
			tr.cancel()
		}
	}
}

// flushRunning writes the running state of the jobs running here since a
// poll interval or more that have none written yet.
func (t *Tracker) flushRunning(ctx context.Context) {
	cutoff := time.Now().Add(-t.cfg.Poll)
	t.running.Range(func(_, v any) bool {
		v.(*Track).flushRunning(ctx, cutoff)
		return ctx.Err() == nil
	})
	t.beside.Range(func(v, _ any) bool {
		v.(*Track).flushRunning(ctx, cutoff)
		return ctx.Err() == nil
	})
}
