package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/postgres"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/outbox"
)

// relayTargets are the backends the relay phase moves a PostgreSQL outbox
// to.
var relayTargets = []string{"redis", "rabbit", "nats"}

// relayBatch is the relay's Config.Batch in the relay phase.
const relayBatch = 100

// relayResult is one run of the relay phase: N jobs committed to the
// outbox beforehand, then relayed by one relay.
type relayResult struct {
	Target string
	N      int
	Rate   float64 // jobs/s relayed
	Err    string
}

// measureRelays runs the relay phase for every target.
func measureRelays(o options) []relayResult {
	var out []relayResult
	for _, t := range relayTargets {
		r := measureRelay(t, o.N, o.Srv)
		log.Printf("relay postgres -> %s: %d jobs at %.0f/s %s", t, r.N, r.Rate, r.Err)
		out = append(out, r)
	}
	return out
}

func measureRelay(target string, n int, srv servers) relayResult {
	res := relayResult{Target: target, N: n}
	if err := relayOnce(target, n, srv, &res); err != nil {
		res.Err = err.Error()
	}
	return res
}

func relayOnce(target string, n int, srv servers, res *relayResult) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tag := "relay-" + target
	src, cleanup, err := openPostgres(ctx, tag, true, srv)
	if err != nil {
		return err
	}
	defer cleanup()
	defer src.Close()
	dst, dstCleanup, err := openBackend(ctx, target, tag, true, srv)
	if err != nil {
		return err
	}
	defer dstCleanup()
	defer dst.Close()
	queue := "bench-" + tag
	if d, ok := dst.(driver.QueueDeleter); ok {
		defer d.DeleteQueue(context.Background(), queue) //nolint:errcheck // best effort
	}
	p, err := ap.New(src, ap.Config{Logger: quiet})
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, withPool(srv.Postgres, 4))
	if err != nil {
		return err
	}
	defer pool.Close()
	for done := 0; done < n; {
		k := min(100, n-done)
		jobs := make([]*ap.Job, k)
		for i := range jobs {
			jobs[i] = &ap.Job{Type: "bench", Queue: queue, Payload: []byte(fmt.Sprint(done + i))}
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return p.EnqueueBatch(postgres.OutboxTx(ctx, tx), jobs)
		}); err != nil {
			return err
		}
		done += k
	}
	r, err := outbox.New(outbox.Config{Source: src, Target: dst, Batch: relayBatch, Logger: quiet})
	if err != nil {
		return err
	}
	start := time.Now()
	moved := 0
	for moved < n {
		k, err := r.Once(ctx)
		if err != nil {
			return err
		}
		if k == 0 {
			return fmt.Errorf("relayed %d of %d, then nothing", moved, n)
		}
		moved += k
	}
	res.Rate = float64(n) / time.Since(start).Seconds()
	return nil
}

func (rep *report) writeRelay(w func(string, ...any)) {
	if len(rep.Relay) == 0 {
		return
	}
	w("## The outbox relay: PostgreSQL to a broker\n\n")
	w("N jobs committed to a PostgreSQL outbox (`postgres.OutboxTx`, transactions of 100) beforehand, then moved by one `outbox.Relay` (Batch %d: one read, one `Enqueue` of the batch, one delete per round trip) to the target; jobs/s from the relay's start to the last delete.\n\n", relayBatch)
	w("| target | jobs | jobs/s | |\n|---|--:|--:|---|\n")
	for _, r := range rep.Relay {
		w("| %s | %d | %.0f | %s |\n", r.Target, r.N, r.Rate, r.Err)
	}
	w("\n")
}
