package azure

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"

	"github.com/asyncplatform/asyncplatform"
)

// benchJobs is the number of jobs per iteration: Azurite slows as a queue
// deepens, so keep it near 1,000 and compare only within one run.
const benchJobs = 1000

// BenchmarkThroughput compares, in one run, the facade end to end (enqueue
// with EnqueueBatch, then handlers at concurrency C until all are done) with
// a raw azqueue loop: C goroutines that dequeue one message (or 32) per
// request and delete each. Run it with -benchtime=1x (-count for more).
// "jobs/s" is the drain rate after the enqueue; "enq/s" the enqueue rate.
func BenchmarkThroughput(b *testing.B) {
	for _, c := range []int{10, 50} {
		b.Run(fmt.Sprintf("c=%d/facade", c), func(b *testing.B) { benchFacade(b, c) })
		b.Run(fmt.Sprintf("c=%d/raw-1", c), func(b *testing.B) { benchRaw(b, c, 1) })
		b.Run(fmt.Sprintf("c=%d/raw-32", c), func(b *testing.B) { benchRaw(b, c, 32) })
	}
}

func report(b *testing.B, enq, drain time.Duration) {
	n := float64(benchJobs * b.N)
	b.ReportMetric(n/drain.Seconds(), "jobs/s")
	b.ReportMetric(n/enq.Seconds(), "enq/s")
	b.ReportMetric(0, "ns/op")
}

func benchFacade(b *testing.B, c int) {
	be, q := newBackend(b, Config{})
	ctx := context.Background()
	payload := make([]byte, 100)
	var enq, drain time.Duration
	for range b.N {
		p, err := asyncplatform.New(be, asyncplatform.Config{
			Queues: map[string]asyncplatform.QueueConfig{q: {Concurrency: c}},
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			b.Fatal(err)
		}
		var done atomic.Int64
		all := make(chan struct{})
		if err := p.Handle("bench", func(ctx context.Context, j *asyncplatform.Job) error {
			if done.Add(1) == benchJobs {
				close(all)
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		jobs := make([]*asyncplatform.Job, benchJobs)
		for i := range jobs {
			jobs[i] = &asyncplatform.Job{Type: "bench", Queue: q, Payload: payload}
		}
		b.StartTimer()
		t0 := time.Now()
		if err := p.EnqueueBatch(ctx, jobs); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := p.Start(ctx); err != nil {
			b.Fatal(err)
		}
		<-all
		t2 := time.Now()
		b.StopTimer()
		enq += t1.Sub(t0)
		drain += t2.Sub(t1)
		if err := p.Stop(ctx); err != nil {
			b.Fatal(err)
		}
	}
	report(b, enq, drain)
}

func benchRaw(b *testing.B, c, batch int) {
	be, q := newBackend(b, Config{})
	ctx := context.Background()
	wq := be.svc.NewQueueClient(mustNames(b, be, q).work)
	text := workFrame{body: make([]byte, 100)}.encode()
	var enq, drain time.Duration
	for range b.N {
		b.StartTimer()
		t0 := time.Now()
		parallel(b, 16, benchJobs, func() error {
			_, err := wq.EnqueueMessage(ctx, text, &azqueue.EnqueueMessageOptions{TimeToLive: to.Ptr(int32(-1))})
			return err
		})
		t1 := time.Now()
		var done atomic.Int64
		var wg sync.WaitGroup
		for range c {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for done.Load() < benchJobs {
					resp, err := wq.DequeueMessages(ctx, &azqueue.DequeueMessagesOptions{
						NumberOfMessages: to.Ptr(int32(batch)), VisibilityTimeout: to.Ptr(int32(30)),
					})
					if err != nil {
						b.Error(err)
						return
					}
					if len(resp.Messages) == 0 {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					for _, m := range resp.Messages {
						if _, err := wq.DeleteMessage(ctx, *m.MessageID, *m.PopReceipt, nil); err != nil {
							b.Error(err)
							return
						}
						done.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		t2 := time.Now()
		b.StopTimer()
		enq += t1.Sub(t0)
		drain += t2.Sub(t1)
	}
	report(b, enq, drain)
}

// parallel runs fn n times on w goroutines.
func parallel(b *testing.B, w, n int, fn func() error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if err := fn(); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
