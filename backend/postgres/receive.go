package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/asyncplatform/asyncplatform/driver"
)

// handle is a delivery's receipt: the row and the token its claim wrote.
type handle struct{ id, token int64 }

// dueTime is a NotBefore as a timestamptz holds it: the first whole
// microsecond not before t (rounded up, so that a message is never due in
// the microsecond before its NotBefore); the zero time stays zero.
func dueTime(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	u := t.Truncate(time.Microsecond)
	if u.Before(t) {
		u = u.Add(time.Microsecond)
	}
	return u
}

// Enqueue implements driver.Backend: one INSERT of every message. Within a
// transaction given by WithTx or WithSQLTx it writes with that transaction,
// and notifies the queue's waiting receivers in the same statement, so
// they are woken when it commits. Outside one, the INSERT commits on its
// own and the wake-ups follow in a statement of their own (notifier).
func (b *Backend) Enqueue(ctx context.Context, queue string, msgs []driver.Message) error {
	if err := b.check(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	bodies := make([][]byte, len(msgs))
	due := make([]time.Time, len(msgs))
	for i, m := range msgs {
		if len(m.Body) > b.cfg.MaxBody {
			return fmt.Errorf("postgres: enqueue %s: a body of %d bytes: %w (at most %d)", queue, len(m.Body), driver.ErrTooLarge, b.cfg.MaxBody)
		}
		bodies[i], due[i] = nonNil(m.Body), dueTime(m.NotBefore)
	}
	if inOutbox(ctx) {
		return b.enqueueOutbox(ctx, queue, msgs)
	}
	if tx := txOf(ctx); tx != nil {
		if _, err := tx.Exec(ctx, b.q.enqueue, queue, bodies, due, b.channel); err != nil {
			return b.wrap("enqueue "+queue, err)
		}
		return nil
	}
	var n int
	if err := b.pool.QueryRow(ctx, b.q.enqueueQuiet, queue, bodies, due).Scan(&n); err != nil {
		return b.wrap("enqueue "+queue, err)
	}
	if n > 0 {
		b.notifyLater(queue, n)
	}
	return nil
}

// Receive implements driver.Backend. It claims with one UPDATE of rows
// picked FOR UPDATE SKIP LOCKED; with nothing to claim it waits for a
// notification, the next due time of the queue (a NotBefore or a lease's
// end), or Config.IdleWait, whichever comes first.
func (b *Backend) Receive(ctx context.Context, queue string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if _, ok := b.seen.Load(queue); !ok {
		if err := b.Declare(ctx, queue); err != nil {
			return nil, err
		}
		b.seen.Store(queue, struct{}{})
	}
	max = min(max, maxClaim)
	for {
		ds, err := b.receiveOnce(ctx, queue, max, lease)
		if err != nil || len(ds) > 0 {
			return ds, err
		}
	}
}

// receiveOnce claims, or else waits once: for a wake-up, the queue's
// next due time or IdleWait. It is registered as a waiter before it
// claims, so a notification sent meanwhile is not missed.
func (b *Backend) receiveOnce(ctx context.Context, queue string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	woken, done := b.wake.wait(queue)
	ds, err := b.claim(ctx, queue, max, lease)
	if err != nil || len(ds) > 0 {
		done(false)
		return ds, err
	}
	wait := b.cfg.IdleWait
	if next, err := b.nextDue(ctx, queue); err != nil {
		done(false)
		return nil, err
	} else if next >= 0 && next < wait {
		wait = next
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-woken:
		done(true)
		return nil, nil
	case <-t.C:
		done(false)
		return nil, nil
	case <-ctx.Done():
		done(false)
		return nil, ctx.Err()
	case <-b.ctx.Done():
		done(false)
		return nil, driver.ErrClosed
	}
}

// claim takes up to max jobs. Its statement runs to its end even when ctx
// ends meanwhile (a cancelled statement may have committed unseen), and
// jobs claimed for a ctx that ended are put back uncounted.
func (b *Backend) claim(ctx context.Context, queue string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultQueryWait)
	defer cancel()
	rows, err := b.pool.Query(qctx, b.q.claim, queue, max, lease.Microseconds(), b.cfg.MaxBody+1)
	if err != nil {
		return nil, b.wrap("receive "+queue, err)
	}
	var ds []*driver.Delivery
	var h handle
	var body []byte
	var n int
	_, err = pgx.ForEachRow(rows, []any{&h.id, &h.token, &body, &n}, func() error {
		ds = append(ds, &driver.Delivery{Queue: queue, Body: body, Deliveries: n, Handle: h})
		body = nil
		return nil
	})
	if err != nil {
		return nil, b.wrap("receive "+queue, err)
	}
	if ctx.Err() != nil && len(ds) > 0 {
		ids, tokens := make([]int64, len(ds)), make([]int64, len(ds))
		for i, d := range ds {
			h := d.Handle.(handle)
			ids[i], tokens[i] = h.id, h.token
		}
		if _, err := b.pool.Exec(qctx, b.q.unclaim, ids, tokens, b.channel); err != nil {
			return nil, errors.Join(ctx.Err(), b.wrap("putting back "+queue, err))
		}
		return nil, ctx.Err()
	}
	return ds, nil
}

