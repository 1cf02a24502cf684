package asyncplatform

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
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
// Each process also publishes the schedule's definition in the store, for
// Platform.Schedules and TriggerSchedule (asyncctl schedules list and
// trigger). Scheduling needs the backend's store (Platform.Store).
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
	return &Store{s: kv.Of(d, kv.Schedules)}, nil
}

// lateLimit is how late a tick may be fired by a scheduler that fell
// behind (a stalled process, a slow broker); ticks later than that are
// skipped, as missed.
const lateLimit = 10 * time.Second

// runSchedule publishes the schedule's definition, catches up the missed
// ticks, then fires every tick until ctx ends.
func (p *Platform) runSchedule(ctx context.Context, e *schedEntry) {
	st, err := p.scheduleStore()
	if err != nil {
		p.log.Error("asyncplatform: the schedule does not run", "schedule", e.s.Name, "error", err)
		return
	}
	p.publishSchedule(ctx, e)
	from := time.Now() // the ticks after this one are this run's own
	last, ok := p.lastTick(ctx, st, e.s.Name)
	var missed int
	var caught []time.Time
	if ok {
		missed, caught = missedTicks(e.next, last, from, e.s.CatchUp)
	}
	level := slog.LevelDebug
	if missed > 0 {
		level = slog.LevelInfo
	}
	p.log.Log(ctx, level, "asyncplatform: schedule started", "schedule", e.s.Name, "from", from, "last_tick", last,
		"missed", missed, "caught_up", len(caught), "skipped", missed-len(caught))
	for _, t := range caught {
		p.fire(ctx, st, e, t)
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
			p.log.Warn("asyncplatform: a schedule fell behind; ticks skipped", "schedule", e.s.Name, "from", next, "to", skip)
			next = skip
		}
		timer.Reset(time.Until(next))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		p.fire(ctx, st, e, next)
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

// lastTick reads the last tick fired of a schedule.
func (p *Platform) lastTick(ctx context.Context, st *Store, name string) (time.Time, bool) {
	t, err := readTick(ctx, st, name)
	if err != nil {
		if !errors.Is(err, ErrKeyNotFound) {
			p.log.Warn("asyncplatform: reading a schedule's last tick failed; missed ticks are skipped", "schedule", name, "error", err)
		}
		return time.Time{}, false
	}
	return t, true
}

// readTick reads the last tick fired of a schedule; ErrKeyNotFound when
// none was.
func readTick(ctx context.Context, st *Store, name string) (time.Time, error) {
	v, _, err := st.Get(ctx, name)
	if err != nil {
		return time.Time{}, err
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("asyncplatform: schedule %q: a last tick that does not parse: %w", name, err)
	}
	return time.Unix(0, n), nil
}

// fire enqueues the job of tick t unless another process fired t or a later
// tick: the schedule's record moves from an earlier tick to t by
// compare-and-swap, and the process whose write lands enqueues.
func (p *Platform) fire(ctx context.Context, st *Store, e *schedEntry, t time.Time) {
	name, val := e.s.Name, []byte(strconv.FormatInt(t.UnixNano(), 10))
	won := false
	err := kv.Retry(ctx, func() error {
		v, rev, err := st.Get(ctx, name)
		switch {
		case errors.Is(err, ErrKeyNotFound):
			_, err = st.Create(ctx, name, val, 0)
			if errors.Is(err, ErrKeyExists) {
				return kv.ErrRetry
			}
		case err == nil:
			last, perr := strconv.ParseInt(string(v), 10, 64)
			if perr == nil && last >= t.UnixNano() {
				return nil // fired by another process
			}
			_, err = st.Update(ctx, name, val, rev, 0)
			if errors.Is(err, ErrRevision) {
				return kv.ErrRetry
			}
		}
		won = err == nil
		return err
	})
	if !won {
		if err != nil && ctx.Err() == nil {
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

// ScheduleTriggerHeader is the header of a job enqueued by TriggerSchedule
// (asyncctl schedules trigger) instead of at a tick: the time it was
// triggered (RFC 3339 with nanoseconds, UTC). Such a job has no
// ScheduleTickHeader.
const ScheduleTriggerHeader = "asyncplatform-schedule-trigger"

// ErrNoSchedule is matched (errors.Is) by the error of TriggerSchedule for
// a schedule that no process has run on this backend.
var ErrNoSchedule = errors.New("no such schedule")

// scheduleDef is a schedule's definition as the store keeps it.
type scheduleDef struct {
	Cron     string        `json:"cron,omitempty"`
	Location string        `json:"location,omitempty"`
	Every    time.Duration `json:"every,omitempty"`
	CatchUp  int           `json:"catch_up,omitempty"`
	Type     string        `json:"type"`
	Queue    string        `json:"queue"`
	Job      *Job          `json:"job,omitempty"` // nil when too large for the store
	Worker   string        `json:"worker"`
	Started  time.Time     `json:"started"`
}

func (p *Platform) defStore() (*Store, error) {
	d, err := driver.StoreOf(p.backend)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: schedules need the backend's store: %w", err)
	}
	return &Store{s: kv.Of(d, kv.ScheduleDefs)}, nil
}

// publishSchedule writes the schedule's definition to the store (last
// writer wins), so that a process without the code can list the schedule
// and trigger it.
func (p *Platform) publishSchedule(ctx context.Context, e *schedEntry) {
	st, err := p.defStore()
	if err != nil {
		return
	}
	d := scheduleDef{Cron: e.s.Cron, Every: e.s.Every, CatchUp: e.s.CatchUp, Type: e.s.Job.Type, Queue: e.s.Job.Queue,
		Worker: p.cfg.WorkerName, Started: time.Now().UTC()}
	if d.Queue == "" {
		d.Queue = DefaultQueue
	}
	if e.s.Location != nil {
		d.Location = e.s.Location.String()
	}
	j := e.s.Job
	j.ID, j.EnqueuedAt, j.copyNo = "", time.Time{}, 0
	d.Job = &j
	v, err := json.Marshal(d)
	if err == nil && driver.CheckValue(v) != nil { // keep what fits: the schedule without its job
		d.Job = nil
		v, err = json.Marshal(d)
	}
	if err == nil {
		err = put(ctx, st, e.s.Name, v)
	}
	if err != nil && ctx.Err() == nil {
		p.log.Warn("asyncplatform: publishing a schedule's definition failed; asyncctl may not list it", "schedule", e.s.Name, "error", err)
	}
}

// put writes key whatever it holds.
func put(ctx context.Context, st *Store, key string, v []byte) error {
	err := kv.Retry(ctx, func() error {
		_, rev, err := st.Get(ctx, key)
		switch {
		case errors.Is(err, ErrKeyNotFound):
			_, err = st.Create(ctx, key, v, 0)
			if errors.Is(err, ErrKeyExists) {
				return kv.ErrRetry
			}
		case err == nil:
			_, err = st.Update(ctx, key, v, rev, 0)
			if errors.Is(err, ErrRevision) {
				return kv.ErrRetry
			}
		}
		return err
	})
	if errors.Is(err, kv.ErrContended) {
		return fmt.Errorf("key %q: %w", key, err)
	}
	return err
}

// ScheduleInfo is what the backend's store tells of one schedule: its
// definition, as the process that last started it published it, and its
// last tick fired.
type ScheduleInfo struct {
	Name    string
	Cron    string        // as registered; empty for an Every schedule
	Every   time.Duration // zero for a Cron schedule
	CatchUp int
	Type    string // the job's type
	Queue   string // the job's queue

	// Last is the last tick fired (zero when none was); Next is the first
	// tick after now, which a running scheduler fires (zero when the
	// definition is unknown or the cron spec has no tick left).
	Last, Next time.Time

	// Worker is the Config.WorkerName of the process that last started
	// the schedule, and Started when it did: a schedule no longer in the
	// code keeps its old Started.
	Worker  string
	Started time.Time

	// Triggerable says whether TriggerSchedule can enqueue its job (the
	// store keeps the job unless it is over driver.MaxValueLen).
	Triggerable bool
}

// Schedules lists the schedules known to the backend's store, by name:
// every schedule some process has run (Platform.Schedule, Config.Schedules),
// whether or not one runs now; or, with names, those of them (a name no
// process has run is left out). asyncctl schedules list prints them.
func (p *Platform) Schedules(ctx context.Context, names ...string) ([]ScheduleInfo, error) {
	if p == nil || p.backend == nil {
		return nil, ErrNotNew
	}
	defs, err := p.defStore()
	if err != nil {
		return nil, err
	}
	ticks, err := p.scheduleStore()
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, n := range names {
		if err := driver.CheckKey(n); err != nil {
			return nil, fmt.Errorf("asyncplatform: schedule name %q: %w", n, err)
		}
		known[n] = true
	}
	for _, st := range []*Store{defs, ticks} {
		if len(names) > 0 {
			break
		}
		for cursor := ""; ; {
			page, err := st.List(ctx, "", cursor, MaxListLimit)
			if err != nil {
				return nil, fmt.Errorf("asyncplatform: listing schedules: %w", err)
			}
			for _, k := range page.Keys {
				known[k] = true
			}
			if cursor = page.Next; cursor == "" {
				break
			}
		}
	}
	now := time.Now()
	out := make([]ScheduleInfo, 0, len(names))
	for _, name := range slices.Sorted(maps.Keys(known)) {
		si := ScheduleInfo{Name: name}
		last, err := readTick(ctx, ticks, name)
		hasLast := err == nil
		switch {
		case hasLast:
			si.Last = last
		case !errors.Is(err, ErrKeyNotFound):
			return nil, err
		}
		d, err := readDef(ctx, defs, name)
		switch {
		case errors.Is(err, ErrKeyNotFound):
			if !hasLast {
				continue // named, and unknown
			}
		case err != nil:
			return nil, err
		default:
			si.Cron, si.Every, si.CatchUp, si.Type, si.Queue = d.Cron, d.Every, d.CatchUp, d.Type, d.Queue
			si.Worker, si.Started, si.Triggerable = d.Worker, d.Started, d.Job != nil
			if e, err := newSchedEntry(d.schedule(name)); err == nil {
				si.Next = e.next(now)
			}
		}
		out = append(out, si)
	}
	return out, nil
}

func readDef(ctx context.Context, st *Store, name string) (scheduleDef, error) {
	var d scheduleDef
	v, _, err := st.Get(ctx, name)
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(v, &d); err != nil {
		return d, fmt.Errorf("asyncplatform: schedule %q: a definition that does not parse: %w", name, err)
	}
	return d, nil
}

// schedule rebuilds the Schedule of a definition (its Location missing
// when this process does not know the zone).
func (d scheduleDef) schedule(name string) Schedule {
	s := Schedule{Name: name, Cron: d.Cron, Every: d.Every, CatchUp: d.CatchUp, Job: Job{Type: d.Type, Queue: d.Queue}}
	if d.Location != "" {
		s.Location, _ = time.LoadLocation(d.Location)
	}
	if d.Job != nil {
		s.Job = *d.Job
	}
	return s
}

// TriggerSchedule enqueues the job of a schedule now, as the process that
// last started the schedule defined it, without a tick: the job carries
// ScheduleTriggerHeader, and the schedule's ticks go on as before. The
// schedule need not be registered in this process (asyncctl schedules
// trigger). It returns the job enqueued; the error matches ErrNoSchedule
// when no process has run the schedule on this backend.
func (p *Platform) TriggerSchedule(ctx context.Context, name string) (*Job, error) {
	if p == nil || p.backend == nil {
		return nil, ErrNotNew
	}
	if err := driver.CheckKey(name); err != nil {
		return nil, fmt.Errorf("asyncplatform: TriggerSchedule %q: %w: %w", name, ErrNoSchedule, err)
	}
	defs, err := p.defStore()
	if err != nil {
		return nil, err
	}
	d, err := readDef(ctx, defs, name)
	if errors.Is(err, ErrKeyNotFound) {
		return nil, fmt.Errorf("asyncplatform: TriggerSchedule %q: %w (no process has started it on this backend)", name, ErrNoSchedule)
	}
	if err != nil {
		return nil, err
	}
	if d.Job == nil {
		return nil, fmt.Errorf("asyncplatform: TriggerSchedule %q: its job is over the store's %d-byte limit, so it is not kept: trigger it from the code", name, driver.MaxValueLen)
	}
	j := *d.Job
	j.ID = ""
	j.Headers = cloneHeaders(j.Headers)
	delete(j.Headers, ScheduleTickHeader)
	j.Headers[ScheduleTriggerHeader] = time.Now().UTC().Format(time.RFC3339Nano)
	if err := p.Enqueue(ctx, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// DeleteSchedule removes what the backend's store keeps of a schedule (its
// definition and its last tick), for a schedule taken out of the code. A
// process still running it writes both again at its next start and tick,
// and fires the next tick as if none had been fired before (no catch-up).
// Deleting a schedule never known is no error.
func (p *Platform) DeleteSchedule(ctx context.Context, name string) error {
	if p == nil || p.backend == nil {
		return ErrNotNew
	}
	if err := driver.CheckKey(name); err != nil {
		return fmt.Errorf("asyncplatform: schedule name %q: %w", name, err)
	}
	defs, err := p.defStore()
	if err != nil {
		return err
	}
	ticks, err := p.scheduleStore()
	if err != nil {
		return err
	}
	if err := defs.Delete(ctx, name, ""); err != nil {
		return err
	}
	return ticks.Delete(ctx, name, "")
}
