package rabbit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Headers this backend sets on the messages it stores.
const (
	// delayHeader carries, in milliseconds, how much of a message's delay
	// is left after the delay queue it was published to.
	delayHeader = "x-asyncplatform-delay-ms"

	// baseHeader carries deliveries that a copy inherits: a message that
	// reached this backend's buffer but was never handed out is handed back
	// as a copy (so its count does not rise), and the copy keeps the
	// original's x-delivery-count here. Any writer sets it: it counts only
	// when bound or bounded (see base.go).
	baseHeader = "x-asyncplatform-base"

	// dueHeader carries, in Unix milliseconds, when a message in a delay
	// queue is due to leave it (its publish plus the queue's step): the
	// delay sweeper moves a message found there after that time.
	dueHeader = "x-asyncplatform-due"

	// markerHeader marks a settle barrier's marker (see settleBarrier): a
	// message that is no job.
	markerHeader = "x-asyncplatform-barrier"
)

// qchan is the channel a queue's consumers run on. gen numbers it: receipts
// carry it, and a receipt whose channel is gone is stale.
//
// A released consumer retires its channel: from the moment its release
// begins, the next consumer of the queue opens a new one (see detachLocked),
// and the retired channel is closed once every delivery it handed out is
// settled, and every settle it sent is applied (see settleBarrier). A
// delivery the broker sent after basic.cancel-ok (the client drops those)
// so comes back when that channel closes, instead of staying stuck on it.
type qchan struct {
	ch       *amqp.Channel
	conn     *amqp.Connection // the connection ch is on
	acks     *acker           // every ack and nack of ch goes through it
	queue    string           // the queue's name, not its work queue's
	gen      uint64
	prefetch int
	held     atomic.Int64 // deliveries handed out and not yet settled
	retired  atomic.Bool
	closing  atomic.Bool  // closeRetired has begun
	barrier  atomic.Int64 // acks.settles when the last settle barrier began
}

// alive returns ErrLeaseLost once q's channel, or the connection it is
// on, has closed: the deliveries q holds then go back to the queue by
// themselves. amqp091 marks a lost connection closed before it closes its
// channels, and so before it resolves the publishing channel's confirms
// as lost: a replacement whose confirm was lost with the connection always
// finds here that the delivery it replaces is lost too, and does not
// publish its successor again (see publishFor).
func (q *qchan) alive() error {
	if q.ch.IsClosed() || q.conn != nil && q.conn.IsClosed() {
		return fmt.Errorf("rabbit: channel generation %d is closed: %w", q.gen, driver.ErrLeaseLost)
	}
	return nil
}

// retire marks q retired and closes it when nothing it handed out is still
// held. Otherwise the last settle closes it (see settled).
func (b *Backend) retire(q *qchan) {
	q.retired.Store(true)
	if q.held.Load() == 0 {
		b.closeRetired(q)
	}
}

// settled ends one held delivery of q; the last one of a retired channel
// closes it.
func (b *Backend) settled(q *qchan) {
	if q.held.Add(-1) == 0 && q.retired.Load() {
		b.closeRetired(q)
	}
}

// closeRetired closes a retired channel once the settles it sent are
// applied.
func (b *Backend) closeRetired(q *qchan) {
	if !q.closing.CompareAndSwap(false, true) {
		return
	}
	b.settleBarrier(q)
	q.ch.Close()
}

// barrierAfter is how many settle frames a channel may have sent since its
// last settle barrier and still be closed without one: well below the 32
// unapplied commands beyond which RabbitMQ 3.10 holds a channel's settles
// back.
const barrierAfter = 16

// settleBarrier returns once the queue has applied the settles q sent, when
// they may be more than barrierAfter.
//
// RabbitMQ 3.10 sends a channel's settles to a quorum queue as Raft
// commands, holds them back in the channel once about 32 are unapplied,
// sends the held ones (as one command) as earlier ones are applied, and
// drops those it still holds when the channel closes: their deliveries come
// back with a delivery counted. A release whose originals are acked one
// frame each (a handler holds a lower tag), then the channel closed at that
// handler's ack or at Close, brought 27 of 60 originals back beside their
// copies (TestReleaseHeldAcksApplied, TestCloseHeldAcksApplied), and 80
// handler acks then the last one's close brought 67 back
// (TestRetiredManySettlesApplied).
//
// The barrier is a marker message published on q itself, in confirm mode,
// to the work queue: the queue confirms it once it has applied it, and so
// every settle q sent before it, and the channel handles those
// applications, sending what it held back, before it passes the confirm
// on. The marker expires at once (expiration 0) and a consumer that gets
// it acks it without handing it out (see isMarker), so it takes no message
// (a basic.get barrier took one, and a kill right after it charged an
// innocent job a crash in TestFaults/PoisonIsolation). A consumer with no
// credit is no barrier: 3.10 ignores x-credit on basic.consume, and the
// consumer is given its prefetch.
func (b *Backend) settleBarrier(q *qchan) {
	sent := q.acks.settles.Load()
	if sent-q.barrier.Load() <= barrierAfter || !settleBarriers {
		return
	}
	q.barrier.Store(sent)
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.PublishTimeout)
	defer cancel()
	if err := b.publishMarker(ctx, q); err != nil {
		b.log.Debug("settle barrier failed; settles held back by the broker may be dropped", "queue", q.queue, "err", err)
	}
}

