package rabbit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

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
	if err := b.check(queue); err != nil {
		return nil, err
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

// ListDead reads the dead-letter queue with basic.get on a side channel and
// closes the channel, which returns every record to its place. The cursor is
// the number of records to skip, so a page costs skip+limit round trips.
func (b *Backend) ListDead(ctx context.Context, queue, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	if err := b.check(queue); err != nil {
		return nil, "", err
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
		for i := 0; i < skip+limit; i++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			d, ok, err := ch.Get(b.deadName(queue), false)
			if err != nil {
				return fmt.Errorf("rabbit: get from %q: %w", b.deadName(queue), err)
			}
			if !ok {
				return nil
			}
			if i >= skip {
				recs = append(recs, driver.DeadMessage{ID: d.MessageId, Body: d.Body})
			}
			if d.MessageCount == 0 {
				return nil
			}
		}
		next = strconv.Itoa(skip + limit)
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return recs, next, nil
}

// DeleteDead reads the whole dead-letter queue with basic.get on a side
// channel, acks the records whose ID is among ids, and closes the channel,
// which returns the others to their place.
func (b *Backend) DeleteDead(ctx context.Context, queue string, ids []string) (int, error) {
	if err := b.check(queue); err != nil {
		return 0, err
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
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			d, ok, err := ch.Get(b.deadName(queue), false)
			if err != nil {
				return fmt.Errorf("rabbit: get from %q: %w", b.deadName(queue), err)
			}
			if !ok {
				return nil
			}
			if want[d.MessageId] {
				if err := ch.Ack(d.DeliveryTag, false); err != nil {
					return fmt.Errorf("rabbit: ack dead letter %q: %w", d.MessageId, err)
				}
				n++
			}
			if d.MessageCount == 0 {
				return nil
			}
		}
	})
	return n, err
}

// PurgeDead purges the dead-letter queue (queue.purge): records held by a
// NextDead caller are left alone.
func (b *Backend) PurgeDead(ctx context.Context, queue string) (int, error) {
	if err := b.check(queue); err != nil {
		return 0, err
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
