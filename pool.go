package asyncplatform

import (
	"fmt"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/executor"
	"github.com/asyncplatform/asyncplatform/internal/health"
	"github.com/asyncplatform/asyncplatform/internal/jobctx"
	"github.com/asyncplatform/asyncplatform/internal/runner"
)

// poolProbe bounds how long a pool waits for a queue that just had work to
// answer whether it still has some, before it asks the next queue; a queue
// found empty is then watched at no cost until a job arrives.
const poolProbe = 100 * time.Millisecond

// Pool works several queues of Config.Queues with one set of handlers, by
// priority: in strict order (a queue's jobs are taken only while every
// queue before it is empty, as Taskcluster's workers poll their queues) or,
// with Weights, in a weighted random order on each claim (asynq's model:
// with weights 6, 3, 1 and work on every queue, the first queue gets about
// 60 % of the claims, and no queue with a weight starves). A queue found
// empty is not polled: a standing Receive waits on the broker's own signal
// and wakes the pool when a job arrives.
//
// The queues of a pool take their Policy, TrackStatus and Output from
// their QueueConfig; their Concurrency and Prefetch must be left zero, as
// the pool's own apply. A pool may hold one job more than Concurrency +
// Prefetch per queue in it, claimed by those standing Receives.
type Pool struct {
	// Queues are the pool's queues, highest priority first: at least two,
	// each in Config.Queues and in no other pool.
	Queues []string

	// Weights, when set, has one weight (1 or more) per queue and makes
	// the order weighted instead of strict. Defaults to nil: strict order.
	Weights []int

	// Concurrency is how many handlers run at once for the whole pool.
	// Defaults to DefaultConcurrency.
	Concurrency int

	// Prefetch is how many jobs the pool claims ahead of its running ones.
	// Use Limit(0) for none. Defaults to Concurrency.
	Prefetch *int
}

// validatePools checks c.Pools against c.Queues (as the caller gave them,
// before their defaults) and sets the pools' defaults.
func (c *Config) validatePools() error {
	in := map[string]int{}
	for pi := range c.Pools {
		pl := &c.Pools[pi]
		where := fmt.Sprintf("Pools[%d]", pi)
		if len(pl.Queues) < 2 {
			return fmt.Errorf("%w: %s has %d queues; a pool works two or more", ErrInvalidConfig, where, len(pl.Queues))
		}
		if pl.Weights != nil && len(pl.Weights) != len(pl.Queues) {
			return fmt.Errorf("%w: %s has %d weights for %d queues", ErrInvalidConfig, where, len(pl.Weights), len(pl.Queues))
		}
		for i, w := range pl.Weights {
			if w < 1 || w > 1000 {
				return fmt.Errorf("%w: %s.Weights[%d] is %d; a weight is 1 to 1000", ErrInvalidConfig, where, i, w)
			}
		}
		for _, q := range pl.Queues {
			qc, ok := c.Queues[q]
			switch {
			case !ok:
				return fmt.Errorf("%w: %s names queue %q, which is not in Config.Queues", ErrInvalidConfig, where, q)
			case in[q] > 0:
				return fmt.Errorf("%w: queue %q is in two pools (Pools[%d] and %s)", ErrInvalidConfig, q, in[q]-1, where)
			case qc.Concurrency != 0 || qc.Prefetch != nil:
				return fmt.Errorf("%w: queue %q of %s sets Concurrency or Prefetch; a pool's queues take the pool's", ErrInvalidConfig, q, where)
			}
			in[q] = pi + 1
		}
		if pl.Concurrency < 0 {
			return fmt.Errorf("%w: %s.Concurrency is %d, it must be positive", ErrInvalidConfig, where, pl.Concurrency)
		}
		if pl.Concurrency == 0 {
			pl.Concurrency = DefaultConcurrency
		}
		if pl.Prefetch == nil {
			pl.Prefetch = Limit(pl.Concurrency)
		} else if *pl.Prefetch < 0 {
			return fmt.Errorf("%w: %s.Prefetch is %d, it must be 0 or more", ErrInvalidConfig, where, *pl.Prefetch)
		}
	}
	c.Pools = append([]Pool(nil), c.Pools...) // the caller's slices may change
	return nil
}

// pooled reports whether queue belongs to a pool.
func (c *Config) pooled(queue string) bool {
	for _, pl := range c.Pools {
		for _, q := range pl.Queues {
			if q == queue {
				return true
			}
		}
	}
	return false
}

// newRunners builds the runners: one per pool, one per other queue.
func (p *Platform) newRunners() {
	for name, qc := range p.cfg.Queues {
		if p.cfg.pooled(name) {
			continue
		}
		var q *executor.Queue[Job]
		q = runner.New(runner.Config[executor.Work[Job]]{
			Name: name, Backend: p.backend, Gate: &p.health, Pause: p.pz.Gate(name), Lease: p.cfg.Lease,
			Concurrency: qc.Concurrency, Prefetch: *qc.Prefetch, LocalSettle: p.caps.LocalSettle, Log: p.log, Workers: &p.workers,
			Process: func(t *jobctx.Timer, f *inflight) { p.exec.Process(q, t, f) },
		})
		p.queues = append(p.queues, q)
	}
	for _, pl := range p.cfg.Pools {
		pauses := make([]*health.Gate, len(pl.Queues))
		for i, name := range pl.Queues {
			pauses[i] = p.pz.Gate(name)
		}
		var q *executor.Queue[Job]
		q = runner.New(runner.Config[executor.Work[Job]]{
			Name: pl.Queues[0], Backend: p.backend, Gate: &p.health, Lease: p.cfg.Lease,
			Concurrency: pl.Concurrency, Prefetch: *pl.Prefetch, LocalSettle: p.caps.LocalSettle, Log: p.log, Workers: &p.workers,
			Process: func(t *jobctx.Timer, f *inflight) { p.exec.Process(q, t, f) },
			Pool: &runner.PoolConfig[executor.Work[Job]]{
				Names: pl.Queues, Weights: pl.Weights, Pauses: pauses, Probe: poolProbe, HandBack: p.exec.HandBack,
			},
		})
		p.queues = append(p.queues, q)
	}
}
