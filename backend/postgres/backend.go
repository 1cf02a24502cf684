package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/pgstore"
)

// Defaults of Config.
const (
	DefaultPrefix    = "asyncplatform"
	DefaultDeadHold  = 30 * time.Second
	DefaultIdleWait  = time.Second
	DefaultMaxBody   = 1 << 20
	DefaultQueryWait = 30 * time.Second
	DefaultMaxConns  = 20
)

// URLEnv names the environment variable that an empty Config.URL falls
// back to (the same as pgstore's).
const URLEnv = pgstore.URLEnv

// MinLease is the shortest lease the backend honours (Capabilities.MinLease).
const MinLease = 50 * time.Millisecond

// maxClaim bounds the jobs one Receive hands out.
const maxClaim = 1000

// maxList bounds the records one ListDead returns, whatever its limit.
const maxList = 1000

// maxDeadID bounds a dead-letter record's ID, in bytes (a job's ID with a
// copy number is far shorter).
const maxDeadID = 4 << 10

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.QueueDeleter  = (*Backend)(nil)
	_ driver.QueueLister   = (*Backend)(nil)
	_ driver.Pinger        = (*Backend)(nil)
	_ driver.StoreProvider = (*Backend)(nil)
)

// Config configures a Backend.
type Config struct {
	// Pool is the connection pool for every statement but the wake-ups'
	// LISTEN. The Backend does not close it. Defaults to nil: New opens a
	// pool on URL, and Close closes it.
	Pool *pgxpool.Pool

	// URL is the connection string (a postgres:// URL or key=value pairs)
	// when Pool is nil. Defaults to $ASYNCPLATFORM_POSTGRES_URL (URLEnv),
	// or, when that is empty, to libpq's defaults and PG* environment
	// variables (read by pgx).
	URL string

	// MaxConns bounds the pool New opens when Pool is nil (pgx's own
	// default, four on a small machine, starves a worker whose handlers
	// renew their leases while others claim); a pool_max_conns parameter
	// in URL wins. Defaults to DefaultMaxConns (20).
	MaxConns int32

	// ListenURL is where the wake-ups' session connection goes (LISTEN
	// needs one: behind PgBouncer in transaction mode, point it at the
	// server itself or at a session-mode pool). Defaults to the pool's own
	// connection settings.
	ListenURL string

	// Prefix starts the names of the backend's tables, its sequence and
	// its notification channel: 1 to 40 bytes of [a-z0-9_], starting with
	// a letter. Defaults to DefaultPrefix ("asyncplatform").
	Prefix string

	// SkipMigrate leaves the schema alone in New: the tables must then be
	// at SchemaVersion already (asyncctl migrate, or Migrate). Defaults to
	// false: New applies the missing migrations.
	SkipMigrate bool

	// DeadHold is how long a dead letter handed out by NextDead stays held
	// without ExtendDead or SettleDead (Capabilities.DeadHold). Defaults to
	// DefaultDeadHold (30s).
	DeadHold time.Duration

	// IdleWait is the longest an idle Receive waits before it looks at the
	// queue again when no notification came: a safety net, at most a
	// second. Defaults to DefaultIdleWait (1s).
	IdleWait time.Duration

	// MaxBody is the largest message body, in bytes (Capabilities.MaxBody).
	// Defaults to DefaultMaxBody (1 MiB).
	MaxBody int

	// Logger receives the wake-up connection's errors. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.URL == "" && c.Pool == nil {
		c.URL = os.Getenv(URLEnv)
	}
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
	case !validPrefix(c.Prefix):
		return fmt.Errorf("postgres: Config.Prefix %q: want 1 to 40 bytes of [a-z0-9_], starting with a letter", c.Prefix)
	case c.DeadHold < 3*MinLease:
		return fmt.Errorf("postgres: Config.DeadHold %v: want at least %v", c.DeadHold, 3*MinLease)
	case c.IdleWait < 10*time.Millisecond || c.IdleWait > time.Second:
		return fmt.Errorf("postgres: Config.IdleWait %v: want 10ms to 1s", c.IdleWait)
	case c.MaxConns < 1:
		return fmt.Errorf("postgres: Config.MaxConns %d: want at least 1", c.MaxConns)
	case c.MaxBody < 0 || c.MaxBody > 1<<30-1:
		return fmt.Errorf("postgres: Config.MaxBody %d: want 0 to %d", c.MaxBody, 1<<30-1)
	}
	return nil
}

