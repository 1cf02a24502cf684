package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/asyncplatform/asyncplatform/backend/postgres"
)

// The PostgreSQL systems share the server of -postgres: ours and the raw
// loop in its database, in tables named after the run; River in a
// database of its own (riverDB), which the bench creates when missing, so
// its migrations never meet our tables.

// pgConns bounds each PostgreSQL system's pool: c=50 handlers, their lease
// renewals and the enqueuers.
const pgConns = 64

// riverDB is the database River's tables live in.
const riverDB = "bench_river"

// pgPrefix is the table prefix of our backend for a run's tag.
func pgPrefix(tag string) string {
	p := "bench_" + strings.ToLower(notTableByte.ReplaceAllString(tag, "_"))
	return p[:min(len(p), 40)]
}

// openPostgres opens our PostgreSQL backend on tables of the tag's own;
// cleanup drops them when owner is set.
func openPostgres(ctx context.Context, tag string, owner bool, srv servers) (*postgres.Backend, func(), error) {
	prefix := pgPrefix(tag)
	b, err := postgres.New(ctx, postgres.Config{URL: withPool(srv.Postgres, pgConns), Prefix: prefix, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() {}
	if owner {
		cleanup = func() { _ = dropPrefix(srv.Postgres, prefix) }
	}
	return b, cleanup, nil
}

// dropPrefix drops every table and sequence of our backend's prefix.
func dropPrefix(dsn, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `DROP TABLE IF EXISTS `+prefix+`_jobs, `+prefix+`_dead, `+prefix+`_queues, `+prefix+`_migrations, `+prefix+`_store, `+prefix+`_outbox, `+prefix+`_outbox_aside;
		DROP SEQUENCE IF EXISTS `+prefix+`_token, `+prefix+`_store_rev`)
	return err
}

// fillPostgresDead makes n dead letters of f's queue from one made by the
// platform: copies of its record, each with an ID of its own, written in
// one statement (a million through failing handlers would take the
// bench's whole run).
func fillPostgresDead(ctx context.Context, f *facade, n int, dsn string) error {
	if err := fill(ctx, f, 1); err != nil {
		return err
	}
	if err := dead(ctx, f, 1); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	p := pgPrefix(strings.TrimPrefix(f.queue, "bench-"))
	_, err = conn.Exec(ctx, `INSERT INTO `+p+`_dead (queue, rec_id, body)
		SELECT d.queue, d.rec_id || convert_to('-' || g, 'UTF8'), d.body FROM `+p+`_dead d, generate_series(2, $2) g WHERE d.queue = $1`, f.queue, n)
	if err != nil {
		return fmt.Errorf("copying the dead letter: %w", err)
	}
	_, err = conn.Exec(ctx, `VACUUM ANALYZE `+p+`_dead`)
	return err
}

// ---- raw: FOR UPDATE SKIP LOCKED on a table of its own ----

// rawPostgres is pgx alone, with our backend's durability: a committed
// INSERT per enqueue, a committed claim (lease and delivery count written
// before the handler runs) and a committed DELETE per job. An idle worker
// polls every rawPostgresIdle.
type rawPostgres struct {
	pool  *pgxpool.Pool
	table string
	batch int
}

const rawPostgresIdle = 5 * time.Millisecond

func newRawPostgres(ctx context.Context, dsn, tag string, batch int) (*rawPostgres, error) {
	pool, err := pgxpool.New(ctx, withPool(dsn, pgConns))
	if err != nil {
		return nil, err
	}
	table := "bench_raw_" + strings.ToLower(notTableByte.ReplaceAllString(tag, "_"))
	_, err = pool.Exec(ctx, `CREATE TABLE `+table+` (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		body bytea NOT NULL,
		run_at timestamptz NOT NULL DEFAULT now(),
		deliveries integer NOT NULL DEFAULT 0);
		CREATE INDEX ON `+table+` (run_at, id)`)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &rawPostgres{pool: pool, table: table, batch: batch}, nil
}

func (r *rawPostgres) enqueue(ctx context.Context, p []byte) error {
	_, err := r.pool.Exec(ctx, `INSERT INTO `+r.table+` (body) VALUES ($1)`, p)
	return err
}

func (r *rawPostgres) enqueueBatch(ctx context.Context, ps [][]byte) error {
	_, err := r.pool.Exec(ctx, `INSERT INTO `+r.table+` (body) SELECT unnest($1::bytea[])`, ps)
	return err
}

func (r *rawPostgres) consume(_ context.Context, c int, handle func([]byte)) (func(), error) {
	claim := `UPDATE ` + r.table + ` t SET run_at = clock_timestamp() + interval '30 seconds', deliveries = t.deliveries + 1
		FROM (SELECT id FROM ` + r.table + ` WHERE run_at <= now() ORDER BY run_at, id LIMIT $1 FOR UPDATE SKIP LOCKED) p
		WHERE t.id = p.id RETURNING t.id, t.body`
	ack := `DELETE FROM ` + r.table + ` WHERE id = ANY($1::bigint[])`
	return workers(c, func(ctx context.Context) {
		for ctx.Err() == nil {
			rows, err := r.pool.Query(ctx, claim, r.batch)
			if err != nil {
				continue
			}
			var ids []int64
			var bodies [][]byte
			var id int64
			var body []byte
			_, err = pgx.ForEachRow(rows, []any{&id, &body}, func() error {
				ids, bodies = append(ids, id), append(bodies, body)
				body = nil
				return nil
			})
			if err != nil || len(ids) == 0 {
				select {
				case <-ctx.Done():
				case <-time.After(rawPostgresIdle):
				}
				continue
			}
			for _, b := range bodies {
				handle(b)
			}
			_, _ = r.pool.Exec(context.Background(), ack, ids)
		}
	}), nil
}

func (r *rawPostgres) close() error {
	_, err := r.pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+r.table)
	r.pool.Close()
	return err
}

