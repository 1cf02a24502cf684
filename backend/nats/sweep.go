package nats

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// sweep looks at up to budget messages of stream s from sequence from on,
// and deletes those on subject ("" for any) at or below floor, the ack
// floor of the stream's consumer. It returns how many it deleted and where
// to go on from; it has looked at everything up to the floor when next >
// floor.
//
// On a work-queue stream an ack deletes the message, so nothing should be
// there. But nats-server 2.9 keeps a message block's deletes in an index it
// writes lazily (at most every 0.5 to 2 s, when a later delete comes), while
// a consumer's state is written within 100 ms of a change. After a SIGKILL
// of the server, messages acked in the last second or two are back in the
// stream while the consumer, which remembers their acks, never hands them
// out again (TestNATSKillLeftoversFact in conformance/faults). They would
// stay for ever: counted by Stats, taking space, and holding the stream's
// first sequence down. Every message below the floor was acknowledged, so
// deleting it is what the ack should have done.
//
// It walks every message, not only the subject's: 2.9's per-subject index
// can lose a message (see the package doc), so a lookup by subject can miss
// one. One lookup when there is nothing below the floor (on 2.10 and later
// there is never anything of the consumer's below it).
func sweep(ctx context.Context, s jetstream.Stream, subject string, floor, from uint64, budget int) (n int, next uint64, err error) {
	next = max(from, 1)
	if next > floor {
		return 0, next, nil
	}
	looked := 0
	var derr error
	err = scan(ctx, s, "", next, floor, func(m *jetstream.RawStreamMsg) bool {
		if looked == budget {
			return false
		}
		looked++
		if subject == "" || m.Subject == subject {
			if err := s.DeleteMsg(ctx, m.Sequence); err != nil && !gone(err) {
				derr = fmt.Errorf("nats: sweep %s: delete %d: %w", s.CachedInfo().Config.Name, m.Sequence, err)
				return false
			}
			n++
		}
		next = m.Sequence + 1
		return true
	})
	switch {
	case err != nil:
		return n, next, err
	case derr != nil:
		return n, next, derr
	case looked < budget:
		next = floor + 1 // nothing more at or below the floor
	}
	return n, next, nil
}

// ackGhosts sends consumer an ack for every sequence from from to to that
// stream s no longer holds, looking at up to budget messages and sending up
// to budget acks; it returns how many it sent and where to go on from (past
// to when done).
//
// A SIGKILL of nats-server 2.9 can also go the other way: a message's
// delete (its ack) written, the consumer's record of the ack not. The
// consumer then keeps a pending entry with no message behind it: it tries
// to redeliver it every AckWait, finds nothing, and keeps it, on 2.9 until
// every message older than it has left the stream. Meanwhile it counts as
// in flight, and holds the ack floor, so sweep cannot clear what lies
// above it. Seen in the fault suite's NATS BrokerKill (a run that waited
// minutes on one such entry; these acks cleared it at once). The server
// takes an ack for a sequence it does not hold as pending as a no-op, and
// a message no longer in the stream was acked (or deleted) by someone, so
// acking its pending entry is safe. 2.10 and later clear such entries
// themselves; the backend sends these acks to 2.9 servers only.
func (b *Backend) ackGhosts(ctx context.Context, s jetstream.Stream, consumer string, from, to uint64, budget int) (acks int, next uint64, err error) {
	subj := "$JS.ACK." + s.CachedInfo().Config.Name + "." + consumer + ".1."
	// gap acks the sequences from next up to end, as budget allows.
	gap := func(end uint64) error {
		for ; next <= end && acks < budget; next++ {
			if err := b.nc.Publish(subj+strconv.FormatUint(next, 10)+".0.0.0", nil); err != nil {
				return err
			}
			acks++
		}
		return nil
	}
	next = max(from, 1)
	looked := 0
	var perr error
	err = scan(ctx, s, "", next, to, func(m *jetstream.RawStreamMsg) bool {
		if looked == budget {
			return false
		}
		looked++
		if perr = gap(m.Sequence - 1); perr != nil || next < m.Sequence {
			return false // out of acks, inside the gap
		}
		next = m.Sequence + 1
		return true
	})
	if err == nil && perr == nil && looked < budget && next <= to {
		perr = gap(to) // the stream ends before to
	}
	if err == nil {
		err = perr
	}
	if acks > 0 && err == nil {
		err = b.nc.FlushWithContext(ctx)
	}
	return acks, next, err
}

