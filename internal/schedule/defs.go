package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// ErrNoSchedule is matched (errors.Is) by the error of Published for a
// schedule that no process has published.
var ErrNoSchedule = errors.New("no such schedule")

// MaxList is the most schedules List reads: the names it is given, or the
// names it finds in the store.
const MaxList = 10_000

// ErrTooMany is matched by the error of List when the store holds more
// than MaxList schedules (or more names are given): nothing is returned.
var ErrTooMany = errors.New("too many schedules to list")

// def is a schedule's definition as the store keeps it (JSON, one key per
// schedule in kv.ScheduleDefs, last writer wins).
type def[J any] struct {
	Cron     string        `json:"cron,omitempty"`
	Location string        `json:"location,omitempty"`
	Every    time.Duration `json:"every,omitempty"`
	CatchUp  int           `json:"catch_up,omitempty"`
	Type     string        `json:"type"`
	Queue    string        `json:"queue"`
	Job      *J            `json:"job,omitempty"` // nil when too large for the store
	Worker   string        `json:"worker"`
	Started  time.Time     `json:"started"`
}

// Info is what the store tells of one schedule: its definition, as the
// process that last started it published it, and its last tick fired.
type Info struct {
	Name    string
	Cron    string        // empty for an Every schedule
	Every   time.Duration // zero for a Cron schedule
	CatchUp int
	Type    string // the job's type
	Queue   string // the job's queue

	// Last is the last tick fired (zero when none was); Next is the first
	// tick after now (zero when the definition is unknown or the cron spec
	// has no tick left).
	Last, Next time.Time

	// Worker is the Config.Worker of the process that last started the
	// schedule, and Started when it did.
	Worker  string
	Started time.Time

	// Triggerable says whether the definition holds the job (Published
	// returns it).
	Triggerable bool
}

// publish writes the schedule's definition to the store (last writer wins),
// so that a process without the code can list the schedule and trigger it.
// A failure is logged: the schedule runs all the same.
func (s *Scheduler[J]) publish(ctx context.Context, sp Spec[J]) {
	d := def[J]{Cron: sp.Cron, Every: sp.Every, CatchUp: sp.CatchUp, Type: sp.Type, Queue: sp.Queue,
		Worker: s.cfg.Worker, Started: time.Now().UTC(), Job: &sp.Job}
	if sp.Location != nil {
		d.Location = sp.Location.String()
	}
	v, err := json.Marshal(d)
	if err == nil && driver.CheckValue(v) != nil { // keep what fits: the schedule without its job
		d.Job = nil
		v, err = json.Marshal(d)
	}
	if err == nil {
		err = put(ctx, s.cfg.Defs, sp.Name, v)
	}
	if err != nil && ctx.Err() == nil {
		s.cfg.Log.Warn("asyncplatform: publishing a schedule's definition failed; asyncctl may not list it", "schedule", sp.Name, "error", err)
	}
}

