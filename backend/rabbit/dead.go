package rabbit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// deadReceipt is the Handle of a DeadDelivery: the basic.get delivery tag on
// a channel opened for this one holder.
type deadReceipt struct {
	owner   string // the queue whose dead letter it is
	queue   string // the broker's dead-letter queue
	ch      *amqp.Channel
	tag     uint64
	settled atomic.Bool
}

// deadSeqHeader orders dead letters: the time of the DeadLetter in Unix
// nanoseconds. A quorum queue puts every record it gets back (a kept one, a
// listed one, one whose holder died) at the back, so the queue's order is
// not the records' order: every read sorts by this header.
const deadSeqHeader = "x-asyncplatform-dead-seq"

// deadSeq returns a record's place in the order: its deadSeqHeader, or
// its AMQP timestamp for a record without one.
func deadSeq(d amqp.Delivery) int64 {
	if n, ok := asInt(d.Headers[deadSeqHeader]); ok {
		return n
	}
	return d.Timestamp.UnixNano()
}

// deadLockName is the exclusive queue that a dead-letter read of queue
// holds (see lockDead).
func (b *Backend) deadLockName(queue string) string { return b.deadName(queue) + "-lock" }

// lockDead makes the dead-letter reads of queue take turns across every
// process and node: a read takes every ready record off the queue for a
// moment (AMQP has no browse), and a read beside it would not see the
// records it holds (a DeleteDead then left redriven records in place, a
// listing found none: TestSIGINTRedrive). It waits for the other reads of
// this Backend, then takes the exclusive queue deadLockName (see lockQueue).
// The func it returns releases both.
func (b *Backend) lockDead(ctx context.Context, queue string) (func(), error) {
	b.mu.Lock()
	turn := b.deadTurns[queue]
	if turn == nil {
		turn = make(chan struct{}, 1)
		b.deadTurns[queue] = turn
	}
	b.mu.Unlock()
	select {
	case turn <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("rabbit: waiting for another dead-letter read of %q: %w", queue, ctx.Err())
	case <-b.done:
		return nil, driver.ErrClosed
	}
	conn, err := b.connection(ctx)
	if err != nil {
		<-turn
		return nil, err
	}
	name := b.deadLockName(queue)
	ch, err := lockQueue(ctx, conn, name)
	if err != nil {
		<-turn
		return nil, err
	}
	return func() {
		if err := unlockQueue(conn, ch, name); err != nil {
			b.log.Warn("the dead-letter lock stays held until the connection closes", "queue", queue, "err", err)
		}
		<-turn
	}, nil
}

// NextDead reads every ready record of the dead-letter queue on a channel
// of its own (see scanDead), holding lockDead, keeps the oldest (by
// deadSeqHeader) unacked, which hides it from every other caller until
// SettleDead or until the channel or connection closes, and hands the
// others back (basic.nack with requeue). It costs the whole queue streamed:
// a quorum queue puts records it gets back at its tail, so its head is not
// always the oldest.
func (b *Backend) NextDead(ctx context.Context, queue string) (*driver.DeadDelivery, error) {
	if b.isClosed() {
		return nil, driver.ErrClosed
	}
	if err := b.ensureQueue(ctx, queue); err != nil {
		return nil, err
	}
	if b.cfg.Store != nil {
		if err := b.toStore(ctx, queue); err != nil {
			return nil, err
		}
		return b.nextStoreDead(ctx, queue)
	}
	b.migrateDead(ctx, queue)
	unlock, err := b.lockDead(ctx, queue)
	if err != nil {
		return nil, err
	}
	defer unlock()
	conn, err := b.connection(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbit: open channel: %w", err)
	}
	name := b.deadName(queue)
	var all []amqp.Delivery
	_, tag, err := scanDead(ctx, ch, name, math.MaxInt, func(d amqp.Delivery) bool {
		all = append(all, d)
		return true
	})
	if err != nil {
		ch.Close()
		b.waitReady(ctx, name, len(all))
		return nil, err
	}
	if len(all) == 0 {
		ch.Close()
		return nil, driver.ErrNoDeadLetters
	}
	oldest := 0
	for i, d := range all {
		if deadSeq(d) < deadSeq(all[oldest]) {
			oldest = i
		}
	}
	// Stop the consumer first: a record handed back must not come back to
	// this channel, which holds the oldest from now on.
	if err := ch.Cancel(tag, false); err != nil {
		ch.Close()
		b.waitReady(ctx, name, len(all))
		return nil, fmt.Errorf("rabbit: cancel the scan of %q: %w", name, err)
	}
	for i, d := range all {
		if i == oldest {
			continue
		}
		if err := ch.Nack(d.DeliveryTag, false, true); err != nil {
			ch.Close() // returns them all
			b.waitReady(ctx, name, len(all))
			return nil, fmt.Errorf("rabbit: hand back dead letter %q: %w", d.MessageId, err)
		}
	}
	d := all[oldest]
	// The returns are in place before the next read, which waits for the
	// lock; the channel has settled its returns by then too, so the ack of
	// a SettleDead is written at once, not queued behind them.
	b.waitReady(ctx, name, len(all)-1)
	return &driver.DeadDelivery{
		DeadMessage: driver.DeadMessage{ID: d.MessageId, Body: d.Body},
		Handle:      &deadReceipt{owner: queue, queue: name, ch: ch, tag: d.DeliveryTag},
	}, nil
}