// Backend is a driver.Backend in PostgreSQL tables. Create one with New.
type Backend struct {
	cfg     Config
	pool    *pgxpool.Pool
	ownPool bool
	store   *pgstore.Store
	q       queries
	channel string
	wake    waker
	notes   notifier

	seen sync.Map // queue -> struct{}: names this Backend wrote to the queues table

	// completed holds the deliveries a handler completed in its own
	// transaction (CompleteTx), until their settle: their row is gone (or
	// going) by the handler's doing, so Ack and Extend finding none is no
	// lost lease.
	completed sync.Map // handle -> struct{}

	acks *acker // commits concurrent Acks together

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// New connects (when cfg.Pool is nil), applies the schema's missing
// migrations (unless cfg.SkipMigrate), opens the store (a pgstore table
// named Prefix+"_store") and the wake-ups' session connection, which it
// holds until Close and opens again when lost.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	pool, own := cfg.Pool, false
	if pool == nil {
		pc, err := pgxpool.ParseConfig(cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("postgres: Config.URL: %w", err)
		}
		if !strings.Contains(cfg.URL, "pool_max_conns") {
			pc.MaxConns = cfg.MaxConns
		}
		if pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return nil, fmt.Errorf("postgres: connecting: %w", err)
		}
		own = true
	}
	b, err := open(ctx, cfg, pool, own)
	if err != nil && own {
		pool.Close()
	}
	return b, err
}

func open(ctx context.Context, cfg Config, pool *pgxpool.Pool, own bool) (*Backend, error) {
	listenCfg := pool.Config().ConnConfig.Copy()
	if cfg.ListenURL != "" {
		c, err := pgx.ParseConfig(cfg.ListenURL)
		if err != nil {
			return nil, fmt.Errorf("postgres: Config.ListenURL: %w", err)
		}
		listenCfg = c
	}
	if !cfg.SkipMigrate {
		if err := Migrate(ctx, pool, cfg.Prefix); err != nil {
			return nil, err
		}
	}
	st, err := pgstore.New(ctx, pgstore.Config{Pool: pool, Table: cfg.Prefix + "_store", Logger: cfg.Logger, Conn: txOf})
	if err != nil {
		return nil, fmt.Errorf("postgres: the store: %w", err)
	}
	b := &Backend{cfg: cfg, pool: pool, ownPool: own, store: st, q: makeQueries(cfg.Prefix), channel: cfg.Prefix + "_wake"}
	b.wake.queue = map[string][]chan struct{}{}
	conn, err := b.listenConn(ctx, listenCfg)
	if err != nil {
		st.Close()
		return nil, err
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.acks = newAcker(b.deleteAcked)
	b.wg.Add(1)
	go b.listen(conn, listenCfg)
	return b, nil
}

// Capabilities implements driver.Backend.
func (b *Backend) Capabilities() driver.Capabilities {
	return driver.Capabilities{MaxBody: b.cfg.MaxBody, MinLease: MinLease, DeadHold: b.cfg.DeadHold}
}

// Store implements driver.StoreProvider: the pgstore table on the same
// database.
func (b *Backend) Store() (driver.Store, error) { return b.store, nil }

// Close stops the wake-ups, closes the store and, when New opened the
// pool, the pool. Unsettled deliveries come back after their lease. It is
// idempotent.
func (b *Backend) Close() error {
	b.once.Do(func() {
		b.cancel()
		b.wg.Wait()
		b.store.Close()
		if b.ownPool {
			b.pool.Close()
		}
	})
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
	if err := b.pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: ping: %w", err)
	}
	return nil
}

// Declare implements driver.Backend: it records the queue's name for
// Queues, on a connection of its own even within WithTx (two open
// transactions inserting the same name would wait for each other).
func (b *Backend) Declare(ctx context.Context, queue string) error {
	if err := b.check(); err != nil {
		return err
	}
	if _, err := b.pool.Exec(ctx, b.q.declare, queue); err != nil {
		return fmt.Errorf("postgres: declare %s: %w", queue, err)
	}
	return nil
}

// DeleteQueue implements driver.QueueDeleter.
func (b *Backend) DeleteQueue(ctx context.Context, queue string) error {
	if err := b.check(); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for _, s := range []string{b.q.delJobs, b.q.delDead, b.q.delQueue} {
			if _, err := tx.Exec(ctx, s, queue); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("postgres: delete queue %s: %w", queue, err)
	}
	b.seen.Delete(queue)
	return nil
}

