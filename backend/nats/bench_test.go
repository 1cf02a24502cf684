package nats

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	ap "github.com/asyncplatform/asyncplatform"
)

// BenchmarkThroughput compares, in one run against the machine's server
// (file storage, acks confirmed by the server everywhere), the jobs/s of
//
//   - Facade/cN: the platform end to end over this backend, N handlers,
//     each job preloaded, then received, handled (a no-op) and acked;
//   - Raw/one/cN: the ceiling: N goroutines on one durable pull consumer,
//     each fetching one message per request and double-acking it;
//   - Raw/batch/cN: the same fetching up to 64 messages per request.
//
// Run: go test -run '^$' -bench Throughput -benchtime 5000x ./backend/nats/
func BenchmarkThroughput(b *testing.B) {
	url := realURL(b)
	for _, c := range []int{10, 50} {
		b.Run(fmt.Sprintf("Facade/c%d", c), func(b *testing.B) { benchFacade(b, url, c) })
		b.Run(fmt.Sprintf("Raw/one/c%d", c), func(b *testing.B) { benchRaw(b, url, c, 1) })
		b.Run(fmt.Sprintf("Raw/batch/c%d", c), func(b *testing.B) { benchRaw(b, url, c, 64) })
	}
}

var benchPayload = make([]byte, 64)

func benchFacade(b *testing.B, url string, conc int) {
	ctx := context.Background()
	q := queueName(b)
	be := newBackend(b, url, q)
	p, err := ap.New(be, ap.Config{
		Queues: map[string]ap.QueueConfig{q: {Concurrency: conc}},
		Lease:  30 * time.Second,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	var done atomic.Int64
	all := make(chan struct{})
	n := int64(b.N)
	if err := p.Handle("bench", func(context.Context, *ap.Job) error {
		if done.Add(1) == n {
			close(all)
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i += 500 {
		jobs := make([]*ap.Job, 0, 500)
		for j := i; j < min(i+500, b.N); j++ {
			jobs = append(jobs, &ap.Job{Type: "bench", Queue: q, Payload: benchPayload})
		}
		if err := p.EnqueueBatch(ctx, jobs); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	start := time.Now()
	if err := p.Start(ctx); err != nil {
		b.Fatal(err)
	}
	<-all
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.Stop(sctx); err != nil {
		b.Error(err)
	}
}

func benchRaw(b *testing.B, url string, conc, batch int) {
	ctx := context.Background()
	nc, err := gonats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	name := "BENCHRAW"
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{name + ".>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer js.DeleteStream(ctx, name)
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: -1,
	})
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		if _, err := js.PublishAsync(name+".q", benchPayload); err != nil {
			b.Fatal(err)
		}
		if i%1000 == 999 {
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
	b.ResetTimer()
	start := time.Now()
	var left atomic.Int64
	left.Store(int64(b.N))
	var end atomic.Int64 // when the last ack was confirmed
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Load() > 0 {
				mb, err := cons.Fetch(batch, jetstream.FetchMaxWait(time.Second))
				if err != nil {
					b.Error(err)
					return
				}
				for m := range mb.Messages() {
					if err := m.DoubleAck(ctx); err != nil {
						b.Error(err)
						return
					}
					if left.Add(-1) == 0 {
						end.Store(time.Now().UnixNano())
					}
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Unix(0, end.Load()).Sub(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
}
