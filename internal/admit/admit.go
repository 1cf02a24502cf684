// Package admit is the platform's admission of jobs under their type's
// limits (Config.Limits): a place under the process's concurrency, a
// cluster-wide slot and a start under a cluster-wide rate, taken before a
// job's handler runs and, for the first two, given back after it (a
// cluster slot stays with the process for its next job of the type for a
// moment first: see slotLinger). The cluster-wide limits live in the backend's store (internal/flow over a
// kv.Store), under sem/<type>/<slot> and rate/<type>.
package admit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/flow"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

var _ flow.KV = (*kv.Store)(nil)

// Limit is one job type's limits; a zero field sets no limit. Its fields
// are those of asyncplatform.TypeLimit, which documents them.
type Limit struct {
	Concurrency        int     // jobs running at once in this process
	ClusterConcurrency int     // jobs running at once across every process
	Rate               float64 // starts per second across every process
	Burst              int     // starts the rate admits at once; 0 means 1
}

// Config is what a Gate is built from.
type Config struct {
	// Limits are the limits of each job type.
	Limits map[string]Limit

	// Key returns a job type as a store key segment: the type's slots are
	// the keys sem/<Key(type)>/<i> of Store, and its rate rate/<Key(type)>.
	// Defaults to the type itself.
	Key func(typ string) string

	// Store holds the cluster-wide limits. Nil when the backend has none;
	// StoreErr then says why, and New refuses a cluster-wide limit with
	// an error wrapping it.
	Store    *kv.Store
	StoreErr error

	// Lease is how long a cluster slot stays held without a renewal: Run
	// renews the slots of running jobs every Lease/3, and each store round
	// trip of the Gate is given Lease/3. Required.
	Lease time.Duration

	// Holder names this process in the slots it holds.
	Holder string

	// Logger receives the warnings of failed store round trips. Defaults
	// to slog.Default().
	Logger *slog.Logger
}

// Gate admits jobs under their type's limits. A Gate is safe for
// concurrent use.
type Gate struct {
	types  map[string]*typeGate // only the types with a limit
	lease  time.Duration
	holder string
	log    *slog.Logger
	renews bool // some type has a cluster-wide concurrency limit

	mu    sync.Mutex
	slots map[*flow.Slot]struct{} // cluster slots held by running jobs
}

// typeGate is one job type's limits, each nil when not set.
type typeGate struct {
	local *flow.Local
	sem   *flow.Semaphore
	pool  *slotPool // with sem: the slots held here with no job
	rate  *rateLine
}

// slotLinger is how long a cluster slot a job gave back stays with its
// process for the next job of the type (at most a sixth of the lease):
// while jobs come, a slot is taken from the store once and used by job
// after job, with no round trip. It counts against the limit all along
// (its key is held and renewed); after slotLinger with no job, or once it
// was held for a lease since it was taken, it goes back to the store, so
// no process keeps a slot from the others for longer than a lease.
const slotLinger = 100 * time.Millisecond

// slotPool is the cluster slots of one type held by this process with no
// job running, the most recently used last.
type slotPool struct {
	mu     sync.Mutex
	idle   []idleSlot
	timer  *time.Timer // frees the slots idle for the linger; nil: none armed
	closed bool        // Run ended: slots given back are freed
}

type idleSlot struct {
	slot         *flow.Slot
	taken, since time.Time // from the store; given back by its last job
}

