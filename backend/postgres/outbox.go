package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/outbox"
)

// outboxQueries are the outbox's statements.
type outboxQueries struct {
	outboxPut, outboxQueues, outboxNext, outboxDelete, outboxAside string
}

func makeOutboxQueries(q func(string) string) outboxQueries {
	return outboxQueries{
		outboxPut: q(`INSERT INTO {{p}}_outbox (queue, id, dedupe, body, not_before)
			SELECT $1, u.i, u.d, u.b, u.t FROM unnest($2::text[], $3::text[], $4::bytea[], $5::timestamptz[]) WITH ORDINALITY AS u(i, d, b, t, n)
			ORDER BY u.n`),
		// Bounded: at most outbox.MaxQueues names, each cut one character
		// past driver.MaxQueueLen. The names the relay can drain come
		// first: rows under a name too long to address stay in the table,
		// and as many such names must not hide the others.
		outboxQueues: q(`SELECT q FROM (
				(SELECT DISTINCT queue AS q, 0 AS o FROM {{p}}_outbox WHERE octet_length(queue) <= ` + strconv.Itoa(driver.MaxQueueLen) + ` LIMIT ` + strconv.Itoa(outbox.MaxQueues) + `)
				UNION ALL
				(SELECT DISTINCT left(queue, ` + strconv.Itoa(driver.MaxQueueLen+1) + `), 1 FROM {{p}}_outbox WHERE octet_length(queue) > ` + strconv.Itoa(driver.MaxQueueLen) + ` LIMIT ` + strconv.Itoa(outbox.MaxQueues) + `)
			) s ORDER BY o LIMIT ` + strconv.Itoa(outbox.MaxQueues)),
		// Bounded: a body past $3 bytes or an ID past $4 is not read.
		outboxNext: q(`SELECT seq,
				CASE WHEN octet_length(id) <= $4 AND octet_length(dedupe) <= $4 THEN id END,
				CASE WHEN octet_length(id) <= $4 AND octet_length(dedupe) <= $4 THEN dedupe END,
				CASE WHEN octet_length(body) <= $3 THEN body END,
				octet_length(body), greatest(octet_length(id), octet_length(dedupe)), not_before
			FROM {{p}}_outbox WHERE queue = $1 ORDER BY seq LIMIT $2`),
		outboxDelete: q(`DELETE FROM {{p}}_outbox WHERE queue = $1 AND seq = ANY($2::bigint[])`),
		outboxAside: q(`WITH moved AS (DELETE FROM {{p}}_outbox WHERE queue = $1 AND seq = $2 RETURNING *)
			INSERT INTO {{p}}_outbox_aside (seq, queue, id, dedupe, body, not_before, reason)
			SELECT seq, queue, id, dedupe, body, not_before, $3 FROM moved`),
	}
}

// maxOutboxID bounds a job's ID and Dedupe read back from the outbox, in
// bytes: a longer one marks the row bad.
const maxOutboxID = 4 << 10

var _ outbox.Source = (*Backend)(nil)

// OutboxTx returns a context under which the Backend's Enqueue writes the
// jobs to its outbox table, in tx, the caller's transaction, instead of
// to its queues; the platform's writes to the Backend's store for that
// Enqueue (unique keys, status records) go to tx as under WithTx. The
// jobs exist when tx commits and never when it rolls back, and an
// outbox.Relay then moves them, in order per queue, to another backend:
//
//	err := p.Enqueue(postgres.OutboxTx(ctx, tx), job)
//
// The rules of WithTx hold for tx. The jobs keep their ID and Dedupe on
// the way to the target; their records stay in this Backend's store (give
// the target's platform the same store to keep them).
func OutboxTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, &txConn{db: tx, outbox: true})
}

// OutboxSQLTx is OutboxTx for a database/sql transaction, on the pgx
// driver (github.com/jackc/pgx/v5/stdlib).
func OutboxSQLTx(ctx context.Context, tx *sql.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, &txConn{db: sqlDB{tx}, outbox: true})
}

// inOutbox reports whether ctx is an OutboxTx's.
func inOutbox(ctx context.Context) bool {
	c, ok := ctx.Value(txKey{}).(*txConn)
	return ok && c.outbox
}

// enqueueOutbox writes msgs to the outbox in the caller's transaction, in
// their order.
func (b *Backend) enqueueOutbox(ctx context.Context, queue string, msgs []driver.Message) error {
	ids := make([]string, len(msgs))
	dedupes := make([]string, len(msgs))
	bodies := make([][]byte, len(msgs))
	due := make([]pgtype.Timestamptz, len(msgs))
	for i, m := range msgs {
		ids[i], dedupes[i], bodies[i] = m.ID, m.Dedupe, nonNil(m.Body)
		due[i] = pgtype.Timestamptz{Time: dueTime(m.NotBefore), Valid: !m.NotBefore.IsZero()}
	}
	if _, err := txOf(ctx).Exec(ctx, b.q.outboxPut, queue, ids, dedupes, bodies, due); err != nil {
		return b.wrap("enqueue "+queue+" to the outbox", err)
	}
	return nil
}

