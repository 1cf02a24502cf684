package main

// The workflow rows: what a workflow step and a dependency edge cost on
// each backend, through our facade in a process of its own. Four runs
// of the same no-op handler (Concurrency 10), each timed from the first
// enqueue until every job's outcome was reported (AfterAttempt):
//
//   - plain: N ordinary jobs in batches (the baseline);
//   - steps: a workflow of N steps with no dependencies (each step: its
//     record, Begin's reads, Succeed's write);
//   - fan-in: N steps into one join (N edges: each parent's claim race
//     and reads of the join's dependencies);
//   - chain: C steps one after another (a hop: a step's success, the
//     next step's enqueue, its delivery).
//
// Per step = (steps − plain) / N; per edge = (fan-in − steps) / N; per
// hop = chain / C. RabbitMQ's store is the PostgreSQL companion.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// workflowSystem names the workflow child in a childSpec.
const workflowSystem = "workflow"

// workflowChain is the length of the chain run (C).
const workflowChain = 50

// workflowResult is what one workflow child reports.
type workflowResult struct {
	Backend                   string
	N, Chain                  int
	Plain, Steps, FanIn, Hops time.Duration // each run's wall time
	PerJob, PerStep, PerEdge  time.Duration
	PerHop                    time.Duration
	Load                      float64
	Err                       string
}

// measureWorkflows measures every backend o names, one after another.
func measureWorkflows(o options) []workflowResult {
	var out []workflowResult
	for _, b := range o.Backends {
		if b == "azure" && o.Srv.Azure == "" {
			continue
		}
		r := measureWorkflow(b, o)
		log.Printf("%s workflows: %s", b, r.summary())
		out = append(out, r)
	}
	return out
}

// measureWorkflow runs one backend's workflow child.
func measureWorkflow(backend string, o options) workflowResult {
	r := workflowResult{Backend: backend}
	n := o.N / 10
	if backend == "azure" {
		n = o.AzureN / 10
	}
	n = min(max(n, 50), ap.MaxWorkflowSteps-1)
	spec := childSpec{Backend: backend, System: workflowSystem, Srv: o.Srv, Plan: plan{N: n}}
	if err := runJSONChild(spec, 10*time.Minute, &r); err != nil {
		r.Err = err.Error()
	}
	return r
}

