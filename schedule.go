package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Schedule is a periodic job: a job enqueued at every tick of a cron
// expression or a fixed interval. Register it with Platform.Schedule or
// Config.Schedules on every worker process that should run the scheduler
// (all of them may): between Start and Stop each one waits for the ticks,
// and exactly one job is enqueued per tick across all of them. A tick is
// fired by the process that moves the schedule's record in the backend's
// store from the previous tick to this one (a compare-and-swap), so there
// is no leader, and a process whose clock is late or early cannot fire a
// tick twice: a tick at or before the last one fired is never fired again.
// Scheduling needs the backend's store (Platform.Store).
type Schedule struct {
	// Name identifies the schedule on the backend: every process gives the
	// same schedule the same name. It follows the Store's key grammar.
	// Required.
	Name string

	// Cron is a cron expression: five fields (minute to day of week), or
	// six with seconds first, or a descriptor such as "@hourly"; parsed by
	// github.com/robfig/cron/v3. It may start with "CRON_TZ=<zone> ". Set
	// Cron or Every, not both.
	Cron string

	// Location is the time zone of Cron when it names none. Defaults to
	// UTC.
	Location *time.Location

	// Every is a fixed interval, at least a millisecond: the ticks are the
	// multiples of Every since the Unix epoch, the same in every process.
	Every time.Duration

	// Job is the job enqueued at each tick (a copy with a new ID and the
	// tick in the ScheduleTickHeader header). Job.Type is required.
	Job Job

	// CatchUp is how many ticks missed while no scheduler ran are enqueued
	// when one starts again: the latest CatchUp of them, at once, oldest
	// first. Defaults to 0: missed ticks are skipped.
	CatchUp int
}

// ScheduleTickHeader is the header a scheduled job carries its tick in
// (RFC 3339 with nanoseconds, UTC).
const ScheduleTickHeader = "asyncplatform-schedule-tick"

// scheduleNamespace is the store namespace of the schedules' records.
const scheduleNamespace = "_schedule"

// maxCatchUpScan bounds the ticks looked at to find the missed ones.
const maxCatchUpScan = 1_000_000

var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// scheduler holds a platform's schedules.
type scheduler struct {
	mu      sync.Mutex
	entries map[string]*schedEntry
	ctx     context.Context // set by Start; nil before
}

type schedEntry struct {
	s    Schedule
	next func(time.Time) time.Time // the first tick after t
}

// Schedule registers a periodic job (see Schedule). It may be called
// before or after Start; the scheduler runs from Start to Stop. Errors wrap
// ErrInvalidConfig.
func (p *Platform) Schedule(s Schedule) error {
	if p == nil || p.backend == nil {
		return ErrNotNew
	}
	e, err := newSchedEntry(s)
	if err != nil {
		return err
	}
	p.sched.mu.Lock()
	defer p.sched.mu.Unlock()
	if _, dup := p.sched.entries[s.Name]; dup {
		return fmt.Errorf("%w: Schedule %q: a schedule of that name is registered", ErrInvalidConfig, s.Name)
	}
	if p.sched.entries == nil {
		p.sched.entries = map[string]*schedEntry{}
	}
	p.sched.entries[s.Name] = e
	if p.sched.ctx != nil {
		p.goSchedule(p.sched.ctx, e)
	}
	return nil
}

func newSchedEntry(s Schedule) (*schedEntry, error) {
	where := fmt.Sprintf("Schedule %q", s.Name)
	if err := driver.CheckKey(s.Name); err != nil {
		return nil, fmt.Errorf("%w: %s: Name: %w", ErrInvalidConfig, where, err)
	}
	if s.Job.Type == "" {
		return nil, fmt.Errorf("%w: %s: Job.Type is empty", ErrInvalidConfig, where)
	}
	if s.Job.Queue != "" {
		if err := driver.CheckQueue(s.Job.Queue); err != nil {
			return nil, fmt.Errorf("%w: %s: Job.Queue: %w", ErrInvalidConfig, where, err)
		}
	}
	if s.CatchUp < 0 {
		return nil, fmt.Errorf("%w: %s: CatchUp is %d, it must be 0 or more", ErrInvalidConfig, where, s.CatchUp)
	}
	e := &schedEntry{s: s}
	switch {
	case (s.Cron == "") == (s.Every == 0):
		return nil, fmt.Errorf("%w: %s: set Cron or Every, one of them", ErrInvalidConfig, where)
	case s.Every != 0:
		if s.Every < time.Millisecond {
			return nil, fmt.Errorf("%w: %s: Every is %v, at least 1ms", ErrInvalidConfig, where, s.Every)
		}
		every := s.Every.Nanoseconds()
		e.next = func(t time.Time) time.Time {
			n := t.UnixNano()
			return time.Unix(0, (n/every+1)*every)
		}
	default:
		spec := strings.TrimSpace(s.Cron)
		if strings.HasPrefix(spec, "@every") {
			return nil, fmt.Errorf("%w: %s: Cron %q: use Every for a fixed interval (its ticks are the same in every process)", ErrInvalidConfig, where, s.Cron)
		}
		if !strings.HasPrefix(spec, "CRON_TZ=") && !strings.HasPrefix(spec, "TZ=") {
			loc := s.Location
			if loc == nil {
				loc = time.UTC
			}
			spec = "CRON_TZ=" + loc.String() + " " + spec
		}
		sched, err := cronParser.Parse(spec)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: Cron %q: %w", ErrInvalidConfig, where, s.Cron, err)
		}
		e.next = sched.Next
	}
	return e, nil
}

