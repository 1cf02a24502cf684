package rabbit

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/conformance/storetest"
	"github.com/asyncplatform/asyncplatform/driver"
)

// spyStore is a companion store that records the calls it gets: a
// memory store with the batch interfaces the platform looks for.
type spyStore struct {
	*memory.Backend
	mu    sync.Mutex
	calls []string   // the method of each call
	keys  [][]string // the keys of each batch call
}

func (s *spyStore) record(call string, keys []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, call)
	s.keys = append(s.keys, keys)
}

func itemKeys(items []driver.BatchItem) []string {
	keys := make([]string, len(items))
	for i, it := range items {
		keys[i] = it.Key
	}
	return keys
}

func (s *spyStore) Get(ctx context.Context, key string) ([]byte, string, error) {
	s.record("Get", []string{key})
	return s.Backend.Get(ctx, key)
}

func (s *spyStore) Delete(ctx context.Context, key, rev string) error {
	s.record("Delete", []string{key})
	return s.Backend.Delete(ctx, key, rev)
}

func (s *spyStore) CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	s.record("CreateEach", itemKeys(items))
	return s.Backend.CreateEach(ctx, items)
}

func (s *spyStore) DeleteValueEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	s.record("DeleteValueEach", itemKeys(items))
	return s.Backend.DeleteValueEach(ctx, items)
}

// bareStore is a companion store with no optional interface.
type bareStore struct{ d driver.Store }

func (s bareStore) Get(ctx context.Context, key string) ([]byte, string, error) {
	return s.d.Get(ctx, key)
}

func (s bareStore) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	return s.d.Create(ctx, key, value, ttl)
}

func (s bareStore) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	return s.d.Update(ctx, key, value, rev, ttl)
}

func (s bareStore) Delete(ctx context.Context, key, rev string) error {
	return s.d.Delete(ctx, key, rev)
}

func (s bareStore) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	return s.d.List(ctx, prefix, after, limit)
}

// TestStoreBatchesForwarded checks that the backend's store hands a batch
// to the companion's batch interface in one call, its keys scoped (the
// unique releases on pgstore are then one statement a batch, not a Get and
// a Delete a key), and gives the keys back unscoped.
func TestStoreBatchesForwarded(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	mem, _ := memory.New(ctx, memory.Config{})
	spy := &spyStore{Backend: mem}
	st, err := newBackend(t, Config{Prefix: "apt-fwd", Store: spy}).Store()
	if err != nil {
		t.Fatal(err)
	}
	items := []driver.BatchItem{{Key: "u/a", Value: []byte("1")}, {Key: "u/b", Value: []byte("2")}, {Key: "u/c", Value: []byte("3")}}
	if _, err := driver.CreateEach(ctx, st, items); err != nil {
		t.Fatal(err)
	}
	lists, err := driver.ListEach(ctx, st, []string{"u/"}, 10)
	if err != nil || len(lists) != 1 || !slices.Equal(lists[0], []string{"u/a", "u/b", "u/c"}) {
		t.Fatalf("ListEach = %q, %v; want the three keys, unscoped", lists, err)
	}
	if n, err := driver.CountKeys(ctx, st, "u/"); err != nil || n != 3 {
		t.Fatalf("CountKeys = %d, %v; want 3", n, err)
	}
	items[1].Value = []byte("not b's") // b stays
	rs, err := driver.DeleteValueEach(ctx, st, items)
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Err != nil || rs[1].Err != driver.ErrRevision || rs[2].Err != nil {
		t.Fatalf("DeleteValueEach = %+v; want a and c deleted, b refused", rs)
	}
	spy.mu.Lock()
	calls, keys := slices.Clone(spy.calls), slices.Clone(spy.keys)
	spy.mu.Unlock()
	if want := []string{"CreateEach", "DeleteValueEach"}; !slices.Equal(calls, want) {
		t.Fatalf("the companion got %q, want %q: one call a batch", calls, want)
	}
	scoped := []string{"apt-fwd/u/a", "apt-fwd/u/b", "apt-fwd/u/c"}
	for i, k := range keys {
		if !slices.Equal(k, scoped) {
			t.Errorf("%s got the keys %q, want %q", calls[i], k, scoped)
		}
	}
	left, err := mem.List(ctx, "", "", 10)
	if err != nil || !slices.Equal(left, []string{"apt-fwd/u/b"}) {
		t.Fatalf("the companion holds %q, %v; want only apt-fwd/u/b", left, err)
	}
}

// TestStoreBareCompanion runs the store suite on a companion with none of
// the optional interfaces: the backend's store falls back to one call a
// key through the driver's helpers.
func TestStoreBareCompanion(t *testing.T) {
	t.Parallel()
	br := memory.NewBroker() // every store of the suite on one companion
	storetest.Run(t, func(ctx context.Context, tb testing.TB) (driver.Store, error) {
		mem, err := memory.New(ctx, memory.Config{Broker: br})
		if err != nil {
			return nil, err
		}
		return newBackend(tb, Config{Prefix: "apt-bare", Store: bareStore{mem}}).Store()
	}, storetest.Options{
		SingleProcess: "the companion is a memory store",
		NoRestart:     "the companion is a memory store",
	})
}
