// Package pgstore is an asyncplatform store (driver.Store) in a PostgreSQL
// table: the companion store for RabbitMQ, which keeps no state of its own,
// and for anyone who already runs PostgreSQL.
//
//	st, err := pgstore.New(ctx, pgstore.Config{URL: "postgres://app@db/app"})
//	defer st.Close()
//	b, err := rabbit.New(ctx, rabbit.Config{Store: st})
//
// # Layout
//
// One table (Config.Table, "asyncplatform_store" by default) and a sequence
// beside it, both made by New when absent:
//
//	CREATE TABLE <table> (
//	    key        text COLLATE "C" PRIMARY KEY,  -- byte order, for List
//	    value      bytea NOT NULL,
//	    rev        bigint NOT NULL,               -- nextval('<table>_rev')
//	    expires_at timestamptz                    -- NULL: never
//	);
//
// Every operation is one statement in a transaction of its own: Create is
// an INSERT ... ON CONFLICT DO UPDATE that only takes the place of an
// expired row (and writes nothing, so waits for no WAL flush, when it
// finds a live one: a semaphore's failed tries are reads), Update and Delete at a revision are conditional on the row's
// rev. Revisions come from the sequence, so no revision is ever given
// twice. Several platforms can share the table: their keys are namespaced
// (asyncplatform.Store, and the RabbitMQ backend's prefix).
//
// # TTLs
//
// Expiry is judged by the server's clock (now()): a row is present while
// now() < expires_at. Expired rows are absent at once, and deleted by a
// sweep every Config.SweepInterval (a thousand rows per statement).
//
// # Limits
//
// Those of every store (asyncplatform.Store): keys up to 512 bytes with the
// namespace, values up to 64 KiB. A Store is safe for concurrent use; its
// durability is PostgreSQL's (a write is committed before it returns).
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Defaults of Config.
const (
	DefaultTable         = "asyncplatform_store"
	DefaultSweepInterval = time.Minute
)

// URLEnv names the environment variable that an empty Config.URL falls
// back to: the only one the store itself reads, in New.
const URLEnv = "ASYNCPLATFORM_POSTGRES_URL"

// sweepBatch is how many expired rows one sweep statement deletes.
const sweepBatch = 1000

// Config configures a Store.
type Config struct {
	// Pool is the connection pool to use. The Store does not close it.
	// Defaults to nil: New opens a pool on URL, and Close closes it.
	Pool *pgxpool.Pool

	// URL is the connection string (a postgres:// URL or key=value pairs)
	// when Pool is nil. Defaults to $ASYNCPLATFORM_POSTGRES_URL (URLEnv),
	// or, when that is empty, to libpq's defaults and PG* environment
	// variables (read by pgx).
	URL string

	// Table is the table's name: 1 to 50 bytes of [a-z0-9_], not starting
	// with a digit. Its sequence is Table+"_rev". Defaults to DefaultTable.
	Table string

	// SweepInterval is how often expired rows are deleted. Defaults to
	// DefaultSweepInterval.
	SweepInterval time.Duration

	// Logger receives sweep errors. Defaults to slog.Default().
	Logger *slog.Logger

	// Conn, when set, returns the connection a call's context asks the
	// store to use instead of the pool (a caller's open transaction, so
	// that the store's writes commit or roll back with it), or nil for
	// the pool. The sweep always uses the pool. Defaults to nil: every
	// call uses the pool.
	Conn func(ctx context.Context) DB
}

// DB runs statements: a pool, a connection or a transaction (pgx.Tx and
// *pgxpool.Pool are DBs).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (c Config) withDefaults() Config {
	if c.URL == "" {
		c.URL = os.Getenv(URLEnv)
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	if !validTable(c.Table) {
		return fmt.Errorf("pgstore: Config.Table %q: want 1 to 50 bytes of [a-z0-9_], not starting with a digit", c.Table)
	}
	if c.SweepInterval < 10*time.Millisecond {
		return fmt.Errorf("pgstore: Config.SweepInterval %v: want at least 10ms", c.SweepInterval)
	}
	return nil
}

