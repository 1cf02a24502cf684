// Package workflow is the engine of workflows: steps (jobs) with
// dependencies, kept in the store, each step enqueued once every step it
// depends on has ended.
//
// The rules:
//
//   - A workflow's state lives in the store: one record per step
//     (<id>/s/<step>), written by compare-and-swap, a record of the
//     workflow (<id>) listing its steps, and a cancel mark (<id>/cancel).
//   - A step's job is enqueued only by the engine: the roots by Create, the
//     others by Advance once their dependencies have all ended. The
//     enqueue comes first and the record's move to "enqueued" second, so
//     a process that dies between them leaves the step waiting, and the
//     redelivery of the parent that ended last enqueues it again, with the
//     same identity (Ready.Attempt), which a backend that deduplicates
//     drops and Begin tells apart (a step that succeeded never runs again).
//   - Before a step's handler runs, Begin reads its record and its
//     dependencies': a step that succeeded already is not run again
//     (Advance is repeated, idempotent); a cancelled workflow's step does
//     not run; a step whose dependency failed runs, is skipped or fails
//     with dependency_failed, as its OnDependencyFailed says.
//   - Everything read from the store is untrusted: records are bounded by
//     the store's value limit, decoded strictly, and a record that does
//     not decode is an error naming the key, never a panic.
package workflow

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"strconv"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// MaxSteps is the most steps of one workflow.
const MaxSteps = 5000

// RecordTimeout bounds the write of a step's record moved to "enqueued"
// once its job is enqueued: that write outlives the caller's context.
const RecordTimeout = 30 * time.Second

// MaxNameLen is the longest step name, in bytes.
const MaxNameLen = 64

// ReasonDependencyFailed is the dead-letter reason of a step whose
// dependency failed for good (policy Fail).
const ReasonDependencyFailed = "dependency_failed"

// OnFailed says what a step does when a dependency failed for good.
type OnFailed int

// The policies.
const (
	// Fail: the step is dead-lettered with ReasonDependencyFailed (the
	// default).
	Fail OnFailed = iota
	// Run: the step runs anyway.
	Run
	// Skip: the step does not run; it is recorded skipped, and its own
	// dependents see it as succeeded with no result.
	Skip
)

// The states of a step.
const (
	Waiting   = "waiting"   // a dependency has not ended
	Enqueued  = "enqueued"  // its job is on its queue
	Succeeded = "succeeded" // its handler returned nil
	Failed    = "failed"    // dead-lettered for good (Reason says why)
	Skipped   = "skipped"   // a dependency failed and its policy is Skip
	Cancelled = "cancelled" // the workflow was cancelled before it ran
)

// ErrInvalid is matched by every error of Validate.
var ErrInvalid = errors.New("invalid workflow")

// ErrNotFound is returned for a workflow or step with no record.
var ErrNotFound = errors.New("workflow not found")

// ErrBadRecord is matched by the error of a record that does not decode.
var ErrBadRecord = errors.New("workflow record does not decode")

// ErrTooLarge is matched by the error of a write whose record would not
// fit in the store (a step's result too large): writing it again cannot
// succeed.
var ErrTooLarge = errors.New("workflow record too large")

// Error names what is wrong with a workflow's definition.
type Error struct {
	Step    string // the step concerned, when there is one
	Problem string // "duplicate step", "unknown dependency", "cycle", ...
	Detail  string
}

func (e *Error) Error() string {
	s := "asyncplatform: invalid workflow: " + e.Problem
	if e.Step != "" {
		s += fmt.Sprintf(" at step %q", e.Step)
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap makes the error match ErrInvalid.
func (e *Error) Unwrap() error { return ErrInvalid }

// Spec is one step as defined.
type Spec struct {
	Name     string
	Deps     []string
	OnFailed OnFailed
	Job      json.RawMessage // the job to enqueue, encoded by the caller
}

// Record is a step's record in the store.
type Record struct {
	Name       string          `json:"name"`
	Deps       []string        `json:"deps,omitempty"`
	Dependents []string        `json:"dependents,omitempty"`
	OnFailed   OnFailed        `json:"on_failed,omitempty"`
	Job        json.RawMessage `json:"job"`
	State      string          `json:"state"`
	Reason     string          `json:"reason,omitempty"`
	Attempt    int             `json:"attempt"`
	Result     []byte          `json:"result,omitempty"`
}

// ended says whether the step will not change unless redriven.
func (r *Record) ended() bool {
	return r.State == Succeeded || r.State == Failed || r.State == Skipped || r.State == Cancelled
}

// good says whether the step's dependents may run as if it succeeded.
func (r *Record) good() bool { return r.State == Succeeded || r.State == Skipped }

// Meta is the workflow's own record.
type Meta struct {
	Name    string    `json:"name"`
	Steps   []string  `json:"steps"`
	Created time.Time `json:"created"`
}

// Ready is a step whose job is to be enqueued.
type Ready struct {
	Workflow string
	Step     string
	Attempt  int
	Job      json.RawMessage
}

// Store is the part of the platform's store the engine uses (kv.Store).
type Store interface {
	Get(ctx context.Context, key string) ([]byte, string, error)
	Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error)
	Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error)
	GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error)
	CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error)
}

