package main

// The limits rows: three platforms sharing one queue and a cluster-wide
// limit on one job type, as the conformance cases Flow/RateLimit and
// Flow/ClusterConcurrency run them (conformance/limits.go). How close the
// achieved rate comes to the limit, and how many jobs run at once under a
// concurrency limit, were asserted there; on a loaded machine they depend
// on how fast the workers are, not on the limit, so the suite now asserts
// only what load cannot break (never over the limit, every job starts) and
// the figures are measured here. The three platforms have backends (and
// connections) of their own, in one child process per backend.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/azure"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	apnats "github.com/asyncplatform/asyncplatform/backend/nats"
	"github.com/asyncplatform/asyncplatform/backend/rabbit"
	apredis "github.com/asyncplatform/asyncplatform/backend/redis"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/pgstore"
)

// limitsSystem names the limits child in a childSpec.
const limitsSystem = "limits"

// The two runs, as the conformance cases have them.
const (
	limitProcs   = 3  // platforms sharing the limit
	limitWorkers = 20 // each one's concurrency

	limitRate, limitBurst = 50, 5
	rateBacklog           = 100              // jobs kept waiting
	rateObserved          = 12 * time.Second // from the first start
	rateWindow            = 10 * time.Second
	rateSlack             = time.Second // a start stamped late, as the conformance case allows

	limitSlots    = 5
	slotHold      = 300 * time.Millisecond // each handler's run
	slotBacklog   = 30
	slotObserved  = 8 * time.Second
	slotLimitWait = 200 * time.Millisecond // LimitDelay, as in the conformance case
)

// limitsResult is what one limits child reports.
type limitsResult struct {
	Backend string

	// The rate: starts in the rateWindow after the first second, and the
	// most in any rateWindow; Jobs enqueued, Unstarted of them at the end.
	Starts          int
	PerSecond       float64
	Most            int
	Jobs, Unstarted int

	// The cluster concurrency: the most handlers running at once, and the
	// mean running from the first second to the end of the backlog.
	Peak     int
	Mean     float64
	SlotJobs int

	Load float64
	Err  string
}

// rateBound is the most starts a rateWindow may hold: the limit's, and a
// second's worth for a start stamped late.
func rateBound() (limit, withSlack int) {
	limit = int(rateWindow/time.Second)*limitRate + limitBurst
	return limit, limit + int(rateSlack/time.Second)*limitRate
}

// measureLimits measures every backend o names, one after another.
func measureLimits(o options) []limitsResult {
	var out []limitsResult
	for _, b := range storeBackends(o) {
		r := limitsResult{Backend: b}
		spec := childSpec{Backend: b, System: limitsSystem, Srv: o.Srv}
		if err := runJSONChild(spec, 5*time.Minute, &r); err != nil {
			r.Err = err.Error()
		}
		log.Printf("%s limits: %s", b, r.summary())
		out = append(out, r)
	}
	return out
}

// runJSONChild runs spec in a child process and reads its last line of
// output, JSON, into r.
func runJSONChild(spec childSpec, limit time.Duration, r any) error {
	js, _ := json.Marshal(spec)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, self, "-child", string(js))
	var out, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err = cmd.Run()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), r); jerr != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 300 {
			msg = msg[len(msg)-300:]
		}
		return fmt.Errorf("child failed: %v %s", err, msg)
	}
	return nil
}

