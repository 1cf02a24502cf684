package flow_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/flow"
)

func TestRateConfig(t *testing.T) {
	t.Parallel()
	kv := newFakeKV()
	for _, tc := range []struct {
		name string
		cfg  flow.RateConfig
	}{
		{"no key", flow.RateConfig{Events: 1}},
		{"bad key", flow.RateConfig{Key: "/r", Events: 1}},
		{"no events", flow.RateConfig{Key: "r"}},
		{"negative events", flow.RateConfig{Key: "r", Events: -1}},
		{"NaN events", flow.RateConfig{Key: "r", Events: math.NaN()}},
		{"infinite events", flow.RateConfig{Key: "r", Events: math.Inf(1)}},
		{"negative period", flow.RateConfig{Key: "r", Events: 1, Period: -time.Second}},
		{"negative burst", flow.RateConfig{Key: "r", Events: 1, Burst: -1}},
		{"negative attempts", flow.RateConfig{Key: "r", Events: 1, MaxAttempts: -1}},
		{"interval under 1ns", flow.RateConfig{Key: "r", Events: 2e9}},
		{"burst window over MaxTTL", flow.RateConfig{Key: "r", Events: 1, Period: 24 * time.Hour, Burst: 10 * 366}},
	} {
		if _, err := flow.NewRate(kv, tc.cfg); err == nil {
			t.Errorf("%s: NewRate(%+v) accepted it", tc.name, tc.cfg)
		}
	}
	if _, err := flow.NewRate(nil, flow.RateConfig{Key: "r", Events: 1}); err == nil {
		t.Error("NewRate accepted a nil KV")
	}
	for _, tc := range []struct {
		cfg      flow.RateConfig
		interval time.Duration
		burst    int
	}{
		{flow.RateConfig{Key: "r", Events: 50}, 20 * time.Millisecond, 1},
		{flow.RateConfig{Key: "r", Events: 0.5, Burst: 4}, 2 * time.Second, 4},
		{flow.RateConfig{Key: "r", Events: 100, Period: time.Minute}, 600 * time.Millisecond, 1},
		{flow.RateConfig{Key: "r", Events: 3}, 333333333, 1},
	} {
		r, err := flow.NewRate(kv, tc.cfg)
		must(t, "NewRate", err)
		if r.Interval() != tc.interval || r.Burst() != tc.burst || r.Key() != "r" {
			t.Errorf("%+v: Interval, Burst = %v, %d; want %v, %d", tc.cfg, r.Interval(), r.Burst(), tc.interval, tc.burst)
		}
	}
}

// TestRateGCRA checks the algorithm to the nanosecond on the fake store: a
// burst, then one event per interval, waits that are exact, and a key that
// vanishes once the limit is idle.
func TestRateGCRA(t *testing.T) {
	t.Parallel()
	kv := newFakeKV()
	ctx := t.Context()
	const iv = 100 * time.Millisecond
	r, err := flow.NewRate(kv, flow.RateConfig{Key: "gcra", Events: 10, Burst: 3})
	must(t, "NewRate", err)
	take := func(want time.Duration) {
		t.Helper()
		wait, err := r.Take(ctx, kv.Now())
		must(t, "Take", err)
		if wait != want {
			t.Fatalf("Take at +%v: wait %v, want %v", kv.Now().Sub(time.Unix(1_700_000_000, 0)), wait, want)
		}
	}
	take(0)
	take(0)
	take(0)
	take(iv) // the burst is spent
	kv.Advance(iv - time.Millisecond)
	take(time.Millisecond)
	kv.Advance(time.Millisecond)
	take(0)
	take(iv)
	kv.Advance(iv / 2)
	take(iv / 2)

	// Idle for the burst window: the burst is back, the key kept for
	// KeepState.
	kv.Advance(iv/2 + 3*iv)
	if _, _, err := kv.Get(ctx, "gcra"); err != nil {
		t.Fatalf("the key is gone after the burst window, within KeepState: %v", err)
	}
	take(0)
	take(0)
	take(0)
	take(iv)

	// Idle for the burst window and KeepState: the key is gone and the
	// burst is back.
	kv.Advance(3*iv + flow.KeepState)
	if _, _, err := kv.Get(ctx, "gcra"); !errors.Is(err, driver.ErrKeyNotFound) {
		t.Fatalf("the key is still there after the burst window and KeepState: %v", err)
	}
	take(0)
	take(0)
	take(0)
	take(iv)

	// Steady demand, one Take a millisecond for 10 s: the burst and then
	// one per interval.
	kv.Advance(10 * iv)
	admitted := 0
	for range 10_000 {
		wait, err := r.Take(ctx, kv.Now())
		must(t, "Take", err)
		if wait == 0 {
			admitted++
		}
		kv.Advance(time.Millisecond)
	}
	if want := 3 + 100 - 1; admitted < want || admitted > want+1 {
		t.Fatalf("%d admitted in 10 s at 10/s with a burst of 3, want %d or %d", admitted, want, want+1)
	}
}

