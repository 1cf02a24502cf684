package asyncplatform_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// A workflow is a set of steps with dependencies: here a diamond, where
// "ship" runs once "pack" and "bill" have both succeeded, and reads
// their results.
func ExampleWorkflow() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	step := func(ctx context.Context, job *ap.Job) error {
		job.SetResult([]byte(job.Type + " done"))
		return nil
	}
	_ = p.Handle("order", step)
	_ = p.Handle("pack", step)
	_ = p.Handle("bill", step)
	shipped := make(chan string, 1)
	_ = p.Handle("ship", func(ctx context.Context, job *ap.Job) error {
		pack, err := job.DependencyResult(ctx, "pack")
		if err != nil {
			return err
		}
		bill, err := job.DependencyResult(ctx, "bill")
		if err != nil {
			return err
		}
		shipped <- string(pack) + ", " + string(bill)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)

	wf := ap.NewWorkflow("order-42").
		Add("order", &ap.Job{Type: "order"}).
		Add("pack", &ap.Job{Type: "pack"}, "order").
		Add("bill", &ap.Job{Type: "bill"}, "order").
		Add("ship", &ap.Job{Type: "ship"}, "pack", "bill")
	if err := p.EnqueueWorkflow(ctx, wf); err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-shipped)
	st, _ := p.WorkflowStatus(ctx, wf.ID)
	for !st.Done() {
		time.Sleep(10 * time.Millisecond)
		st, _ = p.WorkflowStatus(ctx, wf.ID)
	}
	var states []string
	for _, s := range st.Steps {
		states = append(states, s.Name+"="+s.State)
	}
	fmt.Println(strings.Join(states, " "))
	// Output:
	// pack done, bill done
	// order=succeeded pack=succeeded bill=succeeded ship=succeeded
}

// A batch with a callback: the callback job is enqueued once, after every
// job of the batch has succeeded (OnSuccess), and the batch's ID is a
// workflow's, for WorkflowStatus and CancelWorkflow.
func ExamplePlatform_EnqueueBatchWithCallback() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	_ = p.Handle("resize", func(ctx context.Context, job *ap.Job) error { return nil })
	done := make(chan struct{}, 1)
	_ = p.Handle("notify", func(ctx context.Context, job *ap.Job) error {
		done <- struct{}{}
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)

	jobs := []*ap.Job{{Type: "resize"}, {Type: "resize"}, {Type: "resize"}}
	id, err := p.EnqueueBatchWithCallback(ctx, jobs, ap.Callback{OnSuccess: &ap.Job{Type: "notify"}})
	if err != nil {
		log.Fatal(err)
	}
	<-done
	st, _ := p.WorkflowStatus(ctx, id)
	for !st.Done() {
		time.Sleep(10 * time.Millisecond)
		st, _ = p.WorkflowStatus(ctx, id)
	}
	fmt.Println(len(st.Steps), "steps, succeeded:", st.Succeeded())
	// Output: 4 steps, succeeded: true
}