// startSchedules runs the registered schedules until ctx ends (Start
// calls it with the context Stop cancels).
func (p *Platform) startSchedules(ctx context.Context) {
	p.sched.mu.Lock()
	defer p.sched.mu.Unlock()
	p.sched.ctx = ctx
	for _, e := range p.sched.entries {
		p.goSchedule(ctx, e)
	}
}

func (p *Platform) goSchedule(ctx context.Context, e *schedEntry) {
	p.background.Add(1)
	go func() {
		defer p.background.Done()
		p.runSchedule(ctx, e)
	}()
}

func (p *Platform) scheduleStore() (*Store, error) {
	d, err := driver.StoreOf(p.backend)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: schedules need the backend's store: %w", err)
	}
	return &Store{d: d, ns: scheduleNamespace + "/"}, nil
}

// runSchedule catches up the missed ticks, then fires every tick until ctx
// ends.
func (p *Platform) runSchedule(ctx context.Context, e *schedEntry) {
	st, err := p.scheduleStore()
	if err != nil {
		p.log.Error("asyncplatform: the schedule does not run", "schedule", e.s.Name, "error", err)
		return
	}
	if e.s.CatchUp > 0 {
		if last, ok := p.lastTick(ctx, st, e.s.Name); ok {
			for _, t := range missedTicks(e.next, last, time.Now(), e.s.CatchUp) {
				p.fire(ctx, st, e, t)
			}
		}
	}
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for {
		next := e.next(time.Now())
		timer.Reset(time.Until(next))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		p.fire(ctx, st, e, next)
	}
}

// missedTicks returns the latest n ticks after last and at or before now,
// oldest first.
func missedTicks(next func(time.Time) time.Time, last, now time.Time, n int) []time.Time {
	var ring []time.Time
	for t, i := next(last), 0; !t.IsZero() && !t.After(now) && i < maxCatchUpScan; t, i = next(t), i+1 {
		if len(ring) == n {
			ring = append(ring[:0], ring[1:]...)
		}
		ring = append(ring, t)
	}
	return ring
}

// lastTick reads the last tick fired of a schedule.
func (p *Platform) lastTick(ctx context.Context, st *Store, name string) (time.Time, bool) {
	v, _, err := st.Get(ctx, name)
	if err != nil {
		if !errors.Is(err, ErrKeyNotFound) {
			p.log.Warn("asyncplatform: reading a schedule's last tick failed; missed ticks are skipped", "schedule", name, "error", err)
		}
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	return time.Unix(0, n), err == nil
}

// fire enqueues the job of tick t unless another process fired t or a later
// tick: the schedule's record moves from an earlier tick to t by
// compare-and-swap, and the process whose write lands enqueues.
func (p *Platform) fire(ctx context.Context, st *Store, e *schedEntry, t time.Time) {
	name, val := e.s.Name, []byte(strconv.FormatInt(t.UnixNano(), 10))
	won := false
	var err error
	for range 10 {
		var v []byte
		var rev string
		v, rev, err = st.Get(ctx, name)
		switch {
		case errors.Is(err, ErrKeyNotFound):
			_, err = st.Create(ctx, name, val, 0)
			if errors.Is(err, ErrKeyExists) {
				continue
			}
		case err == nil:
			last, perr := strconv.ParseInt(string(v), 10, 64)
			if perr == nil && last >= t.UnixNano() {
				return // fired by another process
			}
			_, err = st.Update(ctx, name, val, rev, 0)
			if errors.Is(err, ErrRevision) {
				continue
			}
		}
		won = err == nil
		break
	}
	if !won {
		if ctx.Err() == nil {
			p.log.Warn("asyncplatform: a schedule's tick was not fired", "schedule", name, "tick", t, "error", err)
		}
		return
	}
	j := e.s.Job
	j.ID, j.EnqueuedAt, j.copyNo = "", time.Time{}, 0
	j.Headers = cloneHeaders(e.s.Job.Headers)
	j.Headers[ScheduleTickHeader] = t.UTC().Format(time.RFC3339Nano)
	for try := 0; ; try++ { // the tick is ours alone: try a little harder
		err = p.Enqueue(context.WithoutCancel(ctx), &j)
		if err == nil || try == 2 || errors.Is(err, ErrInvalidJob) || errors.Is(err, ErrDuplicate) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		p.log.Error("asyncplatform: enqueueing a schedule's job failed; the tick is lost", "schedule", name, "tick", t, "error", err)
	}
}
