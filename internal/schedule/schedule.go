// Package schedule is the platform's scheduler of periodic jobs. It parses
// each schedule (a cron expression, or a fixed interval whose ticks are the
// multiples of Every since the Unix epoch), waits for its ticks, and fires
// each tick exactly once across every process that runs the same schedule:
// the process that moves the schedule's record in the store from an earlier
// tick to this one (a compare-and-swap through kv.Retry) fires it. There is
// no leader, and a tick at or before the last one fired is never fired
// again, whatever the clocks say. It also publishes each schedule's
// definition in the store, for operators (List, Published, Delete).
//
// The job a schedule enqueues is opaque here (the type parameter J): the
// scheduler publishes it as JSON and hands it to Config.Fire at every tick
// this process wins.
package schedule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// Spec is one periodic job as the scheduler sees it.
type Spec[J any] struct {
	// Name identifies the schedule in the store: every process gives the
	// same schedule the same name. It follows the store's key grammar.
	Name string

	// Cron is a cron expression (five fields, six with seconds first, or a
	// descriptor other than @every), optionally after "CRON_TZ=<zone> ".
	// Set Cron or Every, not both.
	Cron string

	// Location is the time zone of Cron when it names none; nil is UTC.
	Location *time.Location

	// Every is a fixed interval of at least a millisecond.
	Every time.Duration

	// CatchUp is how many of the ticks missed while no scheduler ran are
	// fired when one starts: the latest CatchUp of them, oldest first.
	CatchUp int

	// Type and Queue are the job's type and queue, published for
	// operators.
	Type, Queue string

	// Job is the job: published in the definition (left out when the
	// definition would be over driver.MaxValueLen) and handed to Fire.
	Job J
}

// Config is what a Scheduler needs.
type Config[J any] struct {
	// Ticks holds each schedule's last tick fired (kv.Schedules), and Defs
	// each schedule's definition (kv.ScheduleDefs). Both nil when the
	// backend has no store.
	Ticks, Defs *kv.Store

	// NoStore is why Ticks and Defs are nil (an error matching
	// driver.ErrNoStore): Add and every read of the store return it.
	NoStore error

	// MaxList is the most schedules List reads. Defaults to MaxList.
	MaxList int

	// Log receives the scheduler's reports. Required.
	Log *slog.Logger

	// Worker names this process in the definitions it publishes.
	Worker string

	// Fire enqueues job (a copy of Spec.Job, Fire's to change) for tick;
	// it is called only for a tick this process won. A failed Fire is
	// called again with the same *J, 100 ms later, 3 times in all at most,
	// unless Final says the error is final. Required.
	Fire func(ctx context.Context, job *J, tick time.Time) error

	// Final reports whether a Fire error is final (no other try). Nil:
	// every error is tried again.
	Final func(error) bool
}

// fireTries is how many times Fire is called for a tick won, at most;
// firePause is the pause between two calls. The tick is this process's
// alone: no other process fires it.
const (
	fireTries = 3
	firePause = 100 * time.Millisecond
)

// lateLimit is how late a tick may be fired by a scheduler that fell behind
// (a stalled process, a slow store); ticks later than that are skipped, as
// missed.
const lateLimit = 10 * time.Second

// maxAhead is how far after the local clock a schedule's last tick may be
// and still be taken as written by a process: one fires a tick when its
// clock reaches it, and the clocks of the processes sharing a schedule
// agree to well within maxAhead. A later tick is corrupt (a writer to the
// store set it): the next tick due repairs it, with a warning, instead of
// waiting for it.
const maxAhead = time.Minute

// maxCatchUpScan bounds the ticks looked at to find the missed ones.
const maxCatchUpScan = 1_000_000

var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Scheduler runs a process's schedules: from Start to Stop, one goroutine
// per schedule waits for its ticks and fires those it wins.
type Scheduler[J any] struct {
	cfg Config[J]

	mu      sync.Mutex
	entries map[string]*entry[J]
	ctx     context.Context // set by Start; nil before
	cancel  context.CancelFunc
	stopped bool
	loops   sync.WaitGroup
}

type entry[J any] struct {
	spec Spec[J]
	next func(time.Time) time.Time // the first tick after t; zero when none is left
}

// New returns a Scheduler with no schedules.
func New[J any](cfg Config[J]) *Scheduler[J] {
	return &Scheduler[J]{cfg: cfg, entries: map[string]*entry[J]{}}
}

