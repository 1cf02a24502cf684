package schedule

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// job stands for the platform's job type, which the scheduler never looks
// into.
type job struct {
	Type    string `json:"type"`
	Payload string `json:"payload,omitempty"`
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fired records the calls of Config.Fire, in order.
type fired struct {
	mu    sync.Mutex
	ticks []time.Time
	fail  int   // the first fail calls fail
	err   error // with this error
}

func (f *fired) fire(_ context.Context, _ *job, tick time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ticks = append(f.ticks, tick)
	if len(f.ticks) <= f.fail {
		return f.err
	}
	return nil
}

func (f *fired) got() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ticks)
}

// store returns a new memory broker's store.
func store(t *testing.T) driver.Store {
	t.Helper()
	b, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	d, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// newScheduler returns a scheduler over d whose Fire records into f.
func newScheduler(d driver.Store, f *fired, worker string) *Scheduler[job] {
	return New(Config[job]{Ticks: kv.Of(d, kv.Schedules), Defs: kv.Of(d, kv.ScheduleDefs), Log: quiet, Worker: worker,
		Fire: f.fire, Final: func(err error) bool { return errors.Is(err, errFinal) }})
}

var errFinal = errors.New("final")

// hourAgo returns the tick of an hourly schedule n hours before the last
// one at or before now.
func hourAgo(n int) time.Time {
	h := time.Hour.Nanoseconds()
	return time.Unix(0, (time.Now().UnixNano()/h-int64(n))*h)
}

func setLast(t *testing.T, d driver.Store, name string, last time.Time) {
	t.Helper()
	_, err := kv.Of(d, kv.Schedules).Create(context.Background(), name, []byte(strconv.FormatInt(last.UnixNano(), 10)), 0)
	if err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip("no tzdata:", err)
	}
	from := time.Date(2026, 1, 10, 12, 0, 0, 500, time.UTC)
	for _, c := range []struct {
		name  string
		cron  string
		loc   *time.Location
		every time.Duration
		want  time.Time // zero: refused
	}{
		{"six fields in a zone", "30 0 9 * * *", paris, 0, time.Date(2026, 1, 11, 8, 0, 30, 0, time.UTC)},
		{"five fields, UTC", "0 9 * * *", nil, 0, time.Date(2026, 1, 11, 9, 0, 0, 0, time.UTC)},
		{"CRON_TZ wins over loc", "CRON_TZ=Europe/Paris 0 9 * * *", time.UTC, 0, time.Date(2026, 1, 11, 8, 0, 0, 0, time.UTC)},
		{"descriptor", "@hourly", nil, 0, time.Date(2026, 1, 10, 13, 0, 0, 0, time.UTC)},
		{"every, since the epoch", "", nil, 7 * time.Minute, time.Unix(0, (from.UnixNano()/(7*time.Minute).Nanoseconds()+1)*(7*time.Minute).Nanoseconds())},
		{"every 1ms", "", nil, time.Millisecond, from.Truncate(time.Millisecond).Add(time.Millisecond)},
		{"neither", "", nil, 0, time.Time{}},
		{"both", "* * * * *", nil, time.Second, time.Time{}},
		{"under 1ms", "", nil, time.Millisecond - 1, time.Time{}},
		{"@every", "@every 1s", nil, 0, time.Time{}},
		{"bad field", "61 * * * * *", nil, 0, time.Time{}},
	} {
		next, err := parse(c.cron, c.loc, c.every)
		switch {
		case c.want.IsZero() && err == nil:
			t.Errorf("%s: parse(%q, %v) accepted", c.name, c.cron, c.every)
		case !c.want.IsZero() && err != nil:
			t.Errorf("%s: parse(%q, %v): %v", c.name, c.cron, c.every, err)
		case err == nil:
			if got := next(from); !got.Equal(c.want) {
				t.Errorf("%s: first tick after %v = %v; want %v", c.name, from, got, c.want)
			}
		}
	}
}

