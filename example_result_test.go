package asyncplatform_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// JSONResult makes a handler's return value the job's result, kept in the
// job's status (TrackStatus) and in its outcome report (QueueConfig.Output).
func ExampleJSONResult() {
	type Sum struct{ A, B int }
	type Total struct{ N int }
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{TrackStatus: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	_ = p.Handle("sum", ap.JSONResult(func(ctx context.Context, job *ap.Job, s Sum) (Total, error) {
		return Total{N: s.A + s.B}, nil
	}))
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)

	job, _ := ap.NewJSONJob("sum", Sum{A: 2, B: 3})
	if err := p.Enqueue(ctx, job); err != nil {
		log.Fatal(err)
	}
	st, _ := p.Status(ctx, job.ID)
	for !st.State.Terminal() {
		time.Sleep(10 * time.Millisecond)
		st, _ = p.Status(ctx, job.ID)
	}
	total, err := ap.DecodeResult[Total](st.Result)
	fmt.Println(st.State, total.N, err)
	// Output: succeeded 5 <nil>
}
