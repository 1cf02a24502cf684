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

// Run a workflow step's handler alone, with the results its dependencies
// would have set: Job.DependencyResult returns them, and the step's own
// result is Result.Job.Result().
func ExampleOptions_dependencyResults() {
	sum := func(ctx context.Context, j *asyncplatform.Job) error {
		a, err := j.DependencyResult(ctx, "price")
		if err != nil {
			return asyncplatform.Permanent(err)
		}
		b, err := j.DependencyResult(ctx, "shipping")
		if err != nil {
			return asyncplatform.Permanent(err)
		}
		j.SetResult([]byte(string(a) + "+" + string(b)))
		return nil
	}
	r, err := jobtest.Work(context.Background(), sum, &asyncplatform.Job{Type: "total"}, jobtest.Options{
		DependencyResults: map[string][]byte{"price": []byte("40"), "shipping": []byte("5")},
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Outcome, string(r.Job.Result()))
	// Output: succeeded 40+5
}
