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

// NextDeadLetter drains dead letters one at a time: pop what was handled, keep
// the rest. It works whether or not the platform is started.
func ExamplePlatform_NextDeadLetter() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	dead := make(chan struct{})
	p, err := ap.New(backend, ap.Config{
		Logger: slog.New(slog.DiscardHandler),
		Hooks:  ap.Hooks{OnDeadLetter: func(context.Context, ap.DeadLetter) { close(dead) }},
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = p.Handle("invoice.parse", func(ctx context.Context, job *ap.Job) error {
		return ap.Invalid(errors.New("not a PDF"))
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	if err := p.Enqueue(ctx, &ap.Job{ID: "inv-42", Type: "invoice.parse", Payload: []byte("%GIF89a")}); err != nil {
		log.Fatal(err)
	}
	<-dead
	_ = p.Stop(ctx)

	for {
		err := p.NextDeadLetter(ctx, ap.DefaultQueue, func(ctx context.Context, dl ap.DeadLetter) (bool, error) {
			fmt.Printf("%s %s: %s after %d try: %s\n", dl.Job.ID, dl.Job.Type, dl.Reason, dl.Job.TryCount, dl.Error)
			return true, nil // pop it
		})
		if errors.Is(err, ap.ErrNoDeadLetters) {
			fmt.Println("no more dead letters")
			return
		}
		if err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// inv-42 invoice.parse: invalid after 1 try: invalid input: not a PDF
	// no more dead letters
}
