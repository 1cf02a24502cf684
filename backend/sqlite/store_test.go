package sqlite

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
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

// TestStorePlantedRows: a value or key the store never writes, planted in
// the file by someone else, is refused by Get and List with a
// *StoreRowError naming the key, and never read whole.
func TestStorePlantedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, err := New(ctx, Config{Path: filepath.Join(t.TempDir(), "planted.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	plant := func(key string, value any) {
		t.Helper()
		if _, err := b.DB().ExecContext(ctx, `INSERT INTO asyncplatform_store (key, value, rev, expires_at) VALUES (?, ?, 1, 0)`, key, value); err != nil {
			t.Fatal(err)
		}
	}
	plant("big/blob", make([]byte, 1<<20))
	plant("big/text", strings.Repeat("é", driver.MaxValueLen)) // 2 bytes a character
	plant("fit/whole", make([]byte, driver.MaxValueLen))
	for _, key := range []string{"big/blob", "big/text"} {
		_, _, err := b.Get(ctx, key)
		var re *StoreRowError
		if !errors.As(err, &re) || re.Key != key || re.Len != driver.MaxValueLen+1 || !errors.Is(err, driver.ErrValueTooLarge) {
			t.Errorf("Get(%q): %v (%#v), want a *StoreRowError naming the key, %d bytes read, matching ErrValueTooLarge", key, err, re, driver.MaxValueLen+1)
		}
		if err != nil && !strings.Contains(err.Error(), key) {
			t.Errorf("Get(%q): %q does not name the key", key, err)
		}
	}
	if v, _, err := b.Get(ctx, "fit/whole"); err != nil || len(v) != driver.MaxValueLen {
		t.Errorf("Get of a value at the limit: %d bytes, %v", len(v), err)
	}

	long := "long/" + strings.Repeat("k", 10<<10)
	plant(long, []byte("v"))
	_, err = b.List(ctx, "long/", "", 10)
	var re *StoreRowError
	if !errors.As(err, &re) || !strings.HasPrefix(long, re.Key) || len(re.Key) != 64 || re.Len != driver.MaxStoreKeyLen+1 || !errors.Is(err, driver.ErrBadKey) {
		t.Errorf("List over a planted long key: %v (%#v), want a *StoreRowError with the key cut to 64 bytes, matching ErrBadKey", err, re)
	}
	if keys, err := b.List(ctx, "fit/", "", 10); err != nil || len(keys) != 1 {
		t.Errorf("List(fit/): %q, %v", keys, err)
	}
}