// Config holds the engine's dependencies.
type Config struct {
	// Store keeps the records. Required.
	Store Store
	// Enqueue writes the jobs of ready steps. Required.
	Enqueue func(ctx context.Context, ready []Ready) error
	// TTL is how long records are kept after their last write; zero keeps
	// them for good. Defaults to none.
	TTL time.Duration
	// Log receives warnings. Defaults to slog.Default().
	Log *slog.Logger
}

// Engine runs workflows.
type Engine struct {
	cfg Config
}

// New returns an engine.
func New(cfg Config) *Engine {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Engine{cfg: cfg}
}

// NewID returns a new workflow ID: 128 random bits in hex.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ValidID says whether id is an ID NewID could have made.
func ValidID(id string) bool {
	if len(id) != 32 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

// ValidName says whether name is a valid step name: 1 to MaxNameLen bytes
// of [A-Za-z0-9._-].
func ValidName(name string) bool {
	if name == "" || len(name) > MaxNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Validate checks a definition: at least one step, at most MaxSteps, valid
// and distinct names, known dependencies, no step depending on itself or
// twice on one step, no cycle.
func Validate(steps []Spec) error {
	if len(steps) == 0 {
		return &Error{Problem: "no steps"}
	}
	if len(steps) > MaxSteps {
		return &Error{Problem: "too many steps", Detail: fmt.Sprintf("%d steps, at most %d", len(steps), MaxSteps)}
	}
	index := make(map[string]int, len(steps))
	for i, s := range steps {
		if !ValidName(s.Name) {
			return &Error{Step: s.Name, Problem: "bad step name", Detail: fmt.Sprintf("1 to %d bytes of [A-Za-z0-9._-]", MaxNameLen)}
		}
		if _, dup := index[s.Name]; dup {
			return &Error{Step: s.Name, Problem: "duplicate step"}
		}
		if s.OnFailed < Fail || s.OnFailed > Skip {
			return &Error{Step: s.Name, Problem: "bad OnDependencyFailed", Detail: fmt.Sprint(int(s.OnFailed))}
		}
		index[s.Name] = i
	}
	for _, s := range steps {
		seen := make(map[string]bool, len(s.Deps))
		for _, d := range s.Deps {
			if _, ok := index[d]; !ok {
				return &Error{Step: s.Name, Problem: "unknown dependency", Detail: fmt.Sprintf("%q", d)}
			}
			if d == s.Name {
				return &Error{Step: s.Name, Problem: "cycle", Detail: "the step depends on itself"}
			}
			if seen[d] {
				return &Error{Step: s.Name, Problem: "duplicate dependency", Detail: fmt.Sprintf("%q", d)}
			}
			seen[d] = true
		}
	}
	// Kahn's algorithm: what is left once every step without pending
	// dependencies is removed lies on a cycle.
	pending := make([]int, len(steps))
	dependents := make([][]int, len(steps))
	var queue []int
	for i, s := range steps {
		pending[i] = len(s.Deps)
		for _, d := range s.Deps {
			dependents[index[d]] = append(dependents[index[d]], i)
		}
		if pending[i] == 0 {
			queue = append(queue, i)
		}
	}
	done := 0
	for len(queue) > 0 {
		i := queue[0]
		queue = queue[1:]
		done++
		for _, j := range dependents[i] {
			if pending[j]--; pending[j] == 0 {
				queue = append(queue, j)
			}
		}
	}
	if done < len(steps) {
		for i, n := range pending {
			if n > 0 {
				return &Error{Step: steps[i].Name, Problem: "cycle", Detail: "the step depends, through others, on itself"}
			}
		}
	}
	return nil
}

func metaKey(id string) string       { return id }
func cancelKey(id string) string     { return id + "/cancel" }
func stepKey(id, step string) string { return id + "/s/" + step }
func stepKeys(id string, steps []string) []string {
	keys := make([]string, len(steps))
	for i, s := range steps {
		keys[i] = stepKey(id, s)
	}
	return keys
}

// Create stores a validated workflow under id and enqueues its roots. The
// step records are written first, then the workflow's record, then the
// roots' jobs: a workflow whose Create failed has no record and runs
// nothing but roots already enqueued.
func (e *Engine) Create(ctx context.Context, id, name string, steps []Spec) error {
	if err := Validate(steps); err != nil {
		return err
	}
	dependents := make(map[string][]string, len(steps))
	for _, s := range steps {
		for _, d := range s.Deps {
			dependents[d] = append(dependents[d], s.Name)
		}
	}
	items := make([]driver.BatchItem, 0, len(steps))
	var roots []Ready
	meta := Meta{Name: name, Created: time.Now().UTC()}
	for _, s := range steps {
		rec := Record{Name: s.Name, Deps: s.Deps, Dependents: dependents[s.Name], OnFailed: s.OnFailed, Job: s.Job, State: Waiting}
		if len(s.Deps) == 0 {
			rec.State = Enqueued
			roots = append(roots, Ready{Workflow: id, Step: s.Name, Job: s.Job})
		}
		b, err := json.Marshal(&rec)
		if err != nil {
			return fmt.Errorf("encoding step %q: %w", s.Name, err)
		}
		if len(b) > driver.MaxValueLen {
			return &Error{Step: s.Name, Problem: "step too large", Detail: fmt.Sprintf("its record is %d bytes, the store holds at most %d (a smaller payload, fewer dependencies)", len(b), driver.MaxValueLen)}
		}
		items = append(items, driver.BatchItem{Key: stepKey(id, s.Name), Value: b, TTL: e.cfg.TTL})
		meta.Steps = append(meta.Steps, s.Name)
	}
	mb, err := json.Marshal(&meta)
	if err != nil {
		return fmt.Errorf("encoding workflow: %w", err)
	}
	if len(mb) > driver.MaxValueLen {
		return &Error{Problem: "too many steps", Detail: fmt.Sprintf("the list of step names is %d bytes, the store holds at most %d", len(mb), driver.MaxValueLen)}
	}
	for start := 0; start < len(items); start += driver.MaxBatch {
		rs, err := e.cfg.Store.CreateEach(ctx, items[start:min(start+driver.MaxBatch, len(items))])
		if err != nil {
			return fmt.Errorf("storing the steps of workflow %s: %w", id, err)
		}
		for i, r := range rs {
			if r.Err != nil {
				return fmt.Errorf("storing step %s of workflow %s: %w", items[start+i].Key, id, r.Err)
			}
		}
	}
	if _, err := e.cfg.Store.Create(ctx, metaKey(id), mb, e.cfg.TTL); err != nil {
		return fmt.Errorf("storing workflow %s: %w", id, err)
	}
	if err := e.cfg.Enqueue(ctx, roots); err != nil {
		return fmt.Errorf("enqueueing the first steps of workflow %s: %w", id, err)
	}
	return nil
}

// decode decodes a record read from the store.
func decode(key string, b []byte, v any) error {
	if len(b) > driver.MaxValueLen {
		return fmt.Errorf("%w: %s: %d bytes", ErrBadRecord, key, len(b))
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadRecord, key, err)
	}
	return nil
}

// get reads a step's record and its revision.
func (e *Engine) get(ctx context.Context, id, step string) (*Record, string, error) {
	key := stepKey(id, step)
	b, rev, err := e.cfg.Store.Get(ctx, key)
	if errors.Is(err, driver.ErrKeyNotFound) {
		return nil, "", fmt.Errorf("%w: step %s of workflow %s", ErrNotFound, step, id)
	}
	if err != nil {
		return nil, "", err
	}
	var r Record
	if err := decode(key, b, &r); err != nil {
		return nil, "", err
	}
	if r.Name != step {
		return nil, "", fmt.Errorf("%w: %s holds step %q", ErrBadRecord, key, r.Name)
	}
	return &r, rev, nil
}

// update changes a step's record by compare-and-swap: fn changes the
// record read and reports whether to write it.
func (e *Engine) update(ctx context.Context, id, step string, fn func(r *Record) (bool, error)) (*Record, error) {
	var out *Record
	err := kv.Retry(ctx, func() error {
		r, rev, err := e.get(ctx, id, step)
		if err != nil {
			return err
		}
		write, err := fn(r)
		if err != nil {
			return err
		}
		out = r
		if !write {
			return nil
		}
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		if len(b) > driver.MaxValueLen {
			return fmt.Errorf("%w: step %s of workflow %s: its record would be %d bytes, the store holds at most %d (a smaller result)", ErrTooLarge, step, id, len(b), driver.MaxValueLen)
		}
		if _, err := e.cfg.Store.Update(ctx, stepKey(id, step), b, rev, e.cfg.TTL); err != nil {
			if errors.Is(err, driver.ErrRevision) {
				return kv.ErrRetry
			}
			return err
		}
		return nil
	})
	return out, err
}

// Cancelled says whether the workflow was cancelled.
func (e *Engine) Cancelled(ctx context.Context, id string) (bool, error) {
	_, _, err := e.cfg.Store.Get(ctx, cancelKey(id))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, driver.ErrKeyNotFound):
		return false, nil
	}
	return false, err
}

