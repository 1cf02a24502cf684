package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/outbox"
)

// maxOutboxID bounds a job's ID and Dedupe read back from the outbox, in
// bytes: a longer one marks the row bad.
const maxOutboxID = 4 << 10

var _ outbox.Source = (*Backend)(nil)

// OutboxTx returns a context under which the Backend's Enqueue writes the
// jobs to its outbox table, in tx, the caller's transaction, instead of
// to its queues; the platform's writes to the Backend's store for that
// Enqueue (unique keys, status records) go to tx as under WithTx. The
// jobs exist when tx commits and never when it rolls back, and an
// outbox.Relay then moves them, in commit order per queue, to another
// backend:
//
//	tx, err := b.DB().BeginTx(ctx, nil)
//	...
//	err = p.Enqueue(sqlite.OutboxTx(ctx, tx), job)
//	...
//	err = tx.Commit()
//
// The rules of WithTx hold for tx. The jobs keep their ID and Dedupe on
// the way to the target; their records stay in this Backend's store.
func OutboxTx(ctx context.Context, tx *sql.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, &txConn{tx: tx, outbox: true})
}

// inOutbox reports whether ctx is an OutboxTx's.
func inOutbox(ctx context.Context) bool {
	c := txOf(ctx)
	return c != nil && c.outbox
}

