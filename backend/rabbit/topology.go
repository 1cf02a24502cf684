package rabbit

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// The delay ladder: step k holds messages for minStep<<k. Twenty-two steps
// reach from 50ms to about 29 hours; longer delays take several hops of the
// largest step.
const (
	minStep  = 50 * time.Millisecond
	numSteps = 22
)

// step returns the TTL of delay step k.
func step(k int) time.Duration { return minStep << k }

// pickStep returns the largest step not longer than remaining, or the
// smallest step when remaining is shorter than it (a message is never
// delivered early, at worst one smallest step late).
func pickStep(remaining time.Duration) int {
	for k := numSteps - 1; k > 0; k-- {
		if step(k) <= remaining {
			return k
		}
	}
	return 0
}

func (b *Backend) workName(queue string) string { return b.cfg.Prefix + "." + queue }
func (b *Backend) deadName(queue string) string { return b.cfg.Prefix + "." + queue + ":dead" }

// legacyDeadName is the classic dead-letter queue of the older layout,
// which migrateDead empties into deadName.
func (b *Backend) legacyDeadName(queue string) string { return b.cfg.Prefix + "." + queue + ".dead" }
func (b *Backend) delayName(queue string, k int) string {
	return b.cfg.Prefix + "." + queue + ".delay." + strconv.FormatInt(step(k).Milliseconds(), 10)
}

func workArgs() amqp.Table { return amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum} }

// deadArgs declares a dead-letter queue: a quorum queue, replicated like
// the work queue (a classic one lives on one node).
func deadArgs() amqp.Table { return amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum} }

// delayArgs declares delay step k of queue: a quorum queue whose expired
// messages are dead-lettered at least once back to the work queue. A classic
// delay queue dead-letters at most once, and drops the messages it holds
// across a restart of the node (evidence: docs/reliability.md, "RabbitMQ: a
// delayed copy can be lost across a broker restart").
// At-least-once dead-lettering needs x-overflow=reject-publish.
func (b *Backend) delayArgs(queue string, k int) amqp.Table {
	return amqp.Table{
		amqp.QueueTypeArg:           amqp.QueueTypeQuorum,
		"x-message-ttl":             step(k).Milliseconds(),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": b.workName(queue),
		"x-dead-letter-strategy":    "at-least-once",
		"x-overflow":                "reject-publish",
	}
}

var inequivalentArg = regexp.MustCompile(`inequivalent arg '([^']+)'`)

// declareQueue declares one durable queue, turning PRECONDITION_FAILED into
// an error that names the queue and the argument.
func declareQueue(ch *amqp.Channel, name string, args amqp.Table) error {
	_, err := ch.QueueDeclare(name, true, false, false, false, args)
	if err == nil {
		return nil
	}
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.PreconditionFailed {
		arg := "(unknown)"
		if m := inequivalentArg.FindStringSubmatch(aerr.Reason); m != nil {
			arg = m[1]
		}
		want := "none"
		if v, ok := args[arg]; ok {
			want = fmt.Sprint(v)
		}
		return fmt.Errorf("%w: queue %q has another %s than this backend declares (%s); delete it or use another Config.Prefix: %w", ErrIncompatibleQueue, name, arg, want, err)
	}
	return fmt.Errorf("rabbit: declare queue %q: %w", name, err)
}

// ensure declares the named broker queue unless this backend already did.
func (b *Backend) ensure(ctx context.Context, name string, args amqp.Table) error {
	b.mu.Lock()
	_, ok := b.declared[name]
	b.mu.Unlock()
	if ok {
		return nil
	}
	err := b.withChannel(ctx, func(ch *amqp.Channel) error { return declareQueue(ch, name, args) })
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.declared[name] = args
	b.mu.Unlock()
	return nil
}

// ensureQueue declares the work and dead-letter queues of queue unless this
// backend already did.
func (b *Backend) ensureQueue(ctx context.Context, queue string) error {
	b.mu.Lock()
	ok := b.known[queue]
	b.mu.Unlock()
	if ok {
		return nil
	}
	return b.Declare(ctx, queue)
}

// Declare declares the queue's quorum work and dead-letter queues, moves
// the records of a classic dead-letter queue of the older layout (p.q.dead)
// into the new one (see migrateDead), and registers the queue for Queues;
// it fails when the registry entry cannot be written, so that a queue
// declared is always listed (a later Declare registers it). Delay queues
// are declared when first used.
func (b *Backend) Declare(ctx context.Context, queue string) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	if err := b.ensure(ctx, b.workName(queue), workArgs()); err != nil {
		return fmt.Errorf("rabbit: declare work queue of %q: %w", queue, err)
	}
	if err := b.ensure(ctx, b.deadName(queue), deadArgs()); err != nil {
		return fmt.Errorf("rabbit: declare dead-letter queue of %q: %w", queue, err)
	}
	if err := b.findLegacyDead(ctx, queue); err != nil {
		b.log.Warn("cannot tell whether the queue has a classic dead-letter queue to move", "queue", queue, "err", err)
	}
	b.migrateDead(ctx, queue)
	if err := b.register(ctx, queue); err != nil {
		return fmt.Errorf("rabbit: register queue %q for Queues: %w", queue, err)
	}
	b.mu.Lock()
	b.known[queue] = true
	b.mu.Unlock()
	return nil
}