// TestRateReserve checks batches to the nanosecond on the fake store: up
// to n events one interval apart from the first due, whether the burst has
// some left (at once) or not, those due within the horizon only; a refusal
// that says when the next is due; and that a batch is the same limit as
// single Takes (another process shares it).
func TestRateReserve(t *testing.T) {
	t.Parallel()
	kv := newFakeKV()
	ctx := t.Context()
	const iv = 100 * time.Millisecond
	r, err := flow.NewRate(kv, flow.RateConfig{Key: "batch", Events: 10, Burst: 3})
	must(t, "NewRate", err)
	other, err := flow.NewRate(kv, flow.RateConfig{Key: "batch", Events: 10, Burst: 3})
	must(t, "NewRate", err)
	reserve := func(r *flow.Rate, n int, horizon time.Duration, wantCount int, wantFirst, wantWait time.Duration) {
		t.Helper()
		now := kv.Now()
		g, wait, err := r.Reserve(ctx, now, n, horizon)
		must(t, "Reserve", err)
		if g.Count != wantCount || wait != wantWait || (g.Count > 0 && g.First.Sub(now) != wantFirst) {
			t.Fatalf("Reserve(%d, %v) = %d events from %+v, wait %v; want %d from %+v, wait %v",
				n, horizon, g.Count, g.First.Sub(now), wait, wantCount, wantFirst, wantWait)
		}
		for i := 1; i < g.Count; i++ {
			if d := g.At(i).Sub(g.At(i - 1)); d != iv {
				t.Fatalf("events %d and %d of a grant are %v apart, want %v", i-1, i, d, iv)
			}
		}
	}
	// Idle: the burst of 3 (due 200 ms and 100 ms ago and now: at once),
	// and no more within 50 ms; then two more at +100 ms and +200 ms.
	reserve(r, 5, 50*time.Millisecond, 3, -2*iv, 0)
	reserve(r, 5, 2*iv, 2, iv, 0)
	// Everything to +200 ms is taken: the next is due at +300 ms, beyond
	// either horizon.
	reserve(other, 10, 250*time.Millisecond, 0, 0, 3*iv)
	reserve(other, 1, 0, 0, 0, 3*iv)
	// Within a horizon that reaches it: from +300 ms on, those due
	// within it.
	reserve(other, 2, 3*iv, 1, 3*iv, 0)
	reserve(other, 2, 4*iv, 1, 4*iv, 0)
	kv.Advance(5 * iv)
	// Due now, the last of the batch at +200 ms: within a horizon of 200
	// ms, not of 0.
	reserve(r, 3, 0, 1, 0, 0)
	reserve(r, 3, 2*iv, 2, iv, 0)
	// In 10 s of steady demand, batches admit what single Takes do, and the
	// events they reserve are due no sooner.
	kv.Advance(10 * iv)
	start := kv.Now()
	admitted := 0
	for range 1000 {
		g, _, err := r.Reserve(ctx, kv.Now(), 4, 3*iv)
		must(t, "Reserve", err)
		for i := range g.Count {
			if g.At(i).Before(start.Add(time.Duration(admitted-2) * iv)) {
				t.Fatalf("event %d reserved is due at +%v, before its turn", admitted, g.At(i).Sub(start))
			}
			admitted++
		}
		kv.Advance(10 * time.Millisecond)
	}
	// 3 at once, one per interval, and a batch of 4 from up to 3 intervals ahead.
	if want := 3 + 100 - 1 + 3; admitted < want || admitted > want+4 {
		t.Fatalf("%d reserved in 10 s at 10/s with a burst of 3, batches of 4 and a horizon of 3 intervals, want %d to %d", admitted, want, want+4)
	}
}

// TestRateProcesses: two Rates over one key (two processes) share its
// tokens: of their Takes at one instant exactly Burst are admitted, and one
// more once an interval has passed.
func TestRateProcesses(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind string) {
		c := newCluster(t, kind, "rate/procs")
		ctx := t.Context()
		cfg := flow.RateConfig{Key: "rate/procs", Events: 1, Period: 2 * time.Second, Burst: 3}
		a, err := flow.NewRate(c.Connect(t), cfg)
		must(t, "NewRate", err)
		b, err := flow.NewRate(c.Connect(t), cfg)
		must(t, "NewRate", err)
		admitted := 0
		var wait time.Duration
		for i := range 10 {
			r := a
			if i%2 == 1 {
				r = b
			}
			w, err := r.Take(ctx, c.Now())
			must(t, "Take", err)
			if w == 0 {
				admitted++
			} else {
				wait = w
			}
		}
		if admitted != 3 {
			t.Fatalf("%d of 10 Takes by two processes admitted, want the burst of 3", admitted)
		}
		if wait <= 0 || wait > 2*time.Second {
			t.Fatalf("a refused Take waits %v, want up to an interval (2s)", wait)
		}
		c.Sleep(wait)
		admitted = 0
		for i := range 6 {
			r := a
			if i%2 == 1 {
				r = b
			}
			w, err := r.Take(ctx, c.Now())
			must(t, "Take", err)
			if w == 0 {
				admitted++
			}
		}
		if admitted != 1 {
			t.Fatalf("%d of 6 Takes admitted after waiting %v, want 1", admitted, wait)
		}
	})
}

