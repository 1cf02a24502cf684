package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// sweepEvery is how often a Backend deletes up to 1000 expired store keys.
const sweepEvery = time.Minute

// rev parses a revision this store returned; ok is false for any other
// string.
func parseRev(rev string) (int64, bool) {
	n, err := strconv.ParseInt(rev, 10, 64)
	return n, err == nil && n > 0 && strconv.FormatInt(n, 10) == rev
}

// Get implements driver.Store.
func (b *Backend) Get(ctx context.Context, key string) ([]byte, string, error) {
	if err := b.check(); err != nil {
		return nil, "", err
	}
	var (
		value []byte
		rev   int64
	)
	err := b.read(ctx, func(c conn) error {
		return c.QueryRowContext(ctx, b.q.get, key).Scan(&value, &rev)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, "", driver.ErrKeyNotFound
	}
	if err != nil {
		return nil, "", b.wrap("store get", err)
	}
	return nonNil(value), strconv.FormatInt(rev, 10), nil
}

// Create implements driver.Store: a new revision from the file's counter,
// and an INSERT that takes the place of an expired key only.
func (b *Backend) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	if err := b.check(); err != nil {
		return "", err
	}
	var rev int64
	err := b.write(ctx, func(c conn) error {
		if err := c.QueryRowContext(ctx, b.q.nextRev).Scan(&rev); err != nil {
			return err
		}
		res, err := c.ExecContext(ctx, b.q.create, key, nonNil(value), rev, ttl.Milliseconds())
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return driver.ErrKeyExists
		}
		return nil
	})
	if errors.Is(err, driver.ErrKeyExists) {
		return "", err
	}
	if err != nil {
		return "", b.wrap("store create", err)
	}
	return strconv.FormatInt(rev, 10), nil
}

// Update implements driver.Store.
func (b *Backend) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	if err := b.check(); err != nil {
		return "", err
	}
	old, ok := parseRev(rev)
	if !ok {
		return "", driver.ErrRevision
	}
	var next int64
	err := b.write(ctx, func(c conn) error {
		if err := c.QueryRowContext(ctx, b.q.nextRev).Scan(&next); err != nil {
			return err
		}
		res, err := c.ExecContext(ctx, b.q.update, nonNil(value), next, ttl.Milliseconds(), key, old)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return driver.ErrRevision
		}
		return nil
	})
	if errors.Is(err, driver.ErrRevision) {
		return "", err
	}
	if err != nil {
		return "", b.wrap("store update", err)
	}
	return strconv.FormatInt(next, 10), nil
}

// Delete implements driver.Store.
func (b *Backend) Delete(ctx context.Context, key, rev string) error {
	if err := b.check(); err != nil {
		return err
	}
	if rev == "" {
		if err := b.write(ctx, func(c conn) error {
			_, err := c.ExecContext(ctx, b.q.deleteKey, key)
			return err
		}); err != nil {
			return b.wrap("store delete", err)
		}
		return nil
	}
	old, ok := parseRev(rev)
	if !ok {
		return driver.ErrRevision
	}
	err := b.write(ctx, func(c conn) error {
		res, err := c.ExecContext(ctx, b.q.deleteRev, key, old)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return driver.ErrRevision
		}
		return nil
	})
	if errors.Is(err, driver.ErrRevision) {
		return err
	}
	if err != nil {
		return b.wrap("store delete", err)
	}
	return nil
}

// List implements driver.Store: keys are ASCII below 0x7f, so those
// starting with prefix are the range [prefix, prefix+"\x7f").
func (b *Backend) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	var keys []string
	err := b.read(ctx, func(c conn) error {
		rows, err := c.QueryContext(ctx, b.q.list, prefix, after, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				return err
			}
			keys = append(keys, k)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, b.wrap("store list", err)
	}
	return keys, nil
}

// sweep deletes expired keys every sweepEvery until Close: an expired key
// is absent for every method already, this reclaims its space.
func (b *Backend) sweep() {
	defer b.wg.Done()
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		err := b.write(b.ctx, func(c conn) error {
			_, err := c.ExecContext(b.ctx, b.q.sweep)
			return err
		})
		if err != nil && b.ctx.Err() == nil {
			b.cfg.Logger.Warn("sqlite: deleting expired store keys", "path", b.cfg.Path, "err", err)
		}
	}
}