func TestMissedTicks(t *testing.T) {
	t.Parallel()
	next, err := parse("", nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	last := time.Unix(1000, 0)
	now := time.Unix(1010, 500) // ticks 1001 to 1010 missed
	for _, n := range []int{0, 1, 3, 10, 20} {
		missed, latest := missedTicks(next, last, now, n)
		if missed != 10 {
			t.Fatalf("n=%d: %d missed; want 10", n, missed)
		}
		want := min(n, 10)
		if len(latest) != want {
			t.Fatalf("n=%d: %d caught up (%v); want %d", n, len(latest), latest, want)
		}
		for i, tt := range latest {
			if w := time.Unix(int64(1011-want+i), 0); !tt.Equal(w) {
				t.Fatalf("n=%d: caught up %v; want the latest %d ticks, oldest first", n, latest, want)
			}
		}
	}
	// A gap far longer than the scan: the latest ticks still come back.
	next, _ = parse("", nil, time.Millisecond)
	now = last.Add(24 * time.Hour)
	missed, latest := missedTicks(next, last, now, 2)
	if missed != maxCatchUpScan || len(latest) != 2 || !latest[1].Equal(now) || !latest[0].Equal(now.Add(-time.Millisecond)) {
		t.Fatalf("a day of 1ms ticks: missed %d, caught up %v; want %d (the scan's bound) and the two before %v", missed, latest, maxCatchUpScan, now)
	}
}

func TestAddRefuses(t *testing.T) {
	t.Parallel()
	s := newScheduler(store(t), &fired{}, "w")
	if err := s.Add(Spec[job]{Name: "a", Every: time.Hour}); err != nil {
		t.Fatal(err)
	}
	noStore := New(Config[job]{NoStore: driver.ErrNoStore, Log: quiet})
	for _, c := range []struct {
		name string
		s    *Scheduler[job]
		spec Spec[job]
		want error // nil: any error
	}{
		{"empty name", s, Spec[job]{Every: time.Hour}, nil},
		{"bad name", s, Spec[job]{Name: "a b", Every: time.Hour}, nil},
		{"negative CatchUp", s, Spec[job]{Name: "b", Every: time.Hour, CatchUp: -1}, nil},
		{"no spec", s, Spec[job]{Name: "b"}, nil},
		{"a name registered", s, Spec[job]{Name: "a", Every: time.Minute}, nil},
		{"no store", noStore, Spec[job]{Name: "a", Every: time.Hour}, driver.ErrNoStore},
	} {
		err := c.s.Add(c.spec)
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: Add = %v; want an error matching %v", c.name, err, c.want)
		}
	}
	ctx := context.Background()
	if _, err := noStore.List(ctx); !errors.Is(err, driver.ErrNoStore) {
		t.Errorf("List without a store = %v; want ErrNoStore", err)
	}
	if _, err := noStore.Published(ctx, "a"); !errors.Is(err, driver.ErrNoStore) {
		t.Errorf("Published without a store = %v; want ErrNoStore", err)
	}
	if err := noStore.Delete(ctx, "a"); !errors.Is(err, driver.ErrNoStore) {
		t.Errorf("Delete without a store = %v; want ErrNoStore", err)
	}
}