// TestRateVanishes: the key lives until its TAT or KeepState after its
// write, the later, and no longer, on every store.
func TestRateVanishes(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind string) {
		c := newCluster(t, kind, "rate/vanish")
		ctx := t.Context()
		kv := c.Connect(t)
		r, err := flow.NewRate(kv, flow.RateConfig{Key: "rate/vanish", Events: 5, Burst: 2}) // 200 ms apart
		must(t, "NewRate", err)
		for range 2 {
			wait, err := r.Take(ctx, c.Now())
			if err != nil || wait != 0 {
				t.Fatalf("Take = %v, %v; want admitted", wait, err)
			}
		}
		if _, _, err := kv.Get(ctx, "rate/vanish"); err != nil {
			t.Fatalf("the key is gone right after two Takes: %v", err)
		}
		c.Sleep(400*time.Millisecond + 100*time.Millisecond)
		if _, _, err := kv.Get(ctx, "rate/vanish"); err != nil {
			t.Fatalf("the key is gone after the burst window, within KeepState: %v", err)
		}
		c.Sleep(flow.KeepState)
		if _, _, err := kv.Get(ctx, "rate/vanish"); !errors.Is(err, driver.ErrKeyNotFound) {
			t.Fatalf("the key is there after the burst window and KeepState: %v", err)
		}
		for range 2 {
			wait, err := r.Take(ctx, c.Now())
			if err != nil || wait != 0 {
				t.Fatalf("Take after idling = %v, %v; want admitted", wait, err)
			}
		}
	})
}

// TestRateCost: the round trips the documentation promises.
func TestRateCost(t *testing.T) {
	t.Parallel()
	fake := newFakeKV()
	kv := &countingKV{KV: fake}
	ctx := t.Context()
	cfg := flow.RateConfig{Key: "cost", Events: 10, Burst: 3}
	r, err := flow.NewRate(kv, cfg)
	must(t, "NewRate", err)
	other, err := flow.NewRate(fake, cfg)
	must(t, "NewRate", err)
	step := func(what string, r *flow.Rate, wantWait bool, wantTrips int64) {
		t.Helper()
		before := kv.calls.Load()
		wait, err := r.Take(ctx, fake.Now())
		must(t, what, err)
		if (wait > 0) != wantWait {
			t.Fatalf("%s: wait %v", what, wait)
		}
		if got := kv.calls.Load() - before; got != wantTrips {
			t.Fatalf("%s: %d round trips, want %d", what, got, wantTrips)
		}
	}
	step("the first Take (Create)", r, false, 1)
	step("a Take on a known key (Update)", r, false, 1)
	step("another Take on a known key (Update)", r, false, 1)
	step("a Take its known state refuses", r, true, 0)
	fake.Advance(100 * time.Millisecond)
	step("another process's Take", other, false, 0)
	fake.Advance(100 * time.Millisecond)
	step("a Take on a stale state (Update, Get, Update)", r, false, 3)
	fake.Advance(flow.KeepState / 2)
	step("a Take after an idle spell within KeepState (Update)", r, false, 1)
	fake.Advance(flow.KeepState + time.Second)
	step("a Take after the key lapsed (Create)", r, false, 1)
}

// meddler is a KV on which every write loses: another writer gets there
// first each time.
type meddler struct{ *countingKV }

func (m meddler) bump(ctx context.Context, key string) {
	if _, rev, err := m.KV.Get(ctx, key); err == nil {
		_, _ = m.KV.Update(ctx, key, []byte("0"), rev, time.Second)
	} else {
		_, _ = m.KV.Create(ctx, key, []byte("0"), time.Second)
	}
}

func (m meddler) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	m.bump(ctx, key)
	return m.countingKV.Create(ctx, key, value, ttl)
}

func (m meddler) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	m.bump(ctx, key)
	return m.countingKV.Update(ctx, key, value, rev, ttl)
}

