package asyncplatform_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// A pipeline: the "resize" queue reports every job's end to its output
// queue, "index", whose handler consumes the reports like any other job:
// the result of a success, the reason and error of a dead letter. The
// report is stored before the resize job is acknowledged, so a crash in
// between reports it again: the indexer deduplicates on the report's Key.
func ExampleQueueConfig_output() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{
		Queues: map[string]ap.QueueConfig{
			"resize": {Concurrency: 1, Output: "index"},
			"index":  {Concurrency: 1},
		},
		WorkerName: "worker-1",
		Logger:     slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = p.Handle("resize", func(ctx context.Context, job *ap.Job) error {
		if string(job.Payload) == "broken.png" {
			return ap.Invalid(errors.New("not an image"))
		}
		job.SetResult([]byte("thumb-" + string(job.Payload)))
		return nil
	})
	done := make(chan struct{})
	seen := map[string]bool{} // report keys already indexed
	_ = p.Handle(ap.ReportType, ap.JSON(func(ctx context.Context, job *ap.Job, r ap.OutcomeReport) error {
		if seen[r.Key] {
			return nil // the same end reported twice
		}
		seen[r.Key] = true
		switch r.Outcome {
		case ap.OutcomeSucceeded:
			fmt.Printf("index %s (%d try)\n", r.Result, r.TryCount)
		case ap.OutcomeDeadLettered:
			fmt.Printf("skip: %s on %s: %s\n", r.Reason, r.Worker, r.Error)
		}
		if len(seen) == 2 {
			close(done)
		}
		return nil
	}))

	for _, file := range []string{"cat.png", "broken.png"} {
		if err := p.Enqueue(ctx, &ap.Job{Type: "resize", Queue: "resize", Payload: []byte(file)}); err != nil {
			log.Fatal(err)
		}
	}
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	<-done
	// Output:
	// index thumb-cat.png (1 try)
	// skip: invalid on worker-1: invalid input: not an image
}