// OutboxQueues implements outbox.Source.
func (b *Backend) OutboxQueues(ctx context.Context) ([]string, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	rows, err := b.pool.Query(ctx, b.q.outboxQueues)
	if err != nil {
		return nil, b.wrap("outbox queues", err)
	}
	qs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, b.wrap("outbox queues", err)
	}
	return qs, nil
}

// TakeOutbox implements outbox.Source with a session advisory lock per
// queue, on a connection the lease keeps until Release: the lease ends
// with that connection (a relay killed with SIGKILL lets it go as its
// connection closes), so ttl is not used. It needs session state: not
// through PgBouncer in transaction mode.
func (b *Backend) TakeOutbox(ctx context.Context, queue string, _ time.Duration) (outbox.Lease, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, b.wrap("outbox lease of "+queue, err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, b.outboxLockKey(queue)).Scan(&ok); err != nil {
		conn.Release()
		return nil, b.wrap("outbox lease of "+queue, err)
	}
	if !ok {
		conn.Release()
		return nil, fmt.Errorf("postgres: outbox of %s: %w", queue, outbox.ErrHeld)
	}
	return &pgLease{b: b, queue: queue, conn: conn}, nil
}

func (b *Backend) outboxLockKey(queue string) string {
	return "asyncplatform outbox " + b.cfg.Prefix + " " + queue
}

// pgLease is a TakeOutbox lease: the advisory lock held by conn.
type pgLease struct {
	b     *Backend
	queue string

	mu   sync.Mutex
	conn *pgxpool.Conn // nil once released
}

func (l *pgLease) held() (*pgxpool.Conn, error) {
	if l.conn == nil {
		return nil, fmt.Errorf("postgres: outbox of %s: released: %w", l.queue, driver.ErrLeaseLost)
	}
	return l.conn, nil
}

// Next implements outbox.Lease. A body past Config.MaxBody or an ID past
// 4 KiB is not read: the row comes back with an outbox.BadRowError.
func (l *pgLease) Next(ctx context.Context, max int) ([]outbox.Row, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	conn, err := l.held()
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, l.b.q.outboxNext, l.queue, max, l.b.cfg.MaxBody, maxOutboxID)
	if err != nil {
		return nil, l.b.wrap("outbox of "+l.queue, err)
	}
	defer rows.Close()
	var out []outbox.Row
	for rows.Next() {
		var (
			r              outbox.Row
			id, dedupe     *string
			body           []byte
			bodyLen, idLen int64
			due            pgtype.Timestamptz
		)
		if err := rows.Scan(&r.Seq, &id, &dedupe, &body, &bodyLen, &idLen, &due); err != nil {
			return nil, l.b.wrap("outbox of "+l.queue, err)
		}
		switch {
		case body == nil:
			r.Err = &outbox.BadRowError{Queue: l.queue, Seq: r.Seq, Reason: fmt.Sprintf("a body of %d bytes, past Config.MaxBody (%d)", bodyLen, l.b.cfg.MaxBody)}
		case id == nil || dedupe == nil:
			r.Err = &outbox.BadRowError{Queue: l.queue, Seq: r.Seq, Reason: fmt.Sprintf("an ID or Dedupe of %d bytes, past %d", idLen, maxOutboxID)}
		default:
			r.Msg = driver.Message{ID: *id, Dedupe: *dedupe, Body: body}
			if due.Valid {
				r.Msg.NotBefore = due.Time
			}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, l.b.wrap("outbox of "+l.queue, err)
	}
	return out, nil
}

// Delete implements outbox.Lease.
func (l *pgLease) Delete(ctx context.Context, seqs []int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	conn, err := l.held()
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, l.b.q.outboxDelete, l.queue, seqs); err != nil {
		return l.b.wrap("outbox of "+l.queue, err)
	}
	return nil
}

// Aside implements outbox.Lease: the row moves to <prefix>_outbox_aside.
func (l *pgLease) Aside(ctx context.Context, seq int64, reason string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	conn, err := l.held()
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, l.b.q.outboxAside, l.queue, seq, reason); err != nil {
		return l.b.wrap("outbox of "+l.queue, err)
	}
	return nil
}

// Release implements outbox.Lease. A connection whose unlock failed is
// closed, which ends the lock as well.
func (l *pgLease) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return nil
	}
	conn := l.conn
	l.conn = nil
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, l.b.outboxLockKey(l.queue)); err != nil {
		_ = conn.Hijack().Close(context.WithoutCancel(ctx))
		return nil
	}
	conn.Release()
	return nil
}
