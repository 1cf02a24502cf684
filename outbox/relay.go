package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Defaults of Config.
const (
	DefaultBatch     = 100
	DefaultLeaseTTL  = 30 * time.Second
	DefaultIdleWait  = 200 * time.Millisecond
	DefaultRetryWait = time.Second
)

// MaxQueues is the most queue names a Source returns from one
// OutboxQueues: a pass of the relay drains at most that many queues.
const MaxQueues = 1000

// Config configures a Relay.
type Config struct {
	// Source is the outbox to read. Required.
	Source Source

	// Target is the backend the jobs are published to: any backend, not
	// the Source's own. Required.
	Target driver.Backend

	// Batch is the most rows published in one Target.Enqueue. Defaults to
	// DefaultBatch (100).
	Batch int

	// LeaseTTL is how long a queue's lease outlives a relay that stopped
	// calling it (SQLite; PostgreSQL's lease ends with the relay's
	// connection). A relay holding a lease renews it with every batch.
	// Defaults to DefaultLeaseTTL (30s).
	LeaseTTL time.Duration

	// IdleWait is how long the relay waits before it looks again when no
	// queue had rows it could take. Defaults to DefaultIdleWait (200ms).
	IdleWait time.Duration

	// RetryWait is how long the relay waits after an error of the Source
	// or the Target before it tries again. Defaults to DefaultRetryWait
	// (1s).
	RetryWait time.Duration

	// Logger receives the errors the relay carries on after and the rows
	// it moves aside. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.IdleWait == 0 {
		c.IdleWait = DefaultIdleWait
	}
	if c.RetryWait == 0 {
		c.RetryWait = DefaultRetryWait
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Source == nil:
		return errors.New("outbox: Config.Source is nil: want the outbox to read")
	case c.Target == nil:
		return errors.New("outbox: Config.Target is nil: want the backend to publish to")
	case c.Batch < 1 || c.Batch > 10000:
		return fmt.Errorf("outbox: Config.Batch %d: want 1 to 10000", c.Batch)
	case c.LeaseTTL < time.Second:
		return fmt.Errorf("outbox: Config.LeaseTTL %v: want at least 1s", c.LeaseTTL)
	case c.IdleWait < 0 || c.RetryWait < 0:
		return errors.New("outbox: Config.IdleWait and RetryWait: want durations of zero or more")
	}
	return nil
}

// Relay moves the jobs of an outbox to a backend: per queue, under the
// queue's lease (so relays running at once share the queues without
// publishing a row twice), it reads the rows in commit order, publishes
// them with one Target.Enqueue, and deletes them once the Target
// confirmed. A relay that dies between the publish and the delete leaves
// the rows for the next holder of the lease, which publishes them again:
// at least once, each copy with the same ID and Dedupe, so a duplicate is
// recognisable (and dropped by a backend that deduplicates).
type Relay struct {
	cfg Config

	published atomic.Int64
	aside     atomic.Int64
}

// New returns a Relay for cfg.
func New(cfg Config) (*Relay, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Relay{cfg: cfg}, nil
}

// Stats are a Relay's counts since New.
type Stats struct {
	// Published is the rows the Target confirmed (a row published again
	// after a failed delete counts again).
	Published int64
	// Aside is the bad rows moved aside.
	Aside int64
}

// Stats returns the Relay's counts.
func (r *Relay) Stats() Stats {
	return Stats{Published: r.published.Load(), Aside: r.aside.Load()}
}

// Run relays until ctx ends, and returns nil then. Errors of the Source
// and the Target are logged and retried after Config.RetryWait.
func (r *Relay) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		moved, err := r.Once(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			r.cfg.Logger.Warn("outbox relay", "err", err)
			sleep(ctx, r.cfg.RetryWait)
		case moved == 0:
			sleep(ctx, r.cfg.IdleWait)
		}
	}
	return nil
}