// publishMarker publishes a settle barrier's marker on q and waits for its
// confirm.
func (b *Backend) publishMarker(ctx context.Context, q *qchan) error {
	if err := q.ch.Confirm(false); err != nil {
		return fmt.Errorf("rabbit: confirm mode for a settle barrier: %w", err)
	}
	dc, err := q.ch.PublishWithDeferredConfirmWithContext(ctx, "", b.workName(q.queue), false, false, amqp.Publishing{
		Expiration: "0",
		Headers:    amqp.Table{markerHeader: true},
	})
	if err != nil {
		return fmt.Errorf("rabbit: publish a settle barrier: %w", err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("rabbit: settle barrier confirm: %w", err)
	}
	if !ok {
		return errors.New("rabbit: settle barrier nacked")
	}
	return nil
}

// isMarker reports whether d is a settle barrier's marker, which is acked
// and never handed out. A marker has no body: a message with one is handed
// out whatever its headers, so that a forged header drops no job.
func isMarker(d amqp.Delivery) bool {
	_, ok := d.Headers[markerHeader]
	return ok && len(d.Body) == 0
}

// settleBarriers is for tests: without it, retired channels close with no
// settle barrier.
var settleBarriers = true

// consumer is one basic.consume on a work queue.
type consumer struct {
	*qchan
	queue      string
	tag        string
	deliveries <-chan amqp.Delivery
	receivers  int         // Receive calls reading deliveries; guarded by Backend.mu
	idle       *time.Timer // releases the consumer when no Receive comes; guarded by Backend.mu
}

// receipt is the Handle of a Delivery: the delivery tag on the channel that
// delivered it.
type receipt struct {
	c       *qchan
	tag     uint64
	inst    string // the message's instance (see gone.go), "" when it has none
	origin  string // the publish it stores (see originHeader), "" when it has none
	settled atomic.Bool
}

var consumerSeq atomic.Uint64

// consumerFor returns the live consumer of queue, starting one when needed,
// and counts the caller as one of its receivers.
func (b *Backend) consumerFor(ctx context.Context, queue string, max int) (*consumer, error) {
	b.consMu.Lock()
	defer b.consMu.Unlock()
	b.mu.Lock()
	c, qc := b.cons[queue], b.qch[queue]
	if c != nil && !c.ch.IsClosed() {
		c.receivers++
		if c.idle != nil {
			c.idle.Stop()
			c.idle = nil
		}
		b.mu.Unlock()
		return c, nil
	}
	b.mu.Unlock()
	if err := b.ensureQueue(ctx, queue); err != nil {
		return nil, err
	}
	if qc == nil || qc.ch.IsClosed() || qc.retired.Load() {
		conn, err := b.connection(ctx)
		if err != nil {
			return nil, err
		}
		ch, err := conn.Channel()
		if err != nil {
			return nil, fmt.Errorf("rabbit: open consumer channel: %w", err)
		}
		prefetch := b.cfg.Prefetch
		if prefetch == 0 {
			b.mu.Lock()
			if max > b.window[queue] {
				b.window[queue] = min(max, 65535)
			}
			prefetch = b.window[queue]
			b.mu.Unlock()
		}
		if err := ch.Qos(prefetch, 0, false); err != nil {
			ch.Close()
			return nil, fmt.Errorf("rabbit: set prefetch %d: %w", prefetch, err)
		}
		qc = &qchan{ch: ch, conn: conn, acks: newAcker(ch), queue: queue, gen: b.chanGen.Add(1), prefetch: prefetch}
	}
	tag := fmt.Sprintf("asyncplatform-%d-%d", os.Getpid(), consumerSeq.Add(1))
	dl, err := qc.ch.Consume(b.workName(queue), tag, false, false, false, false, nil)
	if err != nil {
		qc.ch.Close()
		b.forget(b.workName(queue))
		return nil, fmt.Errorf("rabbit: consume %q: %w", b.workName(queue), err)
	}
	c = &consumer{qchan: qc, queue: queue, tag: tag, deliveries: dl, receivers: 1}
	b.mu.Lock()
	b.cons[queue] = c
	b.qch[queue] = qc
	b.mu.Unlock()
	return c, nil
}

// leave ends one Receive on c. When the Receive was cancelled and was the
// last one reading c, the consumer is cancelled and what it had buffered is
// handed back uncounted, so a stopped worker holds nothing it was not given.
// When no Receive comes for a lease, the same happens: messages are never
// kept unseen in the buffer for longer than a lease.
func (b *Backend) leave(c *consumer, cancelled bool, lease time.Duration) {
	b.mu.Lock()
	c.receivers--
	release := false
	if c.receivers == 0 && b.cons[c.queue] == c {
		if cancelled {
			b.detachLocked(c)
			release = true
		} else {
			if lease <= 0 {
				lease = time.Minute
			}
			c.idle = time.AfterFunc(lease, func() { b.idleRelease(c) })
		}
	}
	b.mu.Unlock()
	if release {
		b.release(c, true)
	}
}

// idleRelease releases c when still no Receive reads it.
func (b *Backend) idleRelease(c *consumer) {
	b.mu.Lock()
	if b.closed || c.receivers > 0 || b.cons[c.queue] != c {
		b.mu.Unlock()
		return
	}
	b.detachLocked(c)
	c.idle = nil
	b.wg.Add(1)
	b.mu.Unlock()
	defer b.wg.Done()
	b.release(c, false)
}

// releaseAll releases every consumer, for Close: what they buffered goes
// back uncounted, and only what was handed out is abandoned.
func (b *Backend) releaseAll() {
	b.mu.Lock()
	cs := make([]*consumer, 0, len(b.cons))
	for _, c := range b.cons {
		if c.idle != nil {
			c.idle.Stop()
			c.idle = nil
		}
		cs = append(cs, c)
		b.detachLocked(c)
	}
	b.mu.Unlock()
	for _, c := range cs {
		b.release(c, false)
	}
}

// detachLocked takes c and its channel out of use before c is released: a
// Receive from then on starts its consumer on a new channel. No call may
// run on the channel beside the release's basic.cancel and channel.close:
// amqp091 matches a channel's replies to its calls in the order they come,
// and the broker answers nothing after channel.close but close-ok, so a
// basic.consume sent then takes the close-ok, and Close waits for ever
// (holding the channel, which the failed consume then closes while holding
// consMu: every Receive of the backend stops). b.mu must be held.
func (b *Backend) detachLocked(c *consumer) {
	delete(b.cons, c.queue)
	if b.qch[c.queue] == c.qchan {
		delete(b.qch, c.queue)
	}
}

// ended forgets a consumer whose deliveries channel closed (its channel
// closed, or the broker cancelled it).
func (b *Backend) ended(c *consumer) {
	b.mu.Lock()
	if b.cons[c.queue] == c {
		delete(b.cons, c.queue)
	}
	b.mu.Unlock()
}

// quietRound is how long release waits for more deliveries before it takes
// the broker's pipeline as quiet (two rounds in a row).
const quietRound = 20 * time.Millisecond

// barrierOK reports whether a release asked for a settle barrier may
// publish one: not on a connection the broker blocked.
func (b *Backend) barrierOK(barrier bool) bool {
	if !barrier || !settleBarriers {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.blocked == nil
}

// holdRound bounds a round of release's wait while it holds the channel's
// settles: the handlers' acks wait for it.
const holdRound = 200 * time.Millisecond

// release cancels the consumer, which detachLocked took out of use, and
// hands back each message it buffered: a copy that keeps the original's
// delivery count in baseHeader, confirmed, then the original acked.
//
// A quorum queue can deliver to a consumer after its basic.cancel-ok (a
// settle just before the cancel opened the prefetch window), and the client
// drops such deliveries, which would then come back counted when the
// channel closes. So release first collects deliveries, acking nothing (the
// window can only shrink), until the window is full or the pipeline has been
// quiet for two rounds. Then it holds the channel's settles, publishes a
// settle barrier (with barrier: a cancelled Receive's release, and
// Release) or waits for two more quiet rounds as long as a round trip
// through the queue (Close and the idle release), cancels, and lets the
// settles go: no settle opens the window while the cancel is on its way.
// It collects what is left, and only then
// acks the originals of the copies, all together; deliveries whose copies
// could not be published are nacked (requeued, counted) after the cancel,
// so that none comes back to the consumer being cancelled. It hands back what
// it collects a burst at a time (what the client has buffered when it
// looks): one gone-mark lookup, one publish of the copies and two mark
// writes per burst, not per message. The copies go to the queue it still
// consumes and come back to it while the window has room, so the window
// fills and the cancel finds nothing on its way (see the package doc).
func (b *Backend) release(c *consumer, barrier bool) {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.PublishTimeout)
	defer cancel()
	var tags []uint64         // originals whose copy is stored, markers, replaced messages
	var insts []string        // their instances
	var requeue []uint64      // deliveries not handed back: nacked once the consumer is cancelled
	var slowest time.Duration // the slowest hand-back: a round trip through the queue, as the broker runs now
	failed := false
	// take hands back a burst of deliveries: looked up in one store call,
	// their copies published together, marked in one call before and one
	// after.
	take := func(got []amqp.Delivery) {
		if failed {
			for _, d := range got {
				requeue = append(requeue, d.DeliveryTag)
			}
			return
		}
		var back []amqp.Delivery
		var backBases []int
		gone := b.replacedEach(ctx, got)
		bases := b.basesEach(ctx, got)
		for i, d := range got {
			if isMarker(d) || gone[i] {
				tags = append(tags, d.DeliveryTag)
				insts = append(insts, instanceOf(d.Headers))
			} else {
				back = append(back, d)
				backBases = append(backBases, bases[i])
			}
		}
		start := time.Now()
		err := b.handBack(ctx, c.queue, back, backBases, c.alive)
		slowest = max(slowest, time.Since(start))
		if err != nil {
			b.log.Warn("handing back buffered messages failed; they return with one more delivery counted", "queue", c.queue, "messages", len(back), "err", err)
			for _, d := range back {
				requeue = append(requeue, d.DeliveryTag)
			}
			failed = true
			return
		}
		for _, d := range back {
			tags = append(tags, d.DeliveryTag)
			insts = append(insts, instanceOf(d.Headers))
		}
	}
	// burst returns d and what else is buffered now, up to the window.
	burst := func(d amqp.Delivery) []amqp.Delivery {
		got := []amqp.Delivery{d}
		for int(c.held.Load())+len(tags)+len(requeue)+len(got) < c.prefetch {
			select {
			case d, ok := <-c.deliveries:
				if !ok {
					return got
				}
				got = append(got, d)
			default:
				return got
			}
		}
		return got
	}
	// collect takes what comes until the window is full or nothing came
	// for two rounds in a row.
	collect := func(round time.Duration) {
		t := time.NewTimer(round)
		defer t.Stop()
		for quiet := 0; quiet < 2 && int(c.held.Load())+len(tags)+len(requeue) < c.prefetch; {
			select {
			case d, ok := <-c.deliveries:
				if !ok {
					return
				}
				take(burst(d))
				quiet = 0
			case <-t.C:
				quiet++
				t.Reset(round)
			}
		}
	}
	collect(quietRound)
	// Then no settle is written on the channel until cancel-ok, so none
	// opens the window while the cancel is on its way. With barrier, a
	// settle barrier (see settleBarrier) follows: the queue sends every
	// delivery that this channel's consume and settles, or the copies
	// confirmed before it, made it send before it confirms the barrier,
	// so they arrive before cancel-ok and the drain below gets them. But a
	// marker waits, counted as ready, behind the queue's ready messages
	// (docs/reliability.md), so Close and the idle release, which a Stats
	// may follow, wait instead for two more quiet rounds, each as long as
	// the slowest hand-back (a round trip through the queue as the broker
	// runs now, within holdRound). A connection the broker blocked takes
	// no publish (it stops reading the connection): no barrier then.
	c.acks.hold()
	if b.barrierOK(barrier) {
		bctx, bcancel := context.WithTimeout(context.Background(), b.cfg.PublishTimeout)
		if err := b.publishMarker(bctx, c.qchan); err != nil {
			b.log.Warn("release barrier failed; a delivery may arrive after the cancel and come back counted", "queue", c.queue, "err", err)
		}
		bcancel()
	} else {
		collect(min(max(slowest, quietRound), holdRound))
	}
	cancelled := c.ch.Cancel(c.tag, false) == nil
	c.acks.unhold()
	if cancelled {
		var rest []amqp.Delivery
		for d := range c.deliveries {
			rest = append(rest, d)
		}
		if len(rest) > 0 {
			take(rest)
		}
	}
	for _, tag := range requeue {
		if err := c.acks.nack(tag, true); err != nil {
			b.log.Debug("nack of a buffered message failed; it comes back when the channel closes", "queue", c.queue, "err", err)
		}
	}
	// All together: RabbitMQ 3.10 holds a channel's settles to a quorum
	// queue back once about 32 commands are unapplied and drops them when
	// the channel closes. Acked one by one here, 7 of 40 originals came
	// back with a delivery counted, beside their copies
	// (TestReleaseAcksApplied). Together they go out in one multiple ack
	// when nothing below them is held (one command), and otherwise in as
	// few frames as the held tags between them allow.
	b.testBeforeAck()
	if err := c.acks.ackAll(tags); err != nil {
		b.log.Debug("acking the originals of handed-back messages failed", "queue", c.queue, "err", err)
	} else {
		b.acked(c.qchan, insts...)
	}
	if len(tags) > 0 {
		b.log.Debug("handed back buffered messages", "queue", c.queue, "messages", len(tags))
	}
	// The channel may close without another settle (at a held delivery's
	// last settle, or with the connection at Close): the barrier sees the
	// originals' acks applied first.
	b.settleBarrier(c.qchan)
	b.retire(c.qchan)
}

// handBack stores an uncounted copy of each of ds, deliveries that were
// never handed out: to the work queue with its count (bases, the counted
// base of each of ds, plus the broker's count) kept in baseHeader and
// bound (see bindBases), or on to its next delay queue when it still has
// delay left. The copies are published together, and their marks (see
// replacing) written in one store call before and one after. held reports
// whether ds are still held (see publishFor): once they are not, they come
// back by themselves, and their copies are not published again.
func (b *Backend) handBack(ctx context.Context, queue string, ds []amqp.Delivery, bases []int, held func() error) (err error) {
	if len(ds) == 0 {
		return nil
	}
	msgs := make([]outMsg, len(ds))
	insts := make([]string, len(ds))
	for i, d := range ds {
		insts[i] = instanceOf(d.Headers)
		pub := copyOf(d)
		if rem := delayLeft(d.Headers); rem > 0 {
			if msgs[i], err = b.delayed(ctx, queue, pub, rem); err != nil {
				return err
			}
			continue
		}
		if base := bases[i] + deliveryCount(d.Headers); base > 0 {
			pub.Headers[baseHeader] = int64(base)
		}
		msgs[i] = outMsg{key: b.workName(queue), pub: pub}
	}
	if err := b.bindBases(ctx, msgs); err != nil {
		return err
	}
	settle := b.replacing(ctx, insts...)
	defer func() { settle(err == nil) }()
	return b.publishFor(ctx, held, msgs...)
}

// copyOf returns the publish of a copy of d: none of its headers but a new
// instance and d's origin (see originHeader).
func copyOf(d amqp.Delivery) amqp.Publishing {
	h := withInstance(nil)
	if o := originOf(d.Headers); o != "" {
		h[originHeader] = o
	}
	return amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		MessageId:    d.MessageId,
		Timestamp:    d.Timestamp,
		ContentType:  d.ContentType,
		Headers:      h,
		Body:         d.Body,
	}
}

