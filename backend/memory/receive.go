package memory

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Receive implements driver.Backend.
func (b *Backend) Receive(ctx context.Context, name string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	if max <= 0 {
		return nil, fmt.Errorf("memory: Receive max is %d, it must be positive", max)
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := b.lock(); err != nil {
			return nil, err
		}
		q := b.broker.queue(name)
		now := time.Now()
		b.broker.tidy(q, now)
		if n := min(max, q.ready.len()); n > 0 {
			out := make([]*driver.Delivery, n)
			for i := range out {
				out[i] = b.claim(q, name, q.ready.pop(), now, lease)
			}
			if q.ready.len() > 0 {
				q.signal() // leave the rest to other receivers
			}
			b.broker.mu.Unlock()
			return out, nil
		}
		next := q.nextDue()
		q.waiting = true
		wake := q.wake
		b.broker.mu.Unlock()

		var due <-chan time.Time
		if !next.IsZero() {
			if timer == nil {
				timer = time.NewTimer(time.Until(next))
			} else {
				timer.Reset(time.Until(next))
			}
			due = timer.C
		}
		select {
		case <-wake:
		case <-due:
		case <-b.done:
			return nil, driver.ErrClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// claim leases m to b. The broker lock is held.
func (b *Backend) claim(q *queue, name string, m *message, now time.Time, lease time.Duration) *driver.Delivery {
	b.broker.token++
	m.token = b.broker.token
	m.deliveries++
	m.leaseUntil = now.Add(lease)
	m.owner = b
	q.inflight[m] = struct{}{}
	q.compactLeases()
	q.leases.push(leaseEntry{m: m, token: m.token, until: m.leaseUntil})
	dl := &delivery{m: m, token: m.token, owner: b}
	dl.d = driver.Delivery{Queue: name, Body: m.body, Deliveries: m.deliveries, Handle: dl}
	return &dl.d
}

// tidy promotes due scheduled messages and returns expired leases. The broker
// lock is held.
func (br *Broker) tidy(q *queue, now time.Time) {
	for q.scheduled.Len() > 0 && !q.scheduled[0].notBefore.After(now) {
		m := heap.Pop(&q.scheduled).(*message)
		m.readyAt = m.notBefore
		q.ready.push(m)
	}
	for q.leases.Len() > 0 && !q.leases[0].until.After(now) {
		e := q.leases.pop()
		if e.m.token == e.token && e.m.leaseUntil.Equal(e.until) {
			br.release(q, e.m)
		}
	}
}

// release returns a held message to ready, its delivery already counted:
// ready since its lease ran out, or now when it is given back early.
func (br *Broker) release(q *queue, m *message) {
	delete(q.inflight, m)
	m.token, m.owner = 0, nil
	m.readyAt = time.Now()
	if m.leaseUntil.Before(m.readyAt) {
		m.readyAt = m.leaseUntil
	}
	q.ready.push(m)
	q.signal()
}

// nextDue is the earliest time something may become ready.
func (q *queue) nextDue() time.Time {
	var t time.Time
	if q.scheduled.Len() > 0 {
		t = q.scheduled[0].notBefore
	}
	if q.leases.Len() > 0 && (t.IsZero() || q.leases[0].until.Before(t)) {
		t = q.leases[0].until
	}
	return t
}

// held checks that d still holds its message and returns its queue. On
// success the broker lock is held.
func (b *Backend) held(d *driver.Delivery) (*queue, *delivery, error) {
	dl, ok := d.Handle.(*delivery)
	if !ok || dl.owner != b {
		return nil, nil, fmt.Errorf("memory: delivery was not handed out by this backend")
	}
	if err := b.lock(); err != nil {
		return nil, nil, err
	}
	q := b.broker.queues[d.Queue]
	if q == nil || dl.m.token != dl.token || !time.Now().Before(dl.m.leaseUntil) {
		if q != nil && dl.m.token == dl.token {
			b.broker.release(q, dl.m) // expired: return it now
		}
		b.broker.mu.Unlock()
		return nil, nil, driver.ErrLeaseLost
	}
	return q, dl, nil
}

// settle ends d's lease and forgets its message. The broker lock is held.
func settle(q *queue, dl *delivery) {
	delete(q.inflight, dl.m)
	dl.m.token, dl.m.owner = 0, nil
}

// Ack implements driver.Backend.
func (b *Backend) Ack(ctx context.Context, d *driver.Delivery) error {
	q, dl, err := b.held(d)
	if err != nil {
		return err
	}
	defer b.broker.mu.Unlock()
	settle(q, dl)
	return nil
}

// Extend implements driver.Backend.
func (b *Backend) Extend(ctx context.Context, d *driver.Delivery, lease time.Duration) error {
	q, dl, err := b.held(d)
	if err != nil {
		return err
	}
	defer b.broker.mu.Unlock()
	dl.m.leaseUntil = time.Now().Add(lease)
	q.leases.push(leaseEntry{m: dl.m, token: dl.token, until: dl.m.leaseUntil})
	return nil
}

// Requeue implements driver.Backend.
func (b *Backend) Requeue(ctx context.Context, d *driver.Delivery, msg driver.Message) error {
	q, dl, err := b.held(d)
	if err != nil {
		return err
	}
	defer b.broker.mu.Unlock()
	settle(q, dl)
	b.broker.put(q, &message{id: msg.ID, body: msg.Body, notBefore: msg.NotBefore}, time.Now())
	return nil
}

// DeadLetter implements driver.Backend.
func (b *Backend) DeadLetter(ctx context.Context, d *driver.Delivery, rec driver.DeadMessage) error {
	q, dl, err := b.held(d)
	if err != nil {
		return err
	}
	defer b.broker.mu.Unlock()
	settle(q, dl)
	q.dead = append(q.dead, &deadRecord{DeadMessage: rec})
	return nil
}
