package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/flow"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// DefaultLimitDelay is Config.LimitDelay's default.
const DefaultLimitDelay = time.Second

// TypeLimit bounds the jobs of one type (Config.Limits): how many run at once
// in this process, how many at once across every process sharing the
// backend, and how many start per second across them. A job over a limit
// is not run: it is requeued uncounted (no try spent, like a Reject) to be
// offered again after Config.LimitDelay, or, over a rate, exactly when
// the rate admits it; the jobs of other types behind it keep running. Set
// the same cluster-wide limits on every process that works the type.
type TypeLimit struct {
	// Concurrency is how many jobs of the type run at once in this
	// process. Defaults to 0: no limit.
	Concurrency int

	// ClusterConcurrency is how many jobs of the type run at once across
	// every process over the backend: a slot in the backend's store,
	// taken before the handler runs, renewed with the job's lease, freed
	// when it ends, and free again one lease after its process died.
	// Defaults to 0: no limit.
	ClusterConcurrency int

	// Rate is how many jobs of the type start per second across every
	// process over the backend (a GCRA in the backend's store; fractions
	// allowed: 0.5 is one every two seconds). Each process reserves starts
	// in batches, one store write each, and a job waits in its worker for
	// its start, up to a second, but never more than about three quarters
	// of its queue's workers at once (contract §13). Defaults to 0: no
	// limit.
	Rate float64

	// Burst is how many jobs the rate admits at once after a quiet spell.
	// Defaults to 1: starts are spaced evenly.
	Burst int
}

var _ flow.KV = (*Store)(nil)

// typeLimit is one job type's limits, built by New.
type typeLimit struct {
	local *flow.Local
	sem   *flow.Semaphore
	rate  *rateLine
}

// How a process takes the starts of a cluster-wide rate: it reserves them
// in batches (one store write each), the first due within rateWait: a
// start for each job waiting for one, and as many more as it used in the
// last demandWindow, at most maxRateBatch and a quarter of the queue's
// workers. A job waits in its worker for its start, up to rateWait; one
// that finds no start reserved reserves a batch while no more than half
// its queue's workers wait so, and is requeued otherwise. So at most about
// three quarters of a queue's workers wait for a type's starts.
const (
	rateWait     = time.Second
	maxRateBatch = 16
	demandWindow = 100 * time.Millisecond
)

// rateLine is this process's share of a job type's cluster-wide rate:
// starts reserved in the store a batch at a time (flow.Rate.Reserve), and
// handed here, in order, to the jobs that come, each waiting for its
// start's time (or the batch's, for starts a burst had left). A start no
// job took within grace of that time is dropped (it
// is lost to every process); one taken late, up to grace, lets the limit be
// passed by at most grace/interval starts over any span of time.
type rateLine struct {
	rate    *flow.Rate
	grace   time.Duration
	waiting atomic.Int32 // jobs waiting here for their starts' time
	pending atomic.Int32 // jobs waiting for a batch to be reserved
	rtt     atomic.Int64 // ns: the expected round trip of a Reserve

	reserving chan struct{} // held by the worker reserving a batch

	mu       sync.Mutex
	next     time.Time // the next unused start reserved
	reserved time.Time // when its batch was reserved
	left     int       // starts reserved and unused: next, next+interval, …
	window   time.Time // the start of the current demand window
	cur      int       // starts used in the current window
	prev     int       // starts used in the window before
}

func newRateLine(r *flow.Rate) *rateLine {
	return &rateLine{
		rate:      r,
		grace:     max(r.Interval(), r.Interval()*time.Duration(r.Burst()-1)),
		reserving: make(chan struct{}, 1),
	}
}

// used counts a start handed out here. The lock is held.
func (l *rateLine) used(now time.Time) {
	l.roll(now)
	l.cur++
}

// roll moves the demand windows on to now. The lock is held.
func (l *rateLine) roll(now time.Time) {
	switch d := now.Sub(l.window); {
	case d >= 2*demandWindow:
		l.window, l.prev, l.cur = now, 0, 0
	case d >= demandWindow:
		l.window, l.prev, l.cur = l.window.Add(demandWindow), l.cur, 0
	}
}

// take hands out the next reserved start, if one is left (ok): its time.
// A start due after rateWait is not handed out; its time says when to
// come again.
func (l *rateLine) take(now time.Time) (at time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.takeLocked(now)
}

// takeLocked is take with the lock held.
func (l *rateLine) takeLocked(now time.Time) (at time.Time, ok bool) {
	iv := l.rate.Interval()
	for l.left > 0 && now.Sub(l.due()) > l.grace {
		l.next, l.left = l.next.Add(iv), l.left-1
	}
	if l.left == 0 {
		return time.Time{}, false
	}
	at = l.due()
	if at.Sub(now) <= rateWait {
		l.next, l.left = l.next.Add(iv), l.left-1
		l.used(now)
	}
	return at, true
}

