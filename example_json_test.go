package asyncplatform_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// JSON decodes a job's payload into a typed value for the handler; a payload
// that does not decode is dead-lettered as invalid, never retried.
func ExampleJSON() {
	type Signup struct {
		Email string `json:"email"`
	}
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

	done := make(chan struct{})
	_ = p.Handle("signup", ap.JSON(func(ctx context.Context, job *ap.Job, s Signup) error {
		fmt.Println("welcome,", s.Email)
		close(done)
		return nil
	}))
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)

	job, err := ap.NewJSONJob("signup", Signup{Email: "grace@example.com"})
	if err != nil {
		log.Fatal(err)
	}
	if err := p.Enqueue(ctx, job); err != nil {
		log.Fatal(err)
	}
	<-done
	// Output: welcome, grace@example.com
}
