package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/schedule"
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
// trigger). Scheduling needs the backend's store (Platform.Store):
// without one, Platform.Schedule and New refuse every schedule with an
// error matching ErrNoStore.
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

// newScheduler returns p's scheduler, over the backend's store (or none:
// then every schedule is refused with an error matching ErrNoStore).
func newScheduler(p *Platform) *schedule.Scheduler[Job] {
	cfg := schedule.Config[Job]{
		Log:    p.log,
		Worker: p.cfg.WorkerName,
		Fire: func(ctx context.Context, j *Job, tick time.Time) error {
			j.Headers = cloneHeaders(j.Headers)
			j.Headers[ScheduleTickHeader] = tick.UTC().Format(time.RFC3339Nano)
			return p.Enqueue(ctx, j)
		},
		Final: func(err error) bool { return errors.Is(err, ErrInvalidJob) || errors.Is(err, ErrDuplicate) },
	}
	if d, err := driver.StoreOf(p.backend); err != nil {
		cfg.NoStore = err
	} else {
		cfg.Ticks, cfg.Defs = kv.Of(d, kv.Schedules), kv.Of(d, kv.ScheduleDefs)
	}
	return schedule.New(cfg)
}

// Schedule registers a periodic job (see Schedule). It may be called
// before or after Start; the scheduler runs from Start to Stop. Errors wrap
// ErrInvalidConfig; without the backend's store they also match
// ErrNoStore.
func (p *Platform) Schedule(s Schedule) error {
	if p == nil || p.backend == nil {
		return ErrNotNew
	}
	if s.Job.Type == "" {
		return fmt.Errorf("%w: Schedule %q: Job.Type is empty", ErrInvalidConfig, s.Name)
	}
	if s.Job.Queue != "" {
		if err := driver.CheckQueue(s.Job.Queue); err != nil {
			return fmt.Errorf("%w: Schedule %q: Job.Queue: %w", ErrInvalidConfig, s.Name, err)
		}
	}
	j := s.Job // what each tick enqueues a copy of, and what is published
	j.ID, j.EnqueuedAt, j.copyNo = "", time.Time{}, 0
	queue := j.Queue
	if queue == "" {
		queue = DefaultQueue
	}
	err := p.sched.Add(schedule.Spec[Job]{Name: s.Name, Cron: s.Cron, Location: s.Location, Every: s.Every,
		CatchUp: s.CatchUp, Type: j.Type, Queue: queue, Job: j})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// ScheduleTriggerHeader is the header of a job enqueued by TriggerSchedule
// (asyncctl schedules trigger) instead of at a tick: the time it was
// triggered (RFC 3339 with nanoseconds, UTC). Such a job has no
// ScheduleTickHeader.
const ScheduleTriggerHeader = "asyncplatform-schedule-trigger"

// ErrNoSchedule is matched (errors.Is) by the error of TriggerSchedule for
// a schedule that no process has run on this backend.
var ErrNoSchedule = schedule.ErrNoSchedule

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

// MaxSchedules is the most schedules Platform.Schedules reads: the names
// it is given, or those it finds in the backend's store.
const MaxSchedules = schedule.MaxList

// ErrTooManySchedules is matched by the error of Platform.Schedules when
// the backend's store holds more than MaxSchedules schedules, or more
// names are given: nothing is listed (list them by name, a page of names
// at a time).
var ErrTooManySchedules = schedule.ErrTooMany

// Schedules lists the schedules known to the backend's store, by name:
// every schedule some process has run (Platform.Schedule, Config.Schedules),
// whether or not one runs now; or, with names, those of them (a name no
// process has run is left out). It reads at most MaxSchedules of them (see
// ErrTooManySchedules). asyncctl schedules list prints them.
func (p *Platform) Schedules(ctx context.Context, names ...string) ([]ScheduleInfo, error) {
	if p == nil || p.backend == nil {
		return nil, ErrNotNew
	}
	list, err := p.sched.List(ctx, names...)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: %w", err)
	}
	out := make([]ScheduleInfo, len(list))
	for i, si := range list {
		out[i] = ScheduleInfo(si)
	}
	return out, nil
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
	j, err := p.sched.Published(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: TriggerSchedule: %w", err)
	}
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
	if err := p.sched.Delete(ctx, name); err != nil {
		return fmt.Errorf("asyncplatform: %w", err)
	}
	return nil
}
