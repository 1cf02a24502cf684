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
	time.Sleep(3500 * time.Millisecond)
	for _, w := range workers { // the schedulers stop; the queued ticks are handed back
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = w.P.Stop(ctx)
		cancel()
	}
	w := e.worker(e.config()).handle(t, "tick", h).start(t) // works what is left
	_ = w
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
	if len(got) < 3 || len(got) > 4 {
		t.Fatalf("%d ticks in 3.5s of a 1s schedule (%v); want 3 or 4", len(got), got)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Sub(got[i-1]) != time.Second {
			t.Fatalf("ticks %v: one missed", got)
		}
	}
}