// New validates cfg's limits and returns their Gate. Its errors name the
// limit at fault as Limits[<type>].
func New(cfg Config) (*Gate, error) {
	if cfg.Lease <= 0 {
		return nil, fmt.Errorf("admit: Lease is %v, want a positive duration", cfg.Lease)
	}
	if cfg.Key == nil {
		cfg.Key = func(typ string) string { return typ }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	g := &Gate{lease: cfg.Lease, holder: cfg.Holder, log: cfg.Logger, slots: map[*flow.Slot]struct{}{}}
	for typ, l := range cfg.Limits {
		t, err := newTypeGate(cfg, typ, l)
		if err != nil {
			return nil, err
		}
		if t == nil {
			continue
		}
		if g.types == nil {
			g.types = make(map[string]*typeGate, len(cfg.Limits))
		}
		g.types[typ] = t
		g.renews = g.renews || t.sem != nil
	}
	return g, nil
}

// newTypeGate builds the limits of type typ; nil when l sets none.
func newTypeGate(cfg Config, typ string, l Limit) (*typeGate, error) {
	where := fmt.Sprintf("Limits[%q]", typ)
	if typ == "" {
		return nil, fmt.Errorf("%s: the job type is empty", where)
	}
	if l.Concurrency < 0 || l.ClusterConcurrency < 0 || l.Rate < 0 || l.Burst < 0 {
		return nil, fmt.Errorf("%s: limits must not be negative", where)
	}
	if (l.ClusterConcurrency > 0 || l.Rate > 0) && cfg.Store == nil {
		err := cfg.StoreErr
		if err == nil {
			err = errors.New("no store given")
		}
		return nil, fmt.Errorf("%s: a cluster-wide limit needs the backend's store: %w", where, err)
	}
	t := &typeGate{}
	if l.Concurrency > 0 {
		t.local, _ = flow.NewLocal(l.Concurrency)
	}
	key := cfg.Key(typ)
	if l.ClusterConcurrency > 0 {
		t.pool = &slotPool{}
		s, err := flow.NewSemaphore(cfg.Store, flow.SemaphoreConfig{Prefix: "sem/" + key, Slots: l.ClusterConcurrency, Lease: cfg.Lease, Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("%s.ClusterConcurrency: %w", where, err)
		}
		t.sem = s
	}
	if l.Rate > 0 {
		r, err := flow.NewRate(cfg.Store, flow.RateConfig{Key: "rate/" + key, Events: l.Rate, Burst: max(l.Burst, 1), Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("%s.Rate: %w", where, err)
		}
		t.rate = newRateLine(r)
	}
	if t.local == nil && t.sem == nil && t.rate == nil {
		return nil, nil
	}
	return t, nil
}

// Ticket is what an admitted job holds while it runs: Release gives it
// back. The zero Ticket holds nothing.
type Ticket struct {
	g     *Gate
	t     *typeGate
	slot  *flow.Slot // nil: none
	taken time.Time  // when the slot was taken from the store
}

// Admit takes what the limits of type typ require before a job of the
// type runs (id names it in the logs): a place under the process's
// concurrency, a cluster slot, a start under the rate, in that order.
// workers is its queue's Concurrency, the handlers that may run at once: a
// rate lets about three quarters of them at most wait in Admit for their
// starts.
//
// A job Admit admits (ok) holds its Ticket until its handler returns (or
// it ends without running), then releases it, before its outcome is
// reported.
// A job it refuses holds nothing, and wait is how long the limit asks it
// to wait; zero when it does not say (a concurrency limit, a store that
// failed: the failure is logged).
//
// ctx ends the wait for a start's time; the start is then lost and the
// job refused. The store round trips are given Lease/3 each and go on
// when ctx ends: a slot taken or freed halfway would stay held for a
// lease.
func (g *Gate) Admit(ctx context.Context, typ, id string, workers int) (tk Ticket, wait time.Duration, ok bool) {
	t := g.types[typ]
	if t == nil {
		return Ticket{}, 0, true
	}
	if t.local != nil && !t.local.TryAcquire() {
		return Ticket{}, 0, false
	}
	tk = Ticket{g: g, t: t}
	if t.sem == nil && t.rate == nil {
		return tk, 0, true
	}
	if t.sem != nil {
		s, taken, ok := g.reuse(t)
		if !ok {
			var err error
			s, ok, err = g.acquire(ctx, t.sem)
			if err != nil || !ok {
				tk.Release(ctx)
				g.failed(typ, id, err)
				return Ticket{}, 0, false
			}
			taken = time.Now()
			g.mu.Lock()
			g.slots[s] = struct{}{}
			g.mu.Unlock()
		}
		tk.slot, tk.taken = s, taken
	}
	if t.rate != nil {
		if wait, err := t.rate.start(ctx, g.lease/3, max(workers/2, 1)); err != nil || wait > 0 {
			tk.Release(context.WithoutCancel(ctx))
			g.failed(typ, id, err)
			return Ticket{}, wait, false
		}
	}
	return tk, 0, true
}

// reuse takes a slot of t held here with no job, if one is left that is
// surely still this process's: Run found it not lost, and its lease runs
// for half a lease more at least by the last renewal that succeeded (a
// slot whose renewals were late may have lapsed and been taken by another
// process: it is freed, not used).
func (g *Gate) reuse(t *typeGate) (*flow.Slot, time.Time, bool) {
	p := t.pool
	var stale []*flow.Slot
	defer func() {
		for _, s := range stale {
			g.free(context.Background(), s)
		}
	}()
	p.mu.Lock()
	defer p.mu.Unlock()
	for n := len(p.idle); n > 0; n = len(p.idle) {
		is := p.idle[n-1]
		p.idle = p.idle[:n-1]
		if !g.isHeld(is.slot) {
			continue
		}
		if time.Until(is.slot.Deadline()) < g.lease/2 {
			stale = append(stale, is.slot)
			continue
		}
		return is.slot, is.taken, true
	}
	return nil, time.Time{}, false
}

// keep puts a slot a job gave back with the type's idle ones, and reports
// whether it did: not when Run has ended, when the slot was lost, or when
// it was taken from the store a lease ago or more (it goes back then).
func (g *Gate) keep(t *typeGate, s *flow.Slot, taken time.Time) bool {
	now := time.Now()
	if now.Sub(taken) >= g.lease || !g.isHeld(s) {
		return false
	}
	p := t.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.idle = append(p.idle, idleSlot{slot: s, taken: taken, since: now})
	if p.timer == nil {
		p.timer = time.AfterFunc(g.linger(), func() { g.expire(t) })
	}
	return true
}

// linger is how long an idle slot stays: slotLinger, at most a sixth of
// the lease.
func (g *Gate) linger() time.Duration { return min(slotLinger, g.lease/6) }

// expire frees the slots of t idle for the linger or more, and arms the
// timer again for the others.
func (g *Gate) expire(t *typeGate) {
	p := t.pool
	now := time.Now()
	p.mu.Lock()
	var old []*flow.Slot
	kept := p.idle[:0]
	for _, is := range p.idle {
		if now.Sub(is.since) >= g.linger() {
			old = append(old, is.slot)
		} else {
			kept = append(kept, is)
		}
	}
	clear(p.idle[len(kept):])
	p.idle = kept
	p.timer = nil
	if len(p.idle) > 0 && !p.closed {
		p.timer = time.AfterFunc(g.linger()-now.Sub(p.idle[0].since), func() { g.expire(t) })
	}
	p.mu.Unlock()
	for _, s := range old {
		g.free(context.Background(), s)
	}
}

// isHeld reports whether s is a slot this process holds and renews.
func (g *Gate) isHeld(s *flow.Slot) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.slots[s]
	return ok
}

// acquire takes a slot of s, if one is free, in a round trip given
// Lease/3 whether or not ctx ends.
func (g *Gate) acquire(ctx context.Context, s *flow.Semaphore) (*flow.Slot, bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.lease/3)
	defer cancel()
	return s.TryAcquire(ctx, g.holder)
}

// failed logs a limit that could not be read: the job waits as if over it.
func (g *Gate) failed(typ, id string, err error) {
	if err != nil {
		g.log.Warn("asyncplatform: checking a job type's limits failed; the job waits and comes again", "type", typ, "id", id, "error", err)
	}
}

// Release gives back what Admit took; it is called once. A cluster slot
// stays with the process for the next job of the type (see slotLinger),
// or is freed: given Lease/3 within ctx; a free that fails is logged, and
// the slot is free again after its lease.
func (tk Ticket) Release(ctx context.Context) {
	if tk.slot != nil && !tk.g.keep(tk.t, tk.slot, tk.taken) {
		tk.g.free(ctx, tk.slot)
	}
	if tk.t != nil && tk.t.local != nil {
		tk.t.local.Release()
	}
}

// free stops renewing s and deletes its key, in Lease/3 within ctx.
func (g *Gate) free(ctx context.Context, s *flow.Slot) {
	g.forget(s)
	ctx, cancel := context.WithTimeout(ctx, g.lease/3)
	defer cancel()
	if err := s.Release(ctx); err != nil {
		g.log.Warn("asyncplatform: freeing a cluster concurrency slot failed; it is free again after its lease", "key", s.Key(), "error", err)
	}
}

// forget stops renewing s, and reports whether it was renewed.
func (g *Gate) forget(s *flow.Slot) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, held := g.slots[s]
	delete(g.slots, s)
	return held
}

