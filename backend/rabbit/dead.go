package rabbit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// deadReceipt is the Handle of a DeadDelivery: the basic.get delivery tag on
// a channel opened for this one holder.
type deadReceipt struct {
	ch      *amqp.Channel
	tag     uint64
	settled atomic.Bool
}

// NextDead takes the head of the dead-letter queue with basic.get (no
// auto-ack) on a channel of its own: the broker hides it from every other
// caller until SettleDead, or until the channel or connection closes, which
// puts it back where it was.
func (b *Backend) NextDead(ctx context.Context, queue string) (*driver.DeadDelivery, error) {
	if b.isClosed() {
		return nil, driver.ErrClosed
	}
	if err := b.ensureQueue(ctx, queue); err != nil {
		return nil, err
	}
	conn, err := b.connection(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbit: open channel: %w", err)
	}
	d, ok, err := ch.Get(b.deadName(queue), false)
	if err != nil {
		ch.Close()
		return nil, fmt.Errorf("rabbit: get from %q: %w", b.deadName(queue), err)
	}
	if !ok {
		ch.Close()
		return nil, driver.ErrNoDeadLetters
	}
	return &driver.DeadDelivery{
		DeadMessage: driver.DeadMessage{ID: d.MessageId, Body: d.Body},
		Handle:      &deadReceipt{ch: ch, tag: d.DeliveryTag},
	}, nil
}

// SettleDead acks the held record (remove) or nacks it with requeue, which
// on a classic queue puts it back at the head; then it closes the holder's
// channel.
func (b *Backend) SettleDead(ctx context.Context, d *driver.DeadDelivery, remove bool) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	if d == nil {
		return errors.New("rabbit: nil dead delivery")
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
	var err error
	if remove {
		err = r.ch.Ack(r.tag, false)
	} else {
		err = r.ch.Nack(r.tag, false, true)
	}
	if err != nil {
		return fmt.Errorf("rabbit: settle dead letter %q: %w: %w", d.ID, driver.ErrLeaseLost, err)
	}
	return nil
}

// scanIdle bounds the wait for the next record of a scan: records counted
// at its start may since have been taken by a NextDead caller.
const scanIdle = 500 * time.Millisecond

// scanDead reads up to want records from the head of the dead-letter queue
// on ch, in order, calling fn for each until it returns false. It streams
// them with a consumer whose prefetch is the number wanted (up to AMQP's
// 65535, then basic.get one by one), and acks nothing itself: when the
// caller closes ch, every record not acked goes back to its place (a
// classic queue requeues in place).
func scanDead(ctx context.Context, ch *amqp.Channel, name string, want int, fn func(amqp.Delivery) bool) error {
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("rabbit: inspect %q: %w", name, err)
	}
	n := min(want, q.Messages)
	if n == 0 {
		return nil
	}
	window := min(n, 65535)
	if err := ch.Qos(window, 0, false); err != nil {
		return fmt.Errorf("rabbit: set prefetch %d: %w", window, err)
	}
	dl, err := ch.Consume(name, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("rabbit: consume %q: %w", name, err)
	}
	idle := time.NewTimer(scanIdle)
	defer idle.Stop()
	seen := 0
	for seen < window {
		select {
		case d, ok := <-dl:
			if !ok {
				return fmt.Errorf("rabbit: reading %q: channel closed", name)
			}
			seen++
			if !fn(d) {
				return nil
			}
			idle.Reset(scanIdle)
		case <-idle.C:
			return nil // fewer records than counted: others hold them
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for ; seen < n; seen++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, ok, err := ch.Get(name, false)
		if err != nil {
			return fmt.Errorf("rabbit: get from %q: %w", name, err)
		}
		if !ok || !fn(d) {
			return nil
		}
	}
	return nil
}

// ListDead reads skip+limit+1 records from the head of the dead-letter
// queue on a side channel (see scanDead) and closes the channel, which
// returns every record to its place. The cursor is the number of records to
// skip, so a page costs skip+limit records streamed.
func (b *Backend) ListDead(ctx context.Context, queue, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	if b.isClosed() {
		return nil, "", driver.ErrClosed
	}
	if limit < 1 {
		return nil, "", fmt.Errorf("rabbit: ListDead limit is %d, must be at least 1", limit)
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
	var recs []driver.DeadMessage
	next := ""
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		i := 0
		return scanDead(ctx, ch, b.deadName(queue), skip+limit+1, func(d amqp.Delivery) bool {
			switch {
			case i == skip+limit:
				next = strconv.Itoa(skip + limit)
				return false
			case i >= skip:
				recs = append(recs, driver.DeadMessage{ID: d.MessageId, Body: d.Body})
			}
			i++
			return true
		})
	})
	if err != nil {
		return nil, "", err
	}
	return recs, next, nil
}

// DeleteDead reads the whole dead-letter queue on a side channel (see
// scanDead), acks the records whose ID is among ids, and closes the channel,
// which returns the others to their place.
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
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	n := 0
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		// Ack after the scan: an ack during it would open the consumer's
		// window to records past it, which basic.get then cannot see.
		var tags []uint64
		err := scanDead(ctx, ch, b.deadName(queue), math.MaxInt, func(d amqp.Delivery) bool {
			if want[d.MessageId] {
				tags = append(tags, d.DeliveryTag)
			}
			return true
		})
		if err != nil {
			return err
		}
		for _, tag := range tags {
			if err := ch.Ack(tag, false); err != nil {
				return fmt.Errorf("rabbit: ack dead letter: %w", err)
			}
			n++
		}
		return nil
	})
	return n, err
}

// PurgeDead purges the dead-letter queue (queue.purge): records held by a
// NextDead caller are left alone.
func (b *Backend) PurgeDead(ctx context.Context, queue string) (int, error) {
	if b.isClosed() {
		return 0, driver.ErrClosed
	}
	if err := b.ensureQueue(ctx, queue); err != nil {
		return 0, err
	}
	n := 0
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		var err error
		n, err = ch.QueuePurge(b.deadName(queue), false)
		if err != nil {
			return fmt.Errorf("rabbit: purge %q: %w", b.deadName(queue), err)
		}
		return nil
	})
	return n, err
}
