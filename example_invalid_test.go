package asyncplatform_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"strconv"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// Invalid says the job's input cannot be used: the job is dead-lettered at
// once with reason "invalid", never retried, and its payload is kept in the
// dead letter for whoever looks at it.
func ExampleInvalid() {
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
	_ = p.Handle("stock.adjust", func(ctx context.Context, job *ap.Job) error {
		n, err := strconv.Atoi(string(job.Payload))
		if err != nil {
			return ap.Invalid(err)
		}
		fmt.Println("adjusting stock by", n)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)

	if err := p.Enqueue(ctx, &ap.Job{Type: "stock.adjust", Payload: []byte("twelve")}); err != nil {
		log.Fatal(err)
	}
	dl := <-dead
	fmt.Printf("%s after %d try, payload %q: %s\n", dl.Reason, dl.Job.TryCount, dl.Job.Payload, dl.Error)
	// Output: invalid after 1 try, payload "twelve": invalid input: strconv.Atoi: parsing "twelve": invalid syntax
}