// Once makes one pass over the queues with rows waiting: each it can
// lease is drained and released. It returns the rows published.
func (r *Relay) Once(ctx context.Context) (int, error) {
	queues, err := r.cfg.Source.OutboxQueues(ctx)
	if err != nil {
		return 0, err
	}
	// Relays start on different queues, so that several share the work.
	rand.Shuffle(len(queues), func(i, j int) { queues[i], queues[j] = queues[j], queues[i] })
	total := 0
	var errs []error
	for _, q := range queues {
		if len(q) > driver.MaxQueueLen {
			// Rows a writer other than OutboxTx put under a name too
			// long to address once cut: they stay in the table.
			r.cfg.Logger.Error("outbox: rows under a queue name over the limit are not relayed; they stay in the outbox table",
				"limit", driver.MaxQueueLen, "name_starts", q[:min(len(q), 40)])
			continue
		}
		n, err := r.drain(ctx, q)
		total += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return total, errors.Join(errs...)
}

// drain relays the queue's rows while it holds the queue's lease.
func (r *Relay) drain(ctx context.Context, queue string) (n int, err error) {
	lease, err := r.cfg.Source.TakeOutbox(ctx, queue, r.cfg.LeaseTTL)
	if errors.Is(err, ErrHeld) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if rerr := lease.Release(rctx); rerr != nil && err == nil {
			err = rerr
		}
	}()
	badQueue := driver.CheckQueue(queue)
	// A body the target cannot store (its bound may be below the
	// source's) would fail every publish of the queue's rows: it is a bad
	// row.
	maxBody := r.cfg.Target.Capabilities().MaxBody
	for ctx.Err() == nil {
		rows, err := lease.Next(ctx, r.cfg.Batch)
		if err != nil || len(rows) == 0 {
			return n, err
		}
		msgs := make([]driver.Message, 0, len(rows))
		seqs := make([]int64, 0, len(rows))
		for _, row := range rows {
			if row.Err == nil && badQueue != nil {
				row.Err = &BadRowError{Queue: queue, Seq: row.Seq, Reason: badQueue.Error()}
			}
			if row.Err == nil && maxBody > 0 && len(row.Msg.Body) > maxBody {
				row.Err = &BadRowError{Queue: queue, Seq: row.Seq, Reason: fmt.Sprintf("a body of %d bytes, past the target's MaxBody (%d)", len(row.Msg.Body), maxBody)}
			}
			if row.Err != nil {
				// The rows before it are published first: order holds.
				if err := r.publish(ctx, lease, queue, msgs, seqs); err != nil {
					return n, err
				}
				n += len(msgs)
				msgs, seqs = msgs[:0], seqs[:0]
				if err := lease.Aside(ctx, row.Seq, row.Err.Error()); err != nil {
					return n, err
				}
				r.aside.Add(1)
				r.cfg.Logger.Warn("outbox: row moved aside", "queue", queue, "seq", row.Seq, "err", row.Err)
				continue
			}
			msgs = append(msgs, row.Msg)
			seqs = append(seqs, row.Seq)
		}
		if err := r.publish(ctx, lease, queue, msgs, seqs); err != nil {
			return n, err
		}
		n += len(msgs)
	}
	return n, nil
}

// publish enqueues msgs on the Target and, once it confirmed, deletes the
// rows seqs.
func (r *Relay) publish(ctx context.Context, lease Lease, queue string, msgs []driver.Message, seqs []int64) error {
	if len(msgs) == 0 {
		return nil
	}
	if err := r.cfg.Target.Enqueue(ctx, queue, msgs); err != nil {
		return fmt.Errorf("outbox: publishing %d jobs of %s: %w", len(msgs), queue, err)
	}
	r.published.Add(int64(len(msgs)))
	if err := lease.Delete(ctx, seqs); err != nil {
		return fmt.Errorf("outbox: deleting the published rows of %s: %w", queue, err)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