// TestRateContention: a Take whose every write loses gives up after
// MaxAttempts writes with a *ContentionError.
func TestRateContention(t *testing.T) {
	t.Parallel()
	kv := meddler{&countingKV{KV: newFakeKV()}}
	r, err := flow.NewRate(kv, flow.RateConfig{Key: "busy", Events: 1000, Burst: 1000, MaxAttempts: 4})
	must(t, "NewRate", err)
	_, err = r.Take(t.Context(), time.Time{})
	isErr(t, "Take under endless contention", err, flow.ErrContention)
	var ce *flow.ContentionError
	if !errors.As(err, &ce) || ce.Attempts != 4 || ce.Key != "busy" {
		t.Fatalf("error %#v, want a *ContentionError for 4 attempts on busy", err)
	}
	if got := kv.calls.Load(); got != 4+4 {
		t.Fatalf("%d round trips, want 4 writes and 4 reads", got)
	}
}

// TestRateOddValue: a value that is no TAT is replaced.
func TestRateOddValue(t *testing.T) {
	t.Parallel()
	kv := newFakeKV()
	ctx := t.Context()
	_, err := kv.Create(ctx, "odd", []byte("not a time"), 0)
	must(t, "Create", err)
	r, err := flow.NewRate(kv, flow.RateConfig{Key: "odd", Events: 1})
	must(t, "NewRate", err)
	if wait, err := r.Take(ctx, kv.Now()); err != nil || wait != 0 {
		t.Fatalf("Take over an odd value = %v, %v; want admitted", wait, err)
	}
	if wait, err := r.Take(ctx, kv.Now()); err != nil || wait != time.Second {
		t.Fatalf("the next Take = %v, %v; want a wait of 1s", wait, err)
	}
}

// TestRateErrors: a store error is returned, wrapped; a Take waiting for
// another ends with its context.
func TestRateErrors(t *testing.T) {
	t.Parallel()
	boom := errors.New("store down")
	r, err := flow.NewRate(failingKV{boom}, flow.RateConfig{Key: "e", Events: 1})
	must(t, "NewRate", err)
	if _, err := r.Take(t.Context(), time.Time{}); !errors.Is(err, boom) {
		t.Fatalf("Take on a failing store: %v, want its error", err)
	}
	blocked := &blockingKV{KV: newFakeKV(), entered: make(chan struct{}), release: make(chan struct{})}
	r, err = flow.NewRate(blocked, flow.RateConfig{Key: "b", Events: 1})
	must(t, "NewRate", err)
	done := make(chan error, 1)
	go func() { _, err := r.Take(context.Background(), time.Time{}); done <- err }()
	<-blocked.entered
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := r.Take(ctx, time.Time{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Take behind a blocked one = %v, want its context's error", err)
	}
	close(blocked.release)
	if err := <-done; err != nil {
		t.Fatalf("the blocked Take: %v", err)
	}
}

// blockingKV holds the first Create until release is closed.
type blockingKV struct {
	flow.KV
	entered, release chan struct{}
}

func (b *blockingKV) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	close(b.entered)
	<-b.release
	return b.KV.Create(ctx, key, value, ttl)
}

// TestRateCorruptState: a TAT further ahead than any Rate writes (a writer
// to the store set it to MaxInt64, year 2262) is replaced, with a warning,
// instead of making every Take wait for centuries; a TAT within the reach
// of a Rate's writes is a real one and is waited for.
func TestRateCorruptState(t *testing.T) {
	t.Parallel()
	kv := newFakeKV()
	ctx := t.Context()
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	_, err := kv.Create(ctx, "corrupt", []byte(strconv.FormatInt(math.MaxInt64, 10)), 0)
	must(t, "Create", err)
	r, err := flow.NewRate(kv, flow.RateConfig{Key: "corrupt", Events: 1, Logger: log})
	must(t, "NewRate", err)
	for i := range 2 { // the first Take learns of the key, the second reads it
		if wait, err := r.Take(ctx, kv.Now()); err != nil || wait > time.Second {
			t.Fatalf("Take %d over a TAT of MaxInt64 = %v, %v; want admitted or a wait of 1s at most", i, wait, err)
		}
	}
	if !strings.Contains(logs.String(), "corrupt") {
		t.Errorf("no warning of the corrupt state; logs: %q", logs.String())
	}

	// 30 s ahead: within a minute's horizon, so a real state.
	ahead := kv.Now().Add(30 * time.Second).UnixNano()
	_, err = kv.Create(ctx, "ahead", []byte(strconv.FormatInt(ahead, 10)), time.Minute)
	must(t, "Create", err)
	r, err = flow.NewRate(kv, flow.RateConfig{Key: "ahead", Events: 1, Logger: log})
	must(t, "NewRate", err)
	if wait, err := r.Take(ctx, kv.Now()); err != nil || wait != 30*time.Second {
		t.Fatalf("Take over a TAT 30 s ahead = %v, %v; want a wait of 30s", wait, err)
	}
}