// Cancel marks the workflow cancelled: steps not yet running never run.
// Cancelling twice is not an error.
func (e *Engine) Cancel(ctx context.Context, id string) error {
	if _, _, err := e.cfg.Store.Get(ctx, metaKey(id)); err != nil {
		if errors.Is(err, driver.ErrKeyNotFound) {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		return err
	}
	_, err := e.cfg.Store.Create(ctx, cancelKey(id), []byte("1"), e.cfg.TTL)
	if err != nil && !errors.Is(err, driver.ErrKeyExists) {
		return err
	}
	return nil
}

// Action is what Begin says to do with a delivered step.
type Action int

// The actions.
const (
	// RunIt: run the handler (Start.Results holds the dependencies').
	RunIt Action = iota
	// Done: the step succeeded already; Advance again, do not run it.
	Done
	// CancelIt: the workflow is cancelled; the step is recorded cancelled.
	CancelIt
	// SkipIt: a dependency failed and the step's policy is Skip; it is
	// recorded skipped (Advance follows).
	SkipIt
	// FailIt: a dependency failed and the step's policy is Fail: it is to
	// be dead-lettered with ReasonDependencyFailed.
	FailIt
	// Stale: the delivery is of an older attempt than the record's, which
	// has not ended: drop it, the newer copy runs.
	Stale
)

// Start is Begin's answer.
type Start struct {
	Action  Action
	Failed  string            // FailIt: the dependency that failed
	Results map[string][]byte // RunIt: each dependency's result
}

// Begin decides what a delivered step does, before its handler runs.
func (e *Engine) Begin(ctx context.Context, id, step string, attempt int) (Start, error) {
	r, _, err := e.get(ctx, id, step)
	if err != nil {
		return Start{}, err
	}
	if r.State == Succeeded || r.State == Skipped {
		return Start{Action: Done}, nil
	}
	if r.State == Cancelled {
		return Start{Action: CancelIt}, nil
	}
	if attempt < r.Attempt && !r.ended() {
		return Start{Action: Stale}, nil
	}
	cancelled, err := e.Cancelled(ctx, id)
	if err != nil {
		return Start{}, err
	}
	if cancelled {
		if _, err := e.update(ctx, id, step, func(r *Record) (bool, error) {
			if r.ended() {
				return false, nil
			}
			r.State = Cancelled
			return true, nil
		}); err != nil {
			return Start{}, err
		}
		return Start{Action: CancelIt}, nil
	}
	deps, err := e.records(ctx, id, r.Deps)
	if err != nil {
		return Start{}, err
	}
	st := Start{Action: RunIt, Results: make(map[string][]byte, len(deps))}
	for _, d := range deps {
		switch {
		case d.good():
			st.Results[d.Name] = d.Result
		case d.State == Failed || d.State == Cancelled:
			switch r.OnFailed {
			case Skip:
				if err := e.finish(ctx, id, step, Skipped, "", nil); err != nil {
					return Start{}, err
				}
				return Start{Action: SkipIt}, nil
			case Fail:
				return Start{Action: FailIt, Failed: d.Name}, nil
			}
		default:
			// A dependency that has not ended: the step was enqueued by
			// a copy of the workflow's state that has changed since (a
			// dependency redriven). Run it as the policy would.
			if r.OnFailed != Run {
				return Start{Action: FailIt, Failed: d.Name}, nil
			}
		}
	}
	return st, nil
}

// records reads the records of steps, in batches.
func (e *Engine) records(ctx context.Context, id string, steps []string) ([]*Record, error) {
	out, _, err := e.recordsSized(ctx, id, steps)
	return out, err
}

// recordsSized reads the records of steps, in batches, and says how many
// bytes they held.
func (e *Engine) recordsSized(ctx context.Context, id string, steps []string) ([]*Record, int, error) {
	out := make([]*Record, 0, len(steps))
	size := 0
	keys := stepKeys(id, steps)
	for start := 0; start < len(keys); start += driver.MaxBatch {
		part := keys[start:min(start+driver.MaxBatch, len(keys))]
		rs, err := e.cfg.Store.GetEach(ctx, part)
		if err != nil {
			return nil, 0, err
		}
		for i, res := range rs {
			if res.Err != nil {
				return nil, 0, fmt.Errorf("%w: %s: %w", ErrNotFound, part[i], res.Err)
			}
			size += len(res.Value)
			var r Record
			if err := decode(part[i], res.Value, &r); err != nil {
				return nil, 0, err
			}
			if r.Name != steps[start+i] {
				return nil, 0, fmt.Errorf("%w: %s holds step %q", ErrBadRecord, part[i], r.Name)
			}
			out = append(out, &r)
		}
	}
	return out, size, nil
}

// Succeed records the step succeeded with its result, then advances the
// workflow. Calling it again (a redelivery) writes nothing and advances
// again.
func (e *Engine) Succeed(ctx context.Context, id, step string, result []byte) error {
	if err := e.finish(ctx, id, step, Succeeded, "", result); err != nil {
		return err
	}
	return e.Advance(ctx, id, step)
}

// Fail records the step dead-lettered for good with reason, then advances
// the workflow.
//
// A step failed with ReasonDependencyFailed whose dependencies have all
// succeeded by then (the failed one was redriven, and its Advance read
// this step before its failure was recorded) is enqueued again at its next
// attempt, as that Advance would have: one of the two finds it.
func (e *Engine) Fail(ctx context.Context, id, step, reason string) error {
	return e.FailAttempt(ctx, id, step, AnyAttempt, reason)
}

// AnyAttempt is the attempt of a FailAttempt that applies whatever the
// step's current attempt.
const AnyAttempt = -1

// FailAttempt is Fail for the dead letter of the step's attempt: the dead
// letter of an attempt older than the record's (a stale copy, redriven or
// delivered late, after a dependency's redrive enqueued the step again)
// records nothing and advances nothing.
func (e *Engine) FailAttempt(ctx context.Context, id, step string, attempt int, reason string) error {
	stale, err := e.finishAttempt(ctx, id, step, attempt, Failed, reason, nil)
	if err != nil || stale {
		return err
	}
	if reason == ReasonDependencyFailed {
		var cancelled *bool
		if err := e.fire(ctx, id, step, step, &cancelled); err != nil {
			return err
		}
	}
	return e.Advance(ctx, id, step)
}

// Skip records the step skipped and advances the workflow.
func (e *Engine) Skip(ctx context.Context, id, step string) error {
	if err := e.finish(ctx, id, step, Skipped, "", nil); err != nil {
		return err
	}
	return e.Advance(ctx, id, step)
}

// MarkCancelled records the step cancelled.
func (e *Engine) MarkCancelled(ctx context.Context, id, step string) error {
	return e.finish(ctx, id, step, Cancelled, "", nil)
}

func (e *Engine) finish(ctx context.Context, id, step, state, reason string, result []byte) error {
	_, err := e.finishAttempt(ctx, id, step, AnyAttempt, state, reason, result)
	return err
}

// finishAttempt records the step ended in state, unless attempt (not
// AnyAttempt) is older than the record's: stale is then true.
func (e *Engine) finishAttempt(ctx context.Context, id, step string, attempt int, state, reason string, result []byte) (stale bool, err error) {
	_, err = e.update(ctx, id, step, func(r *Record) (bool, error) {
		stale = attempt != AnyAttempt && attempt < r.Attempt
		if stale {
			return false, nil
		}
		if r.State == state && r.Reason == reason {
			return false, nil
		}
		if r.State == Succeeded && state != Succeeded {
			return false, nil // a success is final
		}
		r.State, r.Reason, r.Result = state, reason, result
		return true, nil
	})
	return stale, err
}

// Advance enqueues each dependent of step whose dependencies have all
// ended, once: a waiting dependent at its attempt, a dependent that failed
// with ReasonDependencyFailed at its next attempt once its dependencies
// have all succeeded (the failed dependency was redriven). It is
// idempotent: repeating it enqueues nothing new but what an earlier call
// died before recording.
func (e *Engine) Advance(ctx context.Context, id, step string) error {
	r, _, err := e.get(ctx, id, step)
	if err != nil {
		return err
	}
	var cancelled *bool
	for _, dep := range r.Dependents {
		if err := e.fire(ctx, id, dep, step, &cancelled); err != nil {
			return err
		}
	}
	return nil
}

// fire enqueues step dep, for holder (a dependency of dep, or dep itself),
// if it is waiting or failed with ReasonDependencyFailed and its
// dependencies have all ended (all succeeded, when it failed), and holder
// takes the claim. cancelled caches the workflow's cancel mark.
func (e *Engine) fire(ctx context.Context, id, dep, holder string, cancelled **bool) error {
	d, _, err := e.get(ctx, id, dep)
	if err != nil {
		return err
	}
	refire := d.State == Failed && d.Reason == ReasonDependencyFailed
	if d.State != Waiting && !refire {
		return nil
	}
	ok, err := e.depsEnded(ctx, id, d, refire)
	if err != nil || !ok {
		return err
	}
	if *cancelled == nil {
		c, err := e.Cancelled(ctx, id)
		if err != nil {
			return err
		}
		*cancelled = &c
	}
	if **cancelled {
		return e.MarkCancelled(ctx, id, dep)
	}
	attempt := d.Attempt
	if refire {
		attempt++
	}
	mine, err := e.claim(ctx, id, dep, holder, attempt)
	if err != nil {
		return err
	}
	if !mine {
		return nil // another step enqueues it, or has
	}
	if err := e.cfg.Enqueue(ctx, []Ready{{Workflow: id, Step: dep, Attempt: attempt, Job: d.Job}}); err != nil {
		return fmt.Errorf("enqueueing step %s of workflow %s: %w", dep, id, err)
	}
	// The job is on its queue: its record is written even when ctx has
	// ended since (the holder's lease lost, its handler cancelled), or the
	// holder's redelivery, finding the step waiting, would enqueue it again
	// while this copy waits to run.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RecordTimeout)
	defer cancel()
	_, err = e.update(rctx, id, dep, func(r *Record) (bool, error) {
		if r.Attempt > attempt || r.Attempt == attempt && r.State != Waiting {
			return false, nil // another process recorded it
		}
		if r.State != Waiting && !(r.State == Failed && r.Reason == ReasonDependencyFailed) {
			// The attempt ran and ended before this write (its job was
			// delivered at once): keep its end, and record its attempt.
			if r.Attempt < attempt {
				r.Attempt = attempt
				return true, nil
			}
			return false, nil
		}
		r.State, r.Reason, r.Attempt = Enqueued, "", attempt
		return true, nil
	})
	return err
}

// claim takes the right to enqueue the attempt of step dep for step
// (create-if-absent of <id>/e/<dep>/<attempt>, holding step's name), and
// reports whether step holds it: the first of the steps that find dep
// ready takes it, and only it, or its redelivery after its worker died
// between the claim and the enqueue, enqueues dep.
func (e *Engine) claim(ctx context.Context, id, dep, step string, attempt int) (bool, error) {
	key := id + "/e/" + dep + "/" + strconv.Itoa(attempt)
	_, err := e.cfg.Store.Create(ctx, key, []byte(step), e.cfg.TTL)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, driver.ErrKeyExists) {
		return false, err
	}
	holder, _, err := e.cfg.Store.Get(ctx, key)
	if errors.Is(err, driver.ErrKeyNotFound) {
		return false, nil // expired with the workflow
	}
	if err != nil {
		return false, err
	}
	return string(holder) == step, nil
}