// due returns when the next reserved start is due: its time, or when it
// was reserved if that is later (the starts a burst had left are due at
// once). The lock is held.
func (l *rateLine) due() time.Time {
	if l.next.Before(l.reserved) {
		return l.reserved
	}
	return l.next
}

// add keeps a batch reserved for the time at, the starts before it being
// gone, and hands out its first start to the job that reserved it, as take
// would at now (ok false: every start of the batch came too late).
func (l *rateLine) add(g flow.Grant, at, now time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.next, l.left, l.reserved = g.First, g.Count, at
	if late := now.Sub(l.due()); late > l.grace && late <= rateWait {
		// Slower than expected: the reserver's start is its own (late by
		// the store's delay), the others are dropped by take as late.
		first := l.due()
		l.next, l.left = l.next.Add(l.rate.Interval()), l.left-1
		l.used(now)
		return first, true
	}
	return l.takeLocked(now)
}

// crowded reports whether maxWaiting jobs of the type already wait here,
// for their starts' time or for a batch.
func (l *rateLine) crowded(maxWaiting int) bool {
	return int(l.waiting.Load()+l.pending.Load()) >= maxWaiting
}

// roundTrip is the expected time of a Reserve: the longest of the last
// ones, decaying (better a start waited for a little than one dropped).
func (l *rateLine) roundTrip() time.Duration {
	return time.Duration(l.rtt.Load())
}

// took adds the time of a Reserve to the estimate.
func (l *rateLine) took(d time.Duration) {
	old := l.rtt.Load()
	l.rtt.Store(max(int64(d), old-old/8))
}

// want is the size of the next batch: a start for each job waiting for
// one, and as many more as were used here in the last demand window; at
// most maxWaiting/2.
func (l *rateLine) want(maxWaiting int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.roll(time.Now())
	n := 1 + int(l.pending.Load()) + l.prev
	return max(min(n, maxRateBatch, maxWaiting/2), 1)
}

// rateStart finds a job a start under the rate and waits for its time: the
// next start reserved here, or the first of a batch it reserves (one worker
// at a time; the others wait for that batch). A job that finds no start
// reserved while more than maxWaiting jobs of the type are here already
// reserves none: so at most about 1.5 × maxWaiting wait (those, and the
// jobs that take the starts they reserved). It returns 0 once the start's
// time has come, or, when the job is to be requeued, how long until this
// process's or the limit's next start.
func (p *Platform) rateStart(ctx context.Context, l *rateLine, maxWaiting int) (time.Duration, error) {
	at, ok := l.take(time.Now())
	if !ok {
		if l.crowded(maxWaiting) { // enough wait for starts already
			return demandWindow, nil
		}
		l.pending.Add(1)
		select {
		case l.reserving <- struct{}{}:
			l.pending.Add(-1)
		case <-ctx.Done():
			l.pending.Add(-1)
			return 0, ctx.Err()
		}
		at, ok = l.take(time.Now()) // a batch reserved while this one waited
		if !ok && l.crowded(maxWaiting) {
			<-l.reserving
			return demandWindow, nil
		}
		if !ok {
			// The batch is timed from when it is expected back: the starts
			// due at once are due then, not dropped as late on arrival.
			start := time.Now()
			expect := start.Add(l.roundTrip())
			g, wait, err := l.rate.Reserve(ctx, expect, l.want(maxWaiting), rateWait)
			l.took(time.Since(start))
			if err != nil || g.Count == 0 {
				<-l.reserving
				return max(wait, time.Millisecond), err
			}
			at, ok = l.add(g, expect, time.Now())
		}
		<-l.reserving
		if !ok {
			return demandWindow, nil
		}
	}
	d := time.Until(at)
	if d > rateWait {
		return d, nil
	}
	if d > 0 {
		l.waiting.Add(1)
		defer l.waiting.Add(-1)
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-p.stopWait: // stopping: the start is lost, the job is handed back
			return d, nil
		case <-p.workCtx.Done():
			return d, nil
		}
	}
	return 0, nil
}

// limits are the platform's job-type limits.
type limits struct {
	byType map[string]*typeLimit // nil: none configured
	slots  sync.Map              // *flow.Slot → struct{}: cluster slots held by running jobs
}

