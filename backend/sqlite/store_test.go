package sqlite

import (
	"context"
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

// TestStoreBoundedRead: a value someone else wrote to the file far over
// driver.MaxValueLen is read cut to MaxValueLen+1 bytes (the store never
// writes one that long), as pgstore reads its table.
func TestStoreBoundedRead(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b, err := New(ctx, Config{Path: testPath(t, "bounded")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.DB().ExecContext(ctx, `INSERT INTO `+DefaultPrefix+`_store (key, value, rev) VALUES ('big', ?, 1)`, make([]byte, 4<<20)); err != nil {
		t.Fatal(err)
	}
	v, _, err := b.Get(ctx, "big")
	if err != nil || len(v) != driver.MaxValueLen+1 {
		t.Fatalf("Get: %d bytes, %v; want %d", len(v), err, driver.MaxValueLen+1)
	}
}

// TestDeleteDeadByIndex: DeleteDead (each redrive chunk, the dashboard's
// delete) finds each record by an index on its ID, not by a scan of
// every dead letter of the queue (O(records × queue) for a redrive).
func TestDeleteDeadByIndex(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b, err := New(ctx, Config{Path: testPath(t, "deadindex")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	rows, err := b.DB().QueryContext(ctx, `EXPLAIN QUERY PLAN `+b.q.deleteDead, "q", []byte("id"))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(plan) == 0 || !strings.Contains(strings.Join(plan, "; "), "rec_id=") {
		t.Errorf("DeleteDead's plan %q: want a search by an index on rec_id", plan)
	}
}
