package nats

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// TestServerRestartUnderLoad runs a worker and a producer against an
// in-process nats-server with file storage, shuts the server down in the
// middle of the load and starts it again on the same port and store. Every
// job whose Enqueue returned nil must be processed (lost = 0), nothing that
// was not enqueued may appear, the worker must resume by itself, and the
// queue must end empty. Duplicates are allowed (at-least-once) and counted.
func TestServerRestartUnderLoad(t *testing.T) {
	const (
		total    = 3000
		downtime = time.Second
	)
	dir, port := t.TempDir(), freePort(t)
	srv := startServer(t, dir, port)
	url := srv.ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	q := queueName(t)

	newPlatform := func() (*ap.Platform, *Backend) {
		b, err := New(ctx, testConfig(url))
		if err != nil {
			t.Fatal(err)
		}
		p, err := ap.New(b, ap.Config{
			Queues:         map[string]ap.QueueConfig{q: {Concurrency: 10}},
			Lease:          2 * time.Second,
			HealthInterval: 200 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		return p, b
	}

	var mu sync.Mutex
	processed := map[string]int{}
	var lastDone, restartAt, firstAfter time.Time
	worker, wb := newPlatform()
	if err := worker.Handle("load", func(_ context.Context, j *ap.Job) error {
		mu.Lock()
		processed[j.ID]++
		lastDone = time.Now()
		if !restartAt.IsZero() && firstAfter.IsZero() {
			firstAfter = lastDone
		}
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := worker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	producer, pb := newPlatform()

	// The producer enqueues one job at a time and retries each with the
	// same Job until the server acks it (JetStream deduplicates the retries).
	acked := make(map[string]bool, total)
	var failedTries int
	// The server goes down once a third of the jobs are in, while the
	// producer and the worker keep going.
	third := make(chan struct{})
	restartDone := make(chan struct{})
	go func() {
		defer close(restartDone)
		<-third
		srv.Shutdown()
		srv.WaitForShutdown()
		time.Sleep(downtime)
		srv2 := startServer(t, dir, port)
		mu.Lock()
		restartAt = time.Now()
		mu.Unlock()
		_ = srv2
	}()
	const producers = 4
	var sent sync.WaitGroup
	var closeThird sync.Once
	for p := range producers {
		sent.Add(1)
		go func() {
			defer sent.Done()
			for i := p; i < total; i += producers {
				if i >= total/3 {
					closeThird.Do(func() { close(third) })
				}
				id := fmt.Sprintf("%s-%05d", q, i)
				// The same Job each time: its enqueue nonce, and so its
				// deduplication key, is kept across the retries.
				job := &ap.Job{ID: id, Type: "load", Queue: q, Payload: []byte(id)}
				for {
					ectx, ecancel := context.WithTimeout(ctx, 2*time.Second)
					err := producer.Enqueue(ectx, job)
					ecancel()
					mu.Lock()
					if err == nil {
						acked[id] = true
					} else {
						failedTries++
					}
					mu.Unlock()
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						t.Errorf("enqueue %s: %v", id, err)
						return
					}
				}
			}
		}()
	}
	sent.Wait()
	enqueuedAt := time.Now()
	<-restartDone

	// Wait until every acked job was processed.
	for {
		mu.Lock()
		n := 0
		for id := range acked {
			if processed[id] > 0 {
				n++
			}
		}
		mu.Unlock()
		if n == len(acked) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("only %d of %d acked jobs processed", n, len(acked))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Then until the queue has drained, the worker still running: a job
	// whose ack was lost in the outage (its handler ran, the ack timed out)
	// comes back after its lease, and is processed again (a duplicate). A
	// Stop that catches such a redelivery in flight hands it back, and the
	// queue would not end empty although nothing is wrong.
	for {
		st, err := pb.Stats(ctx, q)
		if err == nil && st.Ready == 0 && st.InFlight == 0 && st.Scheduled == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the queue did not drain: %+v, %v", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopCtx, stopCancel := context.WithTimeout(ctx, 10*time.Second)
	defer stopCancel()
	if err := worker.Stop(stopCtx); err != nil {
		t.Errorf("stop: %v", err)
	}

	mu.Lock()
	var lost, dups, unexpected int
	for id := range acked {
		if processed[id] == 0 {
			lost++
		}
	}
	for id, n := range processed {
		if !acked[id] {
			unexpected++
		}
		dups += n - 1
	}
	drained := lastDone.Sub(enqueuedAt)
	resumed := firstAfter.Sub(restartAt)
	mu.Unlock()
	st, err := pb.Stats(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restart under load: %d jobs acked (%d enqueue attempts failed during the outage), lost %d, duplicated %d, unexpected %d; server down %v; worker resumed %v after the restart; last job done %v after the last enqueue; queue at the end %+v",
		len(acked), failedTries, lost, dups, unexpected, downtime, resumed.Round(time.Millisecond), drained.Round(time.Millisecond), st)
	if lost != 0 || unexpected != 0 {
		t.Errorf("lost %d, unexpected %d: want 0 and 0", lost, unexpected)
	}
	if st.Ready != 0 || st.InFlight != 0 || st.Scheduled != 0 || st.Dead != 0 {
		t.Errorf("queue not empty at the end: %+v", st)
	}
	_ = producer.Stop(ctx)
	_ = pb.DeleteQueue(ctx, q)
	_ = pb.Close()
	_ = wb.Close()
}