// nextDue returns how long until the queue's next job falls due, or -1
// when it has none waiting.
func (b *Backend) nextDue(ctx context.Context, queue string) (time.Duration, error) {
	var secs *float64
	if err := b.pool.QueryRow(ctx, b.q.nextDue, queue).Scan(&secs); err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, b.wrap("receive "+queue, err)
	}
	if secs == nil {
		return -1, nil
	}
	return max(time.Duration(*secs*float64(time.Second)), time.Millisecond), nil
}

// settle runs one statement on a delivery's row; none changed means the
// lease was lost.
func (b *Backend) settle(ctx context.Context, op string, d *driver.Delivery, stmt string, args ...any) error {
	if err := b.check(); err != nil {
		return err
	}
	h, ok := d.Handle.(handle)
	if !ok {
		return errLost(op)
	}
	tag, err := b.db(ctx).Exec(ctx, stmt, append([]any{h.id, h.token}, args...)...)
	if err != nil {
		return b.wrap(op, err)
	}
	var done bool
	if stmt == b.q.extend {
		_, done = b.completed.Load(h)
	} else {
		_, done = b.completed.LoadAndDelete(h)
	}
	if tag.RowsAffected() == 0 && !(done && (stmt == b.q.ack || stmt == b.q.extend)) {
		return errLost(op)
	}
	return nil
}

// Ack implements driver.Backend. Within a transaction given by WithTx it
// deletes the row in that transaction; outside one, the acker commits it
// together with the Acks of concurrent callers, in one statement, and Ack
// returns once that statement committed.
func (b *Backend) Ack(ctx context.Context, d *driver.Delivery) error {
	if txOf(ctx) != nil {
		return b.settle(ctx, "ack", d, b.q.ack)
	}
	if err := b.check(); err != nil {
		return err
	}
	h, ok := d.Handle.(handle)
	if !ok {
		return errLost("ack")
	}
	gone, err := b.acks.ack(ctx, h)
	if err != nil {
		return b.wrap("ack", err)
	}
	if _, done := b.completed.LoadAndDelete(h); gone && !done {
		return errLost("ack")
	}
	return nil
}

// Extend implements driver.Backend.
func (b *Backend) Extend(ctx context.Context, d *driver.Delivery, lease time.Duration) error {
	return b.settle(ctx, "extend", d, b.q.extend, lease.Microseconds())
}

// Requeue implements driver.Backend: the row takes the new body in place,
// its count back at zero.
func (b *Backend) Requeue(ctx context.Context, d *driver.Delivery, msg driver.Message) error {
	if len(msg.Body) > b.cfg.MaxBody {
		return fmt.Errorf("postgres: requeue: a body of %d bytes: %w (at most %d)", len(msg.Body), driver.ErrTooLarge, b.cfg.MaxBody)
	}
	return b.settle(ctx, "requeue", d, b.q.requeue, nonNil(msg.Body), dueTime(msg.NotBefore), b.channel)
}

// DeadLetter implements driver.Backend: the row moves to the dead table
// in one statement. A record over maxDeadID or maxDeadBody is refused.
func (b *Backend) DeadLetter(ctx context.Context, d *driver.Delivery, rec driver.DeadMessage) error {
	if len(rec.ID) > maxDeadID || len(rec.Body) > b.maxDeadBody() {
		return fmt.Errorf("postgres: dead-letter: a record of %d bytes with an ID of %d: %w (at most %d and %d)", len(rec.Body), len(rec.ID), driver.ErrTooLarge, b.maxDeadBody(), maxDeadID)
	}
	return b.settle(ctx, "dead-letter", d, b.q.deadLetter, []byte(rec.ID), nonNil(rec.Body))
}

// maxDeadBody bounds a dead-letter record: the job (at most MaxBody) with
// what the platform adds around it, within bytea's limit.
func (b *Backend) maxDeadBody() int { return min(b.cfg.MaxBody+1<<20, 1<<30-1) }

// nonNil keeps an empty body from being written as NULL.
func nonNil(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}