// Receive hands out what the queue's consumer has buffered, up to max,
// waiting for at least one message. The lease is the channel's life: it
// needs no renewal while the connection lives (see the package doc on
// consumer_timeout). Messages still between delay hops are moved on to
// their next delay queue here and never handed out. When ctx ends and no
// other Receive reads the queue, the consumer is cancelled and the messages
// it had buffered are handed back uncounted.
func (b *Backend) Receive(ctx context.Context, queue string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	if b.isClosed() {
		return nil, driver.ErrClosed
	}
	if max < 1 {
		return nil, fmt.Errorf("rabbit: Receive max is %d, must be at least 1", max)
	}
	for {
		// Close releases the consumers, which ends a waiting Receive here
		// with its deliveries channel closed: it must not start another.
		if b.isShutting() {
			return nil, driver.ErrClosed
		}
		c, err := b.consumerFor(ctx, queue, max)
		if err != nil {
			return nil, b.closedErr(err)
		}
		if ctx.Err() != nil {
			b.leave(c, true, lease)
			return nil, ctx.Err()
		}
		var first amqp.Delivery
		select {
		case d, ok := <-c.deliveries:
			if !ok {
				b.ended(c)
				b.leave(c, false, lease)
				continue
			}
			first = d
		case <-ctx.Done():
			b.leave(c, true, lease)
			return nil, ctx.Err()
		}
		got := []amqp.Delivery{first}
	drain:
		for len(got) < max {
			select {
			case d, ok := <-c.deliveries:
				if !ok {
					break drain
				}
				got = append(got, d)
			default:
				break drain
			}
		}
		var out []*driver.Delivery
		gone := b.replacedEach(ctx, got)
		bases := b.basesEach(ctx, got)
		for i, d := range got {
			what := "handed out"
			switch {
			case isMarker(d):
				what = "marker"
				if err := c.acks.ack(d.DeliveryTag); err != nil {
					b.log.Debug("ack of a settle barrier's marker failed", "queue", queue, "err", err)
				}
			case gone[i]:
				what = "dropped: replaced or acked"
				if err := c.acks.ack(d.DeliveryTag); err != nil {
					b.log.Debug("ack of a replaced message failed; it comes back and is dropped again", "queue", queue, "id", d.MessageId, "err", err)
				} else {
					b.acked(c.qchan, instanceOf(d.Headers))
				}
			case delayLeft(d.Headers) > 0:
				what = "hop"
				b.hop(ctx, c, d, delayLeft(d.Headers))
			default:
				r := &receipt{c: c.qchan, tag: d.DeliveryTag, inst: instanceOf(d.Headers), origin: originOf(d.Headers)}
				if !b.holding.take(r) {
					// A twin of a held delivery (see twins.go); not
					// remembered as acked: its sibling may still come
					// back.
					what = "dropped: twin of a held delivery"
					if err := c.acks.ack(d.DeliveryTag); err != nil {
						b.log.Debug("ack of a twin failed; it comes back", "queue", queue, "id", d.MessageId, "err", err)
					}
					break
				}
				c.held.Add(1)
				out = append(out, &driver.Delivery{
					Queue:      queue,
					Body:       d.Body,
					Deliveries: bases[i] + deliveryCount(d.Headers) + 1,
					Handle:     r,
				})
			}
			b.testTraceDelivery(d, what)
		}
		b.leave(c, false, lease)
		if len(out) > 0 {
			return out, nil
		}
	}
}

