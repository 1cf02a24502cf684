package nats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// sweep looks at up to budget messages of stream s from sequence from on,
// and deletes those on subject ("" for any) that sit at or below the ack
// floor of consumer. It returns how many it deleted, where to go on from,
// the floor, and the consumer's highest delivered stream sequence; it has
// looked at everything up to the floor when next > floor.
//
// On a work-queue stream an ack deletes the message, so nothing should be
// there. But nats-server 2.9 keeps a message block's deletes in an index it
// writes lazily (at most every 0.5 to 2 s, when a later delete comes), while
// a consumer's state is written within 100 ms of a change. After a SIGKILL
// of the server, messages acked in the last second or two are back in the
// stream while the consumer, which remembers their acks, never hands them
// out again (TestNATSKillLeftoversFact in conformance/faults). They would
// stay for ever: counted by Stats, taking space, and holding the stream's
// first sequence down, which on 2.9 also keeps pending entries whose
// message is gone (a delete written, the consumer's ack not) from ever
// being cleared: in flight for ever. Every message below the floor was
// acknowledged, so deleting it is what the ack should have done.
//
// It walks every message, not only the subject's: 2.9's per-subject index
// loses track of a subject's last message once that was deleted first, so
// a lookup by subject can miss one (seen here). One consumer info and one
// lookup when there is nothing below the floor (on 2.10 and later there is
// never anything of the consumer's below it).
func sweep(ctx context.Context, s jetstream.Stream, consumer, subject string, from uint64, budget int) (n int, next, floor, delivered uint64, err error) {
	name := s.CachedInfo().Config.Name
	c, err := s.Consumer(ctx, consumer)
	if err != nil {
		return 0, from, 0, 0, fmt.Errorf("nats: sweep %s: consumer %s: %w", name, consumer, err)
	}
	info := c.CachedInfo()
	floor, delivered = info.AckFloor.Stream, info.Delivered.Stream
	for next = max(from, 1); next <= floor && budget > 0; budget-- {
		m, err := s.GetMsg(ctx, next, jetstream.WithGetMsgSubject(">")) // the first message at or after next
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return n, floor + 1, floor, delivered, nil
		}
		if err != nil {
			return n, next, floor, delivered, fmt.Errorf("nats: sweep %s: look up from %d: %w", name, next, err)
		}
		if m.Sequence > floor {
			return n, floor + 1, floor, delivered, nil
		}
		if subject == "" || m.Subject == subject {
			if err := s.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				return n, next, floor, delivered, fmt.Errorf("nats: sweep %s: delete %d: %w", name, m.Sequence, err)
			}
			n++
		}
		next = m.Sequence + 1
	}
	return n, next, floor, delivered, nil
}

// sweepBudget is how many messages one sweep looks at.
const sweepBudget = 1000

// sweeper sweeps one consumer (see sweep) after each reconnect of the
// connection, and when the backend first pulls from it: what a server
// restart can have left lies at or below what the consumer had delivered
// when the connection came back, so the sweeps of one connection go on,
// each where the last stopped, until the ack floor has reached that and
// everything below it was looked at, retried before pulls at growing
// intervals (1 s to a minute). A pending delivery holds the floor below it
// (on 2.9, so does any redelivered one until nothing is pending), so the
// sweeps can take as long as the work in flight. A failed sweep is logged;
// it never fails a pull.
type sweeper struct {
	stream   func() jetstream.Stream
	consumer string
	subject  string // "" for any
	queue    string // for the log; "" for the mover

	done atomic.Uint64 // the connection generation whose sweeps are done; 0 none

	mu      sync.Mutex // held by the sweeping pull; the others go on
	gen     uint64     // the generation being swept
	target  uint64     // the delivered sequence at its first sweep
	started bool       // target is set
	from    uint64     // where the next sweep goes on
	next    time.Time  // no sweep before
	wait    time.Duration
}

func (b *Backend) newSweeper(stream func() jetstream.Stream, consumer, subject, queue string) *sweeper {
	return &sweeper{stream: stream, consumer: consumer, subject: subject, queue: queue}
}

// maybe sweeps, unless this generation of the connection is swept, another
// pull is sweeping, or the next sweep is not due.
func (sw *sweeper) maybe(ctx context.Context, b *Backend) {
	// Reconnects only grows; +1 so that the first generation is not 0.
	gen := b.nc.Stats().Reconnects + 1
	if sw.done.Load() == gen || !sw.mu.TryLock() {
		return
	}
	defer sw.mu.Unlock()
	now := time.Now()
	if sw.gen != gen {
		sw.gen, sw.started, sw.from, sw.next, sw.wait = gen, false, 0, now, time.Second
	}
	if now.Before(sw.next) || sw.done.Load() == gen {
		return
	}
	s := sw.stream()
	n, next, floor, delivered, err := sweep(ctx, s, sw.consumer, sw.subject, sw.from, sweepBudget)
	sw.from = next
	switch {
	case err != nil && ctx.Err() == nil:
		b.log.Warn("nats: sweep acknowledged messages left behind by a server restart", "stream", s.CachedInfo().Config.Name, "queue", sw.queue, "deleted", n, "err", err)
	case n > 0:
		b.log.Warn("nats: deleted acknowledged messages that a server restart left in the stream", "stream", s.CachedInfo().Config.Name, "queue", sw.queue, "deleted", n)
	}
	if err == nil && !sw.started {
		sw.target, sw.started = delivered, true
	}
	b.log.Debug("nats: sweep", "consumer", sw.consumer, "generation", gen, "floor", floor, "until", sw.target, "next", next, "deleted", n, "err", err)
	if err == nil && next > floor && floor >= sw.target {
		sw.done.Store(gen)
		return
	}
	sw.next, sw.wait = now.Add(sw.wait), min(2*sw.wait, time.Minute)
}
