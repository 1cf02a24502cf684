package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/asyncplatform/asyncplatform/driver"
)

// Defaults of Config.
const (
	DefaultPrefix      = "asyncplatform"
	DefaultDeadHold    = 30 * time.Second
	DefaultIdleWait    = time.Second
	DefaultMaxBody     = 1 << 20
	DefaultBusyTimeout = 10 * time.Second
	DefaultMaxConns    = 8
)

// PollInterval is how often each process looks for commits of other
// processes to the database file (PRAGMA data_version), to wake its idle
// Receives: the delay, at most, before a job enqueued by another process
// is seen. Commits of the process itself wake its Receives at once.
const PollInterval = 100 * time.Millisecond

// MinLease is the shortest lease the backend honours (Capabilities.MinLease).
const MinLease = 50 * time.Millisecond

// maxClaim bounds the jobs one Receive hands out.
const maxClaim = 1000

// maxList bounds the records one ListDead returns, whatever its limit.
const maxList = 1000

// maxDeadID bounds a dead-letter record's ID, in bytes.
const maxDeadID = 4 << 10

var (
	_ driver.Backend      = (*Backend)(nil)
	_ driver.QueueDeleter = (*Backend)(nil)
	_ driver.QueueLister  = (*Backend)(nil)
	_ driver.Pinger       = (*Backend)(nil)
	_ driver.Store        = (*Backend)(nil)
)

// Config configures a Backend.
type Config struct {
	// Path is the database file, created when missing (its directory must
	// exist). Required.
	Path string

	// Prefix starts the names of the backend's tables: 1 to 40 bytes of
	// [a-z0-9_], starting with a letter. Defaults to DefaultPrefix
	// ("asyncplatform").
	Prefix string

	// DeadHold is how long a dead letter handed out by NextDead stays held
	// without ExtendDead or SettleDead (Capabilities.DeadHold). Defaults to
	// DefaultDeadHold (30s).
	DeadHold time.Duration

	// IdleWait is the longest an idle Receive waits before it looks at the
	// queue again when nothing woke it: a safety net, at most a second.
	// Defaults to DefaultIdleWait (1s).
	IdleWait time.Duration

	// MaxBody is the largest message body, in bytes (Capabilities.MaxBody).
	// Defaults to DefaultMaxBody (1 MiB).
	MaxBody int

	// BusyTimeout is how long a statement waits for another process's
	// write transaction to end before it fails (SQLite's busy_timeout).
	// Defaults to DefaultBusyTimeout (10s).
	BusyTimeout time.Duration

	// MaxConns bounds the connections the Backend opens to the file.
	// Defaults to DefaultMaxConns (8).
	MaxConns int

	// Logger receives the wake-up poll's errors. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.DeadHold == 0 {
		c.DeadHold = DefaultDeadHold
	}
	if c.IdleWait == 0 {
		c.IdleWait = DefaultIdleWait
	}
	if c.MaxBody == 0 {
		c.MaxBody = DefaultMaxBody
	}
	if c.BusyTimeout == 0 {
		c.BusyTimeout = DefaultBusyTimeout
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Path == "":
		return errors.New("sqlite: Config.Path is empty: want the database file")
	case strings.ContainsAny(c.Path, "?#\x00"):
		return errors.New("sqlite: Config.Path holds '?', '#' or NUL: want a plain file path")
	case !validPrefix(c.Prefix):
		return fmt.Errorf("sqlite: Config.Prefix %q: want 1 to 40 bytes of [a-z0-9_], starting with a letter", c.Prefix)
	case c.DeadHold < 3*MinLease:
		return fmt.Errorf("sqlite: Config.DeadHold %v: want at least %v", c.DeadHold, 3*MinLease)
	case c.IdleWait < 10*time.Millisecond || c.IdleWait > time.Second:
		return fmt.Errorf("sqlite: Config.IdleWait %v: want 10ms to 1s", c.IdleWait)
	case c.MaxBody < 0 || c.MaxBody > 1<<29:
		return fmt.Errorf("sqlite: Config.MaxBody %d: want 0 to %d", c.MaxBody, 1<<29)
	case c.BusyTimeout < 0:
		return fmt.Errorf("sqlite: Config.BusyTimeout %v: want a positive duration", c.BusyTimeout)
	case c.MaxConns < 1:
		return fmt.Errorf("sqlite: Config.MaxConns %d: want at least 1", c.MaxConns)
	}
	return nil
}