// hop moves a message that arrived with delay left on to its next delay
// queue: publish the copy, confirm, then ack.
func (b *Backend) hop(ctx context.Context, c *consumer, d amqp.Delivery, rem time.Duration) {
	ctx = context.WithoutCancel(ctx)
	settle := b.replacing(ctx, instanceOf(d.Headers))
	m, err := b.delayed(ctx, c.queue, copyOf(d), rem)
	if err == nil {
		err = b.publishFor(ctx, c.alive, m)
	}
	settle(err == nil)
	if err != nil {
		b.log.Warn("moving a delayed message to its next delay queue failed; requeued", "queue", c.queue, "id", d.MessageId, "err", err)
		c.acks.nack(d.DeliveryTag, true)
		return
	}
	if err := c.acks.ack(d.DeliveryTag); err != nil {
		b.log.Debug("ack after a delay hop failed; the hop will repeat", "queue", c.queue, "id", d.MessageId, "err", err)
	} else {
		b.acked(c.qchan, instanceOf(d.Headers))
	}
}

// route makes the publish that stores msg for queue: to the work queue, or
// to the first delay queue when msg.NotBefore is ahead.
func (b *Backend) route(ctx context.Context, queue string, msg driver.Message) (outMsg, error) {
	pub := amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		MessageId:    msg.ID,
		Timestamp:    time.Now(),
		Headers:      withInstance(nil),
		Body:         msg.Body,
	}
	if !msg.NotBefore.IsZero() {
		if rem := time.Until(msg.NotBefore); rem > 0 {
			return b.delayed(ctx, queue, pub, rem)
		}
	}
	return outMsg{key: b.workName(queue), pub: pub}, nil
}