func validTable(s string) bool {
	if s == "" || len(s) > 50 || '0' <= s[0] && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Store is a driver.Store in a PostgreSQL table. Create one with New.
type Store struct {
	pool    *pgxpool.Pool
	conn    func(ctx context.Context) DB
	ownPool bool
	log     *slog.Logger
	q       queries

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

var (
	_ driver.Store        = (*Store)(nil)
	_ driver.StoreBatcher = (*Store)(nil)
	_ driver.StoreCounter = (*Store)(nil)
)

// queries are the statements, with the table's name in them.
type queries struct {
	get, create, update, del, delAt, list, sweep     string
	getEach, createEach, deleteEach, listEach, count string
	updateEach, delValue, delValueEach               string
}

// readValue bounds a value read off the table (anyone can write a row):
// one longer than driver.MaxValueLen, which the store never writes, is
// read cut to MaxValueLen+1 bytes.
var readValue = strconv.Itoa(driver.MaxValueLen + 1)

func makeQueries(t string) queries {
	const live = `(expires_at IS NULL OR expires_at > now())`
	exp := func(arg string) string {
		return `CASE WHEN ` + arg + `::bigint > 0 THEN now() + ` + arg + `::bigint * interval '1 millisecond' END`
	}
	return queries{
		get: `SELECT substring(value FROM 1 FOR ` + readValue + `), rev FROM ` + t + ` WHERE key = $1 AND ` + live,
		create: `INSERT INTO ` + t + ` AS t (key, value, rev, expires_at)
			SELECT $1, $2, nextval('` + t + `_rev'), ` + exp("$3") + ` WHERE NOT EXISTS (SELECT 1 FROM ` + t + ` WHERE key = $1 AND ` + live + `)
			ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, rev = EXCLUDED.rev, expires_at = EXCLUDED.expires_at
			WHERE t.expires_at IS NOT NULL AND t.expires_at <= now()
			RETURNING rev`,
		update: `UPDATE ` + t + ` SET value = $2, rev = nextval('` + t + `_rev'), expires_at = ` + exp("$4") + `
			WHERE key = $1 AND rev = $3 AND ` + live + ` RETURNING rev`,
		del:   `DELETE FROM ` + t + ` WHERE key = $1`,
		delAt: `DELETE FROM ` + t + ` WHERE key = $1 AND rev = $2 AND ` + live,
		list: `SELECT key FROM ` + t + ` WHERE key >= $1 COLLATE "C" AND ($2 = '' OR key < $2 COLLATE "C") AND key > $3 COLLATE "C" AND ` + live + `
			ORDER BY key LIMIT $4`,
		sweep:   `DELETE FROM ` + t + ` WHERE key IN (SELECT key FROM ` + t + ` WHERE expires_at <= now() LIMIT ` + strconv.Itoa(sweepBatch) + `)`,
		getEach: `SELECT key, substring(value FROM 1 FOR ` + readValue + `), rev FROM ` + t + ` WHERE key = ANY($1::text[]) AND ` + live,
		createEach: `INSERT INTO ` + t + ` AS t (key, value, rev, expires_at)
			SELECT u.k, u.v, nextval('` + t + `_rev'), ` + exp("u.ttl") + ` FROM unnest($1::text[], $2::bytea[], $3::bigint[]) AS u(k, v, ttl)
			ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, rev = EXCLUDED.rev, expires_at = EXCLUDED.expires_at
			WHERE t.expires_at IS NOT NULL AND t.expires_at <= now()
			RETURNING key, rev`,
		updateEach: `UPDATE ` + t + ` AS t SET value = u.v, rev = nextval('` + t + `_rev'), expires_at = ` + exp("u.ttl") + `
			FROM unnest($1::text[], $2::bytea[], $3::bigint[], $4::bigint[]) AS u(k, v, r, ttl)
			WHERE t.key = u.k AND t.rev = u.r AND ` + live + ` RETURNING t.key, t.rev`,
		// A rev of 0 deletes whatever is there; another, the row at that
		// rev while it is live.
		deleteEach: `DELETE FROM ` + t + ` AS t USING unnest($1::text[], $2::bigint[]) AS u(k, r)
			WHERE t.key = u.k AND (u.r = 0 OR t.rev = u.r AND ` + live + `) RETURNING t.key`,
		// A rev of 0 deletes the live row whatever its rev; another, the
		// live row at that rev; either only when it holds the value.
		delValue: `DELETE FROM ` + t + ` WHERE key = $1 AND ($2::bigint = 0 OR rev = $2) AND value = $3 AND ` + live,
		delValueEach: `DELETE FROM ` + t + ` AS t USING unnest($1::text[], $2::bigint[], $3::bytea[]) AS u(k, r, v)
			WHERE t.key = u.k AND (u.r = 0 OR t.rev = u.r) AND t.value = u.v AND ` + live + ` RETURNING t.key`,
		listEach: `SELECT u.i, l.key FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(p, hi, i)
			CROSS JOIN LATERAL (SELECT key FROM ` + t + ` WHERE key >= u.p COLLATE "C" AND key < u.hi COLLATE "C" AND ` + live + `
				ORDER BY key LIMIT $3) AS l
			ORDER BY u.i, l.key`,
		count: `SELECT count(*) FROM ` + t + ` WHERE key >= $1 COLLATE "C" AND ($2 = '' OR key < $2 COLLATE "C") AND ` + live,
	}
}

// New connects (when cfg.Pool is nil), makes the table and its sequence when
// they are absent, and starts the sweep of expired rows.
func New(ctx context.Context, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	pool, own := cfg.Pool, false
	if pool == nil {
		pc, err := pgxpool.ParseConfig(cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("pgstore: Config.URL: %w", err)
		}
		if pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return nil, fmt.Errorf("pgstore: connecting: %w", err)
		}
		own = true
	}
	if err := ensureTable(ctx, pool, cfg.Table); err != nil {
		if own {
			pool.Close()
		}
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &Store{pool: pool, conn: cfg.Conn, ownPool: own, log: cfg.Logger, q: makeQueries(cfg.Table), ctx: sctx, cancel: cancel}
	s.wg.Add(1)
	go s.sweeper(cfg.SweepInterval)
	return s, nil
}

// ensureTable makes the table, its sequence and its expiry index, under an
// advisory lock so that processes starting together do not collide.
func ensureTable(ctx context.Context, pool *pgxpool.Pool, t string) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('asyncplatform pgstore ' || $1))`, t); err != nil {
			return err
		}
		for _, stmt := range []string{
			`CREATE TABLE IF NOT EXISTS ` + t + ` (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL, rev bigint NOT NULL, expires_at timestamptz)`,
			`CREATE SEQUENCE IF NOT EXISTS ` + t + `_rev`,
			`CREATE INDEX IF NOT EXISTS ` + t + `_expires ON ` + t + ` (expires_at) WHERE expires_at IS NOT NULL`,
		} {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgstore: making the table %s: %w", t, err)
	}
	return nil
}

func (s *Store) sweeper(every time.Duration) {
	defer s.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		if _, err := s.Sweep(s.ctx); err != nil && s.ctx.Err() == nil {
			s.log.Warn("pgstore: sweeping expired rows", "err", err)
		}
	}
}

// Sweep deletes every expired row now and returns how many it deleted. The
// Store also runs it every Config.SweepInterval.
func (s *Store) Sweep(ctx context.Context) (int64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	var n int64
	for {
		tag, err := s.pool.Exec(ctx, s.q.sweep)
		if err != nil {
			return n, fmt.Errorf("pgstore: sweep: %w", err)
		}
		n += tag.RowsAffected()
		if tag.RowsAffected() < sweepBatch {
			return n, nil
		}
	}
}

// Close stops the sweep and, when New opened the pool, closes it. Methods
// called after it return driver.ErrClosed. It is idempotent.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.cancel()
		s.wg.Wait()
		if s.ownPool {
			s.pool.Close()
		}
	})
	return nil
}

func (s *Store) check() error {
	if s.ctx.Err() != nil {
		return driver.ErrClosed
	}
	return nil
}

// Ping checks the connection to PostgreSQL.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("pgstore: ping: %w", err)
	}
	return nil
}

// db returns the connection ctx asks for (Config.Conn), or the pool.
func (s *Store) db(ctx context.Context) DB {
	if s.conn != nil {
		if d := s.conn(ctx); d != nil {
			return d
		}
	}
	return s.pool
}

// parseRev returns the rev column of a revision; ok is false for one this
// store cannot have made.
func parseRev(rev string) (int64, bool) {
	n, err := strconv.ParseInt(rev, 10, 64)
	return n, err == nil && n > 0
}

// Get implements driver.Store.
func (s *Store) Get(ctx context.Context, key string) ([]byte, string, error) {
	if err := s.check(); err != nil {
		return nil, "", err
	}
	var (
		v   []byte
		rev int64
	)
	err := s.db(ctx).QueryRow(ctx, s.q.get, key).Scan(&v, &rev)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, "", driver.ErrKeyNotFound
	}
	if err != nil {
		return nil, "", fmt.Errorf("pgstore: get: %w", err)
	}
	if v == nil {
		v = []byte{}
	}
	return v, strconv.FormatInt(rev, 10), nil
}

// Create implements driver.Store.
func (s *Store) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	if err := s.check(); err != nil {
		return "", err
	}
	var rev int64
	err := s.db(ctx).QueryRow(ctx, s.q.create, key, nonNil(value), ttl.Milliseconds()).Scan(&rev)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", driver.ErrKeyExists
	}
	if err != nil {
		return "", fmt.Errorf("pgstore: create: %w", err)
	}
	return strconv.FormatInt(rev, 10), nil
}

// Update implements driver.Store.
func (s *Store) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	if err := s.check(); err != nil {
		return "", err
	}
	old, ok := parseRev(rev)
	if !ok {
		return "", driver.ErrRevision
	}
	var nrev int64
	err := s.db(ctx).QueryRow(ctx, s.q.update, key, nonNil(value), old, ttl.Milliseconds()).Scan(&nrev)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", driver.ErrRevision
	}
	if err != nil {
		return "", fmt.Errorf("pgstore: update: %w", err)
	}
	return strconv.FormatInt(nrev, 10), nil
}

// Delete implements driver.Store.
func (s *Store) Delete(ctx context.Context, key, rev string) error {
	if err := s.check(); err != nil {
		return err
	}
	if rev == "" {
		if _, err := s.db(ctx).Exec(ctx, s.q.del, key); err != nil {
			return fmt.Errorf("pgstore: delete: %w", err)
		}
		return nil
	}
	old, ok := parseRev(rev)
	if !ok {
		return driver.ErrRevision
	}
	tag, err := s.db(ctx).Exec(ctx, s.q.delAt, key, old)
	if err != nil {
		return fmt.Errorf("pgstore: delete: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return driver.ErrRevision
	}
	return nil
}

// List implements driver.Store.
func (s *Store) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rows, err := s.db(ctx).Query(ctx, s.q.list, prefix, upperBound(prefix), after, limit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: list: %w", err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("pgstore: list: %w", err)
	}
	return keys, nil
}

// upperBound returns the key every key with prefix sorts below (empty:
// none). Keys are ASCII: it is the prefix with its last byte raised by one.
func upperBound(prefix string) string {
	if prefix == "" {
		return ""
	}
	return prefix[:len(prefix)-1] + string(prefix[len(prefix)-1]+1)
}

// GetEach implements driver.StoreBatcher: one statement.
func (s *Store) GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rows, err := s.db(ctx).Query(ctx, s.q.getEach, keys)
	if err != nil {
		return nil, fmt.Errorf("pgstore: get each: %w", err)
	}
	type row struct {
		value []byte
		rev   int64
	}
	found := make(map[string]row, len(keys))
	var (
		k string
		r row
	)
	_, err = pgx.ForEachRow(rows, []any{&k, &r.value, &r.rev}, func() error {
		found[k] = r
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: get each: %w", err)
	}
	out := make([]driver.BatchResult, len(keys))
	for i, k := range keys {
		r, ok := found[k]
		if !ok {
			out[i].Err = driver.ErrKeyNotFound
			continue
		}
		out[i] = driver.BatchResult{Value: nonNil(r.value), Rev: strconv.FormatInt(r.rev, 10)}
	}
	return out, nil
}

// CreateEach implements driver.StoreBatcher: one statement, one commit.
func (s *Store) CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	keys := make([]string, len(items))
	values := make([][]byte, len(items))
	ttls := make([]int64, len(items))
	for i, it := range items {
		keys[i], values[i], ttls[i] = it.Key, nonNil(it.Value), it.TTL.Milliseconds()
	}
	rows, err := s.db(ctx).Query(ctx, s.q.createEach, keys, values, ttls)
	if err != nil {
		return nil, fmt.Errorf("pgstore: create each: %w", err)
	}
	made := make(map[string]int64, len(items))
	var (
		k   string
		rev int64
	)
	_, err = pgx.ForEachRow(rows, []any{&k, &rev}, func() error {
		made[k] = rev
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: create each: %w", err)
	}
	out := make([]driver.BatchResult, len(items))
	for i, k := range keys {
		rev, ok := made[k]
		if !ok {
			out[i].Err = driver.ErrKeyExists
			continue
		}
		out[i].Rev = strconv.FormatInt(rev, 10)
	}
	return out, nil
}

var _ driver.StoreBatchUpdater = (*Store)(nil)

// UpdateEach implements driver.StoreBatchUpdater: one statement, one
// commit.
func (s *Store) UpdateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	out := make([]driver.BatchResult, len(items))
	var (
		keys   []string
		values [][]byte
		revs   []int64
		ttls   []int64
	)
	for i, it := range items {
		rev, ok := parseRev(it.Rev)
		if !ok {
			out[i].Err = driver.ErrRevision
			continue
		}
		keys, values = append(keys, it.Key), append(values, nonNil(it.Value))
		revs, ttls = append(revs, rev), append(ttls, it.TTL.Milliseconds())
	}
	if len(keys) == 0 {
		return out, nil
	}
	rows, err := s.db(ctx).Query(ctx, s.q.updateEach, keys, values, revs, ttls)
	if err != nil {
		return nil, fmt.Errorf("pgstore: update each: %w", err)
	}
	written := make(map[string]int64, len(keys))
	var (
		k   string
		rev int64
	)
	_, err = pgx.ForEachRow(rows, []any{&k, &rev}, func() error {
		written[k] = rev
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: update each: %w", err)
	}
	for i, it := range items {
		if out[i].Err != nil {
			continue
		}
		rev, ok := written[it.Key]
		if !ok {
			out[i].Err = driver.ErrRevision
			continue
		}
		out[i].Rev = strconv.FormatInt(rev, 10)
	}
	return out, nil
}

// DeleteEach implements driver.StoreBatcher: one statement, one commit.
func (s *Store) DeleteEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	out := make([]driver.BatchResult, len(items))
	var (
		keys []string
		revs []int64
	)
	for i, it := range items {
		var rev int64
		if it.Rev != "" {
			var ok bool
			if rev, ok = parseRev(it.Rev); !ok {
				out[i].Err = driver.ErrRevision
				continue
			}
		}
		keys, revs = append(keys, it.Key), append(revs, rev)
	}
	if len(keys) == 0 {
		return out, nil
	}
	rows, err := s.db(ctx).Query(ctx, s.q.deleteEach, keys, revs)
	if err != nil {
		return nil, fmt.Errorf("pgstore: delete each: %w", err)
	}
	gone, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("pgstore: delete each: %w", err)
	}
	deleted := make(map[string]bool, len(gone))
	for _, k := range gone {
		deleted[k] = true
	}
	for i, it := range items {
		if it.Rev != "" && !deleted[it.Key] {
			out[i].Err = driver.ErrRevision
		}
	}
	return out, nil
}

var (
	_ driver.StoreValueDeleter      = (*Store)(nil)
	_ driver.StoreBatchValueDeleter = (*Store)(nil)
)

// DeleteValue implements driver.StoreValueDeleter: one statement.
func (s *Store) DeleteValue(ctx context.Context, key, rev string, value []byte) error {
	if err := s.check(); err != nil {
		return err
	}
	var r int64
	if rev != "" {
		var ok bool
		if r, ok = parseRev(rev); !ok {
			return driver.ErrRevision
		}
	}
	tag, err := s.db(ctx).Exec(ctx, s.q.delValue, key, r, nonNil(value))
	if err != nil {
		return fmt.Errorf("pgstore: delete value: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return driver.ErrRevision
	}
	return nil
}

// DeleteValueEach implements driver.StoreBatchValueDeleter: one statement,
// one commit.
func (s *Store) DeleteValueEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	out := make([]driver.BatchResult, len(items))
	var (
		keys   []string
		revs   []int64
		values [][]byte
	)
	for i, it := range items {
		var rev int64
		if it.Rev != "" {
			var ok bool
			if rev, ok = parseRev(it.Rev); !ok {
				out[i].Err = driver.ErrRevision
				continue
			}
		}
		keys, revs, values = append(keys, it.Key), append(revs, rev), append(values, nonNil(it.Value))
	}
	if len(keys) == 0 {
		return out, nil
	}
	rows, err := s.db(ctx).Query(ctx, s.q.delValueEach, keys, revs, values)
	if err != nil {
		return nil, fmt.Errorf("pgstore: delete value each: %w", err)
	}
	gone, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("pgstore: delete value each: %w", err)
	}
	deleted := make(map[string]bool, len(gone))
	for _, k := range gone {
		deleted[k] = true
	}
	for i, it := range items {
		if out[i].Err == nil && !deleted[it.Key] {
			out[i].Err = driver.ErrRevision
		}
	}
	return out, nil
}

// ListEach implements driver.StoreBatcher: one statement.
func (s *Store) ListEach(ctx context.Context, prefixes []string, limit int) ([][]string, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	// Both bounds in every row, so that each look-up is an index range
	// scan: keys are of the key grammar, every byte below 0x7f.
	uppers := make([]string, len(prefixes))
	for i, p := range prefixes {
		if uppers[i] = upperBound(p); uppers[i] == "" {
			uppers[i] = "\x7f"
		}
	}
	rows, err := s.db(ctx).Query(ctx, s.q.listEach, prefixes, uppers, limit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: list each: %w", err)
	}
	out := make([][]string, len(prefixes))
	var (
		i int64
		k string
	)
	_, err = pgx.ForEachRow(rows, []any{&i, &k}, func() error {
		if i < 1 || int(i) > len(prefixes) {
			return fmt.Errorf("row of prefix %d of %d", i, len(prefixes))
		}
		out[i-1] = append(out[i-1], k)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: list each: %w", err)
	}
	return out, nil
}

// Count implements driver.StoreCounter: one statement.
func (s *Store) Count(ctx context.Context, prefix string) (int64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	var n int64
	if err := s.db(ctx).QueryRow(ctx, s.q.count, prefix, upperBound(prefix)).Scan(&n); err != nil {
		return 0, fmt.Errorf("pgstore: count: %w", err)
	}
	return n, nil
}

// nonNil keeps an empty value from being written as NULL.
func nonNil(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}
