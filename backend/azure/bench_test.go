package azure

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	azlog "github.com/Azure/azure-sdk-for-go/sdk/azcore/log"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/queueerror"

	"github.com/asyncplatform/asyncplatform"
)

// benchJobs is the number of jobs per iteration: Azurite slows as a queue
// deepens, so keep it near 1,000 and compare only within one run.
const benchJobs = 1000

// BenchmarkThroughput compares, in one run, the facade end to end (enqueue
// with EnqueueBatch, then handlers at concurrency C until all are done) with
// a raw azqueue loop of C goroutines that dequeue one message per request
// (raw1) or 32 (raw32) and delete each. Each iteration runs the three in
// turn on benchJobs jobs, so a noisy machine disturbs all three alike; run it
// with -benchtime=3x. Metrics: each mode's drain rate in jobs/s (after its
// enqueue, which is reported as enq/s), and the facade's ratio to each raw
// loop.
func BenchmarkThroughput(b *testing.B) {
	for _, c := range []int{10, 50} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			retries := countRetries(b)
			be, q := newBackend(b, Config{})
			var enq, drain [3]time.Duration
			for range b.N {
				for i, mode := range []func() (time.Duration, time.Duration){
					func() (time.Duration, time.Duration) { return roundFacade(b, be, q, c) },
					func() (time.Duration, time.Duration) { return roundRaw(b, be, q, c, 1) },
					func() (time.Duration, time.Duration) { return roundRaw(b, be, q, c, 32) },
				} {
					e, d := mode()
					enq[i] += e
					drain[i] += d
				}
			}
			n := float64(benchJobs * b.N)
			for i, name := range []string{"facade", "raw1", "raw32"} {
				b.ReportMetric(n/drain[i].Seconds(), name+"-jobs/s")
				b.ReportMetric(n/enq[i].Seconds(), name+"-enq/s")
			}
			b.ReportMetric(drain[1].Seconds()/drain[0].Seconds(), "facade/raw1")
			b.ReportMetric(drain[2].Seconds()/drain[0].Seconds(), "facade/raw32")
			b.ReportMetric(float64(retries.Load()), "sdk-retries")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// countRetries counts the SDK's retried requests (a stall's usual cause)
// until the benchmark ends.
func countRetries(b *testing.B) *atomic.Int64 {
	var n atomic.Int64
	azlog.SetEvents(azlog.EventRetryPolicy)
	azlog.SetListener(func(_ azlog.Event, msg string) {
		if strings.HasPrefix(msg, "=====> Try=") && !strings.HasPrefix(msg, "=====> Try=1 ") {
			n.Add(1)
		}
	})
	b.Cleanup(func() { azlog.SetListener(nil) })
	return &n
}

func roundFacade(b *testing.B, be *Backend, q string, c int) (enq, drain time.Duration) {
	ctx := context.Background()
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
		jobs[i] = &asyncplatform.Job{Type: "bench", Queue: q, Payload: make([]byte, 100)}
	}
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
	if err := p.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	return t1.Sub(t0), t2.Sub(t1)
}

func roundRaw(b *testing.B, be *Backend, q string, c, batch int) (enq, drain time.Duration) {
	ctx := context.Background()
	wq := be.svc.NewQueueClient(be.names(q).work)
	text := workFrame{body: make([]byte, 100)}.encode()
	t0 := time.Now()
	parallel(b, DefaultEnqueueParallel, benchJobs, func() error {
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
						if queueerror.HasCode(err, queueerror.MessageNotFound) {
							// An SDK retry of a delete that had succeeded.
							done.Add(1)
							continue
						}
						if leaseLost(err) { // an overloaded machine: it comes back
							continue
						}
						b.Error(err)
						return
					}
					done.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return t1.Sub(t0), time.Since(t1)
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
