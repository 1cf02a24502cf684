package postgres

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/asyncplatform/asyncplatform/pgstore"
)

// txKey is the context key of a caller's transaction.
type txKey struct{}

// txConn is a caller's transaction, shared by the Backend's Enqueue and
// its store's writes (unique keys, status records). Its statements run
// one at a time: a transaction runs one statement at a time, and the
// platform writes a batch's status records from several goroutines.
type txConn struct {
	mu     sync.Mutex
	db     pgstore.DB
	outbox bool // OutboxTx: Enqueue writes to the outbox table
}

func (c *txConn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.db.Exec(ctx, sql, args...)
}

// Query holds the transaction until the rows are closed.
func (c *txConn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.mu.Lock()
	rows, err := c.db.Query(ctx, sql, args...)
	if err != nil {
		if rows != nil {
			rows.Close()
		}
		c.mu.Unlock()
		return nil, err
	}
	return &lockedRows{Rows: rows, unlock: sync.OnceFunc(c.mu.Unlock)}, nil
}

// QueryRow holds the transaction until the row is scanned.
func (c *txConn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.mu.Lock()
	return lockedRow{row: c.db.QueryRow(ctx, sql, args...), unlock: sync.OnceFunc(c.mu.Unlock)}
}

// lockedRows releases its transaction when closed.
type lockedRows struct {
	pgx.Rows
	unlock func()
}

func (r *lockedRows) Close() {
	r.Rows.Close()
	r.unlock()
}

// lockedRow releases its transaction once scanned.
type lockedRow struct {
	row    pgx.Row
	unlock func()
}

func (r lockedRow) Scan(dest ...any) error {
	defer r.unlock()
	return r.row.Scan(dest...)
}

// WithTx returns a context under which the Backend's Enqueue writes with
// tx, the caller's transaction, instead of a connection of its own, and
// so do the platform's writes to the Backend's store for that Enqueue
// (its unique keys and status records): the jobs and their records exist
// when tx commits (the jobs' receivers are woken then) and never when it
// rolls back. Enqueue through the platform with it:
//
//	err := p.Enqueue(postgres.WithTx(ctx, tx), job)
//
// tx must be on the Backend's database, and must not run statements of
// its own while the Enqueue runs. A failed statement aborts tx, as any
// does. A unique key taken in tx holds up another transaction taking the
// same key until tx ends (PostgreSQL's unique index waits for it).
func WithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, &txConn{db: tx})
}

// WithSQLTx is WithTx for a database/sql transaction, on the pgx driver
// (github.com/jackc/pgx/v5/stdlib).
func WithSQLTx(ctx context.Context, tx *sql.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, &txConn{db: sqlDB{tx}})
}

// txOf returns the caller's transaction in ctx, or nil.
func txOf(ctx context.Context) pgstore.DB {
	if c, ok := ctx.Value(txKey{}).(*txConn); ok {
		return c
	}
	return nil
}

// db returns the caller's transaction in ctx, or the pool.
func (b *Backend) db(ctx context.Context) pgstore.DB {
	if c := txOf(ctx); c != nil {
		return c
	}
	return b.pool
}

// sqlDB runs statements on a database/sql transaction.
type sqlDB struct{ tx *sql.Tx }

func (d sqlDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	res, err := d.tx.ExecContext(ctx, sql, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return pgconn.NewCommandTag("EXEC " + strconv.FormatInt(n, 10)), nil
}

func (d sqlDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := d.tx.QueryContext(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return &sqlRows{rows: rows}, nil
}

func (d sqlDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return sqlRow{d.tx.QueryRowContext(ctx, sql, args...)}
}

// sqlRow maps database/sql's no-rows error to pgx's.
type sqlRow struct{ row *sql.Row }

func (r sqlRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return pgx.ErrNoRows
	}
	return err
}

// sqlRows is the part of pgx.Rows that pgx.CollectRows and
// pgx.ForEachRow use, over database/sql rows.
type sqlRows struct {
	rows *sql.Rows
	n    int64
}

func (r *sqlRows) Close()     { _ = r.rows.Close() }
func (r *sqlRows) Err() error { return r.rows.Err() }
func (r *sqlRows) CommandTag() pgconn.CommandTag {
	return pgconn.NewCommandTag("SELECT " + strconv.FormatInt(r.n, 10))
}
func (r *sqlRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *sqlRows) Next() bool {
	if r.rows.Next() {
		r.n++
		return true
	}
	return false
}
func (r *sqlRows) Scan(dest ...any) error { return r.rows.Scan(dest...) }
func (r *sqlRows) Values() ([]any, error) {
	cols, err := r.rows.Columns()
	if err != nil {
		return nil, err
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	return vals, r.rows.Scan(ptrs...)
}
func (r *sqlRows) RawValues() [][]byte  { return nil }
func (r *sqlRows) Conn() *pgx.Conn      { return nil }
func (r *sqlRows) TypeMap() *pgtype.Map { return nil }
