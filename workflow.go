package asyncplatform

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/wire"
	"github.com/asyncplatform/asyncplatform/internal/workflow"
)

// ReasonDependencyFailed: a step of a workflow whose dependency was
// dead-lettered for good, with the step's policy FailOnDependency (the
// default). Redriving the dependency brings the step back once the
// dependency succeeds.
const ReasonDependencyFailed Reason = workflow.ReasonDependencyFailed

// WorkflowHeader is the header a workflow step's job carries: the
// workflow's ID, the step's name and its attempt, separated by '/'.
const WorkflowHeader = "asyncplatform-workflow"

// MaxWorkflowSteps is the most steps of one workflow (or jobs of one
// batch with a callback).
const MaxWorkflowSteps = workflow.MaxSteps

// ErrInvalidWorkflow is matched by the error of EnqueueWorkflow for a
// definition it refuses: no steps, too many, a bad or duplicate name, an
// unknown dependency, a cycle (a *WorkflowError names the step and the
// problem).
var ErrInvalidWorkflow = workflow.ErrInvalid

// DefaultWorkflowRetention is how long a workflow's records are kept after
// each one's last write, by default (Config.WorkflowRetention).
const DefaultWorkflowRetention = 30 * 24 * time.Hour

// ErrWorkflowNotFound is returned for a workflow with no record (never
// enqueued, or past its retention).
var ErrWorkflowNotFound = workflow.ErrNotFound

// WorkflowError names what is wrong with a workflow's definition.
type WorkflowError = workflow.Error

// DependencyPolicy says what a step does when one of its dependencies is
// dead-lettered for good.
type DependencyPolicy int

// The dependency policies.
const (
	// FailOnDependency dead-letters the step with ReasonDependencyFailed
	// without running it (the default).
	FailOnDependency DependencyPolicy = DependencyPolicy(workflow.Fail)
	// RunOnDependency runs the step anyway, once every dependency has
	// ended; DependencyResult of a failed one is nil.
	RunOnDependency DependencyPolicy = DependencyPolicy(workflow.Run)
	// SkipOnDependency does not run the step: it is recorded skipped, and
	// its own dependents see it as succeeded with no result.
	SkipOnDependency DependencyPolicy = DependencyPolicy(workflow.Skip)
)

// Step is one step of a Workflow: an ordinary job, run once every step it
// depends on has succeeded.
type Step struct {
	// Name names the step in its workflow: 1 to 64 bytes of
	// [A-Za-z0-9._-]. Required.
	Name string
	// Job is the step's job: its Type, Queue, Payload, Headers, Policy,
	// Priority and Group are used; its ID is the platform's (the
	// workflow's ID, the step's name and its attempt). Unique keys,
	// NotBefore and Deadline are refused. Required.
	Job *Job
	// DependsOn names the steps that must end before this one runs.
	// Defaults to none: the step runs at once.
	DependsOn []string
	// OnDependencyFailed says what the step does when a dependency is
	// dead-lettered for good. Defaults to FailOnDependency.
	OnDependencyFailed DependencyPolicy
}

// Workflow is a set of steps with dependencies (a directed acyclic graph),
// enqueued together by Platform.EnqueueWorkflow. See docs/contract.md,
// "Workflows", for the rules.
type Workflow struct {
	// ID is set by EnqueueWorkflow: 128 random bits in hex, so that no one
	// who has not seen it can name the workflow's steps.
	ID string
	// Name is a label for people (shown by WorkflowStatus). Defaults to
	// none.
	Name  string
	steps []Step
}

// NewWorkflow returns an empty workflow labelled name.
func NewWorkflow(name string) *Workflow { return &Workflow{Name: name} }

// Add adds a step named name running job once the steps deps have
// succeeded, and returns w. Mistakes (a duplicate name, an unknown
// dependency, a cycle) are reported by EnqueueWorkflow.
func (w *Workflow) Add(name string, job *Job, deps ...string) *Workflow {
	return w.AddStep(Step{Name: name, Job: job, DependsOn: deps})
}

