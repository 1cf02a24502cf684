package rabbit

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform"
)

// BenchmarkEndToEnd measures jobs/s from enqueue to ack, through the
// platform and, in the same run, through raw amqp091-go loops with the same
// durability (quorum queue, persistent messages, publisher confirms, manual
// ack, the platform's prefetch of twice the concurrency):
//
//   - facade: c producers each Enqueue one job at a time; the platform runs
//     c handlers. It also reports acks/frame: acks per basic.ack frame on
//     its consumer channel (see acker).
//   - raw: c producers each publish one message and wait for its confirm; c
//     workers take deliveries from one consumer and ack each.
//   - rawbatch: producers publish 100 messages and then wait for their
//     confirms; one worker acks every c-th delivery with multiple set.
func BenchmarkEndToEnd(b *testing.B) {
	for _, c := range []int{10, 50} {
		b.Run(fmt.Sprintf("facade/c=%d", c), func(b *testing.B) { benchFacade(b, c) })
		b.Run(fmt.Sprintf("raw/c=%d", c), func(b *testing.B) { benchRaw(b, c, 1) })
		b.Run(fmt.Sprintf("rawbatch/c=%d", c), func(b *testing.B) { benchRaw(b, c, 100) })
	}
}

// split spreads n jobs over c producers.
func split(n, c, i int) int {
	k := n / c
	if i < n%c {
		k++
	}
	return k
}

func benchFacade(b *testing.B, c int) {
	quiet := slog.New(slog.DiscardHandler)
	be := newBackend(b, Config{Logger: quiet})
	q := queueName(b, be)
	ctx := context.Background()
	var handled atomic.Int64
	done := make(chan struct{})
	n := int64(b.N)
	p, err := asyncplatform.New(be, asyncplatform.Config{
		Queues: map[string]asyncplatform.QueueConfig{q: {Concurrency: c}},
		Logger: quiet,
	})
	if err != nil {
		b.Fatal(err)
	}
	p.Handle("bench", func(ctx context.Context, j *asyncplatform.Job) error {
		if handled.Add(1) == n {
			close(done)
		}
		return nil
	})
	if err := p.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer p.Stop(ctx)
	payload := make([]byte, 64)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range c {
		wg.Go(func() {
			for range split(b.N, c, i) {
				if err := p.Enqueue(ctx, &asyncplatform.Job{Type: "bench", Queue: q, Payload: payload}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	<-done
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
	be.mu.Lock()
	qc := be.qch[q]
	be.mu.Unlock()
	if qc != nil && qc.acks.acks.Load() > 0 {
		b.ReportMetric(float64(qc.acks.acks.Load())/float64(qc.acks.frames.Load()), "acks/frame")
	}
}

func benchRaw(b *testing.B, c, batch int) {
	be := newBackend(b, Config{Logger: slog.New(slog.DiscardHandler)})
	q := queueName(b, be)
	ctx := context.Background()
	if err := be.Declare(ctx, q); err != nil {
		b.Fatal(err)
	}
	name := be.workName(q)
	conn, err := amqp.Dial(testURL())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	pub, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := pub.Confirm(false); err != nil {
		b.Fatal(err)
	}
	returns := pub.NotifyReturn(make(chan amqp.Return, 16))
	go func() {
		for range returns {
			b.Error("returned")
		}
	}()
	cons, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := cons.Qos(2*c, 0, false); err != nil {
		b.Fatal(err)
	}
	dl, err := cons.Consume(name, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	var handled atomic.Int64
	done := make(chan struct{})
	n := int64(b.N)
	var workers sync.WaitGroup
	if batch == 1 {
		for range c {
			workers.Go(func() {
				for d := range dl {
					if err := d.Ack(false); err != nil {
						b.Error(err)
					}
					if handled.Add(1) == n {
						close(done)
					}
				}
			})
		}
	} else {
		// One worker acks every c-th delivery with multiple set (the
		// prefetch, 2c, leaves room for the next c).
		workers.Go(func() {
			for d := range dl {
				last := handled.Add(1) == n
				if d.DeliveryTag%uint64(c) == 0 || last {
					if err := d.Ack(true); err != nil {
						b.Error(err)
					}
				}
				if last {
					close(done)
				}
			}
		})
	}
	payload := make([]byte, 64)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range c {
		wg.Go(func() {
			left := split(b.N, c, i)
			for left > 0 {
				k := min(batch, left)
				left -= k
				dcs := make([]*amqp.DeferredConfirmation, 0, k)
				for range k {
					dc, err := pub.PublishWithDeferredConfirm("", name, true, false, amqp.Publishing{
						DeliveryMode: amqp.Persistent,
						MessageId:    fmt.Sprint(time.Now().UnixNano()),
						Body:         payload,
					})
					if err != nil {
						b.Error(err)
						return
					}
					dcs = append(dcs, dc)
				}
				for _, dc := range dcs {
					if !dc.Wait() {
						b.Error("nacked")
						return
					}
				}
			}
		})
	}
	wg.Wait()
	<-done
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
	cons.Close()
	workers.Wait()
}
