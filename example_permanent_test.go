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

// Permanent says retrying cannot help: the job is dead-lettered at once with
// reason "permanent", whatever its retry limit. Wrapping keeps the mark.
func ExamplePermanent() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	dead := make(chan ap.DeadLetter, 1)
	p, err := ap.New(backend, ap.Config{
		Logger: slog.New(slog.DiscardHandler),
		Hooks:  ap.Hooks{OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) { dead <- dl }},
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = p.Handle("payment.charge", func(ctx context.Context, job *ap.Job) error {
		return fmt.Errorf("charging card: %w", ap.Permanent(errors.New("card expired")))
	}, ap.Policy{RetryLimit: ap.Limit(10)})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)

	if err := p.Enqueue(ctx, &ap.Job{Type: "payment.charge"}); err != nil {
		log.Fatal(err)
	}
	dl := <-dead
	fmt.Printf("%s after %d try (%d failure): %s\n", dl.Reason, dl.Job.TryCount, dl.Job.Failures, dl.Error)
	// Output: permanent after 1 try (1 failure): charging card: permanent failure: card expired
}