// before210 reports whether a server version is 2.9 or older.
func before210(version string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(version, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major < 2 || major == 2 && minor < 10
}

// sweepBudget is how many messages one sweep looks at, and how many acks
// one ackGhosts sends.
const sweepBudget = 1000

// sweeper sweeps one consumer (see sweep) after each reconnect of the
// connection, and when the backend first pulls from it: what a server
// restart can have left lies at or below what the consumer had delivered
// when the connection came back (the target), so the sweeps of one
// connection go on, each where the last stopped, until the ack floor has
// reached the target and everything below it was looked at, retried
// before pulls at growing intervals (1 s to a minute). After a reconnect to
// a 2.9 server, while the floor is below the target and something is
// pending, they also walk once from the floor to the target acking what
// the stream no longer holds (see ackGhosts; at most sweepBudget acks a
// second). A pending delivery holds the floor below it (on
// 2.9, so does any redelivered one until nothing is pending), so the sweeps
// can take as long as the work in flight. A failed sweep is logged; it
// never fails a pull.
type sweeper struct {
	stream   func() jetstream.Stream
	consumer string
	subject  string // "" for any
	queue    string // for the log; "" for the mover

	done atomic.Uint64 // the connection generation whose sweeps are done; 0 none

	mu        sync.Mutex // held by the sweeping pull; the others go on
	gen       uint64     // the generation being swept
	target    uint64     // the delivered sequence at its first sweep
	started   bool       // target is set
	from      uint64     // where the next sweep goes on
	ghostFrom uint64     // where the next ackGhosts goes on; past target when done
	next      time.Time  // no sweep before
	wait      time.Duration
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
		sw.gen, sw.started, sw.from, sw.ghostFrom, sw.next, sw.wait = gen, false, 0, 0, now, time.Second
	}
	if now.Before(sw.next) || sw.done.Load() == gen {
		return
	}
	s := sw.stream()
	name := s.CachedInfo().Config.Name
	var n, acks int
	c, err := s.Consumer(ctx, sw.consumer)
	if err != nil {
		err = fmt.Errorf("nats: sweep %s: consumer %s: %w", name, sw.consumer, err)
	}
	var info *jetstream.ConsumerInfo
	if err == nil {
		info = c.CachedInfo()
		if !sw.started {
			sw.target, sw.started, sw.ghostFrom = info.Delivered.Stream, true, info.AckFloor.Stream+1
		}
		n, sw.from, err = sweep(ctx, s, sw.subject, info.AckFloor.Stream, sw.from, sweepBudget)
	}
	if err == nil && gen > 1 && info.AckFloor.Stream < sw.target && info.NumAckPending > 0 && sw.ghostFrom <= sw.target && before210(b.nc.ConnectedServerVersion()) {
		acks, sw.ghostFrom, err = b.ackGhosts(ctx, s, sw.consumer, max(sw.ghostFrom, info.AckFloor.Stream+1), sw.target, sweepBudget)
	}
	switch {
	case err != nil && ctx.Err() == nil:
		b.log.Warn("nats: sweep acknowledged messages left behind by a server restart", "stream", name, "queue", sw.queue, "deleted", n, "err", err)
	case n > 0:
		b.log.Warn("nats: deleted acknowledged messages that a server restart left in the stream", "stream", name, "queue", sw.queue, "deleted", n)
	}
	if err != nil {
		sw.next, sw.wait = now.Add(sw.wait), min(2*sw.wait, time.Minute)
		return
	}
	b.log.Debug("nats: sweep", "consumer", sw.consumer, "generation", gen, "floor", info.AckFloor.Stream, "target", sw.target,
		"next", sw.from, "deleted", n, "pending", info.NumAckPending, "ghost_acks", acks, "ghosts_next", sw.ghostFrom)
	if sw.from > info.AckFloor.Stream && info.AckFloor.Stream >= sw.target {
		sw.done.Store(gen)
		return
	}
	if acks > 0 {
		sw.next = now.Add(time.Second) // the floor may have moved: look again soon
		return
	}
	sw.next, sw.wait = now.Add(sw.wait), min(2*sw.wait, time.Minute)
}
