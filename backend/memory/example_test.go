package memory_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// Example builds a memory backend, hands it to asyncplatform.New, and runs
// one job through it.
func Example() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		fmt.Println(err)
		return
	}

	done := make(chan struct{})
	_ = p.Handle("greet", func(ctx context.Context, job *ap.Job) error {
		fmt.Printf("hello, %s\n", job.Payload)
		close(done)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer p.Stop(ctx)

	if err := p.Enqueue(ctx, &ap.Job{Type: "greet", Payload: []byte("memory")}); err != nil {
		fmt.Println(err)
		return
	}
	<-done
	// Output: hello, memory
}
