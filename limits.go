package asyncplatform

import (
	"fmt"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/admit"
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
	// taken before the handler runs, renewed with the job's lease, kept
	// by the process for its next job of the type for up to 100 ms after
	// its handler returns (no store round trip per job while jobs come),
	// then freed;
	// free again one lease after its process died.
	// Defaults to 0: no limit.
	ClusterConcurrency int

	// Rate is how many jobs of the type start per second across every
	// process over the backend (a GCRA in the backend's store; fractions
	// allowed: 0.5 is one every two seconds). Each process reserves starts
	// in batches, one store write each, and a job waits in its worker for
	// its start, up to a second, but never more than about three quarters
	// of its queue's Concurrency at once (contract §13). Defaults to 0: no
	// limit.
	Rate float64

	// Burst is how many jobs the rate admits at once after a quiet spell.
	// Defaults to 1: starts are spaced evenly.
	Burst int
}

// newGate validates cfg.Limits and builds the gate that admits jobs under
// them (internal/admit).
func newGate(backend driver.Backend, cfg Config) (*admit.Gate, error) {
	c := admit.Config{Key: kv.Segment, Lease: cfg.Lease, Holder: cfg.WorkerName, Logger: cfg.Logger}
	if len(cfg.Limits) > 0 {
		c.Limits = make(map[string]admit.Limit, len(cfg.Limits))
		for typ, l := range cfg.Limits {
			c.Limits[typ] = admit.Limit(l)
		}
		if d, err := driver.StoreOf(backend); err != nil {
			c.StoreErr = err
		} else {
			c.Store = kv.Of(d, kv.Limits) // sem/<type>/<slot> and rate/<type>
		}
	}
	g, err := admit.New(c)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return g, nil
}
