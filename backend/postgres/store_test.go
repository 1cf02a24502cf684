package postgres

import (
	"context"
	"testing"

	"github.com/asyncplatform/asyncplatform/conformance/storetest"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/pgstore/pgtest"
)

// storeOn opens each store through a Backend of its own, as a separate
// process would.
func storeOn(dsn, prefix string) storetest.Maker {
	return func(ctx context.Context, tb testing.TB) (driver.Store, error) {
		b, err := New(ctx, Config{URL: dsn, Prefix: prefix, MaxConns: testConns})
		if err != nil {
			return nil, err
		}
		tb.Cleanup(func() { b.Close() })
		return b.Store()
	}
}

func TestStore(t *testing.T) {
	t.Parallel()
	reachable(t)
	storetest.Run(t, storeOn(testURL(), testPrefix(t, "store")), storetest.Options{Restart: restartable})
}

// restartable runs a PostgreSQL of the test's own (pgtest) for
// Durability/Restart and restarts it with a SIGKILL of every server
// process.
func restartable(t *testing.T) (storetest.Maker, func(*testing.T)) {
	srv := pgtest.Start(t)
	return storeOn(srv.URL, "apt_store"), func(t *testing.T) {
		if err := srv.Restart(true); err != nil {
			t.Fatal(err)
		}
	}
}

func BenchmarkStore(b *testing.B) {
	reachable(b)
	storetest.Bench(b, storeOn(testURL(), testPrefix(b, "bstore")))
}
