package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A system is one way of moving jobs through one broker: our facade, a raw
// client loop with the same durability, or a peer library. Each run gets a
// fresh system on queues of its own.
type system interface {
	// enqueue stores one job durably (as the system defines it), one round
	// trip per call. It is called from several goroutines at once.
	enqueue(ctx context.Context, payload []byte) error
	// consume starts c concurrent handlers that call handle with each job's
	// payload and then settle the job. stop ends them and waits.
	consume(ctx context.Context, c int, handle func(payload []byte)) (stop func(), err error)
	// close removes what the system created on the broker and closes its
	// connections.
	close() error
}

// batcher is a system that can also store many jobs in one call.
type batcher interface {
	enqueueBatch(ctx context.Context, payloads [][]byte) error
}

// payloadSize is the size of every job's payload.
const payloadSize = 100

// newPayload returns a payload whose first 8 bytes carry t (UnixNano), for
// the latency measurement.
func newPayload(t time.Time) []byte {
	p := make([]byte, payloadSize)
	binary.BigEndian.PutUint64(p, uint64(t.UnixNano()))
	for i := 8; i < len(p); i++ {
		p[i] = 'x'
	}
	return p
}

// sentAt reads the time newPayload put in p.
func sentAt(p []byte) time.Time {
	if len(p) < 8 {
		return time.Time{}
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(p)))
}

// plan is what one child run measures.
type plan struct {
	N           int           // jobs per phase
	Concs       []int         // handler concurrencies
	Rate        int           // offered jobs/s in the latency phase
	LatencyDur  time.Duration // length of the latency phase
	Producers   int           // goroutines calling enqueue
	PhaseLimit  time.Duration // a phase that takes longer fails
	SkipLatency bool
}

// result is what one child run reports. Rates are jobs/s; zero is "not
// measured".
type result struct {
	Backend, System string
	Note            string
	Err             string

	Enqueue      float64         // one job per call, Producers goroutines
	EnqueueBatch float64         // batches of 100, when the system has them
	Process      map[int]float64 // by concurrency
	P50, P99     time.Duration   // enqueue-to-handler-start at Rate
	LatencyN     int             // samples behind P50/P99
	Offered      float64         // the rate actually offered
	AllocsEnq    float64         // heap allocations per enqueued job
	AllocsProc   float64         // heap allocations per processed job (first concurrency)
	RSSMiB       float64         // peak resident set of the child process
	Seconds      float64         // wall time of the child
	Load         float64         // 1-minute load average when the child started
}

// measure runs every phase of p on s and fills r. A phase that fails ends
// the run with r.Err set; what was measured before stays.
func measure(ctx context.Context, s system, p plan, r *result) {
	r.Process = map[int]float64{}
	fail := func(phase string, err error) { r.Err = fmt.Sprintf("%s: %v", phase, err) }

	// Enqueue, one job per call: these jobs are then processed at the first
	// concurrency.
	ms := mallocs()
	d, err := timed(ctx, p.PhaseLimit, func(ctx context.Context) error { return enqueueN(ctx, s, p.N, p.Producers) })
	if err != nil {
		fail("enqueue", err)
		return
	}
	r.Enqueue = rate(p.N, d)
	r.AllocsEnq = float64(mallocs()-ms) / float64(p.N)

	for i, c := range p.Concs {
		if i > 0 {
			if _, err := timed(ctx, p.PhaseLimit, func(ctx context.Context) error { return preload(ctx, s, p.N, p.Producers, r) }); err != nil {
				fail("preload", err)
				return
			}
		}
		ms := mallocs()
		d, err := processN(ctx, s, p.N, c, p.PhaseLimit)
		if err != nil {
			fail(fmt.Sprintf("process c=%d", c), err)
			return
		}
		r.Process[c] = rate(p.N, d)
		if i == 0 {
			r.AllocsProc = float64(mallocs()-ms) / float64(p.N)
		}
	}
	if !p.SkipLatency {
		lat, offered, err := latency(ctx, s, p)
		if err != nil {
			fail("latency", err)
			return
		}
		r.LatencyN, r.Offered = len(lat), offered
		r.P50, r.P99 = percentile(lat, 50), percentile(lat, 99)
	}
}

