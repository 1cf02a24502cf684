package asyncplatform

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// tickLog records the ticks of the scheduled jobs handled.
type tickLog struct {
	mu    sync.Mutex
	ticks map[string]int
}

func (l *tickLog) handler(ctx context.Context, j *Job) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ticks[j.Headers[ScheduleTickHeader]]++
	return nil
}

func (l *tickLog) sorted(t *testing.T) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []time.Time
	for s, n := range l.ticks {
		if n != 1 {
			t.Errorf("tick %s enqueued %d times", s, n)
		}
		tt, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatalf("tick header %q: %v", s, err)
		}
		out = append(out, tt)
	}
	for i := range out {
		for k := i + 1; k < len(out); k++ {
			if out[k].Before(out[i]) {
				out[i], out[k] = out[k], out[i]
			}
		}
	}
	return out
}

func schedPlatform(t *testing.T, b *memory.Broker, s Schedule, l *tickLog) *Platform {
	t.Helper()
	p, err := New(b.Connect(), Config{Logger: quietLog, Schedules: []Schedule{s}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Handle("tick", l.handler); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	return p
}

func TestScheduleOnePerTick(t *testing.T) {
	t.Parallel()
	b := memory.NewBroker()
	l := &tickLog{ticks: map[string]int{}}
	s := Schedule{Name: "every100ms", Every: 100 * time.Millisecond, Job: Job{Type: "tick"}}
	var ps []*Platform
	for range 3 {
		ps = append(ps, schedPlatform(t, b, s, l))
	}
	time.Sleep(1050 * time.Millisecond)
	for _, p := range ps {
		_ = p.Stop(context.Background())
	}
	ticks := l.sorted(t)
	if len(ticks) < 9 || len(ticks) > 11 {
		t.Fatalf("%d ticks in about a second at 100ms; want 10 or so", len(ticks))
	}
	for i, tt := range ticks {
		if tt.UnixNano()%int64(100*time.Millisecond) != 0 || (i > 0 && tt.Sub(ticks[i-1]) != 100*time.Millisecond) {
			t.Fatalf("ticks %v: want consecutive multiples of 100ms", ticks)
		}
	}
}

// TestScheduleCatchUp: a platform started after ticks were missed enqueues
// the CatchUp latest of them. Ticks are judged by what ran, so the queue is
// drained of the first platform's ticks before the gap, and the restarted
// platform runs until a regular tick of its own has run and its queue is
// empty. The scheduler reads its clock somewhere between restart and
// started: a tick at or before restart was missed, one after started is
// regular, and one in between may be either.
func TestScheduleCatchUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const every = 100 * time.Millisecond
	for _, catchUp := range []int{0, 2} {
		b := memory.NewBroker()
		l := &tickLog{ticks: map[string]int{}}
		s := Schedule{Name: "s", Every: every, Job: Job{Type: "tick"}, CatchUp: catchUp}
		p := schedPlatform(t, b, s, l)
		waitUntil(t, "a tick", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return len(l.ticks) > 0 })
		_ = p.Stop(ctx)
		drain(t, b, l) // the ticks the first platform enqueued and did not run
		before := l.sorted(t)
		last := before[len(before)-1]
		time.Sleep(550 * time.Millisecond) // 5 ticks missed
		restart := time.Now()
		p = schedPlatform(t, b, s, l)
		started := time.Now()
		waitUntil(t, "a regular tick after the restart", func() bool {
			ticks := l.sorted(t)
			return ticks[len(ticks)-1].After(started)
		})
		waitUntil(t, "the restarted platform's queue to drain", func() bool {
			st, err := p.Stats(ctx, DefaultQueue)
			return err == nil && st.Ready == 0 && st.InFlight == 0
		})
		_ = p.Stop(ctx)
		var missed, upToStart []time.Time // ticks after last: at or before restart, and at or before started
		for _, tt := range l.sorted(t) {
			if tt.After(last) && !tt.After(restart) {
				missed = append(missed, tt)
			}
			if tt.After(last) && !tt.After(started) {
				upToStart = append(upToStart, tt)
			}
		}
		window := int(started.Truncate(every).Sub(restart.Truncate(every)) / every) // tick times in (restart, started]
		if len(missed) > catchUp || len(upToStart) < catchUp || len(upToStart) > catchUp+window {
			t.Fatalf("CatchUp %d: %d missed ticks enqueued (%v), %d up to the start %v later (%v)", catchUp, len(missed), missed, len(upToStart), started.Sub(restart), upToStart)
		}
		if catchUp > 0 && len(missed) > 0 && restart.Sub(missed[len(missed)-1]) > every {
			t.Fatalf("CatchUp %d: caught up %v, not the latest missed ticks before %v", catchUp, missed, restart)
		}
	}
}

// drain runs the jobs left on the default queue of b, logging their ticks
// in l, until it is empty.
func drain(t *testing.T, b *memory.Broker, l *tickLog) {
	t.Helper()
	p, err := New(b.Connect(), Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Handle("tick", l.handler); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop(context.Background()) }()
	waitUntil(t, "the queue to drain", func() bool {
		st, err := p.Stats(context.Background(), DefaultQueue)
		return err == nil && st.Ready == 0 && st.InFlight == 0 && st.Scheduled <= 0
	})
}