// ExtendDead reports whether the record is still held: a hold lasts as
// long as the holder's channel (Capabilities.DeadHold is zero), so there is
// nothing to renew.
func (b *Backend) ExtendDead(ctx context.Context, d *driver.DeadDelivery) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	if d == nil {
		return errors.New("rabbit: nil dead delivery")
	}
	if _, ok := d.Handle.(*storeHold); ok {
		return b.extendStoreDead(ctx, d)
	}
	r, ok := d.Handle.(*deadReceipt)
	if !ok {
		return fmt.Errorf("rabbit: dead delivery handle is %T, not one of this backend's", d.Handle)
	}
	if r.settled.Load() || r.ch.IsClosed() {
		return fmt.Errorf("rabbit: dead letter %q is no longer held: %w", d.ID, driver.ErrLeaseLost)
	}
	return nil
}

// SettleDead acks the held record (remove) or nacks it with requeue
// (keep): the next NextDead sees it again, since it is still the oldest.
// Then it closes the holder's channel. A keep holds lockDead, so that the
// next read finds the record in place.
func (b *Backend) SettleDead(ctx context.Context, d *driver.DeadDelivery, remove bool) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	if d == nil {
		return errors.New("rabbit: nil dead delivery")
	}
	if _, ok := d.Handle.(*storeHold); ok {
		return b.settleStoreDead(ctx, d, remove)
	}
	r, ok := d.Handle.(*deadReceipt)
	if !ok {
		return fmt.Errorf("rabbit: dead delivery handle is %T, not one of this backend's", d.Handle)
	}
	if !r.settled.CompareAndSwap(false, true) {
		return fmt.Errorf("rabbit: dead letter %q already settled: %w", d.ID, driver.ErrLeaseLost)
	}
	defer r.ch.Close()
	if r.ch.IsClosed() {
		return fmt.Errorf("rabbit: dead letter %q: its channel is closed: %w", d.ID, driver.ErrLeaseLost)
	}
	if remove {
		if err := r.ch.Ack(r.tag, false); err != nil {
			return fmt.Errorf("rabbit: settle dead letter %q: %w: %w", d.ID, driver.ErrLeaseLost, err)
		}
		return nil
	}
	if unlock, err := b.lockDead(ctx, r.owner); err == nil {
		defer unlock()
	}
	ready := b.ready(ctx, r.queue)
	if err := r.ch.Nack(r.tag, false, true); err != nil {
		return fmt.Errorf("rabbit: settle dead letter %q: %w: %w", d.ID, driver.ErrLeaseLost, err)
	}
	if ready >= 0 {
		b.waitReady(ctx, r.queue, ready+1) // the next NextDead sees it
	}
	return nil
}

