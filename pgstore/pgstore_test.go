package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/asyncplatform/asyncplatform/conformance/storetest"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
	"github.com/asyncplatform/asyncplatform/pgstore"
	"github.com/asyncplatform/asyncplatform/pgstore/pgtest"
)

// testTable is the table of the tests' stores; their keys are namespaced
// per case.
const testTable = "asyncplatform_store_test"

// testURL is the machine's PostgreSQL, trust auth, database test.
func testURL() string {
	return testenv.Getenv(pgstore.URLEnv, "postgres://postgres@127.0.0.1:5432/test")
}

// reachable skips the test (fails it, with ASYNCPLATFORM_REQUIRE_SERVERS)
// when PostgreSQL does not answer.
func reachable(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := pgstore.New(ctx, pgstore.Config{URL: testURL(), Table: testTable})
	if err != nil {
		testenv.Unreachable(tb, "PostgreSQL at "+testURL(), err)
	}
	s.Close()
}

// maker opens each store on a pool of its own, as a separate process would.
func maker(ctx context.Context, tb testing.TB) (driver.Store, error) {
	return makerOn(testURL())(ctx, tb)
}

// makerOn opens stores on the server at url.
func makerOn(url string) storetest.Maker {
	return func(ctx context.Context, tb testing.TB) (driver.Store, error) {
		s, err := pgstore.New(ctx, pgstore.Config{URL: url, Table: testTable})
		if err != nil {
			return nil, err
		}
		tb.Cleanup(func() { s.Close() })
		return s, nil
	}
}

func TestStore(t *testing.T) {
	t.Parallel()
	reachable(t)
	storetest.Run(t, maker, storetest.Options{Restart: restartable})
}

// restartable runs a PostgreSQL of the test's own (pgtest) for
// Durability/Restart, which the machine's shared server is not the tests'
// to restart, and restarts it with a SIGKILL of every server process: the
// keys must come back from the write-ahead log, as each write is one
// committed statement.
func restartable(t *testing.T) (storetest.Maker, func(*testing.T)) {
	srv := pgtest.Start(t)
	return makerOn(srv.URL), func(t *testing.T) {
		if err := srv.Restart(true); err != nil {
			t.Fatal(err)
		}
	}
}

func BenchmarkStore(b *testing.B) {
	reachable(b)
	storetest.Bench(b, maker)
}

// TestSweep checks that expired rows are deleted, by Sweep and by the
// sweeper.
func TestSweep(t *testing.T) {
	t.Parallel()
	reachable(t)
	ctx := t.Context()
	table := "asyncplatform_store_sweep"
	s, err := pgstore.New(ctx, pgstore.Config{URL: testURL(), Table: table, SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, k := range []string{"sweep/a", "sweep/b", "sweep/c"} { // left by a run that failed
		if err := s.Delete(ctx, k, ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create(ctx, "sweep/a", []byte("a"), 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "sweep/b", []byte("b"), 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if n, err := s.Sweep(ctx); err != nil || n < 1 {
		t.Fatalf("Sweep = %d, %v; want at least the expired row", n, err)
	}
	if _, _, err := s.Get(ctx, "sweep/b"); err != nil {
		t.Fatalf("a row without a TTL was swept: %v", err)
	}
	// The sweeper of another Store deletes an expired row by itself.
	s2, err := pgstore.New(ctx, pgstore.Config{URL: testURL(), Table: table, SweepInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, err := s.Create(ctx, "sweep/c", []byte("c"), 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, testURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE key = 'sweep/c'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sweeper never deleted the expired row")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.Delete(ctx, "sweep/b", ""); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, _, err := s.Get(ctx, "sweep/b"); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", err)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	for _, table := range []string{"Bad", "1x", "a-b", "a;drop", strings.Repeat("a", 51)} {
		_, err := pgstore.New(t.Context(), pgstore.Config{URL: testURL(), Table: table})
		if err == nil || !strings.Contains(err.Error(), "Config.Table") {
			t.Errorf("Table %q: %v, want an error naming Config.Table", table, err)
		}
	}
	_, err := pgstore.New(t.Context(), pgstore.Config{URL: "postgres://u:s3cret@127.0.0.1:1/x?connect_timeout=1", Table: testTable})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("an unreachable server: %v; want an error without the password", err)
	}
}

// TestBoundedRead: a value someone else wrote far over
// driver.MaxValueLen is read cut to MaxValueLen+1 bytes, by Get and
// GetEach.
func TestBoundedRead(t *testing.T) {
	t.Parallel()
	reachable(t)
	ctx := t.Context()
	table := "asyncplatform_store_bounded"
	s, err := pgstore.New(ctx, pgstore.Config{URL: testURL(), Table: table})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := pgx.Connect(ctx, testURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, `INSERT INTO `+table+` (key, value, rev) VALUES ('big', $1, 1) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expires_at = NULL`, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	v, _, err := s.Get(ctx, "big")
	if err != nil || len(v) != driver.MaxValueLen+1 {
		t.Fatalf("Get: %d bytes, %v; want %d", len(v), err, driver.MaxValueLen+1)
	}
	res, err := s.GetEach(ctx, []string{"big"})
	if err != nil || len(res) != 1 || len(res[0].Value) != driver.MaxValueLen+1 {
		t.Fatalf("GetEach: %d results, %v; want one value of %d bytes", len(res), err, driver.MaxValueLen+1)
	}
}