// TestClaimOnce: of many claims of one tick at once, exactly one lands; a
// tick at or before the one recorded is never claimed again; a later one
// is.
func TestClaimOnce(t *testing.T) {
	t.Parallel()
	st := kv.Of(store(t), kv.Schedules)
	ctx := context.Background()
	tick := time.Unix(2000, 0)
	for round, tk := range []time.Time{tick, tick.Add(time.Second)} { // Create, then Update
		var wins sync.WaitGroup
		won := make(chan bool, 8)
		for range 8 {
			wins.Go(func() {
				ok, err := claim(ctx, st, "race", tk, time.Now(), quiet)
				if err != nil {
					t.Error(err)
				}
				won <- ok
			})
		}
		wins.Wait()
		close(won)
		n := 0
		for ok := range won {
			if ok {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("round %d: %d of 8 claims of tick %v landed; want 1", round, n, tk)
		}
	}
	for _, c := range []struct {
		tick time.Time
		want bool
	}{
		{tick, false},                      // older than the record
		{tick.Add(time.Second), false},     // the record's own
		{tick.Add(2 * time.Second), true},  // the next
		{tick.Add(10 * time.Second), true}, // one far ahead
		{tick.Add(3 * time.Second), false}, // one it skipped
	} {
		if ok, err := claim(ctx, st, "race", c.tick, time.Now(), quiet); ok != c.want || err != nil {
			t.Errorf("claim of %v = %v, %v; want %v", c.tick, ok, err, c.want)
		}
	}
}

// TestCorruptLastTick: a last tick far in the future (a writer to the store
// set it to MaxInt64, year 2262) does not stop the schedule: its next tick
// replaces the record, with a warning, and the ticks after it fire.
func TestCorruptLastTick(t *testing.T) {
	t.Parallel()
	d := store(t)
	setLast(t, d, "s", time.Unix(0, math.MaxInt64))
	var logs syncBuffer
	f := &fired{}
	s := New(Config[job]{Ticks: kv.Of(d, kv.Schedules), Defs: kv.Of(d, kv.ScheduleDefs), Worker: "w", Fire: f.fire,
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err := s.Add(Spec[job]{Name: "s", Every: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	s.Start(context.Background())
	defer s.Stop()
	waitFor(t, "two ticks fired", func() bool { return len(f.got()) >= 2 })
	if !strings.Contains(logs.String(), "far in the future") {
		t.Errorf("no warning of the corrupt record; logs:\n%s", logs.String())
	}
	if last, err := readTick(context.Background(), kv.Of(d, kv.Schedules), "s"); err != nil || last.After(time.Now().Add(time.Minute)) {
		t.Errorf("last tick after the repair = %v, %v; want a tick of now", last, err)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestCatchUp: a scheduler that starts 5 ticks after the last one fired
// fires the latest CatchUp of them, oldest first, and no other (an hourly
// schedule: no tick comes due while the test runs).
func TestCatchUp(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		catchUp int
		want    []time.Time
	}{
		{0, nil},
		{1, []time.Time{hourAgo(0)}},
		{2, []time.Time{hourAgo(1), hourAgo(0)}},
		{9, []time.Time{hourAgo(4), hourAgo(3), hourAgo(2), hourAgo(1), hourAgo(0)}},
	} {
		d := store(t)
		setLast(t, d, "s", hourAgo(5))
		f := &fired{}
		s := newScheduler(d, f, "w")
		if err := s.Add(Spec[job]{Name: "s", Every: time.Hour, CatchUp: c.catchUp}); err != nil {
			t.Fatal(err)
		}
		s.Start(context.Background())
		waitFor(t, "the definition and the catch-up", func() bool {
			l, err := s.List(context.Background())
			return err == nil && l[0].Worker != "" && len(f.got()) >= len(c.want)
		})
		time.Sleep(50 * time.Millisecond) // time for a tick too many
		s.Stop()
		if got := f.got(); !slices.EqualFunc(got, c.want, time.Time.Equal) {
			t.Errorf("CatchUp %d: fired %v; want %v", c.catchUp, got, c.want)
		}
	}
}

// TestSchedulersRace: two schedulers of one schedule on one store fire
// every tick exactly once between them, none missed.
func TestSchedulersRace(t *testing.T) {
	t.Parallel()
	d := store(t)
	f := &fired{}
	var ss []*Scheduler[job]
	for _, w := range []string{"w1", "w2"} {
		s := newScheduler(d, f, w)
		if err := s.Add(Spec[job]{Name: "race", Every: 20 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	for _, s := range ss {
		s.Start(ctx)
	}
	time.Sleep(500 * time.Millisecond)
	cancel() // the loops end with ctx, as with Stop
	for _, s := range ss {
		s.Stop()
	}
	got := f.got()
	if len(got) < 15 {
		t.Fatalf("%d ticks fired in 500ms at 20ms; want about 25", len(got))
	}
	for i := 1; i < len(got); i++ {
		if d := got[i].Sub(got[i-1]); d != 20*time.Millisecond {
			t.Fatalf("ticks %v: tick %d is %v after the one before; want each tick once, 20ms apart", got, i, d)
		}
	}
	n := len(got)
	time.Sleep(50 * time.Millisecond)
	if len(f.got()) != n {
		t.Fatal("a tick fired after Stop")
	}
}

// TestFireTries: a tick won is fired again after a failure, 3 times in
// all, but not after a final error.
func TestFireTries(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		fail  int
		err   error
		calls int
	}{
		{"ok", 0, nil, 1},
		{"one failure", 1, errors.New("down"), 2},
		{"always failing", 9, errors.New("down"), 3},
		{"final", 9, errFinal, 1},
	} {
		d := store(t)
		setLast(t, d, "s", hourAgo(1))
		f := &fired{fail: c.fail, err: c.err}
		s := newScheduler(d, f, "w")
		if err := s.Add(Spec[job]{Name: "s", Every: time.Hour, CatchUp: 1}); err != nil {
			t.Fatal(err)
		}
		s.Start(context.Background())
		waitFor(t, "the first call", func() bool { return len(f.got()) > 0 })
		s.Stop() // waits for the tick being fired
		got := f.got()
		if len(got) != c.calls {
			t.Errorf("%s: Fire called %d times; want %d", c.name, len(got), c.calls)
		}
		for _, tk := range got {
			if !tk.Equal(hourAgo(0)) {
				t.Errorf("%s: fired %v; want %v each time", c.name, tk, hourAgo(0))
			}
		}
	}
}

// TestStopBeforeStart: Stop without Start returns, and a schedule added
// after Stop never runs.
func TestStopBeforeStart(t *testing.T) {
	t.Parallel()
	d := store(t)
	setLast(t, d, "s", hourAgo(1))
	f := &fired{}
	s := newScheduler(d, f, "w")
	s.Stop()
	s.Start(context.Background())
	if err := s.Add(Spec[job]{Name: "s", Every: time.Hour, CatchUp: 1}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if got := f.got(); len(got) != 0 {
		t.Fatalf("fired %v after Stop", got)
	}
}

func TestPublishListDelete(t *testing.T) {
	t.Parallel()
	d := store(t)
	setLast(t, d, "orphan", hourAgo(3)) // a tick without a definition
	f := &fired{}
	s := newScheduler(d, f, "w1")
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip("no tzdata:", err)
	}
	daily := Spec[job]{Name: "reports/daily", Cron: "0 0 9 * * *", Location: paris, CatchUp: 1, Type: "report", Queue: "q",
		Job: job{Type: "report", Payload: "p"}}
	big := Spec[job]{Name: "big", Every: time.Hour, Type: "t", Queue: "default",
		Job: job{Type: "t", Payload: strings.Repeat("x", driver.MaxValueLen)}}
	for _, sp := range []Spec[job]{daily, big} {
		if err := s.Add(sp); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	before := time.Now()
	s.Start(ctx)
	defer s.Stop()
	var list []Info
	waitFor(t, "both definitions", func() bool {
		list, err = s.List(ctx)
		return err == nil && len(list) == 3 && list[0].Worker != "" && list[2].Worker != ""
	})
	bi, oi, ri := list[0], list[1], list[2]
	if bi.Name != "big" || oi.Name != "orphan" || ri.Name != "reports/daily" {
		t.Fatalf("List = %+v; want big, orphan and reports/daily, by name", list)
	}
	bp := before.In(paris)
	wantNext := time.Date(bp.Year(), bp.Month(), bp.Day(), 9, 0, 0, 0, paris)
	if !wantNext.After(before) {
		wantNext = time.Date(bp.Year(), bp.Month(), bp.Day()+1, 9, 0, 0, 0, paris)
	}
	if ri.Cron != daily.Cron || ri.CatchUp != 1 || ri.Type != "report" || ri.Queue != "q" || !ri.Next.Equal(wantNext) ||
		!ri.Last.IsZero() || !ri.Triggerable || ri.Worker != "w1" || ri.Started.Before(before.Add(-time.Second)) {
		t.Errorf("reports/daily = %+v; want its definition, next %v, no last tick", ri, wantNext)
	}
	if bi.Every != time.Hour || bi.Triggerable || bi.Next.IsZero() {
		t.Errorf("big = %+v; want Every 1h, a next tick, and not triggerable (its job is over the store's limit)", bi)
	}
	if !oi.Last.Equal(hourAgo(3)) || oi.Type != "" || !oi.Next.IsZero() || oi.Triggerable {
		t.Errorf("orphan = %+v; want its last tick alone", oi)
	}
	if l, err := s.List(ctx, "big", "nope"); err != nil || len(l) != 1 || l[0].Name != "big" {
		t.Errorf("List(big, nope) = %+v, %v; want big alone", l, err)
	}

	j, err := s.Published(ctx, "reports/daily")
	if err != nil || j != daily.Job {
		t.Errorf("Published(reports/daily) = %+v, %v; want %+v", j, err, daily.Job)
	}
	if _, err := s.Published(ctx, "big"); err == nil || errors.Is(err, ErrNoSchedule) {
		t.Errorf("Published(big) = %v; want the job-too-large error", err)
	}
	for _, name := range []string{"nope", "a b"} {
		if _, err := s.Published(ctx, name); !errors.Is(err, ErrNoSchedule) {
			t.Errorf("Published(%q) = %v; want ErrNoSchedule", name, err)
		}
	}

	for _, name := range []string{"reports/daily", "orphan", "never"} {
		if err := s.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if l, err := s.List(ctx); err != nil || len(l) != 1 || l[0].Name != "big" {
		t.Errorf("after Delete: %+v, %v; want big alone", l, err)
	}
	if got := f.got(); len(got) != 0 {
		t.Errorf("fired %v; want no tick (none was due)", got)
	}
}

// List reads at most Config.MaxList schedules: one more in the store, or
// more names given, is refused with ErrTooMany, nothing listed.
func TestListBounded(t *testing.T) {
	ctx := context.Background()
	d := store(t)
	s := New(Config[job]{Ticks: kv.Of(d, kv.Schedules), Defs: kv.Of(d, kv.ScheduleDefs), Log: quiet, MaxList: 3})
	for _, n := range []string{"a", "b", "c"} {
		setLast(t, d, n, hourAgo(1))
	}
	if l, err := s.List(ctx); err != nil || len(l) != 3 {
		t.Fatalf("List of 3: %d, %v", len(l), err)
	}
	setLast(t, d, "d", hourAgo(1))
	if l, err := s.List(ctx); !errors.Is(err, ErrTooMany) || l != nil {
		t.Errorf("List of 4: %d, %v; want ErrTooMany", len(l), err)
	}
	if l, err := s.List(ctx, "a", "b", "c", "d"); !errors.Is(err, ErrTooMany) || l != nil {
		t.Errorf("List of 4 names: %d, %v; want ErrTooMany", len(l), err)
	}
	if l, err := s.List(ctx, "a", "d"); err != nil || len(l) != 2 {
		t.Errorf("List of 2 names: %d, %v", len(l), err)
	}
}

// slowPublish is a store whose first write waits: a definition published
// slowly, as on a loaded machine or a slow store.
type slowPublish struct {
	driver.Store
	once  sync.Once
	delay time.Duration
}

func (s *slowPublish) wait() { s.once.Do(func() { time.Sleep(s.delay) }) }

func (s *slowPublish) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	s.wait()
	return s.Store.Create(ctx, key, value, ttl)
}

func (s *slowPublish) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	s.wait()
	return s.Store.Update(ctx, key, value, rev, ttl)
}

// TestTickDuringStartFires: a tick that falls after Start but before the
// schedule's loop is ready (its definition still being published) fires,
// late; it is not skipped as missed before the loop began.
func TestTickDuringStartFires(t *testing.T) {
	t.Parallel()
	d := &slowPublish{Store: store(t), delay: 1200 * time.Millisecond}
	f := &fired{}
	s := newScheduler(d, f, "w")
	if err := s.Add(Spec[job]{Name: "s", Every: time.Second}); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	s.Start(context.Background())
	first := time.Unix(started.Unix()+1, 0) // within the publish's 1.2 s
	waitFor(t, "a tick", func() bool { return len(f.got()) > 0 })
	s.Stop()
	if got := f.got(); !got[0].Equal(first) {
		t.Errorf("the first tick fired is %v; want %v, the first after Start (due while the definition was published)", got[0], first)
	}
}