// validPrefix reports whether p is 1 to 40 bytes of [a-z0-9_] starting
// with a letter.
func validPrefix(p string) bool {
	if len(p) == 0 || len(p) > 40 || p[0] < 'a' || p[0] > 'z' {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// Backend is a driver.Backend, and a driver.Store, in one SQLite database
// file. Create one with New.
type Backend struct {
	cfg Config
	db  *sql.DB
	hub *hub
	q   queries

	obOnce sync.Once
	obq    outboxQueries

	seen sync.Map // queue -> struct{}: names this Backend wrote to the queues table

	// completed holds the deliveries a handler completed in its own
	// transaction (CompleteTx), until their settle: their row is gone (or
	// going) by the handler's doing, so Ack and Extend finding none is no
	// lost lease.
	completed sync.Map // handle -> struct{}

	stmts stmtCache // the Backend's statements, prepared once

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// New opens (or creates) the database file in WAL mode, creates the
// backend's tables when missing, and joins the process's wake-ups for
// that file.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	path, err := filepath.Abs(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("sqlite: Config.Path: %w", err)
	}
	cfg.Path = path
	db, err := sql.Open("sqlite", dsn(path, cfg.BusyTimeout))
	if err != nil {
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, err)
	}
	db.SetMaxOpenConns(cfg.MaxConns)
	db.SetMaxIdleConns(cfg.MaxConns)
	b := &Backend{cfg: cfg, db: db, q: makeQueries(cfg.Prefix)}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.hub, err = joinHub(path, cfg)
	if err != nil {
		db.Close()
		return nil, err
	}
	if err := b.migrate(ctx); err != nil {
		b.hub.leave()
		db.Close()
		return nil, err
	}
	b.wg.Add(1)
	go b.sweep()
	return b, nil
}

// dsn is the modernc.org/sqlite data source for path: WAL, the busy
// timeout, and explicit transactions that take the write lock at BEGIN
// (BEGIN IMMEDIATE), so a transaction never fails to upgrade its lock.
func dsn(path string, busy time.Duration) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Set("_txlock", "immediate")
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

// DB returns the Backend's connection pool, on which a caller opens the
// transactions it passes to WithTx: its transactions begin IMMEDIATE (they
// take the write lock at BEGIN). The Backend closes it on Close.
func (b *Backend) DB() *sql.DB { return b.db }

// Capabilities implements driver.Backend.
func (b *Backend) Capabilities() driver.Capabilities {
	return driver.Capabilities{MaxBody: b.cfg.MaxBody, MinLease: MinLease, DeadHold: b.cfg.DeadHold}
}

// Close leaves the wake-ups and closes the connections. Unsettled
// deliveries come back after their lease. It is idempotent.
func (b *Backend) Close() error {
	var err error
	b.once.Do(func() {
		b.cancel()
		b.wg.Wait()
		b.hub.leave()
		b.stmts.close()
		err = b.db.Close()
	})
	if err != nil {
		return fmt.Errorf("sqlite: close: %w", err)
	}
	return nil
}

func (b *Backend) check() error {
	if b.ctx.Err() != nil {
		return driver.ErrClosed
	}
	return nil
}

// Ping implements driver.Pinger.
func (b *Backend) Ping(ctx context.Context) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := b.db.PingContext(ctx); err != nil {
		return b.wrap("ping", err)
	}
	return nil
}

// Declare implements driver.Backend: it records the queue's name for
// Queues (within WithTx, in the caller's transaction).
func (b *Backend) Declare(ctx context.Context, queue string) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := b.write(ctx, func(c conn) error {
		_, err := c.ExecContext(ctx, b.q.declare, queue)
		return err
	}); err != nil {
		return b.wrap("declare "+queue, err)
	}
	return nil
}

// DeleteQueue implements driver.QueueDeleter.
func (b *Backend) DeleteQueue(ctx context.Context, queue string) error {
	if err := b.check(); err != nil {
		return err
	}
	err := b.write(ctx, func(c conn) error {
		for _, s := range []string{b.q.delJobs, b.q.delDead, b.q.delQueue} {
			if _, err := c.ExecContext(ctx, s, queue); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return b.wrap("delete queue "+queue, err)
	}
	b.seen.Delete(queue)
	return nil
}

// Queues implements driver.QueueLister: declared names, and those of the
// jobs and dead letters, each read from an index.
func (b *Backend) Queues(ctx context.Context) ([]string, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	rows, err := b.db.QueryContext(ctx, b.q.queues)
	if err != nil {
		return nil, b.wrap("queues", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, b.wrap("queues", err)
		}
		if driver.CheckQueue(n) == nil {
			out = append(out, n)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, b.wrap("queues", err)
	}
	return out, nil
}

// Stats implements driver.Backend. A job whose lease lapsed counts as
// ready.
func (b *Backend) Stats(ctx context.Context, queue string) (driver.Stats, error) {
	if err := b.check(); err != nil {
		return driver.Stats{}, err
	}
	var s driver.Stats
	var oldest int64 // ms; run_at of a ready job is when it became ready
	if err := b.pool().QueryRowContext(ctx, b.q.stats, queue).Scan(&s.Ready, &s.Scheduled, &s.InFlight, &s.Dead, &oldest); err != nil {
		return driver.Stats{}, b.wrap("stats "+queue, err)
	}
	if oldest > 0 {
		s.OldestReady = time.UnixMilli(oldest)
	}
	return s, nil
}

// wrap names the operation, and maps an error after Close to ErrClosed.
func (b *Backend) wrap(op string, err error) error {
	if b.ctx.Err() != nil && !errors.Is(err, driver.ErrLeaseLost) {
		return driver.ErrClosed
	}
	return fmt.Errorf("sqlite: %s: %w", op, err)
}

// errLost wraps ErrLeaseLost for op.
func errLost(op string) error { return fmt.Errorf("sqlite: %s: %w", op, driver.ErrLeaseLost) }
