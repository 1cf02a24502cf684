package jobtest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/jobtest"
)

// Test a handler's outcome without a broker: here a job that crashed its
// worker twice before, under a poison limit of 1, is dead-lettered without
// its handler being called again.
func ExampleWork() {
	ctx := context.Background()
	send := func(ctx context.Context, j *asyncplatform.Job) error {
		return asyncplatform.Permanent(errors.New("mailbox does not exist"))
	}
	r, err := jobtest.Work(ctx, send, &asyncplatform.Job{Type: "email"}, jobtest.Options{})
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Outcome, r.Reason, r.Job.TryCount)

	r, _ = jobtest.Work(ctx, send, &asyncplatform.Job{Type: "email"}, jobtest.Options{
		Crashes: 2,
		Policy:  asyncplatform.Policy{PoisonLimit: asyncplatform.Limit(1)},
	})
	fmt.Println(r.Outcome, r.Reason, r.Job.TryCount)
	// Output:
	// dead_lettered permanent 1
	// dead_lettered poisoned 2
}

// Check that code under test enqueued a job.
func ExampleRecorder() {
	var rec jobtest.Recorder
	cfg := asyncplatform.Config{EnqueueMiddleware: []asyncplatform.EnqueueMiddleware{rec.Middleware()}}
	_ = cfg // asyncplatform.New(backend, cfg) in the code under test
	j, err := rec.Enqueued("email")
	fmt.Println(j == nil, errors.Is(err, jobtest.ErrNotEnqueued))
	// Output: true true
}
