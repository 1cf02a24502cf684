package faults

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// stepJobID is the job ID of a workflow step's first attempt (the
// platform's: the workflow's ID, the step's name, the attempt).
func stepJobID(id, step string) string { return id + "." + step + ".0" }

// stepJob returns a job of the run's queue doing p, for a workflow step
// (its ID is the platform's).
func (r *run) stepJob(p Plan) *ap.Job {
	j := newJob("", p)
	j.Queue = r.queue
	return j
}

// enqueueWorkflow enqueues w on the admin platform and records an
// acknowledged enqueue of every step's first attempt: the roots are
// enqueued by EnqueueWorkflow, the others by the workers as their
// dependencies end, and each must complete. A backend without a store
// skips the scenario.
func (r *run) enqueueWorkflow(w *ap.Workflow, steps []string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	from := time.Now()
	err := r.ad().EnqueueWorkflow(ctx, w)
	if errors.Is(err, ap.ErrNoStore) {
		r.t.Skipf("workflows need the backend's store: %v", err)
	}
	if err != nil {
		r.t.Fatalf("EnqueueWorkflow: %v", err)
	}
	for _, s := range steps {
		r.log.Add(Event{Kind: KindEnqueue, ID: stepJobID(w.ID, s), From: from})
	}
}

// workflowDone reports whether every workflow named has ended, per its
// status.
func (r *run) workflowsDone(ids ...string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, id := range ids {
		st, err := r.ad().WorkflowStatus(ctx, id)
		if err != nil || !st.Done() {
			return false
		}
	}
	return true
}

// checkWorkflow fails rep when a workflow did not succeed.
func (r *run) checkWorkflow(rep *Report, id string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := r.ad().WorkflowStatus(ctx, id)
	if err != nil {
		r.t.Errorf("WorkflowStatus(%s): %v", id, err)
		return
	}
	if !st.Succeeded() {
		var b strings.Builder
		for _, s := range st.Steps {
			fmt.Fprintf(&b, " %s=%s", s.Name, s.State)
			if s.Reason != "" {
				fmt.Fprintf(&b, "(%s)", s.Reason)
			}
		}
		rep.Wrong(id, "workflow did not succeed:%s", b.String())
	}
}

// runsOnce fails rep when job id (a join or a callback) completed other
// than once, or was started on its first delivery more than once (see
// History.runsOnce), and logs its figures.
func (r *run) runsOnce(rep *Report, id string, killed map[string]bool, parents ...string) {
	r.t.Helper()
	h := r.history()
	for _, w := range h.runsOnce(id, killed, parents) {
		rep.Wrong(id, "%s", w)
	}
	oks, fresh, _ := h.ranOnce(id)
	r.t.Logf("job %s: completed %d times, %d first-delivery starts, %d leases lost by its parents: %s",
		id, oks, fresh, h.parentsLost(parents), h.of(id).brief())
}

// ranOnce counts job id's completions and its starts on a first delivery
// (no failure, no crash counted).
func (h History) ranOnce(id string) (oks, fresh, lost int) {
	for _, e := range h.of(id) {
		switch {
		case e.Kind == KindStart && e.Crashes == 0 && e.Failures == 0:
			fresh++
		case e.Kind == KindEnd && e.Result == ResultOK:
			oks++
		case e.Kind == KindAck && e.Result == string(ap.OutcomeLeaseLost):
			lost++
		}
	}
	return oks, fresh, lost
}

// parentsLost counts the leases lost by attempts of parents (job IDs)
// whose handler returned nil: only such an attempt can have enqueued the
// step before its lease was lost. One cancelled by the loss (or failed)
// enqueued nothing.
func (h History) parentsLost(parents []string) int {
	type attempt struct {
		id, worker string
		copy       uint64
		try        int
	}
	isParent := map[string]bool{}
	for _, p := range parents {
		isParent[p] = true
	}
	ok := map[attempt]bool{}
	n := 0
	for _, e := range h {
		if !isParent[e.ID] {
			continue
		}
		a := attempt{e.ID, e.Worker, e.Copy, e.Try}
		switch {
		case e.Kind == KindEnd:
			ok[a] = e.Result == ResultOK
		case e.Kind == KindAck && e.Result == string(ap.OutcomeLeaseLost) && ok[a]:
			n++
		}
	}
	return n
}