// DeleteQueue deletes the queue's work queue, its dead-letter queue and its
// delay queues, with every message in them.
func (b *Backend) DeleteQueue(ctx context.Context, queue string) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	b.consMu.Lock()
	b.mu.Lock()
	qc := b.qch[queue]
	delete(b.cons, queue)
	delete(b.qch, queue)
	b.mu.Unlock()
	b.consMu.Unlock()
	if qc != nil {
		qc.ch.Close()
	}
	names := []string{b.workName(queue), b.deadName(queue), b.legacyDeadName(queue)}
	for k := range numSteps {
		names = append(names, b.delayName(queue, k))
	}
	b.mu.Lock()
	for _, n := range names {
		delete(b.declared, n)
	}
	delete(b.known, queue)
	delete(b.legacy, queue)
	b.mu.Unlock()
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		for _, n := range names {
			if _, err := ch.QueueDelete(n, false, false, false); err != nil {
				return fmt.Errorf("rabbit: delete queue %q: %w", n, err)
			}
		}
		return nil
	})
	if err == nil && b.cfg.Store != nil {
		err = b.dropStoreDead(ctx, queue) // see deadstore.go
	}
	return err
}

// inspect returns the ready-message count of a queue, and false when the
// queue does not exist. It may replace *ch when the broker closed it.
func (b *Backend) inspect(ctx context.Context, ch **amqp.Channel, name string) (int, bool, error) {
	q, err := (*ch).QueueDeclarePassive(name, true, false, false, false, nil)
	if err == nil {
		return q.Messages, true, nil
	}
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp.NotFound {
		return 0, false, fmt.Errorf("rabbit: inspect queue %q: %w", name, err)
	}
	conn, err := b.connection(ctx)
	if err != nil {
		return 0, false, err
	}
	nch, err := conn.Channel()
	if err != nil {
		return 0, false, fmt.Errorf("rabbit: open channel: %w", err)
	}
	*ch = nch
	return 0, false, nil
}

// Stats reports Ready (ready messages of the work queue, which includes
// messages between two delay hops), Scheduled (messages in the delay
// queues) and Dead (ready records of the dead-letter queue, and of a
// classic one of the older layout not yet moved, and the records in the
// companion store when there is one). InFlight is -1:
// AMQP does not tell unacknowledged counts without the management plugin.
func (b *Backend) Stats(ctx context.Context, queue string) (driver.Stats, error) {
	if b.isClosed() {
		return driver.Stats{}, driver.ErrClosed
	}
	st := driver.Stats{InFlight: -1}
	conn, err := b.connection(ctx)
	if err != nil {
		return st, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return st, fmt.Errorf("rabbit: open channel: %w", err)
	}
	defer func() { ch.Close() }()
	n, ok, err := b.inspect(ctx, &ch, b.workName(queue))
	if err != nil {
		return st, err
	}
	if !ok {
		return st, fmt.Errorf("rabbit: queue %q is not declared (no broker queue %q)", queue, b.workName(queue))
	}
	st.Ready = int64(n)
	if n, _, err = b.inspect(ctx, &ch, b.deadName(queue)); err != nil {
		return st, err
	}
	st.Dead = int64(n)
	if n, _, err = b.inspect(ctx, &ch, b.legacyDeadName(queue)); err != nil {
		return st, err
	}
	st.Dead += int64(n) // not moved yet (see migrateDead)
	// The records in the companion store: see deadstore.go.
	if b.cfg.Store != nil {
		n, err := b.countStoreDead(ctx, queue)
		if err != nil {
			return st, err
		}
		st.Dead += n
	}
	for k := range numSteps {
		n, _, err := b.inspect(ctx, &ch, b.delayName(queue, k))
		if err != nil {
			return st, err
		}
		st.Scheduled += int64(n)
	}
	return st, nil
}

// The delay sweeper. A quorum delay queue expires messages from its head
// only, so a message there that does not expire keeps every message behind
// it: RabbitMQ 3.10.8 enqueued a publish with no TTL into a delay queue
// another connection was creating (see delayed), and rabbitmq-server
// #10718 reports messages of such queues that never expire. The sweeper
// of each Backend looks at the delay queues of the queues it consumes
// every sweep period (Config.DelaySweep; see sweepOnce). It takes the head
// of a delay queue that held messages at two looks in a row (basic.get,
// which hides it from others) and moves it
// to where its due time says: the work queue when due, else the delay step
// for what is left (never early, at most one smallest step late). When the
// head was overdue by more than sweepGrace, the queue was stuck: it takes
// the next one too, up to sweepBatch. Each move publishes the copy with
// confirm and then acks (one multiple ack per queue swept), so a crash in
// between leaves a duplicate, never a loss. A message without the due
// header (an older version's) is moved to its step again, for a whole
// step.
const (
	sweepMax   = time.Minute
	sweepGrace = time.Second
	sweepBatch = 1000
)