// AddStep adds a step and returns w.
func (w *Workflow) AddStep(s Step) *Workflow {
	w.steps = append(w.steps, s)
	return w
}

// stepJob is a step's job as kept in its record.
type stepJob struct {
	Type     string            `json:"type"`
	Queue    string            `json:"queue,omitempty"`
	Payload  []byte            `json:"payload,omitempty"`
	Headers  map[string]string `json:"headers,omitempty"`
	Policy   Policy            `json:"policy"`
	Priority int               `json:"priority,omitempty"`
	Group    string            `json:"group,omitempty"`
}

// workflows returns the workflow engine over the backend's store.
func (p *Platform) workflows() (*workflow.Engine, error) {
	if p == nil || p.backend == nil {
		return nil, ErrNotNew
	}
	d, err := driver.StoreOf(p.backend)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: workflows: %w", err)
	}
	return workflow.New(workflow.Config{Store: kv.Of(d, kv.Workflows), Enqueue: p.enqueueSteps, TTL: p.cfg.WorkflowRetention, Log: p.log}), nil
}

// EnqueueWorkflow validates w, stores it, sets w.ID and enqueues the steps
// that depend on nothing; the others are enqueued by the workers as their
// dependencies end. It needs the backend's store (an error matching
// ErrNoStore otherwise). A definition it refuses gives an error matching
// ErrInvalidWorkflow (a *WorkflowError) or ErrInvalidJob.
//
// Any other error leaves w.ID set to the new workflow's ID: its records
// may be stored and some of its first steps enqueued, so the workflow may
// run. Cancel it with CancelWorkflow(ctx, w.ID) before enqueueing w again,
// or read its state with WorkflowStatus; an ID whose records were never
// stored gives ErrWorkflowNotFound to both.
func (p *Platform) EnqueueWorkflow(ctx context.Context, w *Workflow) error {
	eng, err := p.workflows()
	if err != nil {
		return err
	}
	if w == nil {
		return &WorkflowError{Problem: "no steps", Detail: "the workflow is nil"}
	}
	specs := make([]workflow.Spec, len(w.steps))
	now := time.Now()
	for i, s := range w.steps {
		if s.Job == nil {
			return &WorkflowError{Step: s.Name, Problem: "no job"}
		}
		if s.Job.UniqueKey != "" || !s.Job.NotBefore.IsZero() || !s.Job.Deadline.IsZero() {
			return fmt.Errorf("%w: workflow step %q: UniqueKey, NotBefore and Deadline are not supported on a step", ErrInvalidJob, s.Name)
		}
		check := *s.Job
		check.ID = "x"
		if err := p.cfg.prepare(&check, now); err != nil {
			return fmt.Errorf("workflow step %q: %w", s.Name, err)
		}
		b, err := json.Marshal(stepJob{Type: s.Job.Type, Queue: s.Job.Queue, Payload: s.Job.Payload, Headers: s.Job.Headers,
			Policy: s.Job.Policy, Priority: s.Job.Priority, Group: s.Job.Group})
		if err != nil {
			return fmt.Errorf("asyncplatform: encoding workflow step %q: %w", s.Name, err)
		}
		specs[i] = workflow.Spec{Name: s.Name, Deps: s.DependsOn, OnFailed: workflow.OnFailed(s.OnDependencyFailed), Job: b}
	}
	if err := workflow.Validate(specs); err != nil {
		return err
	}
	w.ID = workflow.NewID()
	if err := eng.Create(ctx, w.ID, w.Name, specs); err != nil {
		return fmt.Errorf("asyncplatform: EnqueueWorkflow: %w", err)
	}
	return nil
}

// stepID is the job ID of a step's attempt.
func stepID(id, step string, attempt int) string {
	return id + "." + step + "." + strconv.Itoa(attempt)
}

