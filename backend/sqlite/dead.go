package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"

	"github.com/asyncplatform/asyncplatform/driver"
)

// NextDead implements driver.Backend: the oldest record nobody holds, held
// by a token and a deadline written on its row.
func (b *Backend) NextDead(ctx context.Context, queue string) (*driver.DeadDelivery, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	h := handle{token: newToken()}
	var id, body []byte
	err := b.write(ctx, func(c conn) error {
		return c.QueryRowContext(ctx, b.q.nextDead, h.token, millis(b.cfg.DeadHold), queue, maxDeadID+1, b.maxDeadBody()+1).Scan(&h.id, &id, &body)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, driver.ErrNoDeadLetters
	}
	if err != nil {
		return nil, b.wrap("next dead letter of "+queue, err)
	}
	return &driver.DeadDelivery{DeadMessage: driver.DeadMessage{ID: string(id), Body: nonNil(body)}, Handle: h}, nil
}

// settleDead runs one statement on a held record's row (id and token last
// among its arguments); none changed means the hold was lost.
func (b *Backend) settleDead(ctx context.Context, op string, d *driver.DeadDelivery, stmt string, args ...any) error {
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
	if n == 0 {
		return errLost(op)
	}
	return nil
}

// ExtendDead implements driver.Backend.
func (b *Backend) ExtendDead(ctx context.Context, d *driver.DeadDelivery) error {
	return b.settleDead(ctx, "extend dead letter", d, b.q.extendDead, millis(b.cfg.DeadHold))
}

// SettleDead implements driver.Backend: a record put back keeps its place
// (its id).
func (b *Backend) SettleDead(ctx context.Context, d *driver.DeadDelivery, remove bool) error {
	if remove {
		return b.settleDead(ctx, "remove dead letter", d, b.q.removeDead)
	}
	return b.settleDead(ctx, "release dead letter", d, b.q.releaseDead)
}

// ListDead implements driver.Backend. The cursor is the last row's id; a
// page holds at most maxList records, whatever the limit.
func (b *Backend) ListDead(ctx context.Context, queue, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	if err := b.check(); err != nil {
		return nil, "", err
	}
	var after int64
	if cursor != "" {
		n, err := strconv.ParseInt(cursor, 10, 64)
		if err != nil || n < 0 {
			return nil, "", fmt.Errorf("sqlite: list dead letters of %s: cursor %q is not one of ours", queue, cursor)
		}
		after = n
	}
	if limit <= 0 {
		return nil, cursor, nil
	}
	limit = min(limit, maxList)
	rows, err := b.db.QueryContext(ctx, b.q.listDead, maxDeadID+1, b.maxDeadBody()+1, queue, after, limit+1)
	if err != nil {
		return nil, "", b.wrap("list dead letters of "+queue, err)
	}
	defer rows.Close()
	var (
		recs []driver.DeadMessage
		ids  []int64
	)
	for rows.Next() {
		var (
			id          int64
			recID, body []byte
		)
		if err := rows.Scan(&id, &recID, &body); err != nil {
			return nil, "", b.wrap("list dead letters of "+queue, err)
		}
		recs, ids = append(recs, driver.DeadMessage{ID: string(recID), Body: nonNil(body)}), append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, "", b.wrap("list dead letters of "+queue, err)
	}
	if len(recs) <= limit {
		return recs, "", nil
	}
	return recs[:limit], strconv.FormatInt(ids[limit-1], 10), nil
}

// DeleteDead implements driver.Backend: one DELETE per ID in one
// transaction, leaving held records.
func (b *Backend) DeleteDead(ctx context.Context, queue string, ids []string) (int, error) {
	if err := b.check(); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	var n int64
	err := b.write(ctx, func(c conn) error {
		n = 0
		st, err := c.PrepareContext(ctx, b.q.deleteDead)
		if err != nil {
			return err
		}
		defer st.Close()
		for _, id := range ids {
			res, err := st.ExecContext(ctx, queue, []byte(id))
			if err != nil {
				return err
			}
			k, err := res.RowsAffected()
			if err != nil {
				return err
			}
			n += k
		}
		return nil
	})
	if err != nil {
		return 0, b.wrap("delete dead letters of "+queue, err)
	}
	return int(n), nil
}

// PurgeDead implements driver.Backend: one DELETE.
func (b *Backend) PurgeDead(ctx context.Context, queue string) (int, error) {
	if err := b.check(); err != nil {
		return 0, err
	}
	var n int64
	err := b.write(ctx, func(c conn) error {
		res, err := c.ExecContext(ctx, b.q.purge, queue)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, b.wrap("purge dead letters of "+queue, err)
	}
	return int(n), nil
}
