package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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

// StoreRowError is returned by Get and List for a row of the store table
// that the store never writes (someone else wrote the file): a value over
// driver.MaxValueLen bytes or a key over driver.MaxStoreKeyLen bytes. It
// names the key (cut to 64 bytes, quoted) and matches
// driver.ErrValueTooLarge or driver.ErrBadKey.
type StoreRowError struct {
	Key string // the key, cut to 64 bytes
	Len int    // the bytes read of the value or key: one past its limit
	Err error  // driver.ErrValueTooLarge or driver.ErrBadKey
}

func (e *StoreRowError) Error() string {
	what, limit := "value", driver.MaxValueLen
	if e.Err == driver.ErrBadKey {
		what, limit = "key", driver.MaxStoreKeyLen
	}
	return fmt.Sprintf("sqlite: store row %q: its %s is over the %d-byte limit", e.Key, what, limit)
}

func (e *StoreRowError) Unwrap() error { return e.Err }

func rowError(key string, n int, err error) error {
	if len(key) > 64 {
		key = key[:64]
	}
	return &StoreRowError{Key: key, Len: n, Err: err}
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
	if len(value) > driver.MaxValueLen {
		return nil, "", rowError(key, len(value), driver.ErrValueTooLarge)
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
			if len(k) > driver.MaxStoreKeyLen {
				return rowError(k, len(k), driver.ErrBadKey)
			}
			keys = append(keys, k)
		}
		return rows.Err()
	})
	var re *StoreRowError
	if errors.As(err, &re) {
		return nil, err
	}
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