// enqueueSteps enqueues the jobs of ready steps. Each job's ID and
// enqueue nonce derive from the workflow, the step and the attempt, so
// that a second enqueue of the same step (a redelivered parent) is the
// same message: a backend that deduplicates drops it, and a worker that
// takes it finds the step succeeded and does not run it again.
func (p *Platform) enqueueSteps(ctx context.Context, ready []workflow.Ready) error {
	jobs := make([]*Job, 0, len(ready))
	for _, r := range ready {
		var sj stepJob
		if err := json.Unmarshal(r.Job, &sj); err != nil {
			return fmt.Errorf("%w: step %s of workflow %s: %v", workflow.ErrBadRecord, r.Step, r.Workflow, err)
		}
		h := make(map[string]string, len(sj.Headers)+1)
		for k, v := range sj.Headers {
			h[k] = v
		}
		ref := r.Workflow + "/" + r.Step + "/" + strconv.Itoa(r.Attempt)
		h[WorkflowHeader] = ref
		sum := sha256.Sum256([]byte("asyncplatform workflow step\x00" + ref))
		jobs = append(jobs, &Job{
			ID: stepID(r.Workflow, r.Step, r.Attempt), Type: sj.Type, Queue: sj.Queue, Payload: sj.Payload, Headers: h,
			Policy: sj.Policy, Priority: sj.Priority, Group: sj.Group,
			statusNonce: base64.RawURLEncoding.EncodeToString(sum[:16]),
		})
	}
	for start := 0; start < len(jobs); start += driver.MaxBatch {
		if err := p.enqueue(ctx, jobs[start:min(start+driver.MaxBatch, len(jobs))]); err != nil {
			return err
		}
	}
	return nil
}

// parseStep reads a step's header: a workflow ID, a step name, an attempt.
func parseStep(v string) (id, step string, attempt int, ok bool) {
	id, rest, ok1 := strings.Cut(v, "/")
	step, n, ok2 := strings.Cut(rest, "/")
	if !ok1 || !ok2 || !workflow.ValidID(id) || !workflow.ValidName(step) || len(n) > 9 {
		return "", "", 0, false
	}
	a, err := strconv.Atoi(n)
	if err != nil || a < 0 {
		return "", "", 0, false
	}
	return id, step, a, true
}

// stepResult is the outcome of a step that is not its handler's: what
// classify turns into a dead letter of its own reason.
type stepResult struct {
	result decide.Result
	text   string
}

func (e *stepResult) Error() string { return e.text }

// classifyStep turns a step's own outcome into the decision's input.
func classifyStep(err error) (decide.Result, bool) {
	var s *stepResult
	if errors.As(err, &s) {
		return s.result, true
	}
	return 0, false
}

// DependencyResult returns the result (Job.SetResult) of the step named
// step, a dependency of the workflow step j being handled: nil for a
// dependency that set none, was skipped or failed (RunOnDependency). It
// is an error to ask outside a step's handler or for a step that is not
// a dependency.
func (j *Job) DependencyResult(ctx context.Context, step string) ([]byte, error) {
	m, ok := workflow.ResultsFrom(ctx)
	if !ok {
		return nil, fmt.Errorf("asyncplatform: DependencyResult(%q): job %s is not a workflow step being handled", step, j.ID)
	}
	r, ok := m[step]
	if !ok {
		return nil, fmt.Errorf("asyncplatform: DependencyResult(%q): not a dependency of step %s", step, j.Headers[WorkflowHeader])
	}
	return r, nil
}

// workflowDeadTimeout bounds recording a dead-lettered step as failed and
// enqueueing its dependents (several store round trips): the job's own
// lease is too short for that on a loaded machine, and a step whose
// failure is not recorded leaves its dependents waiting until it is
// redriven.
const workflowDeadTimeout = 30 * time.Second

