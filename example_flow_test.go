package asyncplatform_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// Pause stops every worker process from claiming a queue's jobs until
// Resume; the jobs wait, and none spends a try. An admin process (or
// "asyncctl pause emails") pauses and resumes; workers notice within
// PausePoll.
func ExamplePlatform_Pause() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{
		Logger: slog.New(slog.DiscardHandler),
		Queues: map[string]ap.QueueConfig{"emails": {}},
	})
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan int, 1)
	_ = p.Handle("email.send", func(ctx context.Context, job *ap.Job) error {
		ran <- job.TryCount
		return nil
	})
	if err := p.Pause(ctx, "emails"); err != nil { // before Start: the worker takes nothing
		log.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	_ = p.Enqueue(ctx, &ap.Job{Type: "email.send", Queue: "emails"})

	st, _ := p.Stats(ctx, "emails")
	fmt.Println("paused:", st.Paused, "waiting:", st.Ready)
	select {
	case <-ran:
		fmt.Println("ran while paused")
	case <-time.After(2 * ap.PausePoll):
		fmt.Println("nothing ran")
	}
	_ = p.Resume(ctx, "emails")
	fmt.Println("ran after Resume, try", <-ran)
	// Output:
	// paused: true waiting: 1
	// nothing ran
	// ran after Resume, try 1
}

// A Pool works several queues with one set of handlers. In strict order
// (no Weights), a queue's jobs are taken only while the queues before it
// are empty: here every "critical" job runs before any "bulk" one, though
// the bulk jobs were enqueued first.
func ExamplePool() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{
		Logger: slog.New(slog.DiscardHandler),
		Queues: map[string]ap.QueueConfig{"critical": {}, "bulk": {}},
		Pools: []ap.Pool{{
			Queues:      []string{"critical", "bulk"}, // highest priority first
			Concurrency: 1, Prefetch: ap.Limit(0),     // one at a time, to show the order
			// Weights: []int{3, 1} would take about three critical jobs for one bulk job.
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan struct{})
	n := 0
	_ = p.Handle("work", func(ctx context.Context, job *ap.Job) error {
		fmt.Println(job.Queue, string(job.Payload))
		if n++; n == 4 {
			close(done)
		}
		return nil
	})
	for _, j := range []*ap.Job{
		{Type: "work", Queue: "bulk", Payload: []byte("b1")},
		{Type: "work", Queue: "bulk", Payload: []byte("b2")},
		{Type: "work", Queue: "critical", Payload: []byte("c1")},
		{Type: "work", Queue: "critical", Payload: []byte("c2")},
	} {
		_ = p.Enqueue(ctx, j)
	}
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	<-done
	// Output:
	// critical c1
	// critical c2
	// bulk b1
	// bulk b2
}

// A TypeLimit holds one job type back without holding up the others: here
// at most one "video.encode" runs at once (ClusterConcurrency would count
// across every process; Rate would bound the starts per second). The
// others wait, requeued, and spend no try.
func ExampleTypeLimit() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{
		Logger:     slog.New(slog.DiscardHandler),
		Limits:     map[string]ap.TypeLimit{"video.encode": {Concurrency: 1}},
		LimitDelay: 10 * time.Millisecond, // defaults to DefaultLimitDelay
	})
	if err != nil {
		log.Fatal(err)
	}
	var running, most, tries atomic.Int32
	var done sync.WaitGroup
	done.Add(3)
	_ = p.Handle("video.encode", func(ctx context.Context, job *ap.Job) error {
		defer done.Done()
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		tries.Add(int32(job.TryCount))
		time.Sleep(20 * time.Millisecond)
		return nil
	})
	for range 3 {
		_ = p.Enqueue(ctx, &ap.Job{Type: "video.encode"})
	}
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	done.Wait()
	fmt.Println("at most", most.Load(), "at once; tries spent:", tries.Load())
	// Output:
	// at most 1 at once; tries spent: 3
}