// delayed makes the publish of pub to the largest delay step that fits in
// rem, carrying what is left of rem in delayHeader, and declares that delay
// queue when this backend has not yet.
//
// The publish carries the step's TTL as its own expiration too, besides
// the queue's x-message-ttl. RabbitMQ 3.10 starts a quorum queue on an old
// machine version and gives it its arguments (x-message-ttl among them)
// only after the declaring call's start: a second connection declaring the
// same new queue at that moment gets declare-ok at once, and its publish
// got no TTL. Such a message never expires, and a queue expires messages
// from its head only, so every later one stayed behind it for good
// (TestCluster/DelayRace; Retry/Precedence and Outcomes/OutputOnePerJob on
// a cluster). A message's own expiration is read even then. Dead-lettering
// drops the expiration, so the copy in the work queue keeps no TTL.
func (b *Backend) delayed(ctx context.Context, queue string, pub amqp.Publishing, rem time.Duration) (outMsg, error) {
	k := pickStep(rem)
	name := b.delayName(queue, k)
	if err := b.ensure(ctx, name, b.delayArgs(queue, k)); err != nil {
		return outMsg{}, err
	}
	if delayExpiry.Load() {
		pub.Expiration = strconv.FormatInt(step(k).Milliseconds(), 10)
	}
	if pub.Headers == nil {
		pub.Headers = amqp.Table{}
	}
	pub.Headers[dueHeader] = time.Now().Add(step(k)).UnixMilli()
	if left := rem - step(k); left > 0 {
		ms := (left + time.Millisecond - 1) / time.Millisecond
		pub.Headers[delayHeader] = int64(ms)
	}
	return outMsg{key: name, pub: pub}, nil
}