// depsEnded says whether every dependency of d has ended (with all
// succeeded, when good). It reads them in batches, in a random order, and
// stops at the first batch holding one that has not: in a fan-in of n
// parents the parents together read about n·ln n records instead of n².
// The order is a random permutation, not a random start: parents end
// roughly in the order they were defined, so the neighbours of one that
// ended have most likely ended too.
func (e *Engine) depsEnded(ctx context.Context, id string, d *Record, good bool) (bool, error) {
	n := len(d.Deps)
	if n == 0 {
		return true, nil
	}
	chunk := 4 // doubled after each batch of ended ones, up to 256
	order := mrand.Perm(n)
	for off := 0; off < n; off, chunk = off+chunk, min(2*chunk, 256) {
		var names []string
		for _, i := range order[off:min(off+chunk, n)] {
			names = append(names, d.Deps[i])
		}
		rs, err := e.records(ctx, id, names)
		if err != nil {
			return false, err
		}
		for _, r := range rs {
			if !r.ended() || good && !r.good() {
				return false, nil
			}
		}
	}
	return true, nil
}

// Status is a workflow's state, or a page of its steps (StatusPage).
type Status struct {
	ID        string
	Name      string
	Created   time.Time
	Cancelled bool
	// Steps are the records read: every step's for Status, the page's for
	// StatusPage, in the workflow's order.
	Steps []Record
	// Total is the number of steps of the workflow.
	Total int
	// Offset is the index of Steps[0] among the workflow's steps.
	Offset int
	// Next is the index of the first step not read after Steps, or 0 when
	// Steps reach the last step.
	Next int
}

