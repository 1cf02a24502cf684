package asyncplatform

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
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

func TestScheduleCatchUp(t *testing.T) {
	t.Parallel()
	for _, catchUp := range []int{0, 2} {
		b := memory.NewBroker()
		l := &tickLog{ticks: map[string]int{}}
		s := Schedule{Name: "s", Every: 100 * time.Millisecond, Job: Job{Type: "tick"}, CatchUp: catchUp}
		p := schedPlatform(t, b, s, l)
		waitUntil(t, "a tick", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return len(l.ticks) > 0 })
		_ = p.Stop(context.Background())
		before := l.sorted(t)
		last := before[len(before)-1]
		time.Sleep(550 * time.Millisecond) // 5 ticks missed
		restart := time.Now()
		p = schedPlatform(t, b, s, l)
		time.Sleep(50 * time.Millisecond)
		_ = p.Stop(context.Background())
		var caught []time.Time
		for _, tt := range l.sorted(t) {
			if tt.After(last) && !tt.After(restart) {
				caught = append(caught, tt)
			}
		}
		if len(caught) != catchUp {
			t.Fatalf("CatchUp %d: %d missed ticks enqueued (%v)", catchUp, len(caught), caught)
		}
		if catchUp > 0 && restart.Sub(caught[len(caught)-1]) > 100*time.Millisecond {
			t.Fatalf("CatchUp %d: caught up %v, not the latest missed ticks before %v", catchUp, caught, restart)
		}
	}
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

func TestScheduleCronZone(t *testing.T) {
	t.Parallel()
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip("no tzdata:", err)
	}
	e, err := newSchedEntry(Schedule{Name: "z", Cron: "30 0 9 * * *", Location: paris, Job: Job{Type: "t"}})
	if err != nil {
		t.Fatal(err)
	}
	from := time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC)
	if got, want := e.next(from), time.Date(2026, 1, 11, 8, 0, 30, 0, time.UTC); !got.Equal(want) {
		t.Fatalf("next 09:00:30 Paris after %v = %v; want %v", from, got, want)
	}
	e, err = newSchedEntry(Schedule{Name: "z", Cron: "0 9 * * *", Job: Job{Type: "t"}}) // five fields, UTC
	if err != nil {
		t.Fatal(err)
	}
	if got, want := e.next(from), time.Date(2026, 1, 11, 9, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Fatalf("next 09:00 UTC = %v; want %v", got, want)
	}
}
