package main

// The churn row: what a backlog held back by a rate costs the broker. On
// Redis (the -redis server: give it one of its own, as INFO commandstats
// counts every client's commands), a platform at concurrency 10 with a
// rate of 1 job/s on a type: the commands per second the server runs with
// no job waiting (idle), with churnBacklog jobs waiting, and, for
// scale, what one job costs with no limit at all.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	ap "github.com/asyncplatform/asyncplatform"
	apredis "github.com/asyncplatform/asyncplatform/backend/redis"
)

const (
	churnBacklog = 2000
	churnSettle  = 10 * time.Second // after the start, before counting
	churnWindow  = 20 * time.Second // the span counted
)

// churnResult is what the churn phase measured.
type churnResult struct {
	Idle, Backlog float64 // commands/s
	Starts        float64 // jobs started/s during the backlog's window
	PerJob        float64 // commands per job with no limit
	Err           string
}

// measureChurn runs the churn phase on o's Redis.
func measureChurn(o options) *churnResult {
	r := &churnResult{}
	if err := churn(context.Background(), o.Srv.Redis, r); err != nil {
		r.Err = err.Error()
	}
	log.Printf("redis churn: idle %.0f cmd/s, %d waiting at 1/s %.0f cmd/s with %.2f starts/s, %.1f cmd per job unlimited %s",
		r.Idle, churnBacklog, r.Backlog, r.Starts, r.PerJob, r.Err)
	return r
}

// commands returns the commands the server has run, from INFO commandstats.
func commands(ctx context.Context, rdb *goredis.Client) (int64, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		_, rest, ok := strings.Cut(line, "calls=")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, ",")
		c, _ := strconv.ParseInt(v, 10, 64)
		n += c
	}
	return n, nil
}

// rateOver counts the commands per second over d.
func rateOver(ctx context.Context, rdb *goredis.Client, d time.Duration) (float64, error) {
	a, err := commands(ctx, rdb)
	if err != nil {
		return 0, err
	}
	time.Sleep(d)
	b, err := commands(ctx, rdb)
	// INFO itself is a command: one of the two reads is counted.
	return float64(b-a-1) / d.Seconds(), err
}

func churn(ctx context.Context, addr string, r *churnResult) error {
	rdb := goredis.NewClient(&goredis.Options{Addr: addr})
	defer rdb.Close()
	be, err := apredis.New(ctx, apredis.Config{Client: rdb, Prefix: fmt.Sprintf("bench-churn-%d", time.Now().UnixNano()), Logger: quiet})
	if err != nil {
		return err
	}
	defer be.Close()
	// run enqueues jobs, then starts a platform and calls measure with
	// the count of jobs started and the server's command count before the
	// start.
	run := func(queue string, limits map[string]ap.TypeLimit, jobs int, measure func(started *atomic.Int64, before int64) error) error {
		p, err := ap.New(be, ap.Config{Queues: map[string]ap.QueueConfig{queue: {Concurrency: 10}}, Limits: limits, Logger: quiet})
		if err != nil {
			return err
		}
		batch := make([]*ap.Job, 0, 100)
		for i := range jobs {
			batch = append(batch, &ap.Job{Type: "limited", Queue: queue})
			if len(batch) == cap(batch) || i == jobs-1 {
				if err := p.EnqueueBatch(ctx, batch); err != nil {
					return err
				}
				batch = batch[:0]
			}
		}
		var started atomic.Int64
		if err := p.Handle("limited", func(context.Context, *ap.Job) error { started.Add(1); return nil }); err != nil {
			return err
		}
		before, err := commands(ctx, rdb)
		if err != nil {
			return err
		}
		if err := p.Start(ctx); err != nil {
			return err
		}
		err = measure(&started, before)
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return errors.Join(err, p.Stop(sctx), be.DeleteQueue(sctx, queue))
	}
	rate := map[string]ap.TypeLimit{"limited": {Rate: 1}}
	if err := run("bench-churn-idle", rate, 0, func(*atomic.Int64, int64) error {
		time.Sleep(churnSettle)
		r.Idle, err = rateOver(ctx, rdb, churnWindow)
		return err
	}); err != nil {
		return fmt.Errorf("idle: %w", err)
	}
	if err := run("bench-churn-backlog", rate, churnBacklog, func(started *atomic.Int64, _ int64) error {
		time.Sleep(churnSettle)
		s0 := started.Load()
		r.Backlog, err = rateOver(ctx, rdb, churnWindow)
		r.Starts = float64(started.Load()-s0) / churnWindow.Seconds()
		return err
	}); err != nil {
		return fmt.Errorf("backlog: %w", err)
	}
	const plain = 1000
	return run("bench-churn-plain", nil, plain, func(started *atomic.Int64, before int64) error {
		t0 := time.Now()
		for started.Load() < plain {
			if time.Since(t0) > time.Minute {
				return fmt.Errorf("%d of %d jobs in a minute", started.Load(), plain)
			}
			time.Sleep(10 * time.Millisecond)
		}
		after, err := commands(ctx, rdb)
		r.PerJob = float64(after-before) / plain
		return err
	})
}

// writeChurn writes the churn table.
func (rep *report) writeChurn(w func(string, ...any)) {
	r := rep.Churn
	if r == nil {
		return
	}
	w("## A backlog held back by a rate: what it costs the broker\n\n")
	w("Redis at %s (a server of its own: `INFO commandstats` counts every client), one platform at concurrency 10 with `Rate: 1` on the job type. Commands per second the server ran over %v, %v after the start: with no job waiting (*idle*), and with %d jobs waiting; *starts/s* is the jobs started in that window; *per job* is the commands one job costs with no limit (1,000 jobs, enqueue excluded). The goal (issue 34): the backlog's commands within 2× of idle plus the starts' own.\n\n",
		rep.Options.Srv.Redis, churnWindow, churnSettle, churnBacklog)
	w("| idle cmd/s | %d waiting: cmd/s | starts/s | per job (no limit) | bound: 2 × (idle + starts × per job) | |\n|--:|--:|--:|--:|--:|---|\n", churnBacklog)
	bound := 2 * (r.Idle + r.Starts*r.PerJob)
	w("| %.0f | %.0f | %.2f | %.1f | %.0f | %s |\n\n", r.Idle, r.Backlog, r.Starts, r.PerJob, bound, r.Err)
}
