package conformance

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// runs counts the handler runs of each step, by the step's job type,
// leaving out redeliveries after a crash (a lease that lapsed on a loaded
// machine): those are the platform's at-least-once, while a second run
// with no crash behind it is a step enqueued twice.
type runs struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *runs) addJob(name string, j *ap.Job) {
	if j.Crashes > 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[name]++
}

func (r *runs) of(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[name]
}

// waitWorkflow polls the workflow's status until done says so, and
// returns it.
func (e *env) waitWorkflow(p *ap.Platform, id, what string, done func(ap.WorkflowStatus) bool) ap.WorkflowStatus {
	e.t.Helper()
	var st ap.WorkflowStatus
	e.waitFor(what, func() bool {
		var err error
		st, err = p.WorkflowStatus(ctxT(e.t, e.opts.Wait), id)
		if err != nil {
			e.t.Fatalf("WorkflowStatus: %v", err)
		}
		return done(st)
	})
	return st
}

func stepState(t *testing.T, st ap.WorkflowStatus, name string) ap.StepStatus {
	t.Helper()
	s, ok := st.Step(name)
	if !ok {
		t.Fatalf("the workflow's status has no step %q", name)
	}
	return s
}

// testWorkflowChain: a → b → c on two workers: each step runs once, after
// the one before it, and reads its result.
func testWorkflowChain(t *testing.T, e *env) {
	var r runs
	var order []string
	var mu sync.Mutex
	h := func(ctx context.Context, j *ap.Job) error {
		r.addJob(j.Type, j)
		mu.Lock()
		order = append(order, j.Type)
		mu.Unlock()
		n := 0
		if j.Type != "a" {
			prev := map[string]string{"b": "a", "c": "b"}[j.Type]
			b, err := j.DependencyResult(ctx, prev)
			if err != nil {
				return ap.Permanent(err)
			}
			n, _ = strconv.Atoi(string(b))
		}
		j.SetResult([]byte(strconv.Itoa(n + 1)))
		return nil
	}
	for range 2 {
		e.worker(e.config()).handle(t, "a", h).handle(t, "b", h).handle(t, "c", h).start(t)
	}
	prod := e.producer()
	wf := ap.NewWorkflow("chain").
		Add("a", &ap.Job{Type: "a", Queue: e.queue}).
		Add("b", &ap.Job{Type: "b", Queue: e.queue}, "a").
		Add("c", &ap.Job{Type: "c", Queue: e.queue}, "b")
	if err := prod.EnqueueWorkflow(ctxT(t, e.opts.Wait), wf); err != nil {
		t.Fatalf("EnqueueWorkflow: %v", err)
	}
	st := e.waitWorkflow(prod, wf.ID, "the chain to end", ap.WorkflowStatus.Done)
	e.settle()
	if !st.Succeeded() || string(stepState(t, st, "c").Result) != "3" {
		t.Fatalf("status %+v; want every step succeeded and c's result 3", st)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(order) != "[a b c]" {
		t.Errorf("steps ran in the order %v; want [a b c], once each", order)
	}
}

// testWorkflowDiamond: a → b, c → d on three workers: d runs once, after
// b and c, and reads both results.
func testWorkflowDiamond(t *testing.T, e *env) {
	var r runs
	got := make(chan string, 4)
	h := func(ctx context.Context, j *ap.Job) error {
		r.addJob(j.Type, j)
		if j.Type == "d" {
			b, err1 := j.DependencyResult(ctx, "b")
			c, err2 := j.DependencyResult(ctx, "c")
			if err := errors.Join(err1, err2); err != nil {
				return ap.Permanent(err)
			}
			got <- string(b) + "+" + string(c)
		}
		j.SetResult([]byte(j.Type))
		return nil
	}
	for range 3 {
		w := e.worker(e.config())
		for _, s := range []string{"a", "b", "c", "d"} {
			w.handle(t, s, h)
		}
		w.start(t)
	}
	prod := e.producer()
	wf := ap.NewWorkflow("diamond").
		Add("a", &ap.Job{Type: "a", Queue: e.queue}).
		Add("b", &ap.Job{Type: "b", Queue: e.queue}, "a").
		Add("c", &ap.Job{Type: "c", Queue: e.queue}, "a").
		Add("d", &ap.Job{Type: "d", Queue: e.queue}, "b", "c")
	if err := prod.EnqueueWorkflow(ctxT(t, e.opts.Wait), wf); err != nil {
		t.Fatalf("EnqueueWorkflow: %v", err)
	}
	st := e.waitWorkflow(prod, wf.ID, "the diamond to end", ap.WorkflowStatus.Done)
	e.settle()
	if !st.Succeeded() {
		t.Fatalf("status %+v; want every step succeeded", st)
	}
	if v := <-got; v != "b+c" {
		t.Errorf("d read %q; want b+c", v)
	}
	for _, s := range []string{"a", "b", "c", "d"} {
		if n := r.of(s); n != 1 {
			t.Errorf("step %s ran %d times; want once", s, n)
		}
	}
}

// testWorkflowFanIn: n parents (1,000, fewer when the suite's timings are
// stretched) into one join, on two workers: the join runs once and reads
// every parent's result.
func testWorkflowFanIn(t *testing.T, e *env) {
	n := 1000
	if e.opts.FanIn > 0 && e.opts.FanIn < n {
		if e.opts.FanInWhy == "" {
			t.Fatalf("Options.FanIn is %d without Options.FanInWhy", e.opts.FanIn)
		}
		n = e.opts.FanIn
		t.Logf("%d parents, not 1,000: %s", n, e.opts.FanInWhy)
	}
	if e.scale > 1 {
		n = max(100, int(float64(n)/e.scale))
	}
	var r runs
	var ran sync.Map // parents that ran at least once, crashed before or not
	var joined atomic.Int32
	h := func(ctx context.Context, j *ap.Job) error {
		if j.Type == "join" {
			for i := range n {
				b, err := j.DependencyResult(ctx, "p"+strconv.Itoa(i))
				if err != nil || string(b) != strconv.Itoa(i) {
					return ap.Permanent(fmt.Errorf("parent %d: result %q, %v", i, b, err))
				}
			}
			if j.Crashes == 0 {
				joined.Add(1)
			}
			return nil
		}
		i, _ := strconv.Atoi(string(j.Payload))
		r.addJob("p"+strconv.Itoa(i), j)
		ran.Store(i, true)
		j.SetResult([]byte(strconv.Itoa(i)))
		return nil
	}
	for range 2 {
		cfg := e.config()
		cfg.Queues = map[string]ap.QueueConfig{e.queue: {Concurrency: 16}}
		// A thousand jobs at once on a loaded machine: the suite's short
		// lease would lapse on jobs claimed ahead, and crashes are not
		// what this case is about.
		cfg.Lease = 10 * e.lease
		e.worker(cfg).handle(t, "parent", h).handle(t, "join", h).start(t)
	}
	prod := e.producer()
	wf := ap.NewWorkflow("fan-in")
	deps := make([]string, n)
	for i := range n {
		deps[i] = "p" + strconv.Itoa(i)
		wf.Add(deps[i], &ap.Job{Type: "parent", Queue: e.queue, Payload: []byte(strconv.Itoa(i))})
	}
	wf.Add("join", &ap.Job{Type: "join", Queue: e.queue}, deps...)
	if err := prod.EnqueueWorkflow(ctxT(t, e.opts.Wait), wf); err != nil {
		t.Fatalf("EnqueueWorkflow: %v", err)
	}
	deadline := time.Now().Add(e.opts.Wait + e.scaled(time.Duration(n)*50*time.Millisecond))
	for joined.Load() == 0 {
		if time.Now().After(deadline) {
			st, err := prod.WorkflowStatus(ctxT(t, e.opts.Wait), wf.ID)
			states := map[string]int{}
			for _, s := range st.Steps {
				states[s.State]++
			}
			ranN := 0
			ran.Range(func(any, any) bool { ranN++; return true })
			join := "unknown"
			if len(st.Steps) > 0 {
				join = st.Steps[len(st.Steps)-1].State
			}
			t.Fatalf("timed out waiting for the join of %d parents: %d parents ran, steps by state %v (%v), join %s%s\n%s",
				n, ranN, states, err, join, e.stallNote(), e.rec)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.settle()
	if got := joined.Load(); got != 1 {
		t.Errorf("the join ran %d times; want once", got)
	}
	// A parent's run after a crash (a lease that lapsed before its handler
	// started, on a loaded machine) is its only run, so runs are counted
	// per parent: each ran, none twice without a crash between.
	distinct := 0
	ran.Range(func(any, any) bool { distinct++; return true })
	if distinct != n {
		t.Errorf("%d parents ran; want %d", distinct, n)
	}
	for i := range n {
		if got := r.of("p" + strconv.Itoa(i)); got > 1 {
			t.Errorf("parent %d ran %d times without a crash before; want once", i, got)
		}
	}
}

// testWorkflowDependencyFailed: a is dead-lettered (Permanent); b
// (FailOnDependency) is dead-lettered dependency_failed without running,
// c (RunOnDependency) runs, d (SkipOnDependency) is skipped. Then a's
// dead letter is redriven, a succeeds, and b comes back and runs: the
// workflow completes.
func testWorkflowDependencyFailed(t *testing.T, e *env) {
	var r runs
	var fixed atomic.Bool
	h := func(ctx context.Context, j *ap.Job) error {
		r.addJob(j.Type, j)
		if j.Type == "a" && !fixed.Load() {
			return ap.Permanent(errors.New("a is broken"))
		}
		j.SetResult([]byte(j.Type))
		return nil
	}
	w := e.worker(e.config())
	for _, s := range []string{"a", "b", "c", "d"} {
		w.handle(t, s, h)
	}
	w.start(t)
	wf := ap.NewWorkflow("failing").
		Add("a", &ap.Job{Type: "a", Queue: e.queue}).
		Add("b", &ap.Job{Type: "b", Queue: e.queue}, "a").
		AddStep(ap.Step{Name: "c", Job: &ap.Job{Type: "c", Queue: e.queue}, DependsOn: []string{"a"}, OnDependencyFailed: ap.RunOnDependency}).
		AddStep(ap.Step{Name: "d", Job: &ap.Job{Type: "d", Queue: e.queue}, DependsOn: []string{"a"}, OnDependencyFailed: ap.SkipOnDependency})
	if err := w.P.EnqueueWorkflow(ctxT(t, e.opts.Wait), wf); err != nil {
		t.Fatalf("EnqueueWorkflow: %v", err)
	}
	st := e.waitWorkflow(w.P, wf.ID, "a's dependents to end", ap.WorkflowStatus.Done)
	a, b, c, d := stepState(t, st, "a"), stepState(t, st, "b"), stepState(t, st, "c"), stepState(t, st, "d")
	if a.State != "failed" || a.Reason != ap.ReasonPermanent || b.State != "failed" || b.Reason != ap.ReasonDependencyFailed ||
		c.State != "succeeded" || d.State != "skipped" {
		t.Fatalf("a %s/%s, b %s/%s, c %s, d %s; want a failed permanent, b failed dependency_failed, c succeeded, d skipped",
			a.State, a.Reason, b.State, b.Reason, c.State, d.State)
	}
	if r.of("b") != 0 || r.of("d") != 0 {
		t.Errorf("b ran %d times, d %d; want neither run", r.of("b"), r.of("d"))
	}
	var aDead string
	for _, dl := range e.dead(w.P) {
		if dl.Reason == ap.ReasonPermanent {
			aDead = dl.ID
		}
	}
	if aDead == "" {
		t.Fatal("no dead letter of a")
	}
	fixed.Store(true)
	if n, err := w.P.Redrive(ctxT(t, e.opts.Wait), e.queue, aDead); err != nil || n != 1 {
		t.Fatalf("Redrive(a): %d, %v", n, err)
	}
	st = e.waitWorkflow(w.P, wf.ID, "the workflow to complete after a's redrive", ap.WorkflowStatus.Succeeded)
	e.settle()
	if r.of("b") != 1 || r.of("c") != 1 || r.of("d") != 0 {
		t.Errorf("after the redrive b ran %d times, c %d, d %d; want 1, 1, 0", r.of("b"), r.of("c"), r.of("d"))
	}
	// b's job may run and end before its enqueuer records attempt 1 (a
	// broker that delivers at once): the record keeps the end and takes
	// the attempt when the enqueuer writes it, so the attempt is waited
	// for; one never recorded, or another, fails the wait.
	if b := stepState(t, st, "b"); b.Attempt != 1 {
		e.waitWorkflow(w.P, wf.ID, "b's attempt 1 (enqueued again after a's redrive) to be recorded", func(s ap.WorkflowStatus) bool {
			b, ok := s.Step("b")
			return ok && b.Attempt == 1
		})
	}
}

// testWorkflowCancel: a runs and blocks; CancelWorkflow ends its
// handler's context with ErrJobCancelled, a is dead-lettered cancelled,
// and b, waiting on a, never runs.
func testWorkflowCancel(t *testing.T, e *env) {
	started := make(chan struct{}, 1)
	var r runs
	h := func(ctx context.Context, j *ap.Job) error {
		r.addJob(j.Type, j)
		if j.Type == "a" {
			started <- struct{}{}
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), ap.ErrJobCancelled) {
				return ap.Permanent(fmt.Errorf("cause %v, want ErrJobCancelled", context.Cause(ctx)))
			}
			return ctx.Err()
		}
		return nil
	}
	cfg := e.config()
	// Leases are not what this case is about. A lapse on a loaded machine
	// sends a back while it runs; its next delivery, the workflow
	// cancelled by then, is a step not yet running, acknowledged unrun
	// (no dead letter for the case to see): the lease is long enough that
	// a loaded machine's stalls stay inside it.
	cfg.Lease = 4 * e.lease
	w := e.worker(cfg).handle(t, "a", h, ap.Policy{Timeout: time.Minute}).handle(t, "b", h).start(t)
	wf := ap.NewWorkflow("cancel").
		Add("a", &ap.Job{Type: "a", Queue: e.queue}).
		Add("b", &ap.Job{Type: "b", Queue: e.queue}, "a")
	if err := w.P.EnqueueWorkflow(ctxT(t, e.opts.Wait), wf); err != nil {
		t.Fatalf("EnqueueWorkflow: %v", err)
	}
	select {
	case <-started:
	case <-time.After(e.opts.Wait):
		t.Fatal("a never started")
	}
	if err := e.producer().CancelWorkflow(ctxT(t, e.opts.Wait), wf.ID); err != nil {
		t.Fatalf("CancelWorkflow: %v", err)
	}
	dl := e.waitDead(w.P, 1)[0]
	st := e.waitWorkflow(w.P, wf.ID, "the workflow to end", ap.WorkflowStatus.Done)
	e.settle()
	if dl.Reason != ap.ReasonCancelled || !st.Cancelled || stepState(t, st, "b").State != "cancelled" || r.of("b") != 0 {
		t.Errorf("a's dead letter %q, workflow cancelled %v, b %s and ran %d times; want cancelled, true, cancelled, 0",
			dl.Reason, st.Cancelled, stepState(t, st, "b").State, r.of("b"))
	}
}

// testWorkflowBatchOnSuccess: 20 jobs, a third of them failing once
// before they succeed, on two workers: the OnSuccess callback runs once,
// after all of them.
func testWorkflowBatchOnSuccess(t *testing.T, e *env) {
	const n = 20
	var r runs
	var failed sync.Map
	var done atomic.Int32
	var succeeded sync.Map
	h := func(ctx context.Context, j *ap.Job) error {
		if j.Type == "cb" {
			r.addJob("cb", j)
			if got := done.Load(); got != n {
				return ap.Permanent(fmt.Errorf("callback after %d of %d jobs", got, n))
			}
			return nil
		}
		i, _ := strconv.Atoi(string(j.Payload))
		if _, again := failed.LoadOrStore(i, true); !again && i%3 == 0 {
			return errors.New("first try fails")
		}
		if _, again := succeeded.LoadOrStore(i, true); !again {
			done.Add(1)
		}
		return nil
	}
	for range 2 {
		e.worker(e.config()).handle(t, "item", h).handle(t, "cb", h).start(t)
	}
	jobs := make([]*ap.Job, n)
	for i := range jobs {
		jobs[i] = &ap.Job{Type: "item", Queue: e.queue, Payload: []byte(strconv.Itoa(i))}
	}
	prod := e.producer()
	id, err := prod.EnqueueBatchWithCallback(ctxT(t, e.opts.Wait), jobs, ap.Callback{OnSuccess: &ap.Job{Type: "cb", Queue: e.queue}})
	if err != nil {
		t.Fatalf("EnqueueBatchWithCallback: %v", err)
	}
	st := e.waitWorkflow(prod, id, "the batch and its callback", ap.WorkflowStatus.Done)
	e.settle()
	if !st.Succeeded() || r.of("cb") != 1 {
		t.Errorf("batch succeeded %v, callback ran %d times; want true and once", st.Succeeded(), r.of("cb"))
	}
}