// Run renews the cluster slots this process holds (its running jobs', and
// those idle for the next job) every Lease/3 until ctx ends, all at once:
// one slow round trip delays no other slot's renewal. When ctx ends it
// frees the idle slots, and the slots running jobs give back from then on
// are freed at once; the rates' reservations ahead are cancelled, and Run
// returns once none is running (none starts after). It returns at once
// when no type has a cluster-wide concurrency limit or rate.
func (g *Gate) Run(ctx context.Context) {
	defer g.stopRates()
	if !g.renews {
		if g.rates() {
			<-ctx.Done()
		}
		return
	}
	defer g.close()
	tick := time.NewTicker(g.lease / 3)
	defer tick.Stop()
	var held []*flow.Slot
	var wg sync.WaitGroup
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		held = g.held(held[:0])
		for _, s := range held {
			wg.Go(func() { g.renew(ctx, s) })
		}
		wg.Wait()
	}
}

// rates reports whether some type has a cluster-wide rate.
func (g *Gate) rates() bool {
	for _, t := range g.types {
		if t.rate != nil {
			return true
		}
	}
	return false
}

// stopRates stops every rate line's work in the background (rateLine.stop).
func (g *Gate) stopRates() {
	for _, t := range g.types {
		if t.rate != nil {
			t.rate.stop()
		}
	}
}

