package sqlite

import (
	"context"
	"database/sql"
	"slices"
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
	var missed []string
	err := b.writeTx(ctx, fn, &missed)
	// The statements the transaction ran unprepared are prepared on the
	// pool now that it holds none of its connections (nor the writer
	// lock): prepared within it, with every other connection busy
	// (Config.MaxConns 1), the write would wait for itself.
	for _, q := range missed {
		_, _ = b.stmts.get(ctx, b.db, q)
	}
	return err
}

// writeTx runs fn in a transaction of the Backend's own, the writer lock
// held, noting in missed the statements it found uncached.
func (b *Backend) writeTx(ctx context.Context, fn func(c conn) error, missed *[]string) error {
	if err := b.hub.lock.lock(ctx, b.cfg.BusyTimeout); err != nil {
		return err
	}
	defer b.hub.lock.unlock()
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(cached{b: b, tx: tx, missed: missed}); err != nil {
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
	return fn(b.pool())
}

// maxStmts bounds the statements a Backend keeps prepared: its own are a
// few dozen; a query past the bound is parsed at each call, as without
// the cache.
const maxStmts = 128

// stmtCache holds the Backend's statements prepared on its pool, once each:
// SQLite parses a statement on every call otherwise, a large share of a
// job's CPU. database/sql prepares each on a connection at its first use
// there, and a transaction of the pool reuses it (Tx.StmtContext).
type stmtCache struct {
	mu     sync.Mutex
	m      map[string]*sql.Stmt
	closed bool
}

// lookup returns query's statement if it is cached, or nil.
func (c *stmtCache) lookup(query string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[query]
}

// get returns query prepared on db, or nil past maxStmts or after close.
// The prepare, which waits for a free connection of db, runs without the
// lock: a transaction holding the last connection may need the lock to
// look its statements up.
func (c *stmtCache) get(ctx context.Context, db *sql.DB, query string) (*sql.Stmt, error) {
	c.mu.Lock()
	if s, ok := c.m[query]; ok {
		c.mu.Unlock()
		return s, nil
	}
	if c.closed || len(c.m) >= maxStmts {
		c.mu.Unlock()
		return nil, nil
	}
	c.mu.Unlock()
	s, err := db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[query]; ok {
		_ = s.Close()
		return old, nil
	}
	if c.closed || len(c.m) >= maxStmts {
		_ = s.Close()
		return nil, nil
	}
	if c.m == nil {
		c.m = make(map[string]*sql.Stmt)
	}
	c.m[query] = s
	return s, nil
}

func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, s := range c.m {
		_ = s.Close()
	}
	c.m = nil
}

// cached is a conn on the Backend's pool (tx nil) or on one of its own
// transactions that runs the Backend's statements prepared once. A
// caller's transaction (WithTx) may be on another *sql.DB and is not
// wrapped.
type cached struct {
	b      *Backend
	tx     *sql.Tx
	missed *[]string // with tx: the statements it found uncached
}

func (c cached) raw() conn {
	if c.tx != nil {
		return c.tx
	}
	return c.b.db
}

// stmt returns query prepared for c, or nil to run it unprepared.
func (c cached) stmt(ctx context.Context, query string) *sql.Stmt {
	if c.tx != nil {
		// The transaction holds a connection: preparing on the pool here
		// could wait for it. It runs the statement unprepared and write
		// prepares it once the transaction is over.
		s := c.b.stmts.lookup(query)
		if s == nil {
			if c.missed != nil && !slices.Contains(*c.missed, query) {
				*c.missed = append(*c.missed, query)
			}
			return nil
		}
		return c.tx.StmtContext(ctx, s)
	}
	s, err := c.b.stmts.get(ctx, c.b.db, query)
	if err != nil || s == nil {
		return nil // the unprepared call reports the statement's error
	}
	if c.tx != nil {
		return c.tx.StmtContext(ctx, s)
	}
	return s
}

func (c cached) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if s := c.stmt(ctx, query); s != nil {
		return s.ExecContext(ctx, args...)
	}
	return c.raw().ExecContext(ctx, query, args...)
}

func (c cached) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if s := c.stmt(ctx, query); s != nil {
		return s.QueryContext(ctx, args...)
	}
	return c.raw().QueryContext(ctx, query, args...)
}

func (c cached) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if s := c.stmt(ctx, query); s != nil {
		return s.QueryRowContext(ctx, args...)
	}
	return c.raw().QueryRowContext(ctx, query, args...)
}

// PrepareContext prepares query for the caller, who closes it: on a
// transaction, a statement of the transaction's own (closing it leaves the
// cached one); on the pool, a new one.
func (c cached) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	if c.tx != nil {
		if s := c.stmt(ctx, query); s != nil {
			return s, nil
		}
	}
	return c.raw().PrepareContext(ctx, query)
}

// pool is the Backend's pool, running its statements prepared once.
func (b *Backend) pool() conn { return cached{b: b} }