// runWorkflowChild measures one backend and prints its result as JSON.
func runWorkflowChild(spec childSpec) {
	r := workflowResult{Backend: spec.Backend, N: spec.Plan.N, Chain: workflowChain, Load: loadAvg()}
	if err := workflowLoop(context.Background(), spec, &r); err != nil {
		r.Err = err.Error()
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}

func workflowLoop(ctx context.Context, spec childSpec, r *workflowResult) (err error) {
	tag := fmt.Sprintf("workflow-%d", os.Getpid())
	be, cleanup, err := openBackend(ctx, spec.Backend, tag, true, spec.Srv)
	if err != nil {
		return err
	}
	queue := "bench-" + tag
	defer func() {
		if d, ok := be.(driver.QueueDeleter); ok {
			dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			err = errors.Join(err, d.DeleteQueue(dctx, queue))
			cancel()
		}
		err = errors.Join(err, be.Close())
		cleanup()
	}()
	var done atomic.Int64
	p, err := ap.New(be, ap.Config{
		Logger: quiet,
		Queues: map[string]ap.QueueConfig{queue: {Concurrency: 10}},
		Hooks: ap.Hooks{AfterAttempt: func(_ context.Context, a ap.Attempt) {
			if a.Outcome == ap.OutcomeSucceeded {
				done.Add(1)
			}
		}},
	})
	if err != nil {
		return err
	}
	if err := p.Handle("bench", func(context.Context, *ap.Job) error { return nil }); err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = errors.Join(err, p.Stop(sctx))
		cancel()
	}()
	job := func() *ap.Job { return &ap.Job{Type: "bench", Queue: queue, Payload: make([]byte, 100)} }
	// run times enqueue until want more outcomes have been reported.
	run := func(what string, want int64, enqueue func() error) (time.Duration, error) {
		from := done.Load()
		start := time.Now()
		if err := enqueue(); err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		deadline := time.Now().Add(5 * time.Minute)
		for done.Load()-from < want {
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("%s: %d of %d outcomes after 5 minutes", what, done.Load()-from, want)
			}
			time.Sleep(time.Millisecond)
		}
		return time.Since(start), nil
	}
	n := spec.Plan.N
	roots := func(name string) *ap.Workflow {
		w := ap.NewWorkflow(name)
		for i := range n {
			w.Add("s"+strconv.Itoa(i), job())
		}
		return w
	}
	// Warm up: connections, the queue's declaration, the store's tables.
	if _, err := run("warm-up", 10, func() error {
		return p.EnqueueWorkflow(ctx, ap.NewWorkflow("warm").Add("a", job()).Add("b", job(), "a").Add("c", job()).Add("d", job()).Add("e", job()).Add("f", job()).Add("g", job()).Add("h", job()).Add("i", job()).Add("j", job()))
	}); err != nil {
		return err
	}
	if r.Plain, err = run("plain", int64(n), func() error {
		jobs := make([]*ap.Job, n)
		for i := range jobs {
			jobs[i] = job()
		}
		for start := 0; start < n; start += driver.MaxBatch {
			if err := p.EnqueueBatch(ctx, jobs[start:min(start+driver.MaxBatch, n)]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if r.Steps, err = run("steps", int64(n), func() error { return p.EnqueueWorkflow(ctx, roots("steps")) }); err != nil {
		return err
	}
	if r.FanIn, err = run("fan-in", int64(n+1), func() error {
		w := roots("fan-in")
		deps := make([]string, n)
		for i := range deps {
			deps[i] = "s" + strconv.Itoa(i)
		}
		return p.EnqueueWorkflow(ctx, w.Add("join", job(), deps...))
	}); err != nil {
		return err
	}
	if r.Hops, err = run("chain", workflowChain, func() error {
		w := ap.NewWorkflow("chain").Add("s0", job())
		for i := 1; i < workflowChain; i++ {
			w.Add("s"+strconv.Itoa(i), job(), "s"+strconv.Itoa(i-1))
		}
		return p.EnqueueWorkflow(ctx, w)
	}); err != nil {
		return err
	}
	r.PerJob = r.Plain / time.Duration(n)
	r.PerStep = (r.Steps - r.Plain) / time.Duration(n)
	r.PerEdge = (r.FanIn - r.Steps) / time.Duration(n)
	r.PerHop = r.Hops / workflowChain
	return nil
}

func (r workflowResult) summary() string {
	s := fmt.Sprintf("N %d: per job %v, per step +%v, per edge +%v, per chain hop %v", r.N,
		r.PerJob.Round(time.Microsecond), r.PerStep.Round(time.Microsecond), r.PerEdge.Round(time.Microsecond), r.PerHop.Round(time.Microsecond))
	if r.Err != "" {
		s += " ERROR " + r.Err
	}
	return s
}

// writeWorkflow writes the workflow table.
func (rep *report) writeWorkflow(w func(string, ...any)) {
	if len(rep.Workflow) == 0 {
		return
	}
	w("## Workflows: the cost per step and per dependency edge\n\n")
	w("A no-op handler at Concurrency 10 through our facade in a process of its own, each run timed from the first enqueue until every outcome was reported: **plain**, N ordinary jobs in batches; **steps**, a workflow of N steps with no dependencies; **fan-in**, N steps into one join (N edges); **chain**, %d steps one after another. **+step** = (steps − plain)/N, **+edge** = (fan-in − steps)/N, **hop** = chain/%d (a step's success, the next step's enqueue and its delivery). N = N/10 (Azure: azure-n/10), at least 50. RabbitMQ's store is the PostgreSQL companion.\n\n", workflowChain, workflowChain)
	w("| backend | N | plain | steps | fan-in | chain | per job | +step | +edge | hop | load | |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range rep.Workflow {
		w("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %.1f | %s |\n", r.Backend, r.N,
			durCell(r.Plain), durCell(r.Steps), durCell(r.FanIn), durCell(r.Hops),
			durCell(r.PerJob), durCell(r.PerStep), durCell(r.PerEdge), durCell(r.PerHop), r.Load, r.Err)
	}
	w("\n")
}