// runsOnce returns what is wrong with job id, a join or a callback: it
// completed other than once, or was started on its first delivery more
// than once (the step was then enqueued twice, or run again after it
// succeeded). A second completion is excused where its worker died
// between the commit and the report of the first (killed lists the
// workers the scenario killed), as is a second start whose attempt
// reported its lease lost. With killed nil, no kill excuses a second
// completion.
//
// Each lease lost by an attempt of one of parents (the job IDs of the
// step's dependencies) whose handler returned nil excuses one more start
// and completion (see parentsLost): the parent
// was delivered again while its first delivery still ran, and a
// redelivered parent that holds the step's claim enqueues the step again
// (docs/contract.md section 16 rule 4: it cannot know whether its first
// delivery's enqueue happened), so two copies of the step can be in the
// queue before either has succeeded, and both run.
func (h History) runsOnce(id string, killed map[string]bool, parents []string) []string {
	j := h.of(id)
	oks, fresh, lost := h.ranOnce(id)
	lost += h.parentsLost(parents)
	unreported := map[string]int{}
	for _, e := range j {
		switch {
		case e.Kind == KindEnd && e.Result == ResultOK:
			unreported[e.Worker]++
		case e.Kind == KindAck && unreported[e.Worker] > 0:
			unreported[e.Worker]--
		}
	}
	excused := 0
	for w, n := range unreported {
		if killed[w] {
			excused += n
		}
	}
	var wrong []string
	switch {
	case oks == 0:
		wrong = append(wrong, fmt.Sprintf("never completed: %s", j.brief()))
	case oks > 1+excused+lost:
		wrong = append(wrong, fmt.Sprintf("completed %d times (%d explained by a worker killed after the commit, %d by a lost lease of it or its parents): %s", oks, excused, lost, j.brief()))
	}
	if fresh > 1+lost {
		wrong = append(wrong, fmt.Sprintf("started %d times on a first delivery (no crash counted, %d leases lost by it or its parents): enqueued more than once: %s", fresh, lost, j.brief()))
	}
	return wrong
}

// WorkflowJoinKill: two workflows, parents p0..p3 and "last" (which
// depends on them, so it ends last) into a join depending on all five.
// "last" kills its worker at its settle: in one workflow before the ack
// (its success recorded and the join enqueued, the delivery not
// acknowledged: it comes back), in the other just after the ack. Fresh
// workers finish: each join runs exactly once, and both workflows
// succeed. Kills happen in the workers' own settle, so the kill point is
// the same on every run.
func workflowJoinKill(t *testing.T, r *run) *Report {
	r.lim.PoisonLimit = 50 // the kills are not the jobs' fault
	parents := []string{"p0", "p1", "p2", "p3"}
	steps := append(slices.Clone(parents), "last", "join")
	spec := func() WorkerSpec {
		s := r.spec()
		s.DieAtSettle = true
		return s
	}
	killed := map[string]bool{}
	live := r.start(spec(), true)
	restarts := 0
	var ids []string
	// One workflow at a time, so that each kill is at its own last parent.
	for _, mode := range []string{dieBefore, dieAfter} {
		w := ap.NewWorkflow("join-kill-" + mode)
		for _, p := range parents {
			w.Add(p, r.stepJob(Plan{SleepMin: 10, SleepMax: 40}))
		}
		w.Add("last", r.stepJob(Plan{SleepMin: 10, SleepMax: 20, DieAtSettle: mode}), parents...)
		w.Add("join", r.stepJob(Plan{SleepMin: 10, SleepMax: 20}), append(slices.Clone(parents), "last")...)
		r.enqueueWorkflow(w, steps)
		ids = append(ids, w.ID)
		// The kill point is missed when the doomed delivery of "last" lost
		// its lease first (a loaded machine): its attempt then settles
		// nothing, and its redelivery is not doomed. The worker is killed
		// once the workflow has ended instead.
		last := stepJobID(w.ID, "last")
		missed := false
		died := r.waitFor(patience, func() bool {
			select {
			case <-live.Done():
				return true
			default:
			}
			missed = r.history().of(last).count(KindAck, string(ap.OutcomeLeaseLost))[last] > 0 && r.workflowsDone(w.ID)
			return missed
		})
		switch {
		case !died:
			t.Errorf("workflow %s (%s): the worker did not die at the settle of its last parent within %v", w.ID, mode, patience)
			live.Kill()
		case missed:
			t.Logf("workflow %s (%s): %s lost its lease before its settle; its worker is killed after the workflow ended", w.ID, mode, last)
			live.Kill()
		}
		killed[live.Name()] = true
		live = r.start(spec(), true)
		restarts++
		if !r.waitFor(patience, func() bool { return r.workflowsDone(w.ID) }) {
			t.Errorf("workflow %s (%s) had not ended %v after its worker was killed", w.ID, mode, patience)
		}
	}
	t.Logf("workers killed at a settle: %d", restarts)
	r.waitResolved(patience)
	rep := r.finish(nil, true)
	for _, id := range ids {
		// Its success was recorded before the kill: its redelivery
		// (killed before the ack) must not run it again.
		parentJobs := make([]string, len(parents))
		for i, p := range parents {
			parentJobs[i] = stepJobID(id, p)
		}
		r.runsOnce(rep, stepJobID(id, "last"), nil, parentJobs...)
		r.checkWorkflow(rep, id)
		r.runsOnce(rep, stepJobID(id, "join"), killed, append(parentJobs, stepJobID(id, "last"))...)
	}
	r.judge(rep, true)
	return rep
}