// returnsWait bounds how long a dead-letter call waits for records it
// handed back to be ready again: a quorum queue applies a closed channel's
// returns after the close completes. The wait ends as soon as they are,
// within milliseconds but on a loaded machine.
const returnsWait = 10 * time.Second

// waitReady waits, up to returnsWait, until the dead-letter queue name has
// at least n ready records, so that the records this call handed back are
// in place before it returns and the next read sees them. Callers hold
// lockDead, so no other read takes records meanwhile. It returns the last
// count it saw, or -1 when it could not tell.
func (b *Backend) waitReady(ctx context.Context, name string, n int) int {
	seen := -1
	deadline := time.Now().Add(returnsWait)
	_ = b.withChannel(ctx, func(ch *amqp.Channel) error {
		for {
			q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
			if err != nil {
				return err
			}
			seen = q.Messages
			if seen >= n {
				return nil
			}
			if !time.Now().Before(deadline) || ctx.Err() != nil {
				b.log.Warn("records handed back to the dead-letter queue are not all ready again; the next read may miss some",
					"queue", name, "ready", seen, "want", n, "waited", returnsWait)
				return nil
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	return seen
}

// ready returns the number of ready records of the dead-letter queue
// name, or -1 when it cannot tell.
func (b *Backend) ready(ctx context.Context, name string) int {
	n := -1
	_ = b.withChannel(ctx, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		if err == nil {
			n = q.Messages
		}
		return err
	})
	return n
}

// scanIdle is how often a scan that waits for its next record asks the
// broker whether any is still ready. Under lockDead every record counted
// ready at a scan's start comes to it (the records in flight to it count
// as unacknowledged, not ready), except one a NextDead caller of an older
// version takes meanwhile. So a scan ends short only after scanQuiet
// without a record while none is ready: a pause of the broker or of this
// process does not end it (a 500 ms pause did, and cut listings short
// under load: TestDeadUpgrade listed records zero or two times).
const scanIdle = 500 * time.Millisecond

// scanQuiet is how long a scan that has fewer records than it counted
// waits for more while the broker counts none ready; scanPatience, while
// it counts some.
const (
	scanQuiet    = returnsWait
	scanPatience = 30 * time.Second
)

// scanDead reads up to want records from the head of the dead-letter queue
// on ch, in order, calling fn for each until it returns false, and returns
// how many it read. It streams them with a consumer whose prefetch is the
// number wanted (up to AMQP's 65535, then basic.get one by one), and acks
// nothing itself: when the caller closes ch, every record not acked goes
// back (to the tail of the queue: callers sort by deadSeq). It returns the
// tag of its consumer, "" when it started none. Callers hold lockDead.
func scanDead(ctx context.Context, ch *amqp.Channel, name string, want int, fn func(amqp.Delivery) bool) (read int, tag string, err error) {
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return 0, "", fmt.Errorf("rabbit: inspect %q: %w", name, err)
	}
	n := min(want, q.Messages)
	if n == 0 {
		return 0, "", nil
	}
	window := min(n, 65535)
	if err := ch.Qos(window, 0, false); err != nil {
		return 0, "", fmt.Errorf("rabbit: set prefetch %d: %w", window, err)
	}
	tag = fmt.Sprintf("asyncplatform-dead-%d-%d", os.Getpid(), consumerSeq.Add(1))
	dl, err := ch.Consume(name, tag, false, false, false, false, nil)
	if err != nil {
		return 0, "", fmt.Errorf("rabbit: consume %q: %w", name, err)
	}
	read, err = readScan(ctx, ch, name, dl, window, n, fn)
	return read, tag, err
}

// readScan is the reading of scanDead: window records from the consumer's
// deliveries dl, then basic.get up to n.
func readScan(ctx context.Context, ch *amqp.Channel, name string, dl <-chan amqp.Delivery, window, n int, fn func(amqp.Delivery) bool) (int, error) {
	idle := time.NewTimer(scanIdle)
	defer idle.Stop()
	seen := 0
	last := time.Now()
	for seen < window {
		select {
		case d, ok := <-dl:
			if !ok {
				return seen, fmt.Errorf("rabbit: reading %q: channel closed", name)
			}
			seen++
			if !fn(d) {
				return seen, nil
			}
			last = time.Now()
			idle.Reset(scanIdle)
		case <-idle.C:
			q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
			if err != nil {
				return seen, fmt.Errorf("rabbit: inspect %q: %w", name, err)
			}
			if q.Messages == 0 && time.Since(last) >= scanQuiet {
				return seen, nil // fewer records than counted: others hold them
			}
			if q.Messages > 0 && time.Since(last) > scanPatience {
				return seen, fmt.Errorf("rabbit: reading %q: %d records ready, none delivered for %v", name, q.Messages, scanPatience)
			}
			idle.Reset(scanIdle)
		case <-ctx.Done():
			return seen, ctx.Err()
		}
	}
	for ; seen < n; seen++ {
		if err := ctx.Err(); err != nil {
			return seen, err
		}
		d, ok, err := ch.Get(name, false)
		if err != nil {
			return seen, fmt.Errorf("rabbit: get from %q: %w", name, err)
		}
		if !ok {
			return seen, nil
		}
		if !fn(d) {
			return seen + 1, nil
		}
	}
	return seen, nil
}

// ListDead reads every ready record of the dead-letter queue on a side
// channel (see scanDead), holding lockDead, sorts them by deadSeq, keeps
// the page after the cursor, and closes the channel, which returns them
// all; it returns once they are ready again. The cursor is the number of
// records to skip, so a page costs the whole queue streamed.
func (b *Backend) ListDead(ctx context.Context, queue, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	if b.isClosed() {
		return nil, "", driver.ErrClosed
	}
	if limit < 1 {
		return nil, "", fmt.Errorf("rabbit: ListDead limit is %d, must be at least 1", limit)
	}
	if b.cfg.Store != nil {
		if cursor != "" && !validSeq(cursor) {
			return nil, "", fmt.Errorf("rabbit: ListDead cursor %q is not one this backend returned", cursor)
		}
		if err := b.ensureQueue(ctx, queue); err != nil {
			return nil, "", err
		}
		if err := b.toStore(ctx, queue); err != nil {
			return nil, "", err
		}
		return b.listStoreDead(ctx, queue, cursor, limit)
	}
	skip := 0
	if cursor != "" {
		n, err := strconv.Atoi(cursor)
		if err != nil || n < 0 {
			return nil, "", fmt.Errorf("rabbit: ListDead cursor %q is not one this backend returned", cursor)
		}
		skip = n
	}
	if err := b.ensureQueue(ctx, queue); err != nil {
		return nil, "", err
	}
	b.migrateDead(ctx, queue)
	unlock, err := b.lockDead(ctx, queue)
	if err != nil {
		return nil, "", err
	}
	defer unlock()
	var all []amqp.Delivery
	err = b.withChannel(ctx, func(ch *amqp.Channel) error {
		_, _, err := scanDead(ctx, ch, b.deadName(queue), math.MaxInt, func(d amqp.Delivery) bool {
			all = append(all, d)
			return true
		})
		return err
	})
	b.waitReady(ctx, b.deadName(queue), len(all))
	if err != nil {
		return nil, "", err
	}
	sort.SliceStable(all, func(i, j int) bool { return deadSeq(all[i]) < deadSeq(all[j]) })
	var recs []driver.DeadMessage
	for _, d := range all[min(skip, len(all)):min(skip+limit, len(all))] {
		recs = append(recs, driver.DeadMessage{ID: d.MessageId, Body: d.Body})
	}
	next := ""
	if len(all) > skip+limit {
		next = strconv.Itoa(skip + limit)
	}
	return recs, next, nil
}

// deleteRounds bounds the scans of a DeleteDead that finds more records
// ready after its acks than it left: each looks again for the records the
// one before acked.
const deleteRounds = 3

// DeleteDead removes the records whose ID is among ids, holding lockDead:
// it reads the whole dead-letter queue on a side channel (see deleteScan),
// acks those records, and closes the channel, which returns the others;
// once they are ready again, the queue must count exactly the records it
// returned. More means a record came in meanwhile or an ack was not
// applied, so it reads the queue again for the records it acked, acks any
// still there, and counts as removed only what it no longer finds. A record
// held by a NextDead caller is not seen, and stays.
func (b *Backend) DeleteDead(ctx context.Context, queue string, ids []string) (int, error) {
	if b.isClosed() {
		return 0, driver.ErrClosed
	}
	if len(ids) == 0 {
		return 0, nil
	}
	if err := b.ensureQueue(ctx, queue); err != nil {
		return 0, err
	}
	if b.cfg.Store != nil {
		if err := b.toStore(ctx, queue); err != nil {
			return 0, err
		}
		return b.deleteStoreDead(ctx, queue, ids)
	}
	b.migrateDead(ctx, queue)
	unlock, err := b.lockDead(ctx, queue)
	if err != nil {
		return 0, err
	}
	defer unlock()
	look := make(map[string]bool, len(ids))
	for _, id := range ids {
		look[id] = true
	}
	deleted, unsure := 0, 0 // unsure: acked by the last round, not known removed
	for round := 0; ; round++ {
		ack := round < deleteRounds
		left, found, err := b.deleteScan(ctx, queue, look, ack)
		if err != nil {
			return deleted, err
		}
		deleted += max(unsure-len(found), 0) // acked before, no longer there
		seen := b.waitReady(ctx, b.deadName(queue), left)
		if !ack || len(found) == 0 {
			return deleted, nil
		}
		if seen == left {
			return deleted + len(found), nil
		}
		unsure = len(found)
		look = make(map[string]bool, len(found))
		for _, d := range found {
			look[d.MessageId] = true
		}
	}
}

// deleteScan reads every ready record of the dead-letter queue on a side
// channel, acks the ones whose ID is in ids when ack is set, and closes the
// channel, which returns the others. It returns the records it found and
// how many it returned.
//
// A quorum queue's client in the broker queues the settles of a channel
// beyond a few dozen unapplied commands and sends them as earlier ones are
// applied; a channel closed meanwhile drops them and its records come back
// (TestDeleteDeadAcksApplied: 500 acks then a close left up to 466 records
// in place). So before it closes the channel, it cancels the consumer and
// takes one more record with basic.get, two calls the broker answers only
// once the queue has applied them, and so every settle sent before them.
func (b *Backend) deleteScan(ctx context.Context, queue string, ids map[string]bool, ack bool) (returned int, found []amqp.Delivery, err error) {
	name := b.deadName(queue)
	err = b.withChannel(ctx, func(ch *amqp.Channel) error {
		// Ack after the scan: an ack during it would open the consumer's
		// window to records past it, which basic.get then cannot see.
		read, tag, err := scanDead(ctx, ch, name, math.MaxInt, func(d amqp.Delivery) bool {
			if ids[d.MessageId] {
				found = append(found, d)
			}
			return true
		})
		returned = read
		if err != nil || !ack || len(found) == 0 {
			return err
		}
		for _, d := range found {
			if err := ch.Ack(d.DeliveryTag, false); err != nil {
				return fmt.Errorf("rabbit: ack dead letter %q: %w", d.MessageId, err)
			}
			returned--
		}
		if afterAcks != nil {
			afterAcks()
		}
		if !ackBarrier {
			return nil
		}
		if err := ch.Cancel(tag, false); err != nil {
			return fmt.Errorf("rabbit: cancel the scan of %q: %w", name, err)
		}
		_, got, err := ch.Get(name, false)
		if err != nil {
			return fmt.Errorf("rabbit: get from %q after the acks: %w", name, err)
		}
		if got {
			returned++ // back when the channel closes
		}
		return nil
	})
	if err != nil {
		b.waitReady(ctx, name, returned)
		return 0, nil, err
	}
	return returned, found, nil
}

// ackBarrier and afterAcks are for tests: without the barrier,
// deleteScan closes its channel right after its acks; afterAcks runs after
// them.
var (
	ackBarrier = true
	afterAcks  func()
)

// PurgeDead purges the dead-letter queue (queue.purge), holding lockDead:
// records held by a NextDead caller are left alone.
func (b *Backend) PurgeDead(ctx context.Context, queue string) (int, error) {
	if b.isClosed() {
		return 0, driver.ErrClosed
	}
	if err := b.ensureQueue(ctx, queue); err != nil {
		return 0, err
	}
	if b.cfg.Store != nil {
		if err := b.toStore(ctx, queue); err != nil {
			return 0, err
		}
		return b.purgeStoreDead(ctx, queue)
	}
	b.migrateDead(ctx, queue)
	unlock, err := b.lockDead(ctx, queue)
	if err != nil {
		return 0, err
	}
	defer unlock()
	n := 0
	err = b.withChannel(ctx, func(ch *amqp.Channel) error {
		var err error
		n, err = ch.QueuePurge(b.deadName(queue), false)
		if err != nil {
			return fmt.Errorf("rabbit: purge %q: %w", b.deadName(queue), err)
		}
		return nil
	})
	return n, err
}

// migrateDead moves the records of the queue's classic dead-letter queue of
// the older layout (p.q.dead) into its quorum dead-letter queue,
// once Declare has found that the old queue exists: each record is taken
// with basic.get, published to the new queue with the same message-id,
// confirmed, and only then acked, in order, so a crash in between leaves a
// duplicate, never a loss. A record held meanwhile by a NextDead caller of
// an older version is left alone and moved by a later call, as are records
// an older version dead-letters while it still runs. The old queue is left
// in place, empty: DeleteQueue removes it.
func (b *Backend) migrateDead(ctx context.Context, queue string) {
	b.mu.Lock()
	legacy := b.legacy[queue]
	b.mu.Unlock()
	if !legacy {
		return
	}
	b.migMu.Lock()
	defer b.migMu.Unlock()
	n, err := b.moveLegacy(ctx, queue)
	if n > 0 {
		b.log.Info("moved dead letters from the classic dead-letter queue to the quorum one", "queue", queue,
			"from", b.legacyDeadName(queue), "to", b.deadName(queue), "records", n)
	}
	if err != nil {
		b.log.Warn("moving dead letters from the classic dead-letter queue failed; the next call tries again", "queue", queue,
			"from", b.legacyDeadName(queue), "moved", n, "err", err)
	}
}

// moveLegacy does the moving of migrateDead and returns how many records it
// moved.
func (b *Backend) moveLegacy(ctx context.Context, queue string) (int, error) {
	n := 0
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get(b.legacyDeadName(queue), false)
			if err != nil {
				var aerr *amqp.Error
				if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
					b.mu.Lock()
					delete(b.legacy, queue) // deleted meanwhile
					b.mu.Unlock()
					return nil
				}
				return fmt.Errorf("rabbit: get from %q: %w", b.legacyDeadName(queue), err)
			}
			if !ok {
				return nil
			}
			pub := copyOf(d)
			// The old records' order: their second-resolution timestamps,
			// and within a second the order they are moved in.
			pub.Headers = amqp.Table{deadSeqHeader: d.Timestamp.UnixNano() + int64(n)}
			if err := b.publish(ctx, outMsg{key: b.deadName(queue), pub: pub}); err != nil {
				return err // closing ch puts the record back in place
			}
			if err := ch.Ack(d.DeliveryTag, false); err != nil {
				return fmt.Errorf("rabbit: ack %q in %q after its move: %w", d.MessageId, b.legacyDeadName(queue), err)
			}
			n++
		}
	})
	return n, err
}

// findLegacyDead records whether the queue has a classic dead-letter queue
// of the older layout (p.q.dead), which migrateDead then empties.
func (b *Backend) findLegacyDead(ctx context.Context, queue string) error {
	found := false
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(b.legacyDeadName(queue), true, false, false, false, nil)
		var aerr *amqp.Error
		switch {
		case err == nil:
			found = true
		case errors.As(err, &aerr) && aerr.Code == amqp.NotFound:
		default:
			return fmt.Errorf("rabbit: inspect %q: %w", b.legacyDeadName(queue), err)
		}
		return nil
	})
	if err != nil || !found {
		return err
	}
	b.mu.Lock()
	b.legacy[queue] = true
	b.mu.Unlock()
	return nil
}
