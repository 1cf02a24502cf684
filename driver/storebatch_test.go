package driver_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// failingStore is a Store whose every call fails with err for the key bad,
// and answers each call's sentinel otherwise.
type failingStore struct {
	bad string
	err error
}

func (s failingStore) fail(key string, sentinel error) error {
	if key == s.bad {
		return s.err
	}
	return sentinel
}

func (s failingStore) Get(_ context.Context, key string) ([]byte, string, error) {
	return nil, "", s.fail(key, driver.ErrKeyNotFound)
}

func (s failingStore) Create(_ context.Context, key string, _ []byte, _ time.Duration) (string, error) {
	return "", s.fail(key, driver.ErrKeyExists)
}

func (s failingStore) Update(_ context.Context, key string, _ []byte, _ string, _ time.Duration) (string, error) {
	return "", s.fail(key, driver.ErrRevision)
}

func (s failingStore) Delete(_ context.Context, key, _ string) error {
	return s.fail(key, driver.ErrRevision)
}

func (s failingStore) List(context.Context, string, string, int) ([]string, error) {
	return nil, s.err
}

// TestEachFallback: on a Store without batches, the helpers give each
// item its call's sentinel, fail the whole call on any other error, and
// refuse a batch over MaxBatch or with a key twice before calling the store.
func TestEachFallback(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	items := make([]driver.BatchItem, 100)
	keys := make([]string, len(items))
	for i := range items {
		keys[i] = "k" + strconv.Itoa(i)
		items[i].Key = keys[i]
	}
	s := failingStore{bad: "none", err: boom}
	rs, err := driver.DeleteEach(ctx, s, items)
	if err != nil || len(rs) != len(items) {
		t.Fatalf("DeleteEach: %d results, %v", len(rs), err)
	}
	for i, r := range rs {
		if !errors.Is(r.Err, driver.ErrRevision) {
			t.Fatalf("DeleteEach item %d: %v, want ErrRevision", i, r.Err)
		}
	}
	if rs, err := driver.GetEach(ctx, s, keys); err != nil || !errors.Is(rs[7].Err, driver.ErrKeyNotFound) {
		t.Fatalf("GetEach: %v, %v", rs, err)
	}
	s.bad = "k57"
	if _, err := driver.CreateEach(ctx, s, items); !errors.Is(err, boom) {
		t.Errorf("CreateEach with a failing key: %v, want boom", err)
	}
	if _, err := driver.GetEach(ctx, s, keys); !errors.Is(err, boom) {
		t.Errorf("GetEach with a failing key: %v, want boom", err)
	}
	if _, err := driver.DeleteEach(ctx, s, append(items, items[3])); err == nil {
		t.Error("DeleteEach with a key twice: no error")
	}
	if _, err := driver.CreateEach(ctx, s, make([]driver.BatchItem, driver.MaxBatch+1)); err == nil {
		t.Error("CreateEach over MaxBatch: no error")
	}
	revs := make([]driver.BatchItem, len(items))
	for i, it := range items {
		revs[i] = driver.BatchItem{Key: it.Key, Rev: "1"}
	}
	if _, err := driver.UpdateEach(ctx, s, revs); !errors.Is(err, boom) {
		t.Errorf("UpdateEach with a failing key: %v, want boom", err)
	}
	s.bad = "none"
	if rs, err := driver.UpdateEach(ctx, s, revs); err != nil || !errors.Is(rs[7].Err, driver.ErrRevision) {
		t.Errorf("UpdateEach: %v, %v; want ErrRevision each", rs, err)
	}
	if _, err := driver.UpdateEach(ctx, s, items); err == nil {
		t.Error("UpdateEach of items without a revision: no error")
	}
	s.bad = "k57"
	if _, err := driver.ListEach(ctx, s, []string{"a/", "b/"}, 10); !errors.Is(err, boom) {
		t.Errorf("ListEach with a failing List: %v, want boom", err)
	}
	if _, err := driver.CountKeys(ctx, s, "p/"); !errors.Is(err, boom) {
		t.Errorf("CountKeys with a failing List: %v, want boom", err)
	}
}
