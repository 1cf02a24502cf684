package asyncplatform_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/dirstore"
)

// With a PayloadStore, a payload larger than the offload threshold (or than
// the backend's messages can carry) is kept in the store and the job carries
// a reference to it; the handler sees the same bytes either way. The stored
// payload is deleted once its job succeeds. dirstore keeps payloads as files
// of one directory.
func ExamplePayloadStore() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "payloads")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := dirstore.New(dir)
	if err != nil {
		log.Fatal(err)
	}
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()

	attempts := make(chan ap.Attempt, 2)
	p, err := ap.New(backend, ap.Config{
		Logger:           slog.New(slog.DiscardHandler),
		PayloadStore:     store,
		OffloadThreshold: 1 << 10, // payloads over 1 KiB go to the store
		Queues:           map[string]ap.QueueConfig{ap.DefaultQueue: {Concurrency: 1}},
		Hooks:            ap.Hooks{AfterAttempt: func(_ context.Context, a ap.Attempt) { attempts <- a }},
	})
	if err != nil {
		log.Fatal(err)
	}
	small := []byte("a short note")
	large := bytes.Repeat([]byte("scan "), 20_000) // 100,000 bytes
	seen := make(chan string, 2)
	_ = p.Handle("document.index", func(ctx context.Context, job *ap.Job) error {
		seen <- fmt.Sprintf("handler: %d bytes, the same as enqueued: %v",
			len(job.Payload), bytes.Equal(job.Payload, small) || bytes.Equal(job.Payload, large))
		return nil
	})

	stored := func() int {
		refs, err := store.Refs()
		if err != nil {
			log.Fatal(err)
		}
		return len(refs)
	}
	if err := p.Enqueue(ctx, &ap.Job{Type: "document.index", Payload: small}); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payloads in the store after the small job:", stored())
	if err := p.Enqueue(ctx, &ap.Job{Type: "document.index", Payload: large}); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payloads in the store after the large job:", stored())

	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	for range 2 {
		fmt.Println(<-seen)
	}
	for range 2 {
		<-attempts // each job's outcome is reported: its payload is deleted by now
	}
	fmt.Println("payloads in the store once both succeeded:", stored())
	// Output:
	// payloads in the store after the small job: 0
	// payloads in the store after the large job: 1
	// handler: 12 bytes, the same as enqueued: true
	// handler: 100000 bytes, the same as enqueued: true
	// payloads in the store once both succeeded: 0
}