// delayExpiry is for tests: without it, delay publishes carry no
// expiration of their own, and a delay queue declared in a race on a
// cluster can keep them for good (see delayed), which the sweeper must
// then move.
var delayExpiry atomic.Bool

func init() { delayExpiry.Store(true) }

func delayLeft(h amqp.Table) time.Duration {
	n, ok := asInt(h[delayHeader])
	if !ok || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Millisecond
}

// deliveryCount reads the quorum queue's x-delivery-count: absent on a
// copy's first delivery.
func deliveryCount(h amqp.Table) int {
	n, _ := asInt(h["x-delivery-count"])
	return int(max(n, 0))
}

func asInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case int32:
		return int64(n), true
	case int16:
		return int64(n), true
	case int8:
		return int64(n), true
	case int:
		return int64(n), true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	}
	return 0, false
}

// held checks that d is this backend's delivery and still held.
func (b *Backend) held(d *driver.Delivery) (*receipt, error) {
	if b.isClosed() {
		return nil, driver.ErrClosed
	}
	if d == nil {
		return nil, errors.New("rabbit: nil delivery")
	}
	r, ok := d.Handle.(*receipt)
	if !ok {
		return nil, fmt.Errorf("rabbit: delivery handle is %T, not one of this backend's", d.Handle)
	}
	if r.settled.Load() || r.c.ch.IsClosed() {
		return nil, fmt.Errorf("rabbit: delivery tag %d of channel generation %d: %w", r.tag, r.c.gen, driver.ErrLeaseLost)
	}
	return r, nil
}

