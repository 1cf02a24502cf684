package sqlite

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/asyncplatform/asyncplatform/conformance/storetest"
	"github.com/asyncplatform/asyncplatform/driver"
)

// storeOn opens each store through a Backend of its own, as a separate
// process would.
func storeOn(path string) storetest.Maker {
	return func(ctx context.Context, tb testing.TB) (driver.Store, error) {
		b, err := New(ctx, Config{Path: path})
		if err != nil {
			return nil, err
		}
		tb.Cleanup(func() { b.Close() })
		return b, nil
	}
}

func TestStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storeOn(testPath(t, "store")), storetest.Options{Restart: restartable})
}

// restartable gives Durability/Restart a file of its own, and restarts
// it by closing every Backend open on it (so the process holds no
// connection to the file and its hub stops) before the case opens new
// ones.
func restartable(t *testing.T) (storetest.Maker, func(*testing.T)) {
	path := filepath.Join(t.TempDir(), "restart.db")
	var (
		mu   sync.Mutex
		open []*Backend
	)
	mk := func(ctx context.Context, tb testing.TB) (driver.Store, error) {
		b, err := New(ctx, Config{Path: path})
		if err != nil {
			return nil, err
		}
		mu.Lock()
		open = append(open, b)
		mu.Unlock()
		tb.Cleanup(func() { b.Close() })
		return b, nil
	}
	return mk, func(t *testing.T) {
		mu.Lock()
		defer mu.Unlock()
		for _, b := range open {
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
		}
		open = nil
	}
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, storeOn(testPath(b, "bstore")))
}