// timed runs fn under limit and returns how long it took.
func timed(ctx context.Context, limit time.Duration, fn func(context.Context) error) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	start := time.Now()
	err := fn(ctx)
	return time.Since(start), err
}

func rate(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

// enqueueN enqueues n jobs, one per call, from w goroutines.
func enqueueN(ctx context.Context, s system, n, w int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, w)
	for range w {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if err := s.enqueue(ctx, newPayload(time.Now())); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// preload fills the queue with n jobs, in batches of 100 when s can, and
// records the batched rate.
func preload(ctx context.Context, s system, n, w int, r *result) error {
	b, ok := s.(batcher)
	if !ok {
		return enqueueN(ctx, s, n, w)
	}
	start := time.Now()
	for i := 0; i < n; i += 100 {
		batch := make([][]byte, 0, 100)
		for range min(100, n-i) {
			batch = append(batch, newPayload(time.Now()))
		}
		if err := b.enqueueBatch(ctx, batch); err != nil {
			return err
		}
	}
	if r.EnqueueBatch == 0 {
		r.EnqueueBatch = rate(n, time.Since(start))
	}
	return nil
}

// processN drains n waiting jobs with c handlers and returns how long it
// took from the start of consume to the n-th handler call.
func processN(ctx context.Context, s system, n, c int, limit time.Duration) (time.Duration, error) {
	var count atomic.Int64
	done := make(chan struct{})
	start := time.Now()
	stop, err := s.consume(ctx, c, func([]byte) {
		if count.Add(1) == int64(n) {
			close(done)
		}
	})
	if err != nil {
		return 0, err
	}
	var d time.Duration
	select {
	case <-done:
		d = time.Since(start)
	case <-time.After(limit):
		err = fmt.Errorf("handled %d of %d jobs in %v", count.Load(), n, limit)
	case <-ctx.Done():
		err = ctx.Err()
	}
	stop()
	return d, err
}

// latency runs handlers at the first concurrency while jobs are offered at
// p.Rate for p.LatencyDur, and returns each job's time from just before its
// enqueue call to the start of its handler.
func latency(ctx context.Context, s system, p plan) ([]time.Duration, float64, error) {
	n := max(1, int(float64(p.Rate)*p.LatencyDur.Seconds()))
	var mu sync.Mutex
	lat := make([]time.Duration, 0, n)
	done := make(chan struct{})
	stop, err := s.consume(ctx, p.Concs[0], func(b []byte) {
		d := time.Since(sentAt(b))
		mu.Lock()
		lat = append(lat, d)
		if len(lat) == n {
			close(done)
		}
		mu.Unlock()
	})
	if err != nil {
		return nil, 0, err
	}
	defer stop()
	time.Sleep(200 * time.Millisecond) // let the consumers settle

	// Producers take tickets paced at the rate; a late ticket is sent at
	// once, so a slow enqueue shows as latency, not as a lower rate.
	tickets := make(chan struct{}, n)
	errs := make(chan error, p.Producers)
	var wg sync.WaitGroup
	for range p.Producers {
		wg.Go(func() {
			for range tickets {
				if err := s.enqueue(ctx, newPayload(time.Now())); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	start := time.Now()
	interval := time.Second / time.Duration(p.Rate)
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		tickets <- struct{}{}
	}
	close(tickets)
	wg.Wait()
	offered := rate(n, time.Since(start))
	close(errs)
	if err := <-errs; err != nil {
		return nil, 0, err
	}
	select {
	case <-done:
	case <-time.After(p.PhaseLimit):
		mu.Lock()
		got := len(lat)
		mu.Unlock()
		return nil, 0, fmt.Errorf("handled %d of %d jobs", got, n)
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(lat), offered, nil
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

// peakRSS returns the process's peak resident set (VmHWM) in MiB.
func peakRSS() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return float64(kb) / 1024
		}
	}
	return 0
}

// errUnavailable marks a system that cannot run here (a peer that does not
// build, a service we lack); its message goes into the report.
var errUnavailable = errors.New("unavailable")