// workflowCancelPoll is how often a running step's workflow is checked
// for a cancel.
const workflowCancelPoll = time.Second

// stepHandler wraps h with the workflow's rules for a job that carries
// WorkflowHeader; other jobs go to h untouched. Before h: a step that
// succeeded already advances again without running, a cancelled
// workflow's step is recorded cancelled without running, a step whose
// dependency failed is skipped or dead-lettered as its policy says. After
// h returns nil, and before the job's ack, the step is recorded succeeded
// with its result and its ready dependents are enqueued.
func (p *Platform) stepHandler(h Handler) Handler {
	return func(ctx context.Context, j *Job) error {
		v, ok := j.Headers[WorkflowHeader]
		if !ok {
			return h(ctx, j)
		}
		id, step, attempt, ok := parseStep(v)
		if !ok {
			return Invalid(fmt.Errorf("bad %s header", WorkflowHeader))
		}
		eng, err := p.workflows()
		if err != nil {
			return err
		}
		st, err := eng.Begin(ctx, id, step, attempt)
		switch {
		case errors.Is(err, workflow.ErrNotFound), errors.Is(err, workflow.ErrBadRecord):
			return Invalid(err)
		case err != nil:
			return err
		}
		switch st.Action {
		case workflow.Done, workflow.SkipIt:
			return eng.Advance(ctx, id, step)
		case workflow.CancelIt, workflow.Stale:
			return nil
		case workflow.FailIt:
			return &stepResult{result: decide.DependencyFailed, text: fmt.Sprintf("dependency %q failed", st.Failed)}
		}
		hctx, cancel := context.WithCancelCause(workflow.WithResults(ctx, st.Results))
		defer cancel(nil)
		done := make(chan struct{})
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			t := time.NewTicker(workflowCancelPoll)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
					if c, err := eng.Cancelled(hctx, id); err == nil && c {
						cancel(ErrJobCancelled)
						return
					}
				}
			}
		}()
		err = h(hctx, j)
		close(done)
		<-watched
		if err != nil {
			if errors.Is(context.Cause(hctx), ErrJobCancelled) {
				return &stepResult{result: decide.CancelledRun, text: "workflow cancelled: " + err.Error()}
			}
			return err
		}
		if err := eng.Succeed(ctx, id, step, j.Result()); err != nil {
			err = fmt.Errorf("recording workflow step %s: %w", step, err)
			if errors.Is(err, workflow.ErrTooLarge) {
				return Permanent(err) // a retry would run the handler again, to the same end
			}
			return err
		}
		return nil
	}
}

// workflowDead records a step dead-lettered for good as failed and
// advances its workflow (its dependents fail, run or are skipped as
// their policies say). A record of no step is left alone.
func (p *Platform) workflowDead(rec *wire.Dead) {
	if rec == nil || rec.Raw != nil {
		return
	}
	id, step, attempt, ok := parseStep(rec.Job.Headers[WorkflowHeader])
	if !ok {
		return
	}
	eng, err := p.workflows()
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(p.cfg.Lease, workflowDeadTimeout))
	defer cancel()
	if err := eng.FailAttempt(ctx, id, step, attempt, rec.Reason); err != nil {
		p.log.Warn("asyncplatform: recording a dead-lettered workflow step failed; redrive it to resume the workflow",
			"workflow", id, "step", step, "error", err)
	}
}

// StepStatus is one step's state in WorkflowStatus.
type StepStatus struct {
	Name      string
	DependsOn []string
	// State is "waiting", "enqueued", "succeeded", "failed", "skipped" or
	// "cancelled".
	State string
	// Reason is the dead-letter reason of a failed step.
	Reason Reason
	// Attempt counts the times the step was enqueued again after a
	// dependency was redriven.
	Attempt int
	// JobID is the ID of the step's job (of its latest attempt).
	JobID  string
	Result []byte
}