// ---- River v0.51.2, riverpgxv5 ----

// riverArgs is the bench job for River: the payload, base64 in its JSON.
type riverArgs struct {
	P []byte `json:"p"`
}

func (riverArgs) Kind() string { return "bench" }

// riverWorker hands each job's payload to the consume's handle.
type riverWorker struct {
	river.WorkerDefaults[riverArgs]
	handle func([]byte)
}

func (w *riverWorker) Work(_ context.Context, j *river.Job[riverArgs]) error {
	w.handle(j.Args.P)
	return nil
}

type riverSys struct {
	pool   *pgxpool.Pool
	client *river.Client[pgx.Tx] // insert-only
	queue  string
	fast   bool // FetchCooldown 1 ms, FetchPollInterval 100 ms
}

// riverURL is dsn with its database replaced by riverDB, which it creates
// when missing.
func riverURL(ctx context.Context, dsn string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, riverDB).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		if _, err := conn.Exec(ctx, `CREATE DATABASE `+riverDB); err != nil {
			return "", fmt.Errorf("creating the database %s: %w", riverDB, err)
		}
	}
	u.Path = "/" + riverDB
	return u.String(), nil
}

func openRiverFast(ctx context.Context, tag string, srv servers) (system, error) {
	s, err := openRiver(ctx, tag, srv)
	if err != nil {
		return nil, err
	}
	s.(*riverSys).fast = true
	return s, nil
}

func openRiver(ctx context.Context, tag string, srv servers) (system, error) {
	dsn, err := riverURL(ctx, srv.Postgres)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUnavailable, err)
	}
	pool, err := pgxpool.New(ctx, withPool(dsn, pgConns))
	if err != nil {
		return nil, err
	}
	// The bench's systems run one child process at a time, so no two
	// migrate at once.
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err == nil {
		_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	}
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("river migrations: %w", err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quiet})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &riverSys{pool: pool, client: client, queue: "bench-" + tag}, nil
}

func (r *riverSys) enqueue(ctx context.Context, p []byte) error {
	_, err := r.client.Insert(ctx, riverArgs{P: p}, &river.InsertOpts{Queue: r.queue})
	return err
}

func (r *riverSys) enqueueBatch(ctx context.Context, ps [][]byte) error {
	params := make([]river.InsertManyParams, len(ps))
	for i, p := range ps {
		params[i] = river.InsertManyParams{Args: riverArgs{P: p}, InsertOpts: &river.InsertOpts{Queue: r.queue}}
	}
	_, err := r.client.InsertMany(ctx, params)
	return err
}

func (r *riverSys) consume(ctx context.Context, c int, handle func([]byte)) (func(), error) {
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, &riverWorker{handle: handle}); err != nil {
		return nil, err
	}
	cfg := &river.Config{
		Logger:  quiet,
		Queues:  map[string]river.QueueConfig{r.queue: {MaxWorkers: c}},
		Workers: workers,
	}
	if r.fast {
		cfg.FetchCooldown, cfg.FetchPollInterval = time.Millisecond, 100*time.Millisecond
	}
	client, err := river.NewClient(riverpgxv5.New(r.pool), cfg)
	if err != nil {
		return nil, err
	}
	if err := client.Start(ctx); err != nil {
		return nil, err
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = client.Stop(sctx)
	}, nil
}

func (r *riverSys) close() error {
	_, err := r.pool.Exec(context.Background(), `DELETE FROM river_job WHERE queue = $1`, r.queue)
	_, err2 := r.pool.Exec(context.Background(), `DELETE FROM river_queue WHERE name = $1`, r.queue)
	r.pool.Close()
	return errors.Join(err, err2)
}
