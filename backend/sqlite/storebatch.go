package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/asyncplatform/asyncplatform/driver"
)

// The batch calls of the store (driver.StoreBatcher,
// driver.StoreBatchUpdater, driver.StoreBatchValueDeleter): the writes of
// a batch share one write transaction, so a batch of N keys costs one
// commit instead of N; the reads share one statement (GetEach) or one
// read (ListEach). Each item's result is the one its single call would
// have given.
var (
	_ driver.StoreBatcher           = (*Backend)(nil)
	_ driver.StoreBatchUpdater      = (*Backend)(nil)
	_ driver.StoreBatchValueDeleter = (*Backend)(nil)
)

// GetEach implements driver.StoreBatcher in one SELECT.
func (b *Backend) GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	list, err := json.Marshal(keys)
	if err != nil {
		return nil, err
	}
	at := make(map[string]int, len(keys))
	for i, k := range keys {
		at[k] = i
	}
	out := make([]driver.BatchResult, len(keys))
	for i := range out {
		out[i].Err = driver.ErrKeyNotFound
	}
	err = b.read(ctx, func(c conn) error {
		rows, err := c.QueryContext(ctx, b.q.getEach, string(list))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				k     string
				value []byte
				rev   int64
			)
			if err := rows.Scan(&k, &value, &rev); err != nil {
				return err
			}
			i, ok := at[k]
			if !ok {
				continue
			}
			if len(value) > driver.MaxValueLen {
				return rowError(k, len(value), driver.ErrValueTooLarge)
			}
			out[i] = driver.BatchResult{Value: nonNil(value), Rev: strconv.FormatInt(rev, 10)}
		}
		return rows.Err()
	})
	var re *StoreRowError
	if errors.As(err, &re) {
		return nil, err
	}
	if err != nil {
		return nil, b.wrap("store get", err)
	}
	return out, nil
}

// ListEach implements driver.StoreBatcher: List of each prefix.
func (b *Backend) ListEach(ctx context.Context, prefixes []string, limit int) ([][]string, error) {
	out := make([][]string, len(prefixes))
	for i, p := range prefixes {
		keys, err := b.List(ctx, p, "", limit)
		if err != nil {
			return nil, err
		}
		out[i] = keys
	}
	return out, nil
}

// CreateEach implements driver.StoreBatcher in one write transaction.
func (b *Backend) CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	return b.writeEach(ctx, "store create", items, func(c conn, st *sql.Stmt, it driver.BatchItem, rev int64) (driver.BatchResult, error) {
		n, err := affected(st.ExecContext(ctx, it.Key, nonNil(it.Value), rev, it.TTL.Milliseconds()))
		if err != nil || n == 0 {
			return driver.BatchResult{Err: driver.ErrKeyExists}, err
		}
		return driver.BatchResult{Rev: strconv.FormatInt(rev, 10)}, nil
	}, b.q.create, true)
}

// UpdateEach implements driver.StoreBatchUpdater in one write transaction.
func (b *Backend) UpdateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	return b.writeEach(ctx, "store update", items, func(c conn, st *sql.Stmt, it driver.BatchItem, rev int64) (driver.BatchResult, error) {
		old, ok := parseRev(it.Rev)
		if !ok {
			return driver.BatchResult{Err: driver.ErrRevision}, nil
		}
		n, err := affected(st.ExecContext(ctx, nonNil(it.Value), rev, it.TTL.Milliseconds(), it.Key, old))
		if err != nil || n == 0 {
			return driver.BatchResult{Err: driver.ErrRevision}, err
		}
		return driver.BatchResult{Rev: strconv.FormatInt(rev, 10)}, nil
	}, b.q.update, true)
}

// DeleteEach implements driver.StoreBatcher in one write transaction.
func (b *Backend) DeleteEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	return b.writeEach(ctx, "store delete", items, func(c conn, st *sql.Stmt, it driver.BatchItem, _ int64) (driver.BatchResult, error) {
		if it.Rev == "" {
			_, err := c.ExecContext(ctx, b.q.deleteKey, it.Key)
			return driver.BatchResult{}, err
		}
		old, ok := parseRev(it.Rev)
		if !ok {
			return driver.BatchResult{Err: driver.ErrRevision}, nil
		}
		n, err := affected(st.ExecContext(ctx, it.Key, old))
		if err != nil || n == 0 {
			return driver.BatchResult{Err: driver.ErrRevision}, err
		}
		return driver.BatchResult{}, nil
	}, b.q.deleteRev, false)
}

// DeleteValueEach implements driver.StoreBatchValueDeleter in one write
// transaction: each key is removed only at its Rev (any, when empty) and
// holding exactly its Value.
func (b *Backend) DeleteValueEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	return b.writeEach(ctx, "store delete", items, func(c conn, st *sql.Stmt, it driver.BatchItem, _ int64) (driver.BatchResult, error) {
		var old int64
		if it.Rev != "" {
			var ok bool
			if old, ok = parseRev(it.Rev); !ok {
				return driver.BatchResult{Err: driver.ErrRevision}, nil
			}
		}
		n, err := affected(st.ExecContext(ctx, it.Key, nonNil(it.Value), old))
		if err != nil || n == 0 {
			return driver.BatchResult{Err: driver.ErrRevision}, err
		}
		return driver.BatchResult{}, nil
	}, b.q.deleteValue, false)
}

// writeEach runs one for each item in one write transaction, with stmt
// prepared once; with revs, each item is given a new revision of its own
// from one update of the file's counter. An error of one (not an item's
// sentinel, which it returns in its result) rolls the batch back.
func (b *Backend) writeEach(ctx context.Context, op string, items []driver.BatchItem,
	one func(c conn, st *sql.Stmt, it driver.BatchItem, rev int64) (driver.BatchResult, error),
	stmt string, revs bool) ([]driver.BatchResult, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	out := make([]driver.BatchResult, len(items))
	if len(items) == 0 {
		return out, nil
	}
	err := b.write(ctx, func(c conn) error {
		var last int64
		if revs {
			if err := c.QueryRowContext(ctx, b.q.nextRevs, len(items)).Scan(&last); err != nil {
				return err
			}
		}
		st, err := c.PrepareContext(ctx, stmt)
		if err != nil {
			return err
		}
		defer st.Close()
		first := last - int64(len(items)) + 1
		for i, it := range items {
			r, err := one(c, st, it, first+int64(i))
			if err != nil {
				return err
			}
			out[i] = r
		}
		return nil
	})
	if err != nil {
		return nil, b.wrap(op, err)
	}
	return out, nil
}

// affected is the row count of an Exec.
func affected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