// enqueueOutbox writes msgs to the outbox in the caller's transaction, in
// their order.
func (b *Backend) enqueueOutbox(ctx context.Context, queue string, msgs []driver.Message) error {
	err := b.write(ctx, func(c conn) error {
		for _, m := range msgs {
			if _, err := c.ExecContext(ctx, b.ob().put, queue, m.ID, m.Dedupe, nonNil(m.Body), notBefore(m.NotBefore)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return b.wrap("enqueue "+queue+" to the outbox", err)
	}
	return nil
}

// outboxQueries are the outbox's statements.
type outboxQueries struct {
	put, queues, take, next, renew, del, aside, release string
}

func (b *Backend) ob() *outboxQueries {
	b.obOnce.Do(func() {
		r := strings.NewReplacer("{{p}}", b.cfg.Prefix, "NOW", now)
		q := r.Replace
		b.obq = outboxQueries{
			put: q(`INSERT INTO {{p}}_outbox (queue, id, dedupe, body, not_before) VALUES (?, ?, ?, ?, ?)`),
			// Bounded: at most outbox.MaxQueues names, each cut one byte past
			// driver.MaxQueueLen (as bytes). The names the relay can drain
			// come first: rows under a name too long to address stay in
			// the table, and as many such names must not hide the others.
			queues: q(`SELECT q FROM (
					SELECT q, 0 AS o FROM (SELECT DISTINCT queue AS q FROM {{p}}_outbox WHERE length(CAST(queue AS BLOB)) <= ` + strconv.Itoa(driver.MaxQueueLen) + ` LIMIT ` + strconv.Itoa(outbox.MaxQueues) + `)
					UNION ALL
					SELECT q, 1 FROM (SELECT DISTINCT CAST(substr(CAST(queue AS BLOB), 1, ` + strconv.Itoa(driver.MaxQueueLen+1) + `) AS TEXT) AS q FROM {{p}}_outbox WHERE length(CAST(queue AS BLOB)) > ` + strconv.Itoa(driver.MaxQueueLen) + ` LIMIT ` + strconv.Itoa(outbox.MaxQueues) + `)
				) ORDER BY o LIMIT ` + strconv.Itoa(outbox.MaxQueues)),
			take: q(`INSERT INTO {{p}}_outbox_lease (queue, owner, until) VALUES (?1, ?2, NOW + ?3)
				ON CONFLICT (queue) DO UPDATE SET owner = excluded.owner, until = excluded.until WHERE until <= NOW`),
			// Bounded: a body past ?3 bytes or an ID past ?4 is not read.
			next: q(`SELECT seq,
					length(CAST(id AS BLOB)) <= ?4 AND length(CAST(dedupe AS BLOB)) <= ?4, length(CAST(body AS BLOB)) <= ?3,
					CASE WHEN length(CAST(id AS BLOB)) <= ?4 AND length(CAST(dedupe AS BLOB)) <= ?4 THEN CAST(id AS BLOB) END,
					CASE WHEN length(CAST(id AS BLOB)) <= ?4 AND length(CAST(dedupe AS BLOB)) <= ?4 THEN CAST(dedupe AS BLOB) END,
					CASE WHEN length(CAST(body AS BLOB)) <= ?3 THEN CAST(body AS BLOB) END,
					length(CAST(body AS BLOB)), max(length(CAST(id AS BLOB)), length(CAST(dedupe AS BLOB))), not_before
				FROM {{p}}_outbox WHERE queue = ?1 ORDER BY seq LIMIT ?2`),
			renew: q(`UPDATE {{p}}_outbox_lease SET until = NOW + ?3 WHERE queue = ?1 AND owner = ?2 AND until > NOW`),
			del:   q(`DELETE FROM {{p}}_outbox WHERE queue = ?1 AND seq IN (SELECT value FROM json_each(?2))`),
			aside: q(`INSERT INTO {{p}}_outbox_aside (seq, queue, id, dedupe, body, not_before, reason, moved_at)
				SELECT seq, queue, id, dedupe, body, not_before, ?3, NOW FROM {{p}}_outbox WHERE queue = ?1 AND seq = ?2`),
			release: q(`DELETE FROM {{p}}_outbox_lease WHERE queue = ?1 AND owner = ?2`),
		}
	})
	return &b.obq
}

// OutboxQueues implements outbox.Source.
func (b *Backend) OutboxQueues(ctx context.Context) ([]string, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	rows, err := b.db.QueryContext(ctx, b.ob().queues)
	if err != nil {
		return nil, b.wrap("outbox queues", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var q string
		if err := rows.Scan(&q); err != nil {
			return nil, b.wrap("outbox queues", err)
		}
		out = append(out, q)
	}
	if err := rows.Err(); err != nil {
		return nil, b.wrap("outbox queues", err)
	}
	return out, nil
}

// TakeOutbox implements outbox.Source with a lease row per queue that
// ends ttl after it was taken or last renewed (every Delete and Aside
// renews it): a relay killed holding it holds up the queue for ttl.
func (b *Backend) TakeOutbox(ctx context.Context, queue string, ttl time.Duration) (outbox.Lease, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	l := &liteLease{b: b, queue: queue, owner: newToken(), ttl: millis(ttl)}
	var n int64
	err := b.write(ctx, func(c conn) error {
		res, err := c.ExecContext(ctx, b.ob().take, queue, l.owner, l.ttl)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return nil, b.wrap("outbox lease of "+queue, err)
	}
	if n == 0 {
		return nil, fmt.Errorf("sqlite: outbox of %s: %w", queue, outbox.ErrHeld)
	}
	return l, nil
}

// liteLease is a TakeOutbox lease: the lease row with owner.
type liteLease struct {
	b     *Backend
	queue string
	owner int64
	ttl   int64

	mu       sync.Mutex
	released bool
}

// Next implements outbox.Lease. A body past Config.MaxBody or an ID past
// 4 KiB is not read: the row comes back with an outbox.BadRowError.
func (l *liteLease) Next(ctx context.Context, max int) ([]outbox.Row, error) {
	rows, err := l.b.db.QueryContext(ctx, l.b.ob().next, l.queue, max, l.b.cfg.MaxBody, maxOutboxID)
	if err != nil {
		return nil, l.b.wrap("outbox of "+l.queue, err)
	}
	defer rows.Close()
	var out []outbox.Row
	for rows.Next() {
		var (
			r              outbox.Row
			id, dedupe     []byte
			body           []byte
			bodyLen, idLen int64
			due            int64
			idOK, bodyOK   bool
		)
		if err := rows.Scan(&r.Seq, &idOK, &bodyOK, &id, &dedupe, &body, &bodyLen, &idLen, &due); err != nil {
			return nil, l.b.wrap("outbox of "+l.queue, err)
		}
		switch {
		case !bodyOK:
			r.Err = &outbox.BadRowError{Queue: l.queue, Seq: r.Seq, Reason: fmt.Sprintf("a body of %d bytes, past Config.MaxBody (%d)", bodyLen, l.b.cfg.MaxBody)}
		case !idOK:
			r.Err = &outbox.BadRowError{Queue: l.queue, Seq: r.Seq, Reason: fmt.Sprintf("an ID or Dedupe of %d bytes, past %d", idLen, maxOutboxID)}
		default:
			r.Msg = driver.Message{ID: string(id), Dedupe: string(dedupe), Body: body}
			if due > 0 {
				r.Msg.NotBefore = time.UnixMilli(due)
			}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, l.b.wrap("outbox of "+l.queue, err)
	}
	return out, nil
}

// held renews the lease in c, or fails with ErrLeaseLost.
func (l *liteLease) held(ctx context.Context, c conn) error {
	if l.released {
		return fmt.Errorf("sqlite: outbox of %s: released: %w", l.queue, driver.ErrLeaseLost)
	}
	res, err := c.ExecContext(ctx, l.b.ob().renew, l.queue, l.owner, l.ttl)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		if err == nil {
			err = fmt.Errorf("sqlite: outbox of %s: the lease ran out: %w", l.queue, driver.ErrLeaseLost)
		}
		return err
	}
	return nil
}

// Delete implements outbox.Lease, renewing the lease.
func (l *liteLease) Delete(ctx context.Context, seqs []int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	list := make([]string, len(seqs))
	for i, s := range seqs {
		list[i] = fmt.Sprint(s)
	}
	err := l.b.write(ctx, func(c conn) error {
		if err := l.held(ctx, c); err != nil {
			return err
		}
		_, err := c.ExecContext(ctx, l.b.ob().del, l.queue, "["+strings.Join(list, ",")+"]")
		return err
	})
	if err != nil {
		return l.b.wrap("outbox of "+l.queue, err)
	}
	return nil
}

// Aside implements outbox.Lease: the row moves to <prefix>_outbox_aside.
func (l *liteLease) Aside(ctx context.Context, seq int64, reason string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	err := l.b.write(ctx, func(c conn) error {
		if err := l.held(ctx, c); err != nil {
			return err
		}
		if _, err := c.ExecContext(ctx, l.b.ob().aside, l.queue, seq, reason); err != nil {
			return err
		}
		_, err := c.ExecContext(ctx, l.b.ob().del, l.queue, fmt.Sprintf("[%d]", seq))
		return err
	})
	if err != nil {
		return l.b.wrap("outbox of "+l.queue, err)
	}
	return nil
}

// Release implements outbox.Lease.
func (l *liteLease) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return nil
	}
	l.released = true
	err := l.b.write(ctx, func(c conn) error {
		_, err := c.ExecContext(ctx, l.b.ob().release, l.queue, l.owner)
		return err
	})
	if err != nil {
		return l.b.wrap("outbox of "+l.queue, err)
	}
	return nil
}