// pageChunk is how many step records StatusPage reads with one call: the
// most it reads past its byte budget is pageChunk records.
const pageChunk = 16

// Status reads a workflow's state: every step's record, up to MaxSteps of
// driver.MaxValueLen bytes each.
func (e *Engine) Status(ctx context.Context, id string) (Status, error) {
	return e.StatusPage(ctx, id, 0, MaxSteps, 0)
}

// StatusPage reads a page of a workflow's state: the workflow's record,
// its cancel mark, and the records of at most limit steps from the
// offset-th, in the workflow's order. When maxBytes is positive it stops
// once the records read hold maxBytes bytes (at least one record is read),
// so a page reads at most maxBytes plus pageChunk records; Next says where
// the following page starts.
func (e *Engine) StatusPage(ctx context.Context, id string, offset, limit, maxBytes int) (Status, error) {
	b, _, err := e.cfg.Store.Get(ctx, metaKey(id))
	if errors.Is(err, driver.ErrKeyNotFound) {
		return Status{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return Status{}, err
	}
	var m Meta
	if err := decode(metaKey(id), b, &m); err != nil {
		return Status{}, err
	}
	if len(m.Steps) > MaxSteps {
		return Status{}, fmt.Errorf("%w: %s lists %d steps, at most %d", ErrBadRecord, id, len(m.Steps), MaxSteps)
	}
	for _, s := range m.Steps {
		if !ValidName(s) {
			return Status{}, fmt.Errorf("%w: %s lists a bad step name", ErrBadRecord, id)
		}
	}
	c, err := e.Cancelled(ctx, id)
	if err != nil {
		return Status{}, err
	}
	offset = min(max(offset, 0), len(m.Steps))
	end := offset + min(max(limit, 1), len(m.Steps)-offset)
	st := Status{ID: id, Name: m.Name, Created: m.Created, Cancelled: c, Total: len(m.Steps), Offset: offset}
	read, i := 0, offset
	for i < end && (maxBytes <= 0 || read < maxBytes) {
		n := min(end-i, MaxSteps)
		if maxBytes > 0 {
			n = min(n, pageChunk)
		}
		recs, size, err := e.recordsSized(ctx, id, m.Steps[i:i+n])
		if err != nil {
			return Status{}, err
		}
		for _, r := range recs {
			if c && r.State == Waiting {
				r.State = Cancelled
			}
			st.Steps = append(st.Steps, *r)
		}
		read += size
		i += n
	}
	if i < len(m.Steps) {
		st.Next = i
	}
	return st, nil
}