// check returns ErrLeaseLost when the delivering channel is gone.
func (r *receipt) check() error { return r.c.alive() }

// settle acks the delivery once; a second settle, or one on a closed
// channel, is lease-lost. The tag is acked on the channel that delivered it,
// so a stale receipt can never ack another message.
func (b *Backend) settle(r *receipt) error {
	if !r.settled.CompareAndSwap(false, true) {
		return fmt.Errorf("rabbit: delivery tag %d already settled: %w", r.tag, driver.ErrLeaseLost)
	}
	b.holding.drop(r)
	defer b.settled(r.c)
	if r.c.ch.IsClosed() {
		return fmt.Errorf("rabbit: channel generation %d is closed: %w", r.c.gen, driver.ErrLeaseLost)
	}
	if err := r.c.acks.ack(r.tag); err != nil {
		return fmt.Errorf("rabbit: ack tag %d of channel generation %d: %w: %w", r.tag, r.c.gen, driver.ErrLeaseLost, err)
	}
	b.acked(r.c, r.inst)
	if r.origin != "" {
		b.ran.add(time.Now(), []string{r.origin})
	}
	return nil
}

// Ack removes the delivered message.
func (b *Backend) Ack(ctx context.Context, d *driver.Delivery) error {
	r, err := b.held(d)
	if err != nil {
		return err
	}
	return b.settle(r)
}

// Extend is a no-op while the delivering channel lives: RabbitMQ holds an
// unacked delivery until its channel closes. It returns ErrLeaseLost when
// the channel is gone.
func (b *Backend) Extend(ctx context.Context, d *driver.Delivery, lease time.Duration) error {
	_, err := b.held(d)
	return err
}

