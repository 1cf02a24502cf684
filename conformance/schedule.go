package conformance

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// testScheduleOnePerTick: one schedule every second, run by 3 platforms for
// a few seconds: exactly one job per tick, and no tick missed.
func testScheduleOnePerTick(t *testing.T, e *env) {
	var mu sync.Mutex
	ticks := map[string]int{}
	h := func(_ context.Context, j *ap.Job) error {
		mu.Lock()
		ticks[j.Headers[ap.ScheduleTickHeader]]++
		mu.Unlock()
		return nil
	}
	s := ap.Schedule{Name: e.queue, Every: time.Second, Job: ap.Job{Type: "tick", Queue: e.queue}}
	var workers []*worker
	for range 3 {
		cfg := e.config()
		cfg.Schedules = []ap.Schedule{s}
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
		workers = append(workers, e.worker(cfg).handle(t, "tick", h).start(t))
	}
	started := time.Now() // every scheduler runs from here
	time.Sleep(3500 * time.Millisecond)
	stopping := time.Now()
	for _, w := range workers { // the schedulers stop; the queued ticks are handed back
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = w.P.Stop(ctx)
		cancel()
	}
	stopped := time.Now()                              // no scheduler runs from here
	e.worker(e.config()).handle(t, "tick", h).start(t) // works what is left
	e.settle()
	mu.Lock()
	defer mu.Unlock()
	var got []time.Time
	for s, n := range ticks {
		tt, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatalf("tick header %q: %v", s, err)
		}
		if n != 1 {
			t.Errorf("tick %s: %d jobs; want 1", s, n)
		}
		got = append(got, tt)
	}
	sort.Slice(got, func(i, k int) bool { return got[i].Before(got[k]) })
	secs := func(a, b time.Time) int { return int(b.Unix() - a.Unix()) } // whole-second ticks in (a, b]
	if lo, hi := secs(started, stopping), secs(started, stopped)+1; len(got) < lo || len(got) > hi {
		t.Fatalf("%d ticks of a 1s schedule run for %v (stopped after %v): %v; want %d to %d",
			len(got), stopping.Sub(started), stopped.Sub(started), got, lo, hi)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Sub(got[i-1]) != time.Second {
			t.Fatalf("ticks %v: one missed", got)
		}
	}
}