// WorkflowStatus is a workflow's state.
type WorkflowStatus struct {
	ID, Name  string
	Created   time.Time
	Cancelled bool
	Steps     []StepStatus
}

// Done says whether every step has ended (succeeded, failed, skipped or
// cancelled).
func (s WorkflowStatus) Done() bool {
	for _, st := range s.Steps {
		if st.State == workflow.Waiting || st.State == workflow.Enqueued {
			return false
		}
	}
	return true
}

// Succeeded says whether every step succeeded or was skipped.
func (s WorkflowStatus) Succeeded() bool {
	for _, st := range s.Steps {
		if st.State != workflow.Succeeded && st.State != workflow.Skipped {
			return false
		}
	}
	return true
}

// Step returns the state of the step named name.
func (s WorkflowStatus) Step(name string) (StepStatus, bool) {
	for _, st := range s.Steps {
		if st.Name == name {
			return st, true
		}
	}
	return StepStatus{}, false
}

// WorkflowStatus reads a workflow's state from the store: each step's
// state, reason and result. It reads every step's record (up to
// MaxWorkflowSteps of 64 KiB each); WorkflowStatusPage reads a bounded
// page. A workflow with no record gives an error
// matching ErrWorkflowNotFound.
func (p *Platform) WorkflowStatus(ctx context.Context, id string) (WorkflowStatus, error) {
	eng, err := p.workflows()
	if err != nil {
		return WorkflowStatus{}, err
	}
	if !workflow.ValidID(id) {
		return WorkflowStatus{}, fmt.Errorf("%w: %q is not a workflow ID", ErrWorkflowNotFound, id)
	}
	st, err := eng.Status(ctx, id)
	if err != nil {
		return WorkflowStatus{}, fmt.Errorf("asyncplatform: WorkflowStatus: %w", err)
	}
	return WorkflowStatus{ID: st.ID, Name: st.Name, Created: st.Created, Cancelled: st.Cancelled, Steps: stepStatuses(id, st.Steps)}, nil
}

// Bounds of a page of WorkflowStatusPage.
const (
	// MaxWorkflowPageSteps is the most steps of one page.
	MaxWorkflowPageSteps = 100
	// MaxWorkflowPageBytes bounds the step records one page reads: it
	// stops at the record that reaches it, so a page reads at most this
	// plus 16 records of the store's value limit (1 MiB).
	MaxWorkflowPageBytes = 4 << 20
)

// WorkflowPage is a page of a workflow's steps, read by
// WorkflowStatusPage. It tells nothing of the steps outside the page:
// whether the whole workflow is done is WorkflowStatus's to say.
type WorkflowPage struct {
	ID, Name  string
	Created   time.Time
	Cancelled bool
	// Steps are the page's steps, in the workflow's order.
	Steps []StepStatus
	// Total is the number of steps of the workflow.
	Total int
	// Offset is the index of Steps[0] among the workflow's steps.
	Offset int
	// Next is the offset of the next page, or 0 after the last step.
	Next int
}

// Whole says whether the page holds every step of the workflow.
func (pg WorkflowPage) Whole() bool { return pg.Offset == 0 && pg.Next == 0 }