// runLimitsChild measures one backend and prints its result as JSON.
func runLimitsChild(spec childSpec) {
	r := limitsResult{Backend: spec.Backend, Load: loadAvg()}
	if err := limitsRuns(context.Background(), spec, &r); err != nil {
		r.Err = err.Error()
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}

func limitsRuns(ctx context.Context, spec childSpec, r *limitsResult) error {
	pid := os.Getpid()

	// The rate: no-op handlers, the default LimitDelay.
	spans, jobs, err := limitRun(ctx, spec, fmt.Sprintf("limits-rate-%d", pid),
		ap.TypeLimit{Rate: limitRate, Burst: limitBurst}, 0, 0, rateBacklog, rateObserved)
	if err != nil {
		return fmt.Errorf("rate: %w", err)
	}
	starts := make([]int64, len(spans))
	for i, s := range spans {
		starts[i] = s.start
	}
	slices.Sort(starts)
	r.Jobs, r.Unstarted = jobs, jobs-len(starts)
	if len(starts) > 0 {
		t0 := starts[0] + int64(time.Second) // past the start-up: the first claims and the burst
		for _, s := range starts {
			if s >= t0 && s < t0+int64(rateWindow) {
				r.Starts++
			}
		}
		r.PerSecond = float64(r.Starts) / rateWindow.Seconds()
		for i, j := 0, 0; i < len(starts); i++ { // each window begins at a start
			for j < len(starts) && starts[j] < starts[i]+int64(rateWindow) {
				j++
			}
			r.Most = max(r.Most, j-i)
		}
	}

	// The cluster concurrency: handlers of slotHold.
	spans, jobs, err = limitRun(ctx, spec, fmt.Sprintf("limits-conc-%d", pid),
		ap.TypeLimit{ClusterConcurrency: limitSlots}, slotLimitWait, slotHold, slotBacklog, slotObserved)
	if err != nil {
		return fmt.Errorf("cluster concurrency: %w", err)
	}
	r.SlotJobs = jobs
	r.Peak, r.Mean = running(spans, time.Second, slotObserved)
	return nil
}

// span is one handler run: Unix nanoseconds; end 0: not ended.
type span struct{ start, end int64 }

// limitRun starts limitProcs platforms on one queue with lim on the job
// type "limited" and handlers that run for hold, keeps about backlog jobs
// waiting for observed from the first start, then waits for every job
// enqueued to run (a minute at most) and stops. It returns the handler
// runs and how many jobs were enqueued.
func limitRun(ctx context.Context, spec childSpec, tag string, lim ap.TypeLimit, delay, hold time.Duration, backlog int, observed time.Duration) (_ []span, jobs int, err error) {
	bes, cleanup, err := openShared(ctx, spec.Backend, tag, spec.Srv)
	if err != nil {
		return nil, 0, err
	}
	queue := "bench-" + tag
	defer func() { err = errors.Join(err, cleanup(queue)) }()

	var (
		mu    sync.Mutex
		spans []span
	)
	handler := func(context.Context, *ap.Job) error {
		mu.Lock()
		i := len(spans)
		spans = append(spans, span{start: time.Now().UnixNano()})
		mu.Unlock()
		time.Sleep(hold)
		mu.Lock()
		spans[i].end = time.Now().UnixNano()
		mu.Unlock()
		return nil
	}
	started := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(spans)
	}
	var plats []*ap.Platform
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, p := range plats {
			err = errors.Join(err, p.Stop(sctx))
		}
	}()
	for _, be := range bes {
		p, err := ap.New(be, ap.Config{
			Queues:     map[string]ap.QueueConfig{queue: {Concurrency: limitWorkers}},
			Limits:     map[string]ap.TypeLimit{"limited": lim},
			LimitDelay: delay,
			// What is measured is the limit alone, as in the conformance
			// cases.
			DisableIsolation: true,
			Logger:           quiet,
		})
		if err != nil {
			return nil, 0, err
		}
		if err := p.Handle("limited", handler); err != nil {
			return nil, 0, err
		}
		if err := p.Start(ctx); err != nil {
			return nil, 0, err
		}
		plats = append(plats, p)
	}
	enqueue := func(n int) error {
		js := make([]*ap.Job, n)
		for i := range js {
			js[i] = &ap.Job{Type: "limited", Queue: queue}
		}
		if err := plats[0].EnqueueBatch(ctx, js); err != nil {
			return err
		}
		jobs += n
		return nil
	}
	if err := enqueue(backlog); err != nil {
		return nil, 0, err
	}
	if !waitUntil(30*time.Second, func() bool { return started() > 0 }) {
		return nil, jobs, errors.New("no job started within 30s")
	}
	first := time.Now()
	for time.Since(first) < observed {
		time.Sleep(200 * time.Millisecond)
		if n := backlog - (jobs - started()); n > 0 {
			if err := enqueue(n); err != nil {
				return nil, jobs, err
			}
		}
	}
	waitUntil(time.Minute, func() bool { return started() >= jobs })
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(spans), jobs, nil
}

