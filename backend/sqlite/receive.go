package sqlite

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// handle is a delivery's receipt: the row and the token its claim wrote.
type handle struct{ id, token int64 }

// newToken returns a random positive token: a receipt a writer to the file
// cannot guess ahead of the claim.
func newToken() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return int64(binary.BigEndian.Uint64(b[:])>>1) | 1
}

// millis is d in whole milliseconds, rounded up.
func millis(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// notBefore is t in milliseconds since the epoch, rounded up (never
// earlier than t), or 0 for the zero time.
func notBefore(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	ns := t.UnixNano()
	return (ns + int64(time.Millisecond) - 1) / int64(time.Millisecond)
}

// Enqueue implements driver.Backend: one INSERT per message, in one
// transaction (the caller's, within WithTx), which wakes the process's
// waiting receivers when it commits.
func (b *Backend) Enqueue(ctx context.Context, queue string, msgs []driver.Message) error {
	if err := b.check(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	for _, m := range msgs {
		if len(m.Body) > b.cfg.MaxBody {
			return fmt.Errorf("sqlite: enqueue %s: a body of %d bytes: %w (at most %d)", queue, len(m.Body), driver.ErrTooLarge, b.cfg.MaxBody)
		}
	}
	if inOutbox(ctx) {
		return b.enqueueOutbox(ctx, queue, msgs)
	}
	err := b.write(ctx, func(c conn) error {
		st, err := c.PrepareContext(ctx, b.q.enqueue)
		if err != nil {
			return err
		}
		defer st.Close()
		for _, m := range msgs {
			if _, err := st.ExecContext(ctx, queue, nonNil(m.Body), notBefore(m.NotBefore)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return b.wrap("enqueue "+queue, err)
	}
	if txOf(ctx) == nil {
		b.hub.wake(b.waitKey(queue), len(msgs))
	}
	return nil
}

// waitKey names the idle Receives of the queue in the hub: the Backends of
// one process on one file share it, and those of another prefix have
// other tables, so a wake-up of this one's jobs must not go to theirs.
func (b *Backend) waitKey(queue string) string { return b.cfg.Prefix + "/" + queue }

// Receive implements driver.Backend. It claims in one write transaction;
// with nothing to claim it waits for a wake-up, the queue's next due time
// (a NotBefore or a lease's end), or Config.IdleWait, whichever comes
// first.
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

// receiveOnce claims, or else waits once. It is registered as a waiter
// before it claims, so a wake-up sent meanwhile is not missed.
func (b *Backend) receiveOnce(ctx context.Context, queue string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	woken, done := b.hub.wait(b.waitKey(queue))
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

// claim takes up to max jobs: a read looks for a due job first (reads
// never wait for the writer), then one write transaction picks the due
// rows in (run_at, id) order and claims them. The transaction runs to its
// end even when ctx ends meanwhile, and jobs claimed for a ctx that ended
// are put back uncounted, where they were.
func (b *Backend) claim(ctx context.Context, queue string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var one int
	switch err := b.pool().QueryRowContext(ctx, b.q.ready, queue).Scan(&one); {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, b.wrap("receive "+queue, err)
	}
	wctx := context.WithoutCancel(ctx)
	token := newToken()
	type picked struct {
		id, due int64
	}
	var order []picked
	byID := map[int64]*driver.Delivery{}
	err := b.write(wctx, func(c conn) error {
		order, byID = order[:0], map[int64]*driver.Delivery{}
		rows, err := c.QueryContext(wctx, b.q.pick, queue, max)
		if err != nil {
			return err
		}
		var ids []string
		for rows.Next() {
			var p picked
			if err := rows.Scan(&p.id, &p.due); err != nil {
				rows.Close()
				return err
			}
			order = append(order, p)
			ids = append(ids, strconv.FormatInt(p.id, 10))
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		rows, err = c.QueryContext(wctx, b.q.claim, token, millis(lease), "["+strings.Join(ids, ",")+"]", b.cfg.MaxBody+1)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id int64
			d := &driver.Delivery{Queue: queue}
			if err := rows.Scan(&id, &d.Deliveries, &d.Body); err != nil {
				return err
			}
			d.Handle = handle{id: id, token: token}
			byID[id] = d
		}
		return rows.Err()
	})
	if err != nil {
		return nil, b.wrap("receive "+queue, err)
	}
	ds := make([]*driver.Delivery, 0, len(byID))
	for _, p := range order {
		if d := byID[p.id]; d != nil {
			if d.Body == nil {
				d.Body = []byte{}
			}
			ds = append(ds, d)
		}
	}
	if ctx.Err() != nil && len(ds) > 0 {
		err := b.write(wctx, func(c conn) error {
			for _, p := range order {
				if _, err := c.ExecContext(wctx, b.q.unclaim, p.due, p.id, token); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, errors.Join(ctx.Err(), b.wrap("putting back "+queue, err))
		}
		b.hub.wake(b.waitKey(queue), len(ds))
		return nil, ctx.Err()
	}
	return ds, nil
}

// nextDue returns how long until the queue's next job falls due, or -1
// when it has none waiting.
func (b *Backend) nextDue(ctx context.Context, queue string) (time.Duration, error) {
	var ms sql.NullInt64
	if err := b.pool().QueryRowContext(ctx, b.q.nextDue, queue).Scan(&ms); err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, b.wrap("receive "+queue, err)
	}
	if !ms.Valid {
		return -1, nil
	}
	return max(time.Duration(ms.Int64)*time.Millisecond, time.Millisecond), nil
}

// settle runs one statement on a delivery's row (id and token last among
// its arguments); none changed means the lease was lost.
func (b *Backend) settle(ctx context.Context, op string, d *driver.Delivery, stmt string, args ...any) error {
	if err := b.check(); err != nil {
		return err
	}
	h, ok := d.Handle.(handle)
	if !ok {
		return errLost(op)
	}
	var n int64
	err := b.write(ctx, func(c conn) error {
		res, err := c.ExecContext(ctx, stmt, append(args, h.id, h.token)...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return b.wrap(op, err)
	}
	var done bool
	if stmt == b.q.extend {
		_, done = b.completed.Load(h)
	} else {
		_, done = b.completed.LoadAndDelete(h)
	}
	if n == 0 && !done {
		return errLost(op)
	}
	return nil
}

// Ack implements driver.Backend.
func (b *Backend) Ack(ctx context.Context, d *driver.Delivery) error {
	return b.settle(ctx, "ack", d, b.q.ack)
}

// Extend implements driver.Backend.
func (b *Backend) Extend(ctx context.Context, d *driver.Delivery, lease time.Duration) error {
	return b.settle(ctx, "extend", d, b.q.extend, millis(lease))
}

// Requeue implements driver.Backend: the row takes the new body in place,
// its count back at zero.
func (b *Backend) Requeue(ctx context.Context, d *driver.Delivery, msg driver.Message) error {
	if err := b.check(); err != nil {
		return err
	}
	if len(msg.Body) > b.cfg.MaxBody {
		return fmt.Errorf("sqlite: requeue: a body of %d bytes: %w (at most %d)", len(msg.Body), driver.ErrTooLarge, b.cfg.MaxBody)
	}
	h, ok := d.Handle.(handle)
	if !ok {
		return errLost("requeue")
	}
	b.completed.Delete(h) // a completion rolled back: the row is there to requeue
	var dueNow bool
	err := b.write(ctx, func(c conn) error {
		return c.QueryRowContext(ctx, b.q.requeue, nonNil(msg.Body), notBefore(msg.NotBefore), h.id, h.token).Scan(&dueNow)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return errLost("requeue")
	}
	if err != nil {
		return b.wrap("requeue", err)
	}
	if dueNow {
		b.hub.wake(b.waitKey(d.Queue), 1)
	}
	return nil
}

// DeadLetter implements driver.Backend: the row moves to the dead table
// in one transaction. A record over maxDeadID or maxDeadBody is refused.
func (b *Backend) DeadLetter(ctx context.Context, d *driver.Delivery, rec driver.DeadMessage) error {
	if err := b.check(); err != nil {
		return err
	}
	if len(rec.ID) > maxDeadID || len(rec.Body) > b.maxDeadBody() {
		return fmt.Errorf("sqlite: dead-letter: a record of %d bytes with an ID of %d: %w (at most %d and %d)", len(rec.Body), len(rec.ID), driver.ErrTooLarge, b.maxDeadBody(), maxDeadID)
	}
	h, ok := d.Handle.(handle)
	if !ok {
		return errLost("dead-letter")
	}
	b.completed.Delete(h)
	err := b.write(ctx, func(c conn) error {
		var queue string
		if err := c.QueryRowContext(ctx, b.q.takeJob, h.id, h.token).Scan(&queue); err != nil {
			return err
		}
		_, err := c.ExecContext(ctx, b.q.insertDead, queue, []byte(rec.ID), nonNil(rec.Body))
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return errLost("dead-letter")
	}
	if err != nil {
		return b.wrap("dead-letter", err)
	}
	return nil
}

// maxDeadBody bounds a dead-letter record: the job (at most MaxBody) with
// what the platform adds around it.
func (b *Backend) maxDeadBody() int { return b.cfg.MaxBody + 1<<20 }

// nonNil keeps an empty body from being written as NULL.
func nonNil(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}