// initLimits validates Config.Limits and builds them.
func (p *Platform) initLimits() error {
	if len(p.cfg.Limits) == 0 {
		return nil
	}
	var shared *Store
	p.lim.byType = make(map[string]*typeLimit, len(p.cfg.Limits))
	for typ, l := range p.cfg.Limits {
		where := fmt.Sprintf("Limits[%q]", typ)
		if typ == "" {
			return fmt.Errorf("%w: Limits has an empty job type", ErrInvalidConfig)
		}
		if l.Concurrency < 0 || l.ClusterConcurrency < 0 || l.Rate < 0 || l.Burst < 0 {
			return fmt.Errorf("%w: %s: limits must not be negative", ErrInvalidConfig, where)
		}
		tl := &typeLimit{}
		if l.Concurrency > 0 {
			tl.local, _ = flow.NewLocal(l.Concurrency)
		}
		if (l.ClusterConcurrency > 0 || l.Rate > 0) && shared == nil {
			d, err := driver.StoreOf(p.backend)
			if err != nil {
				return fmt.Errorf("%w: %s: a cluster-wide limit needs the backend's store: %w", ErrInvalidConfig, where, err)
			}
			shared = &Store{s: kv.Of(d, kv.Limits)} // sem/<type>/<slot> and rate/<type>
		}
		key := kv.Segment(typ) // the type as a key segment (hashed when it does not fit)
		if l.ClusterConcurrency > 0 {
			s, err := flow.NewSemaphore(shared, flow.SemaphoreConfig{Prefix: "sem/" + key, Slots: l.ClusterConcurrency, Lease: p.cfg.Lease})
			if err != nil {
				return fmt.Errorf("%w: %s.ClusterConcurrency: %w", ErrInvalidConfig, where, err)
			}
			tl.sem = s
		}
		if l.Rate > 0 {
			r, err := flow.NewRate(shared, flow.RateConfig{Key: "rate/" + key, Events: l.Rate, Burst: max(l.Burst, 1)})
			if err != nil {
				return fmt.Errorf("%w: %s.Rate: %w", ErrInvalidConfig, where, err)
			}
			tl.rate = newRateLine(r)
		}
		if tl.local != nil || tl.sem != nil || tl.rate != nil {
			p.lim.byType[typ] = tl
		}
	}
	return nil
}

// admit takes what j's type's limits require before its handler runs: a
// place under the process's concurrency, a cluster slot, a start under the
// rate, in that order. It returns the slot taken (nil: none) and whether j
// may run; when it may not, it has let go of what it took and says how long
// the limit asks the job to wait (zero: about Config.LimitDelay). It
// settles nothing: the caller asks decide.Decide what becomes of a refused
// job.
func (p *Platform) admit(j *Job, tl *typeLimit, workers int) (slot *flow.Slot, ok bool, wait time.Duration) {
	if tl.local != nil && !tl.local.TryAcquire() {
		return nil, false, 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Lease/3)
	defer cancel()
	if tl.sem != nil {
		s, got, err := tl.sem.TryAcquire(ctx, p.cfg.WorkerName)
		if err != nil || !got {
			p.unadmit(tl, nil)
			p.limitFailed(j, err)
			return nil, false, 0
		}
		slot = s
	}
	if tl.rate != nil {
		if wait, err := p.rateStart(ctx, tl.rate, max(workers/2, 1)); err != nil || wait > 0 {
			p.unadmit(tl, slot)
			p.limitFailed(j, err)
			return nil, false, wait
		}
	}
	if slot != nil {
		p.lim.slots.Store(slot, struct{}{})
	}
	return slot, true, 0
}

// limitFailed logs a limit that could not be read: the job waits as if
// over it.
func (p *Platform) limitFailed(j *Job, err error) {
	if err != nil {
		p.log.Warn("asyncplatform: checking a job type's limits failed; the job waits and comes again", "type", j.Type, "id", j.ID, "error", err)
	}
}

// unadmit gives back what admit took.
func (p *Platform) unadmit(tl *typeLimit, slot *flow.Slot) {
	if slot != nil {
		p.lim.slots.Delete(slot)
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Lease/3)
		defer cancel()
		if err := slot.Release(ctx); err != nil {
			p.log.Warn("asyncplatform: freeing a cluster concurrency slot failed; it is free again after its lease", "key", slot.Key(), "error", err)
		}
	}
	if tl.local != nil {
		tl.local.Release()
	}
}

// startLimits renews the cluster slots of running jobs every Lease/3.
func (p *Platform) startLimits(ctx context.Context) {
	need := false
	for _, tl := range p.lim.byType {
		need = need || tl.sem != nil
	}
	if !need {
		return
	}
	p.every(ctx, p.cfg.Lease/3, func(ctx context.Context) {
		p.lim.slots.Range(func(k, _ any) bool {
			slot := k.(*flow.Slot)
			rctx, cancel := context.WithTimeout(ctx, p.cfg.Lease/3)
			err := slot.Renew(rctx)
			cancel()
			switch {
			case err == nil:
			case errors.Is(err, flow.ErrSlotLost):
				p.lim.slots.Delete(slot)
				p.log.Warn("asyncplatform: a running job lost its cluster concurrency slot (the store could not be reached within a lease); the limit may be passed until it ends", "key", slot.Key())
			default:
				p.log.Warn("asyncplatform: renewing a cluster concurrency slot failed; will retry", "key", slot.Key(), "error", err)
			}
			return true
		})
	})
}