// Add checks a schedule and registers it; when the scheduler runs (after
// Start, before Stop) the schedule starts at once. A name registered
// already is refused, and so is every schedule when there is no store.
func (s *Scheduler[J]) Add(sp Spec[J]) error {
	where := fmt.Sprintf("schedule %q", sp.Name)
	if err := driver.CheckKey(sp.Name); err != nil {
		return fmt.Errorf("%s: Name: %w", where, err)
	}
	if sp.CatchUp < 0 {
		return fmt.Errorf("%s: CatchUp is %d, it must be 0 or more", where, sp.CatchUp)
	}
	next, err := parse(sp.Cron, sp.Location, sp.Every)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if err := s.checkStore(); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.entries[sp.Name]; dup {
		return fmt.Errorf("%s: a schedule of that name is registered", where)
	}
	e := &entry[J]{spec: sp, next: next}
	s.entries[sp.Name] = e
	if s.ctx != nil && !s.stopped {
		s.goRun(s.ctx, e)
	}
	return nil
}

// parse returns the function that gives the first tick after a time, for a
// cron expression (in loc when it names no zone; nil is UTC) or a fixed
// interval: exactly one of cronSpec and every is set. The function returns
// the zero time when the cron expression has no tick left.
func parse(cronSpec string, loc *time.Location, every time.Duration) (func(time.Time) time.Time, error) {
	switch {
	case (cronSpec == "") == (every == 0):
		return nil, errors.New("set Cron or Every, one of them")
	case every != 0:
		if every < time.Millisecond {
			return nil, fmt.Errorf("interval Every %v: at least 1ms", every)
		}
		n := every.Nanoseconds()
		return func(t time.Time) time.Time {
			return time.Unix(0, (t.UnixNano()/n+1)*n)
		}, nil
	}
	spec := strings.TrimSpace(cronSpec)
	if strings.HasPrefix(spec, "@every") {
		return nil, fmt.Errorf("cron spec %q: use Every for a fixed interval (its ticks are the same in every process)", cronSpec)
	}
	if !strings.HasPrefix(spec, "CRON_TZ=") && !strings.HasPrefix(spec, "TZ=") {
		if loc == nil {
			loc = time.UTC
		}
		spec = "CRON_TZ=" + loc.String() + " " + spec
	}
	sched, err := cronParser.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("cron spec %q: %w", cronSpec, err)
	}
	return sched.Next, nil
}

// Start runs the registered schedules, and those added later, until ctx
// ends or Stop is called. Call it once.
func (s *Scheduler[J]) Start(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.ctx != nil {
		return
	}
	s.ctx, s.cancel = context.WithCancel(ctx)
	for _, e := range s.entries {
		s.goRun(s.ctx, e)
	}
}

// Stop ends every schedule's loop and waits for them to return (a tick
// being fired is fired first). Schedules added after Stop do not run.
func (s *Scheduler[J]) Stop() {
	s.mu.Lock()
	s.stopped = true
	if s.cancel != nil {
		s.cancel()
	}
	s.mu.Unlock()
	s.loops.Wait()
}

// goRun starts e's loop; s.mu is held. The loop's own ticks are those
// after now: a tick that falls while the loop starts (its goroutine not
// yet run, its definition being published) is fired late, not counted
// as missed.
func (s *Scheduler[J]) goRun(ctx context.Context, e *entry[J]) {
	from := time.Now()
	s.loops.Add(1)
	go func() {
		defer s.loops.Done()
		s.run(ctx, e, from)
	}()
}

func (s *Scheduler[J]) checkStore() error {
	if s.cfg.Ticks == nil || s.cfg.Defs == nil {
		err := s.cfg.NoStore
		if err == nil {
			err = driver.ErrNoStore
		}
		return fmt.Errorf("schedules need the backend's store: %w", err)
	}
	return nil
}

// run publishes the schedule's definition, fires the missed ticks it
// catches up, then fires every tick after from until ctx ends.
func (s *Scheduler[J]) run(ctx context.Context, e *entry[J], from time.Time) {
	name := e.spec.Name
	s.publish(ctx, e.spec)
	last, ok := s.lastTick(ctx, name)
	var missed int
	var caught []time.Time
	if ok {
		missed, caught = missedTicks(e.next, last, from, e.spec.CatchUp)
	}
	level := slog.LevelDebug
	if missed > 0 {
		level = slog.LevelInfo
	}
	s.cfg.Log.Log(ctx, level, "asyncplatform: schedule started", "schedule", name, "from", from, "last_tick", last,
		"missed", missed, "caught_up", len(caught), "skipped", missed-len(caught))
	for _, t := range caught {
		s.fire(ctx, e, t)
	}
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for t := from; ; {
		next := e.next(t)
		if next.IsZero() {
			return // a cron spec with no tick left
		}
		if now := time.Now(); now.Sub(next) > lateLimit {
			skip := e.next(now.Add(-lateLimit))
			s.cfg.Log.Warn("asyncplatform: a schedule fell behind; ticks skipped", "schedule", name, "from", next, "to", skip)
			next = skip
		}
		timer.Reset(time.Until(next))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		s.fire(ctx, e, next)
		t = next
	}
}

