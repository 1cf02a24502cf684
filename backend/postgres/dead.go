package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/asyncplatform/asyncplatform/driver"
)

// NextDead implements driver.Backend: the oldest record nobody holds,
// held by a token and a deadline written on its row.
func (b *Backend) NextDead(ctx context.Context, queue string) (*driver.DeadDelivery, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	var (
		h   handle
		rec driver.DeadMessage
		id  []byte
	)
	err := b.pool.QueryRow(ctx, b.q.nextDead, queue, b.cfg.DeadHold.Microseconds(), maxDeadID+1, b.maxDeadBody()+1).Scan(&h.id, &h.token, &id, &rec.Body)
	rec.ID = string(id)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, driver.ErrNoDeadLetters
	}
	if err != nil {
		return nil, b.wrap("next dead letter of "+queue, err)
	}
	return &driver.DeadDelivery{DeadMessage: rec, Handle: h}, nil
}

// settleDead runs one statement on a held record's row; none changed
// means the hold was lost.
func (b *Backend) settleDead(ctx context.Context, op string, d *driver.DeadDelivery, stmt string, args ...any) error {
	if err := b.check(); err != nil {
		return err
	}
	h, ok := d.Handle.(handle)
	if !ok {
		return errLost(op)
	}
	tag, err := b.pool.Exec(ctx, stmt, append([]any{h.id, h.token}, args...)...)
	if err != nil {
		return b.wrap(op, err)
	}
	if tag.RowsAffected() == 0 {
		return errLost(op)
	}
	return nil
}

// ExtendDead implements driver.Backend.
func (b *Backend) ExtendDead(ctx context.Context, d *driver.DeadDelivery) error {
	return b.settleDead(ctx, "extend dead letter", d, b.q.extendDead, b.cfg.DeadHold.Microseconds())
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
			return nil, "", fmt.Errorf("postgres: list dead letters of %s: cursor %q is not one of ours", queue, cursor)
		}
		after = n
	}
	if limit <= 0 {
		return nil, cursor, nil
	}
	limit = min(limit, maxList)
	rows, err := b.pool.Query(ctx, b.q.listDead, queue, after, limit+1, maxDeadID+1, b.maxDeadBody()+1)
	if err != nil {
		return nil, "", b.wrap("list dead letters of "+queue, err)
	}
	var (
		recs        []driver.DeadMessage
		ids         []int64
		id          int64
		recID, body []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &recID, &body}, func() error {
		recs, ids = append(recs, driver.DeadMessage{ID: string(recID), Body: body}), append(ids, id)
		recID, body = nil, nil
		return nil
	})
	if err != nil {
		return nil, "", b.wrap("list dead letters of "+queue, err)
	}
	if len(recs) <= limit {
		return recs, "", nil
	}
	return recs[:limit], strconv.FormatInt(ids[limit-1], 10), nil
}

// DeleteDead implements driver.Backend: one DELETE, leaving held records.
func (b *Backend) DeleteDead(ctx context.Context, queue string, ids []string) (int, error) {
	if err := b.check(); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	raw := make([][]byte, len(ids))
	for i, id := range ids {
		raw[i] = []byte(id)
	}
	tag, err := b.pool.Exec(ctx, b.q.deleteDead, queue, raw)
	if err != nil {
		return 0, b.wrap("delete dead letters of "+queue, err)
	}
	return int(tag.RowsAffected()), nil
}

// PurgeDead implements driver.Backend: one DELETE.
func (b *Backend) PurgeDead(ctx context.Context, queue string) (int, error) {
	if err := b.check(); err != nil {
		return 0, err
	}
	tag, err := b.pool.Exec(ctx, b.q.purgeDead, queue)
	if err != nil {
		return 0, b.wrap("purge dead letters of "+queue, err)
	}
	return int(tag.RowsAffected()), nil
}