// Requeue publishes msg (to the work queue, or a delay queue when
// msg.NotBefore is ahead), waits for its confirm, and then acks the
// delivery.
func (b *Backend) Requeue(ctx context.Context, d *driver.Delivery, msg driver.Message) error {
	r, err := b.held(d)
	if err != nil {
		return err
	}
	if len(msg.Body) > b.cfg.MaxBody && b.cfg.MaxBody > 0 {
		return fmt.Errorf("rabbit: message %q is %d bytes, limit %d: %w", msg.ID, len(msg.Body), b.cfg.MaxBody, driver.ErrTooLarge)
	}
	m, err := b.route(ctx, d.Queue, msg)
	if err != nil {
		return b.unsettled(r, err)
	}
	settle := b.replacing(ctx, r.inst)
	if err := b.publishFor(ctx, r.check, m); err != nil {
		settle(false)
		return b.unsettled(r, err)
	}
	b.testBeforeAck()
	err = b.settle(r)
	b.later(func() { settle(true) })
	return err
}

// unsettled returns err, the failure of a Requeue or DeadLetter whose new
// copy was not written, after handing the delivery back to the broker
// (basic.nack with requeue; the broker counts it, as a lost lease is
// counted). The platform does not settle a delivery twice: without this it
// would stay held on its channel, which may live as long as the worker,
// while on every other backend its lease runs out and it comes back.
func (b *Backend) unsettled(r *receipt, err error) error {
	if errors.Is(err, driver.ErrLeaseLost) || !r.settled.CompareAndSwap(false, true) {
		return err
	}
	b.holding.drop(r)
	defer b.settled(r.c)
	if !r.c.ch.IsClosed() {
		if nerr := r.c.acks.nack(r.tag, true); nerr != nil {
			b.log.Warn("rabbit: hand back a delivery whose new copy was not written", "tag", r.tag, "err", nerr)
		}
	}
	return err
}

// DeadLetter writes rec to the companion store when there is one (see
// deadstore.go), else publishes it to the queue's dead-letter queue, waits for its
// confirm, and then acks the delivery.
func (b *Backend) DeadLetter(ctx context.Context, d *driver.Delivery, rec driver.DeadMessage) error {
	r, err := b.held(d)
	if err != nil {
		return err
	}
	if err := b.ensureQueue(ctx, d.Queue); err != nil {
		return b.unsettled(r, err)
	}
	if b.cfg.Store != nil { // see deadstore.go
		settle := b.replacing(ctx, r.inst)
		if err := b.storeDeadLetter(ctx, d.Queue, rec); err != nil {
			settle(false)
			return b.unsettled(r, err)
		}
		b.testBeforeAck()
		err := b.settle(r)
		b.later(func() { settle(true) })
		return err
	}
	now := time.Now()
	m := outMsg{key: b.deadName(d.Queue), pub: amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		MessageId:    rec.ID,
		Timestamp:    now,
		Headers:      amqp.Table{deadSeqHeader: now.UnixNano()},
		Body:         rec.Body,
	}}
	if err := b.publishFor(ctx, r.check, m); err != nil {
		return b.unsettled(r, err)
	}
	return b.settle(r)
}

// Enqueue publishes msgs with confirms and returns once the broker has
// confirmed every one.
func (b *Backend) Enqueue(ctx context.Context, queue string, msgs []driver.Message) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	for _, m := range msgs {
		if b.cfg.MaxBody > 0 && len(m.Body) > b.cfg.MaxBody {
			return fmt.Errorf("rabbit: message %q is %d bytes, limit %d: %w", m.ID, len(m.Body), b.cfg.MaxBody, driver.ErrTooLarge)
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	if err := b.ensureQueue(ctx, queue); err != nil {
		return err
	}
	out := make([]outMsg, len(msgs))
	ids := make([]string, len(msgs))
	now := time.Now()
	for i, m := range msgs {
		o, err := b.route(ctx, queue, m)
		if err != nil {
			return err
		}
		if inst := b.unsure.get(now, queue, m.ID, o.pub.Body); inst != "" {
			// Tried again after a failed Enqueue: the same instance (see
			// twins.go).
			o.pub.Headers[instanceHeader] = inst
		}
		out[i], ids[i] = o, m.ID
	}
	if err := b.publish(ctx, out...); err != nil {
		b.unsure.failed(now, queue, out, ids)
		return err
	}
	b.unsure.stored(queue, ids)
	return nil
}
