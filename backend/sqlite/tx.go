package sqlite

import (
	"context"
	"database/sql"
	"sync"
)

// conn runs statements: the Backend's pool, one of its transactions, or
// the caller's transaction given by WithTx.
type conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// txKey is the context key of a caller's transaction.
type txKey struct{}

// txConn is a caller's transaction, shared by the Backend's Enqueue and its
// store's writes (unique keys, status records). Its statements run one
// call at a time: the platform writes a batch's status records from
// several goroutines.
type txConn struct {
	mu     sync.Mutex
	tx     *sql.Tx
	outbox bool // OutboxTx: Enqueue writes to the outbox table
}

// WithTx returns a context under which the Backend's Enqueue writes with
// tx, the caller's transaction, instead of a transaction of its own, and
// so do the platform's writes to the Backend's store for that Enqueue
// (its unique keys and status records): the jobs and their records exist
// when tx commits and never when it rolls back. Enqueue through the
// platform with it:
//
//	tx, err := b.DB().BeginTx(ctx, nil)
//	...
//	err = p.Enqueue(sqlite.WithTx(ctx, tx), job)
//	...
//	err = tx.Commit()
//
// tx must be on the Backend's database file, begun IMMEDIATE (as the
// transactions of Backend.DB are) so that it holds the file's write lock
// from its start, and must not run statements of its own while the
// Enqueue runs. SQLite has one writer at a time: every other write to the
// file, from any process, waits for tx to end, so keep it short. Waiting
// Receives see the jobs within PollInterval of the commit.
func WithTx(ctx context.Context, tx *sql.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, &txConn{tx: tx})
}

// txOf returns the caller's transaction in ctx, or nil.
func txOf(ctx context.Context) *txConn {
	c, _ := ctx.Value(txKey{}).(*txConn)
	return c
}

// write runs fn in a write transaction: the caller's (WithTx), or one of
// the Backend's own, begun IMMEDIATE under the process's writer lock of
// the file and then the processes' (so writers queue in Go and on the
// flock rather than in SQLite's busy handler) and committed when fn
// returns nil. The wait for the process's turn ends with ctx; the wait
// for another process's flock ends with ctx or after Config.BusyTimeout,
// with a *LockTimeoutError.
func (b *Backend) write(ctx context.Context, fn func(c conn) error) error {
	if c := txOf(ctx); c != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		return fn(c.tx)
	}
	if err := b.hub.lock.lock(ctx, b.cfg.BusyTimeout); err != nil {
		return err
	}
	defer b.hub.lock.unlock()
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// read runs fn on the caller's transaction (WithTx), or on the pool.
func (b *Backend) read(ctx context.Context, fn func(c conn) error) error {
	if c := txOf(ctx); c != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		return fn(c.tx)
	}
	return fn(b.db)
}
