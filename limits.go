package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/flow"
)

// DefaultLimitDelay is Config.LimitDelay's default.
const DefaultLimitDelay = time.Second

// limitNamespace holds the cluster-wide limits' state in the store:
// sem/<type>/<slot> and rate/<type>.
const limitNamespace = "_limit/"

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
	// allowed: 0.5 is one every two seconds). Defaults to 0: no limit.
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
	rate  *flow.Rate
	// waiting counts the jobs of this process that wait here for the
	// rate's next start (at most maxRateWaiters, each at most
	// maxRateWait), so a start is not lost for want of a job at hand; the
	// others are requeued.
	waiting atomic.Int32
}

// maxRateWait bounds how long the next job in line waits in its worker for
// the rate's next start; maxRateWaiters bounds the workers of one process
// that wait so for one type.
const (
	maxRateWait    = 100 * time.Millisecond
	maxRateWaiters = 1
)

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
	var kv *Store
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
		if (l.ClusterConcurrency > 0 || l.Rate > 0) && kv == nil {
			d, err := driver.StoreOf(p.backend)
			if err != nil {
				return fmt.Errorf("%w: %s: a cluster-wide limit needs the backend's store: %w", ErrInvalidConfig, where, err)
			}
			kv = &Store{d: d, ns: limitNamespace}
		}
		key := statusKey(typ) // the type as a key segment (hashed when it does not fit)
		if l.ClusterConcurrency > 0 {
			s, err := flow.NewSemaphore(kv, flow.SemaphoreConfig{Prefix: "sem/" + key, Slots: l.ClusterConcurrency, Lease: p.cfg.Lease})
			if err != nil {
				return fmt.Errorf("%w: %s.ClusterConcurrency: %w", ErrInvalidConfig, where, err)
			}
			tl.sem = s
		}
		if l.Rate > 0 {
			r, err := flow.NewRate(kv, flow.RateConfig{Key: "rate/" + key, Events: l.Rate, Burst: max(l.Burst, 1)})
			if err != nil {
				return fmt.Errorf("%w: %s.Rate: %w", ErrInvalidConfig, where, err)
			}
			tl.rate = r
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
// may run; when it may not, it has let go of what it took and requeued j
// uncounted.
func (p *Platform) admit(f *inflight, j *Job, tl *typeLimit) (*flow.Slot, bool) {
	if tl.local != nil && !tl.local.TryAcquire() {
		p.limited(f, j, 0, nil)
		return nil, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Lease/3)
	defer cancel()
	var slot *flow.Slot
	if tl.sem != nil {
		s, got, err := tl.sem.TryAcquire(ctx, p.cfg.WorkerName)
		if err != nil || !got {
			p.unadmit(tl, nil)
			p.limited(f, j, 0, err)
			return nil, false
		}
		slot = s
	}
	if tl.rate != nil {
		wait, err := tl.rate.Take(ctx, time.Now())
		if err == nil && wait > 0 && wait <= maxRateWait {
			if tl.waiting.Add(1) <= maxRateWaiters {
				wait, err = p.waitRate(tl, wait)
			}
			tl.waiting.Add(-1)
		}
		if err != nil || wait > 0 {
			p.unadmit(tl, slot)
			p.limited(f, j, wait, err)
			return nil, false
		}
	}
	if slot != nil {
		p.lim.slots.Store(slot, struct{}{})
	}
	return slot, true
}

// waitRate waits in line for the rate's next start, a few times at most.
func (p *Platform) waitRate(tl *typeLimit, wait time.Duration) (time.Duration, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for range 4 {
		select {
		case <-t.C:
		case <-p.workCtx.Done():
			return wait, nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Lease/3)
		var err error
		wait, err = tl.rate.Take(ctx, time.Now())
		cancel()
		if err != nil || wait == 0 || wait > maxRateWait {
			return wait, err
		}
		t.Reset(wait)
	}
	return wait, nil
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

// limited requeues a job over a limit, uncounted: after wait (a rate's
// answer) or else after about LimitDelay (±50 %, so waiting jobs do not
// all come back at once).
func (p *Platform) limited(f *inflight, j *Job, wait time.Duration, cause error) {
	if cause != nil {
		p.log.Warn("asyncplatform: checking a job type's limits failed; the job waits and comes again", "type", j.Type, "id", j.ID, "error", cause)
	}
	if wait <= 0 {
		d := p.cfg.LimitDelay
		wait = d/2 + rand.N(d)
	} else { // over a rate: spread the refused, which would all come back at the next start
		wait += rand.N(p.cfg.LimitDelay / 2)
	}
	p.log.Debug("asyncplatform: a job over its type's limit waits, no try spent", "queue", j.Queue, "type", j.Type, "id", j.ID, "in", wait)
	if err := p.requeue(f, j, time.Now().Add(wait)); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		p.log.Warn("asyncplatform: requeueing a job over its type's limit failed; it comes back after its lease", "type", j.Type, "error", err)
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