// missedTicks returns how many ticks fall after last and at or before now
// (counting stops at maxCatchUpScan) and the latest n of them, oldest
// first.
func missedTicks(next func(time.Time) time.Time, last, now time.Time, n int) (missed int, latest []time.Time) {
	for t := next(last); !t.IsZero() && !t.After(now) && missed < maxCatchUpScan; t = next(t) {
		missed++
	}
	if n == 0 || missed == 0 {
		return missed, nil
	}
	// The latest n: scan a window before now, wider until it holds n
	// ticks or reaches back to last.
	for w := time.Second; ; w *= 4 {
		from := now.Add(-w)
		if !from.After(last) || w > 100*365*24*time.Hour {
			from = last
		}
		var ring []time.Time
		for t := next(from); !t.IsZero() && !t.After(now); t = next(t) {
			if len(ring) == n {
				ring = append(ring[:0], ring[1:]...)
			}
			ring = append(ring, t)
		}
		if len(ring) == n || from.Equal(last) || w > 100*365*24*time.Hour {
			return missed, ring
		}
	}
}

// lastTick reads the last tick fired of a schedule; false when none was,
// or when it cannot be read (then the missed ticks are skipped).
func (s *Scheduler[J]) lastTick(ctx context.Context, name string) (time.Time, bool) {
	t, err := readTick(ctx, s.cfg.Ticks, name)
	if err != nil {
		if !errors.Is(err, driver.ErrKeyNotFound) {
			s.cfg.Log.Warn("asyncplatform: reading a schedule's last tick failed; missed ticks are skipped", "schedule", name, "error", err)
		}
		return time.Time{}, false
	}
	return t, true
}

// readTick reads the last tick fired of a schedule (its Unix time in
// nanoseconds, in decimal); driver.ErrKeyNotFound when none was.
func readTick(ctx context.Context, st *kv.Store, name string) (time.Time, error) {
	v, _, err := st.Get(ctx, name)
	if err != nil {
		return time.Time{}, err
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("schedule %q: a last tick that does not parse: %w", name, err)
	}
	return time.Unix(0, n), nil
}

// claim moves the schedule's record from an earlier tick to t, by
// compare-and-swap, and reports whether this call's write landed: false
// when the record holds t or a later tick (another process fired it). A
// record more than maxAhead after now is corrupt, and is replaced (the
// warning goes to log): trusted, it would stop the schedule until then.
func claim(ctx context.Context, st *kv.Store, name string, t, now time.Time, log *slog.Logger) (bool, error) {
	val := []byte(strconv.FormatInt(t.UnixNano(), 10))
	won := false
	err := kv.Retry(ctx, func() error {
		v, rev, err := st.Get(ctx, name)
		switch {
		case errors.Is(err, driver.ErrKeyNotFound):
			_, err = st.Create(ctx, name, val, 0)
			if errors.Is(err, driver.ErrKeyExists) {
				return kv.ErrRetry
			}
		case err == nil:
			last, perr := strconv.ParseInt(string(v), 10, 64)
			if perr == nil && last >= t.UnixNano() {
				if last <= now.Add(maxAhead).UnixNano() {
					return nil // fired by another process
				}
				log.Warn("asyncplatform: a schedule's last tick is far in the future; the store's record is corrupt and is replaced",
					"schedule", name, "last_tick", time.Unix(0, last).UTC(), "tick", t)
			}
			_, err = st.Update(ctx, name, val, rev, 0)
			if errors.Is(err, driver.ErrRevision) {
				return kv.ErrRetry
			}
		}
		won = err == nil
		return err
	})
	return won, err
}

// fire fires tick t of e when this process claims it: Fire is called, and
// called again after a failure that is not final, fireTries times at most.
// Stop does not interrupt a tick claimed.
func (s *Scheduler[J]) fire(ctx context.Context, e *entry[J], t time.Time) {
	name := e.spec.Name
	won, err := claim(ctx, s.cfg.Ticks, name, t, time.Now(), s.cfg.Log)
	if !won {
		if err != nil && ctx.Err() == nil {
			s.cfg.Log.Warn("asyncplatform: a schedule's tick was not fired", "schedule", name, "tick", t, "error", err)
		}
		return
	}
	ctx = context.WithoutCancel(ctx)
	j := e.spec.Job
	for try := 1; ; try++ {
		err = s.cfg.Fire(ctx, &j, t)
		if err == nil || try == fireTries || (s.cfg.Final != nil && s.cfg.Final(err)) {
			break
		}
		time.Sleep(firePause)
	}
	if err != nil {
		s.cfg.Log.Error("asyncplatform: enqueueing a schedule's job failed; the tick is lost", "schedule", name, "tick", t, "error", err)
	}
}