// waitUntil polls cond every 50 ms for at most d.
func waitUntil(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// running returns the most spans running at one instant, and the mean
// number running from `from` to `to` after the first start.
func running(spans []span, from, to time.Duration) (peak int, mean float64) {
	type ev struct {
		at int64
		d  int
	}
	now := time.Now().UnixNano()
	var evs []ev
	for _, s := range spans {
		end := s.end
		if end == 0 {
			end = now
		}
		evs = append(evs, ev{s.start, 1}, ev{end, -1})
	}
	if len(evs) == 0 {
		return 0, 0
	}
	slices.SortFunc(evs, func(a, b ev) int {
		if a.at != b.at {
			return int(min(max(a.at-b.at, -1), 1))
		}
		return a.d - b.d // an end before a start at the same instant
	})
	a, b := evs[0].at+int64(from), evs[0].at+int64(to)
	n, area, last := 0, 0.0, a
	for _, e := range evs {
		if t := min(max(e.at, a), b); t > last {
			area += float64(n) * float64(t-last)
			last = t
		}
		n += e.d
		peak = max(peak, n)
	}
	return peak, area / float64(b-a)
}

// openShared opens limitProcs backends of one kind over one namespace
// (queues and store) named after tag; cleanup deletes the queue, closes
// them and removes what they made, the store's keys included.
func openShared(ctx context.Context, backend, tag string, srv servers) (bes []driver.Backend, cleanup func(queue string) error, err error) {
	var closers []func() error
	closeAll := func() error {
		var err error
		for _, be := range bes {
			err = errors.Join(err, be.Close())
		}
		for _, c := range closers {
			err = errors.Join(err, c())
		}
		return err
	}
	// after removes what the backends made besides the queue, once closed.
	after := func() error { return nil }
	add := func(be driver.Backend, err error) error {
		if err == nil {
			bes = append(bes, be)
		}
		return err
	}
	switch backend {
	case "memory":
		broker := memory.NewBroker()
		for range limitProcs {
			bes = append(bes, broker.Connect())
		}
	case "redis":
		prefix := "bench-" + tag
		for range limitProcs {
			rdb := goredis.NewClient(&goredis.Options{Addr: srv.Redis})
			closers = append(closers, rdb.Close)
			if err = add(apredis.New(ctx, apredis.Config{Client: rdb, Prefix: prefix, Logger: quiet})); err != nil {
				break
			}
		}
		after = func() error { return deleteKeys(srv.Redis, "{"+prefix+"}*", "{"+prefix+":*") }
	case "nats":
		stream := "bench-" + tag
		for range limitProcs {
			if err = add(apnats.New(ctx, apnats.Config{URL: srv.NATS, Stream: stream, Logger: quiet})); err != nil {
				break
			}
		}
		after = func() error {
			deleteStreams(srv.NATS, stream, stream+"_DELAY", stream+"_DEAD", stream+"_CLAIM", stream+"_HOLD", "KV_"+stream+"_STORE")
			return nil
		}
	case "rabbit":
		// RabbitMQ keeps no state: the limits' are in the PostgreSQL
		// companion, one table, a pool per platform.
		table := "bench_" + strings.ReplaceAll(tag, "-", "_")
		for range limitProcs {
			var st *pgstore.Store
			if st, err = pgstore.New(ctx, pgstore.Config{URL: srv.Postgres, Table: table, Logger: quiet}); err != nil {
				break
			}
			closers = append(closers, st.Close)
			if err = add(rabbit.New(ctx, rabbit.Config{URL: srv.AMQP, Prefix: "bench", Logger: quiet, Store: st})); err != nil {
				break
			}
		}
		after = func() error { return dropTable(srv.Postgres, table) }
	case "azure":
		if srv.Azure == "" {
			return nil, nil, fmt.Errorf("%w: no Azurite connection string", errUnavailable)
		}
		// A prefix, so a container, of its own: emptied after.
		for range limitProcs {
			if err = add(azure.New(ctx, azure.Config{ConnectionString: srv.Azure, Prefix: "blimits", Logger: quiet})); err != nil {
				break
			}
		}
		if err == nil {
			var d driver.Store
			if d, err = driver.StoreOf(bes[0]); err == nil {
				err = emptyDriverStore(ctx, d) // a run before that failed
			}
		}
	default:
		err = fmt.Errorf("unknown backend %q", backend)
	}
	if err != nil {
		return nil, nil, errors.Join(err, closeAll(), after())
	}
	cleanup = func(queue string) error {
		var err error
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if d, ok := bes[0].(driver.QueueDeleter); ok {
			err = d.DeleteQueue(dctx, queue)
		}
		if backend == "azure" {
			if d, serr := driver.StoreOf(bes[0]); serr == nil {
				err = errors.Join(err, emptyDriverStore(dctx, d))
			}
		}
		return errors.Join(err, closeAll(), after())
	}
	return bes, cleanup, nil
}

// deleteKeys deletes the Redis keys matching the patterns.
func deleteKeys(addr string, patterns ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := goredis.NewClient(&goredis.Options{Addr: addr})
	defer rdb.Close()
	for _, pat := range patterns {
		keys, err := rdb.Keys(ctx, pat).Result()
		if err == nil && len(keys) > 0 {
			err = rdb.Del(ctx, keys...).Err()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// emptyDriverStore deletes every key of d.
func emptyDriverStore(ctx context.Context, d driver.Store) error {
	for {
		keys, err := d.List(ctx, "", "", 1000)
		if err != nil || len(keys) == 0 {
			return err
		}
		for _, k := range keys {
			if err := d.Delete(ctx, k, ""); err != nil {
				return err
			}
		}
	}
}

func (r limitsResult) summary() string {
	s := fmt.Sprintf("rate: %d starts in %v after the first second (%.1f/s), at most %d in any %v, %d of %d jobs not started; cluster concurrency: peak %d, mean %.2f",
		r.Starts, rateWindow, r.PerSecond, r.Most, rateWindow, r.Unstarted, r.Jobs, r.Peak, r.Mean)
	if r.Err != "" {
		s += " ERROR " + r.Err
	}
	return s
}

// writeLimits writes the limits table.
func (rep *report) writeLimits(w func(string, ...any)) {
	if len(rep.Limits) == 0 {
		return
	}
	bound, withSlack := rateBound()
	w("## Limits: rate and cluster concurrency\n\n")
	w("These bounds were assertions of the conformance cases `Flow/RateLimit` and `Flow/ClusterConcurrency` (conformance/limits.go) and moved here: how close the achieved rate comes to the limit is a matter of speed, and speed on a loaded machine is a figure, not a test. The suite still asserts what load cannot break (never more than the limit admits, every job starts in the end).\n\n")
	w("%d platforms, each with a backend (connections) of its own, in one process per backend, share one queue at concurrency %d each and a cluster-wide limit on its one job type (RabbitMQ's limits are in the PostgreSQL companion store). ", limitProcs, limitWorkers)
	w("**Rate**: `TypeLimit{Rate: %d, Burst: %d}`, no-op handlers, about %d jobs kept waiting for %v from the first start: **starts** in the %v after the first second (the limit admits %d) and **starts/s** over them; **most** starts in any %v window (the limit admits %d; a start stamped late adds up to %v's worth: %d). ",
		limitRate, limitBurst, rateBacklog, rateObserved, rateWindow, int(rateWindow/time.Second)*limitRate, rateWindow, bound, rateSlack, withSlack)
	w("**Cluster concurrency**: `TypeLimit{ClusterConcurrency: %d}`, handlers of %v, LimitDelay %v, about %d jobs kept waiting for %v: the **peak** running at once (never above %d) and the **mean** running from the first second to the end of the backlog (at most %d). How soon the slots of a process that vanishes come back is not measured here (the conformance case kills one).\n\n",
		limitSlots, slotHold, slotLimitWait, slotBacklog, slotObserved, limitSlots, limitSlots)
	w("| backend | starts in %v | starts/s | most in any %v | ≤ %d | jobs (not started) | peak running | ≤ %d | mean running | load | |\n|---|--:|--:|--:|:-:|--:|--:|:-:|--:|--:|---|\n", rateWindow, rateWindow, withSlack, limitSlots)
	yes := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "**no**"
	}
	for _, r := range rep.Limits {
		w("| %s | %d | %.1f | %d | %s | %d (%d) | %d | %s | %.2f | %.1f | %s |\n", r.Backend, r.Starts, r.PerSecond, r.Most, yes(r.Most <= withSlack),
			r.Jobs, r.Unstarted, r.Peak, yes(r.Peak <= limitSlots), r.Mean, r.Load, r.Err)
	}
	w("\n")
}