// Queues implements driver.QueueLister: declared names, and those of the
// jobs and dead letters, each found by a skip scan of an index.
func (b *Backend) Queues(ctx context.Context) ([]string, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	rows, err := b.pool.Query(ctx, b.q.queues)
	if err != nil {
		return nil, fmt.Errorf("postgres: queues: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("postgres: queues: %w", err)
	}
	out := names[:0]
	for _, n := range names {
		if driver.CheckQueue(n) == nil {
			out = append(out, n)
		}
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
	var oldest *time.Time // run_at of a ready job is when it became ready
	err := b.pool.QueryRow(ctx, b.q.stats, queue).Scan(&s.Ready, &s.Scheduled, &s.InFlight, &s.Dead, &oldest)
	if err != nil {
		return driver.Stats{}, fmt.Errorf("postgres: stats %s: %w", queue, err)
	}
	if oldest != nil {
		s.OldestReady = *oldest
	}
	return s, nil
}

// queries are the statements, with the prefix in them.
type queries struct {
	declare, delJobs, delDead, delQueue, queues, stats                             string
	enqueue, enqueueQuiet, notify                                                  string
	claim, nextDue, unclaim, ack, ackMany, extend, requeue, deadLetter             string
	nextDead, extendDead, removeDead, releaseDead, listDead, deleteDead, purgeDead string
	browse                                                                         map[driver.BrowseState]string
	outboxQueries
}

func makeQueries(p string) queries {
	r := strings.NewReplacer("{{p}}", p)
	q := func(s string) string { return r.Replace(s) }
	const held = `token <> 0 AND run_at > now()`
	return queries{
		outboxQueries: makeOutboxQueries(q),
		browse:        makeBrowseQueries(q),
		declare:       q(`INSERT INTO {{p}}_queues (name) VALUES ($1) ON CONFLICT DO NOTHING`),
		delJobs:       q(`DELETE FROM {{p}}_jobs WHERE queue = $1`),
		delDead:       q(`DELETE FROM {{p}}_dead WHERE queue = $1`),
		delQueue:      q(`DELETE FROM {{p}}_queues WHERE name = $1`),
		queues: q(`WITH RECURSIVE
			j(q) AS (SELECT min(queue) FROM {{p}}_jobs UNION ALL SELECT (SELECT min(queue) FROM {{p}}_jobs WHERE queue > j.q) FROM j WHERE j.q IS NOT NULL),
			d(q) AS (SELECT min(queue) FROM {{p}}_dead UNION ALL SELECT (SELECT min(queue) FROM {{p}}_dead WHERE queue > d.q) FROM d WHERE d.q IS NOT NULL)
			SELECT q FROM j WHERE q IS NOT NULL UNION SELECT q FROM d WHERE q IS NOT NULL UNION SELECT name FROM {{p}}_queues ORDER BY 1`),
		stats: q(`SELECT
			count(*) FILTER (WHERE run_at <= now()),
			count(*) FILTER (WHERE token = 0 AND run_at > now()),
			count(*) FILTER (WHERE token <> 0 AND run_at > now()),
			(SELECT count(*) FROM {{p}}_dead WHERE queue = $1),
			min(run_at) FILTER (WHERE run_at <= now())
			FROM {{p}}_jobs WHERE queue = $1`),
		enqueue: q(`WITH ins AS (
				INSERT INTO {{p}}_jobs (queue, body, run_at)
				SELECT $1, u.b, greatest(u.t, now()) FROM unnest($2::bytea[], $3::timestamptz[]) WITH ORDINALITY AS u(b, t, n) ORDER BY u.n
				RETURNING run_at)
			SELECT pg_notify($4, c.n || ' ' || $1) FROM (SELECT count(*) AS n FROM ins WHERE run_at <= now()) c WHERE c.n > 0`),
		claim: q(`WITH picked AS (
				SELECT id, run_at FROM {{p}}_jobs WHERE queue = $1 AND run_at <= now() ORDER BY run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED),
			claimed AS (
				UPDATE {{p}}_jobs j SET token = nextval('{{p}}_token'), deliveries = j.deliveries + 1, run_at = clock_timestamp() + $3 * interval '1 microsecond'
				FROM picked WHERE j.id = picked.id
				RETURNING j.id, j.token, substring(j.body FROM 1 FOR $4) AS body, j.deliveries, picked.run_at AS due)
			SELECT id, token, body, deliveries FROM claimed ORDER BY due, id`),
		enqueueQuiet: q(`WITH ins AS (
				INSERT INTO {{p}}_jobs (queue, body, run_at)
				SELECT $1, u.b, greatest(u.t, now()) FROM unnest($2::bytea[], $3::timestamptz[]) WITH ORDINALITY AS u(b, t, n) ORDER BY u.n
				RETURNING run_at)
			SELECT count(*) FROM ins WHERE run_at <= now()`),
		notify:  q(`SELECT pg_notify($1, u.n || ' ' || u.q) FROM unnest($2::text[], $3::int[]) AS u(q, n)`),
		nextDue: q(`SELECT extract(epoch FROM min(run_at) - now()) FROM {{p}}_jobs WHERE queue = $1 AND run_at > now()`),
		unclaim: q(`WITH u AS (
				UPDATE {{p}}_jobs SET token = 0, deliveries = deliveries - 1, run_at = now()
				WHERE id = ANY($1::bigint[]) AND token = ANY($2::bigint[]) RETURNING queue)
			SELECT pg_notify($3, count(*) || ' ' || queue) FROM u GROUP BY queue`),
		ack: q(`DELETE FROM {{p}}_jobs WHERE id = $1 AND token = $2 AND ` + held),
		ackMany: q(`DELETE FROM {{p}}_jobs j USING unnest($1::bigint[], $2::bigint[]) AS u(id, token)
			WHERE j.id = u.id AND j.token = u.token AND j.token <> 0 AND j.run_at > now() RETURNING j.id, j.token`),
		extend: q(`UPDATE {{p}}_jobs SET run_at = clock_timestamp() + $3 * interval '1 microsecond' WHERE id = $1 AND token = $2 AND ` + held),
		requeue: q(`WITH u AS (
				UPDATE {{p}}_jobs SET body = $3, run_at = greatest($4, now()), deliveries = 0, token = 0
				WHERE id = $1 AND token = $2 AND ` + held + ` RETURNING queue, run_at)
			SELECT CASE WHEN run_at <= now() THEN pg_notify($5, '1 ' || queue) END FROM u`),
		deadLetter: q(`WITH d AS (DELETE FROM {{p}}_jobs WHERE id = $1 AND token = $2 AND ` + held + ` RETURNING queue)
			INSERT INTO {{p}}_dead (queue, rec_id, body) SELECT queue, $3, $4 FROM d`),
		nextDead: q(`UPDATE {{p}}_dead SET token = nextval('{{p}}_token'), held_until = clock_timestamp() + $2 * interval '1 microsecond'
			WHERE id = (SELECT id FROM {{p}}_dead WHERE queue = $1 AND (held_until IS NULL OR held_until <= now()) ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
			RETURNING id, token, substring(rec_id FROM 1 FOR $3), substring(body FROM 1 FOR $4)`),
		extendDead:  q(`UPDATE {{p}}_dead SET held_until = clock_timestamp() + $3 * interval '1 microsecond' WHERE id = $1 AND token = $2 AND held_until > now()`),
		removeDead:  q(`DELETE FROM {{p}}_dead WHERE id = $1 AND token = $2 AND held_until > now()`),
		releaseDead: q(`UPDATE {{p}}_dead SET held_until = NULL, token = 0 WHERE id = $1 AND token = $2 AND held_until > now()`),
		listDead:    q(`SELECT id, substring(rec_id FROM 1 FOR $4), substring(body FROM 1 FOR $5) FROM {{p}}_dead WHERE queue = $1 AND id > $2 ORDER BY id LIMIT $3`),
		deleteDead:  q(`DELETE FROM {{p}}_dead WHERE queue = $1 AND rec_id = ANY($2::bytea[]) AND (held_until IS NULL OR held_until <= now())`),
		purgeDead:   q(`DELETE FROM {{p}}_dead WHERE queue = $1`),
	}
}

// errLost wraps ErrLeaseLost for op.
func errLost(op string) error { return fmt.Errorf("postgres: %s: %w", op, driver.ErrLeaseLost) }

// isClosed maps an error after Close to ErrClosed.
func (b *Backend) wrap(op string, err error) error {
	if b.ctx.Err() != nil && !errors.Is(err, driver.ErrLeaseLost) {
		return driver.ErrClosed
	}
	return fmt.Errorf("postgres: %s: %w", op, err)
}