// put writes key whatever it holds.
func put(ctx context.Context, st *kv.Store, key string, v []byte) error {
	err := kv.Retry(ctx, func() error {
		_, rev, err := st.Get(ctx, key)
		switch {
		case errors.Is(err, driver.ErrKeyNotFound):
			_, err = st.Create(ctx, key, v, 0)
			if errors.Is(err, driver.ErrKeyExists) {
				return kv.ErrRetry
			}
		case err == nil:
			_, err = st.Update(ctx, key, v, rev, 0)
			if errors.Is(err, driver.ErrRevision) {
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

func readDef[J any](ctx context.Context, st *kv.Store, name string) (def[J], error) {
	var d def[J]
	v, _, err := st.Get(ctx, name)
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(v, &d); err != nil {
		return d, fmt.Errorf("schedule %q: a definition that does not parse: %w", name, err)
	}
	return d, nil
}

// List returns what the store keeps of the schedules, by name: every
// schedule with a definition or a last tick; or, with names, those of them
// (a name the store does not know is left out).
func (s *Scheduler[J]) List(ctx context.Context, names ...string) ([]Info, error) {
	if err := s.checkStore(); err != nil {
		return nil, err
	}
	most := s.cfg.MaxList
	if most <= 0 {
		most = MaxList
	}
	if len(names) > most {
		return nil, fmt.Errorf("%w: %d names given, at most %d", ErrTooMany, len(names), most)
	}
	known := map[string]bool{}
	for _, n := range names {
		if err := driver.CheckKey(n); err != nil {
			return nil, fmt.Errorf("schedule name %q: %w", n, err)
		}
		known[n] = true
	}
	if len(names) == 0 {
		for _, st := range []*kv.Store{s.cfg.Defs, s.cfg.Ticks} {
			err := st.ListAll(ctx, "", func(k string) (bool, error) {
				known[k] = true
				if len(known) > most {
					return false, fmt.Errorf("%w: the store holds more than %d; list them by name", ErrTooMany, most)
				}
				return true, nil
			})
			if err != nil {
				return nil, fmt.Errorf("listing schedules: %w", err)
			}
		}
	}
	now := time.Now()
	out := make([]Info, 0, len(known))
	for _, name := range slices.Sorted(maps.Keys(known)) {
		si := Info{Name: name}
		last, err := readTick(ctx, s.cfg.Ticks, name)
		hasLast := err == nil
		switch {
		case hasLast:
			si.Last = last
		case !errors.Is(err, driver.ErrKeyNotFound):
			return nil, err
		}
		d, err := readDef[J](ctx, s.cfg.Defs, name)
		switch {
		case errors.Is(err, driver.ErrKeyNotFound):
			if !hasLast {
				continue // named, and unknown
			}
		case err != nil:
			return nil, err
		default:
			si.Cron, si.Every, si.CatchUp, si.Type, si.Queue = d.Cron, d.Every, d.CatchUp, d.Type, d.Queue
			si.Worker, si.Started, si.Triggerable = d.Worker, d.Started, d.Job != nil
			if next, err := parse(d.Cron, location(d.Location), d.Every); err == nil {
				si.Next = next(now)
			}
		}
		out = append(out, si)
	}
	return out, nil
}

// location returns the zone of a definition, nil (UTC) when this process
// does not know it.
func location(name string) *time.Location {
	if name == "" {
		return nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil
	}
	return loc
}

// Published returns the job of a schedule's definition, as the process that
// last started the schedule published it. The error matches ErrNoSchedule
// when no process has; it says so when the job was too large to be kept.
func (s *Scheduler[J]) Published(ctx context.Context, name string) (J, error) {
	var zero J
	if err := driver.CheckKey(name); err != nil {
		return zero, fmt.Errorf("schedule %q: %w: %w", name, ErrNoSchedule, err)
	}
	if err := s.checkStore(); err != nil {
		return zero, err
	}
	d, err := readDef[J](ctx, s.cfg.Defs, name)
	if errors.Is(err, driver.ErrKeyNotFound) {
		return zero, fmt.Errorf("schedule %q: %w (no process has started it on this backend)", name, ErrNoSchedule)
	}
	if err != nil {
		return zero, err
	}
	if d.Job == nil {
		return zero, fmt.Errorf("schedule %q: its job is over the store's %d-byte limit, so it is not kept: trigger it from the code", name, driver.MaxValueLen)
	}
	return *d.Job, nil
}

// Delete removes what the store keeps of a schedule: its definition and its
// last tick. Deleting a schedule never known is no error.
func (s *Scheduler[J]) Delete(ctx context.Context, name string) error {
	if err := driver.CheckKey(name); err != nil {
		return fmt.Errorf("schedule name %q: %w", name, err)
	}
	if err := s.checkStore(); err != nil {
		return err
	}
	if err := s.cfg.Defs.Delete(ctx, name, ""); err != nil {
		return err
	}
	return s.cfg.Ticks.Delete(ctx, name, "")
}
