package postgres

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/asyncplatform/asyncplatform/driver"
)

// seeds write, in the layout of each earlier schema version, one of every
// kind of row: a job waiting, one scheduled, one out on a lease, a dead
// letter free and one held, a declared queue with nothing in it, and the
// token sequence past the tokens in use. A new migration adds the seed of
// the version before it.
var seeds = map[int]func(ctx context.Context, pool *pgxpool.Pool, p string) error{
	1: func(ctx context.Context, pool *pgxpool.Pool, p string) error {
		_, err := pool.Exec(ctx, `
			INSERT INTO `+p+`_jobs (queue, body, run_at, deliveries, token) VALUES
				('up', 'ready', now() - interval '1 second', 0, 0),
				('up', 'later', now() + interval '1 hour', 0, 0),
				('up', 'leased', now() + interval '1 hour', 2, 77);
			INSERT INTO `+p+`_dead (queue, rec_id, body, held_until, token) VALUES
				('up', 'd1', 'dead one', NULL, 0),
				('up', 'd2', 'dead two', now() + interval '1 hour', 99);
			INSERT INTO `+p+`_queues (name) VALUES ('up'), ('declared');
			SELECT setval('`+p+`_token', 1000)`)
		return err
	},
}

// Versions 2 and 3 changed indexes and added tables: the rows of version 1
// are the rows of both.
func init() { seeds[2] = seeds[1] }

// TestUpgradeKeepsData applies each earlier schema version, writes a row
// of every kind in its layout, upgrades to SchemaVersion and reads every
// row back through the backend, each in the state it was left in.
func TestUpgradeKeepsData(t *testing.T) {
	t.Parallel()
	reachable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	latest := SchemaVersion()
	if latest < 2 {
		t.Fatalf("SchemaVersion %d: nothing to upgrade from", latest)
	}
	pool, err := pgxpool.New(ctx, testURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for v := 1; v < latest; v++ {
		seed, ok := seeds[v]
		if !ok {
			t.Fatalf("no seed for schema version %d: add one to seeds", v)
		}
		p := testPrefix(t, "up"+string(rune('a'+v-1)))
		if err := migrateTo(ctx, pool, p, v); err != nil {
			t.Fatal(err)
		}
		if got, err := Version(ctx, pool, p); err != nil || got != v {
			t.Fatalf("after migrating to version %d: Version %d, %v", v, got, err)
		}
		if err := seed(ctx, pool, p); err != nil {
			t.Fatalf("seeding version %d: %v", v, err)
		}
		b, err := New(ctx, Config{Pool: pool, Prefix: p, DeadHold: time.Minute})
		if err != nil {
			t.Fatalf("upgrading from version %d: %v", v, err)
		}
		checkSeeded(ctx, t, b, pool, v)
		b.Close()
	}
}

// checkSeeded reads back what the seeds wrote, through b.
func checkSeeded(ctx context.Context, t *testing.T, b *Backend, pool *pgxpool.Pool, from int) {
	t.Helper()
	if got, err := Version(ctx, pool, b.cfg.Prefix); err != nil || got != SchemaVersion() {
		t.Fatalf("from version %d: Version %d after New, %v; want %d", from, got, err, SchemaVersion())
	}
	st, err := b.Stats(ctx, "up")
	if err != nil {
		t.Fatal(err)
	}
	if st.OldestReady.IsZero() {
		t.Errorf("from version %d: Stats.OldestReady is zero with a job ready", from)
	}
	st.OldestReady = time.Time{}
	if want := (driver.Stats{Ready: 1, Scheduled: 1, InFlight: 1, Dead: 2}); st != want {
		t.Errorf("from version %d: Stats %+v, want %+v", from, st, want)
	}
	qs, err := b.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(qs, "up") || !slices.Contains(qs, "declared") {
		t.Errorf("from version %d: Queues %v, want up and declared among them", from, qs)
	}
	ds, err := b.Receive(ctx, "up", 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || string(ds[0].Body) != "ready" || ds[0].Deliveries != 1 {
		t.Fatalf("from version %d: claimed %d deliveries (%+v), want the waiting job once", from, len(ds), ds)
	}
	if h := ds[0].Handle.(handle); h.token <= 1000 {
		t.Errorf("from version %d: a claim's token %d, want one past the sequence's 1000", from, h.token)
	}
	if err := b.Ack(ctx, ds[0]); err != nil {
		t.Errorf("from version %d: Ack: %v", from, err)
	}
	recs, _, err := b.ListDead(ctx, "up", "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].ID != "d1" || string(recs[0].Body) != "dead one" || recs[1].ID != "d2" || string(recs[1].Body) != "dead two" {
		t.Errorf("from version %d: dead letters %+v, want d1 and d2 with their bodies", from, recs)
	}
	dd, err := b.NextDead(ctx, "up")
	if err != nil {
		t.Fatal(err)
	}
	if dd.ID != "d1" {
		t.Errorf("from version %d: NextDead gave %s, want d1 (d2 is held)", from, dd.ID)
	}
	if err := b.SettleDead(ctx, dd, false); err != nil {
		t.Fatal(err)
	}
	if n, err := b.DeleteDead(ctx, "up", []string{"d1", "d2"}); err != nil || n != 1 {
		t.Errorf("from version %d: DeleteDead of d1 and the held d2: %d, %v; want 1", from, n, err)
	}
	var indexed bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, b.cfg.Prefix+"_dead_rec").Scan(&indexed); err != nil || !indexed {
		t.Errorf("from version %d: no index %s_dead_rec after the upgrade (%v): DeleteDead scans every record of the queue", from, b.cfg.Prefix, err)
	}
}