// WorkflowStatusPage reads a page of a workflow's state: its record and
// the records of at most limit steps (at most MaxWorkflowPageSteps; zero
// or less: that many) from the offset-th, in the workflow's order,
// stopping once the records read reach MaxWorkflowPageBytes; Next is the
// offset of the following page. A step's record holds its job and its
// result, up to 64 KiB, so reading every step of a large workflow
// (WorkflowStatus) reads up to MaxWorkflowSteps times that: operator
// pages read pages. A workflow with no record gives an error matching
// ErrWorkflowNotFound.
func (p *Platform) WorkflowStatusPage(ctx context.Context, id string, offset, limit int) (WorkflowPage, error) {
	eng, err := p.workflows()
	if err != nil {
		return WorkflowPage{}, err
	}
	if !workflow.ValidID(id) {
		return WorkflowPage{}, fmt.Errorf("%w: %q is not a workflow ID", ErrWorkflowNotFound, id)
	}
	if limit <= 0 || limit > MaxWorkflowPageSteps {
		limit = MaxWorkflowPageSteps
	}
	st, err := eng.StatusPage(ctx, id, offset, limit, MaxWorkflowPageBytes)
	if err != nil {
		return WorkflowPage{}, fmt.Errorf("asyncplatform: WorkflowStatusPage: %w", err)
	}
	return WorkflowPage{ID: st.ID, Name: st.Name, Created: st.Created, Cancelled: st.Cancelled, Steps: stepStatuses(id, st.Steps),
		Total: st.Total, Offset: st.Offset, Next: st.Next}, nil
}

func stepStatuses(id string, recs []workflow.Record) []StepStatus {
	out := make([]StepStatus, len(recs))
	for i, r := range recs {
		out[i] = StepStatus{Name: r.Name, DependsOn: r.Deps, State: r.State, Reason: Reason(r.Reason), Attempt: r.Attempt,
			JobID: stepID(id, r.Name, r.Attempt), Result: r.Result}
	}
	return out
}

// CancelWorkflow cancels a workflow, from any process: its steps not yet
// running never run (they are recorded cancelled), and the handlers of
// its running steps have their context cancelled within about a second,
// with context.Cause ErrJobCancelled; a step whose handler then returns
// an error is dead-lettered with ReasonCancelled, not retried. Cancelling
// twice is not an error.
func (p *Platform) CancelWorkflow(ctx context.Context, id string) error {
	eng, err := p.workflows()
	if err != nil {
		return err
	}
	if !workflow.ValidID(id) {
		return fmt.Errorf("%w: %q is not a workflow ID", ErrWorkflowNotFound, id)
	}
	if err := eng.Cancel(ctx, id); err != nil {
		return fmt.Errorf("asyncplatform: CancelWorkflow: %w", err)
	}
	return nil
}

// Callback is the job a batch enqueues when its jobs have ended: exactly
// one of OnSuccess (when every job succeeded) and OnComplete (when every
// job has ended, succeeded or dead-lettered) is set.
type Callback struct {
	OnSuccess  *Job
	OnComplete *Job
}

// CallbackStep is the name of a batch's callback step in its workflow;
// the batch's jobs are steps "job-0", "job-1", ...
const CallbackStep = "callback"

// EnqueueBatchWithCallback enqueues jobs as a batch with a callback, and
// returns the batch's ID (a workflow's: WorkflowStatus and CancelWorkflow
// take it). A batch is a workflow: each job is a step depending on
// nothing, and the callback a step depending on all of them, with policy
// FailOnDependency for OnSuccess (a job dead-lettered dead-letters the
// callback with ReasonDependencyFailed; redriving the job brings it back)
// and RunOnDependency for OnComplete. The callback is enqueued once.
func (p *Platform) EnqueueBatchWithCallback(ctx context.Context, jobs []*Job, cb Callback) (string, error) {
	if (cb.OnSuccess == nil) == (cb.OnComplete == nil) {
		return "", fmt.Errorf("%w: a Callback sets exactly one of OnSuccess and OnComplete", ErrInvalidJob)
	}
	w := NewWorkflow("batch")
	deps := make([]string, len(jobs))
	for i, j := range jobs {
		deps[i] = "job-" + strconv.Itoa(i)
		w.Add(deps[i], j)
	}
	s := Step{Name: CallbackStep, Job: cb.OnSuccess, DependsOn: deps}
	if cb.OnComplete != nil {
		s.Job, s.OnDependencyFailed = cb.OnComplete, RunOnDependency
	}
	w.AddStep(s)
	if err := p.EnqueueWorkflow(ctx, w); err != nil {
		return "", err
	}
	return w.ID, nil
}