// close frees every idle slot, and makes the slots given back from now on
// freed at once.
func (g *Gate) close() {
	for _, t := range g.types {
		if t.pool == nil {
			continue
		}
		p := t.pool
		p.mu.Lock()
		p.closed = true
		if p.timer != nil {
			p.timer.Stop()
			p.timer = nil
		}
		idle := p.idle
		p.idle = nil
		p.mu.Unlock()
		for _, is := range idle {
			g.free(context.Background(), is.slot)
		}
	}
}

// held appends the slots held by running jobs to buf.
func (g *Gate) held(buf []*flow.Slot) []*flow.Slot {
	g.mu.Lock()
	defer g.mu.Unlock()
	for s := range g.slots {
		buf = append(buf, s)
	}
	return buf
}

// renew renews the slot of a running job.
func (g *Gate) renew(ctx context.Context, s *flow.Slot) {
	ctx, cancel := context.WithTimeout(ctx, g.lease/3)
	defer cancel()
	err := s.Renew(ctx)
	switch {
	case err == nil:
	case errors.Is(err, flow.ErrSlotLost):
		if g.forget(s) { // not released meanwhile by its job
			g.log.Warn("asyncplatform: a running job lost its cluster concurrency slot (the store could not be reached within a lease); the limit may be passed until it ends", "key", s.Key())
		}
	default:
		g.log.Warn("asyncplatform: renewing a cluster concurrency slot failed; will retry", "key", s.Key(), "error", err)
	}
}