func TestScheduleInvalid(t *testing.T) {
	t.Parallel()
	p, err := New(memory.NewBroker().Connect(), Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []Schedule{
		{Name: "", Every: time.Second, Job: Job{Type: "t"}},
		{Name: "a", Job: Job{Type: "t"}},
		{Name: "a", Every: time.Second, Cron: "* * * * *", Job: Job{Type: "t"}},
		{Name: "a", Every: time.Second},
		{Name: "a", Cron: "@every 1s", Job: Job{Type: "t"}},
		{Name: "a", Cron: "61 * * * * *", Job: Job{Type: "t"}},
		{Name: "a", Every: time.Second, Job: Job{Type: "t"}, CatchUp: -1},
	} {
		if err := p.Schedule(s); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Schedule(%+v) = %v; want ErrInvalidConfig", s, err)
		}
	}
	if err := p.Schedule(Schedule{Name: "a", Cron: "*/5 * * * * *", Job: Job{Type: "t"}}); err != nil {
		t.Fatal(err)
	}
	if err := p.Schedule(Schedule{Name: "a", Every: time.Second, Job: Job{Type: "t"}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("a second schedule named a: %v", err)
	}
}

// TestScheduleNoStore: without the backend's store every schedule is
// refused (New with Config.Schedules too), and so is every read of them.
func TestScheduleNoStore(t *testing.T) {
	t.Parallel()
	b := struct{ driver.Backend }{memory.NewBroker().Connect()} // the backend alone, without its store
	s := Schedule{Name: "s", Every: time.Second, Job: Job{Type: "t"}}
	if _, err := New(b, Config{Logger: quietLog, Schedules: []Schedule{s}}); !errors.Is(err, ErrNoStore) || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with a schedule and no store = %v; want ErrInvalidConfig and ErrNoStore", err)
	}
	p, err := New(b, Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Schedule(s); !errors.Is(err, ErrNoStore) || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Schedule without a store = %v; want ErrInvalidConfig and ErrNoStore", err)
	}
	ctx := context.Background()
	if _, err := p.Schedules(ctx); !errors.Is(err, ErrNoStore) {
		t.Errorf("Schedules without a store = %v; want ErrNoStore", err)
	}
	if _, err := p.TriggerSchedule(ctx, "s"); !errors.Is(err, ErrNoStore) {
		t.Errorf("TriggerSchedule without a store = %v; want ErrNoStore", err)
	}
	if err := p.DeleteSchedule(ctx, "s"); !errors.Is(err, ErrNoStore) {
		t.Errorf("DeleteSchedule without a store = %v; want ErrNoStore", err)
	}
}

func TestSchedulesListAndTrigger(t *testing.T) {
	t.Parallel()
	b := memory.NewBroker()
	l := &tickLog{ticks: map[string]int{}}
	s := Schedule{Name: "reports/daily", Cron: "0 0 9 * * *", Location: time.UTC, CatchUp: 1,
		Job: Job{Type: "tick", Payload: []byte("p"), Headers: map[string]string{"h": "v"}}}
	p := schedPlatform(t, b, s, l)
	big := Schedule{Name: "big", Every: time.Hour, Job: Job{Type: "tick", Payload: make([]byte, 100<<10)}}
	if err := p.Schedule(big); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var list []ScheduleInfo
	waitUntil(t, "both schedules published", func() bool {
		var err error
		list, err = p.Schedules(ctx)
		return err == nil && len(list) == 2
	})
	bi, ri := list[0], list[1]
	if bi.Name != "big" || ri.Name != "reports/daily" {
		t.Fatalf("Schedules = %+v; want big and reports/daily, by name", list)
	}
	now := time.Now().UTC()
	wantNext := time.Date(now.Year(), now.Month(), now.Day(), 9, 0, 0, 0, time.UTC)
	if !wantNext.After(now) {
		wantNext = wantNext.AddDate(0, 0, 1)
	}
	if ri.Cron != s.Cron || ri.CatchUp != 1 || ri.Type != "tick" || ri.Queue != DefaultQueue || !ri.Next.Equal(wantNext) ||
		!ri.Last.IsZero() || !ri.Triggerable || ri.Worker == "" || ri.Started.IsZero() {
		t.Fatalf("reports/daily = %+v; want its definition, next %v, no last tick", ri, wantNext)
	}
	if bi.Every != time.Hour || bi.Triggerable || bi.Next.IsZero() {
		t.Fatalf("big = %+v; want Every 1h, a next tick, and not triggerable (its job is over the store's limit)", bi)
	}
	// Trigger from another platform, which has no schedule registered.
	other, err := New(b.Connect(), Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	j, err := other.TriggerSchedule(ctx, "reports/daily")
	if err != nil {
		t.Fatal(err)
	}
	if j.ID == "" || j.Type != "tick" || string(j.Payload) != "p" || j.Headers["h"] != "v" || j.Headers[ScheduleTriggerHeader] == "" {
		t.Fatalf("triggered %+v", j)
	}
	if _, ok := j.Headers[ScheduleTickHeader]; ok {
		t.Fatal("a triggered job carries a tick")
	}
	waitUntil(t, "the triggered job handled", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return l.ticks[""] == 1 })
	if _, err := other.TriggerSchedule(ctx, "big"); err == nil || errors.Is(err, ErrNoSchedule) {
		t.Fatalf("TriggerSchedule(big) = %v; want the job-too-large error", err)
	}
	if _, err := other.TriggerSchedule(ctx, "nope"); !errors.Is(err, ErrNoSchedule) {
		t.Fatalf("TriggerSchedule(nope) = %v; want ErrNoSchedule", err)
	}
	if list, _ := other.Schedules(ctx); len(list) != 2 || !list[1].Last.IsZero() {
		t.Fatalf("after a trigger: %+v; want no tick recorded", list)
	}
}