// sweepDelays runs the delay sweeper until Close.
func (b *Backend) sweepDelays(every time.Duration) {
	defer b.wg.Done()
	looks := map[string]look{}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-b.done:
			return
		case <-t.C:
		}
		b.mu.Lock()
		queues := make([]string, 0, len(b.cons))
		for q := range b.cons {
			queues = append(queues, q)
		}
		b.mu.Unlock()
		b.sweepOnce(queues, every, looks)
		for name, l := range looks {
			if time.Since(l.next) > sweepMax {
				delete(looks, name) // its queue is no longer consumed here
			}
		}
	}
}

// look is what the sweeper knows of one delay queue.
type look struct {
	next time.Time // when to look at it again
	held bool      // it held messages at the last look
}

// sweepOnce looks, on one channel, at the delay queues of queues that are
// due for a look. A delay queue is swept only when it held messages at two
// looks in a row, the sweep period apart (a move is a publish and an ack,
// and a process killed between the two leaves a duplicate: a queue that
// just got its messages is left alone); after a sweep it is looked at
// again once its step has passed (at most sweepMax), and a missing one
// after sweepMax.
func (b *Backend) sweepOnce(queues []string, every time.Duration, looks map[string]look) {
	ctx, cancel := context.WithCancel(b.closing)
	defer cancel()
	var (
		conn *amqp.Connection
		ch   *amqp.Channel
	)
	defer func() {
		if ch != nil {
			ch.Close()
		}
	}()
	for _, q := range queues {
		for k := range numSteps {
			name := b.delayName(q, k)
			now := time.Now()
			l := looks[name]
			if now.Before(l.next) {
				continue
			}
			if ch == nil || ch.IsClosed() {
				var err error
				if conn, err = b.connection(ctx); err != nil {
					return
				}
				if ch, err = conn.Channel(); err != nil {
					return
				}
			}
			n, ok, err := b.inspect(ctx, &ch, name)
			switch {
			case err != nil:
				b.log.Warn("sweeping a delay queue failed", "queue", q, "delay", step(k), "err", err)
				return
			case !ok:
				looks[name] = look{next: now.Add(sweepMax)}
				continue
			case n == 0 || !l.held:
				looks[name] = look{next: now.Add(every), held: n > 0}
				continue
			}
			looks[name] = look{next: now.Add(min(max(step(k), every), sweepMax))}
			if err := b.sweepDelay(ctx, conn, ch, q, k); err != nil && ctx.Err() == nil {
				b.log.Warn("sweeping a delay queue failed", "queue", q, "delay", step(k), "err", err)
			}
		}
	}
}

// sweepDelay sweeps delay step k of queue once, on ch of conn (see
// sweepDelays).
func (b *Backend) sweepDelay(ctx context.Context, conn *amqp.Connection, ch *amqp.Channel, queue string, k int) error {
	name := b.delayName(queue, k)
	// A message taken is held while ch lives; once ch or conn is lost it
	// goes back by itself, and its successor is not published again (see
	// qchan.alive).
	held := func() error {
		if ch.IsClosed() || conn.IsClosed() {
			return fmt.Errorf("rabbit: sweeping %q: channel closed: %w", name, driver.ErrLeaseLost)
		}
		return nil
	}
	var moved uint64 // the tag of the last message moved
	defer func() {
		if moved > 0 {
			if err := ch.Ack(moved, true); err != nil {
				b.log.Warn("acking swept delayed messages failed; they are moved again (duplicates)", "queue", queue, "err", err)
			}
		}
	}()
	for range sweepBatch {
		d, ok, err := ch.Get(name, false)
		if err != nil || !ok {
			return err
		}
		now := time.Now()
		due, known := dueOf(d.Headers)
		var m outMsg
		switch rem := due.Sub(now) + delayLeft(d.Headers); {
		case !known:
			m, err = b.delayed(ctx, queue, copyOf(d), step(k)+delayLeft(d.Headers))
		case rem > 0:
			m, err = b.delayed(ctx, queue, copyOf(d), rem)
		default:
			m = outMsg{key: b.workName(queue), pub: copyOf(d)}
		}
		if err == nil {
			settle := b.replacing(ctx, instanceOf(d.Headers))
			err = b.publishFor(ctx, held, m)
			settle(err == nil)
		}
		if err != nil {
			ch.Nack(d.DeliveryTag, false, true)
			return fmt.Errorf("rabbit: move delayed message %q: %w", d.MessageId, err)
		}
		moved = d.DeliveryTag
		if !known || now.Sub(due) <= sweepGrace {
			return nil // on time: the queue expires the rest
		}
		b.log.Warn("moved an overdue message out of a delay queue", "queue", queue, "delay", step(k), "id", d.MessageId, "overdue", now.Sub(due).Round(time.Millisecond))
	}
	return nil
}

// dueOf reads dueHeader.
func dueOf(h amqp.Table) (time.Time, bool) {
	ms, ok := asInt(h[dueHeader])
	if !ok || ms <= 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}