// BatchCallbackKill: a batch of jobs with an OnSuccess callback, worked by
// two worker processes that are SIGKILLed at random moments and replaced
// while the batch runs. Every job completes (duplicates allowed: a kill
// between a commit and its ack), the batch succeeds, and the callback runs
// exactly once: enqueued once, and run again only where its own worker
// died after its commit.
func batchCallbackKill(t *testing.T, r *run) *Report {
	r.lim.PoisonLimit = 50 // the kills are not the jobs' fault
	n := scale(30)
	jobs := make([]*ap.Job, n)
	steps := make([]string, 0, n+1)
	for i := range jobs {
		jobs[i] = r.stepJob(Plan{SleepMin: 10, SleepMax: 80})
		steps = append(steps, fmt.Sprintf("job-%d", i))
	}
	steps = append(steps, ap.CallbackStep)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	from := time.Now()
	id, err := r.ad().EnqueueBatchWithCallback(ctx, jobs, ap.Callback{OnSuccess: r.stepJob(Plan{SleepMin: 10, SleepMax: 40})})
	cancel()
	if errors.Is(err, ap.ErrNoStore) {
		t.Skipf("batches with a callback need the backend's store: %v", err)
	}
	if err != nil {
		t.Fatalf("EnqueueBatchWithCallback: %v", err)
	}
	for _, s := range steps {
		r.log.Add(Event{Kind: KindEnqueue, ID: stepJobID(id, s), From: from})
	}
	cb := stepJobID(id, ap.CallbackStep)

	killed := map[string]bool{}
	live := []worker{r.start(r.spec(), true), r.start(r.spec(), true)}
	for range scale(4) {
		i := mrand.IntN(len(live))
		v := live[i]
		if !r.waitFor(20*time.Second, func() bool { return r.startsBy(v.Name()) > 0 }) || r.workflowsDone(id) {
			break // nothing left to run
		}
		pause(0, 200*time.Millisecond)
		v.Kill()
		killed[v.Name()] = true
		live[i] = r.start(r.spec(), true)
	}
	t.Logf("%d workers killed while the batch ran", len(killed))
	r.waitFor(patience, func() bool { return r.workflowsDone(id) })
	r.waitResolved(patience)
	rep := r.finish(nil, true)
	r.checkWorkflow(rep, id)
	jobIDs := make([]string, 0, n)
	for _, s := range steps[:n] {
		jobIDs = append(jobIDs, stepJobID(id, s))
	}
	r.runsOnce(rep, cb, killed, jobIDs...)
	r.judge(rep, true)
	return rep
}
