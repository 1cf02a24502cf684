package kv_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

func memStore(t *testing.T) driver.Store {
	t.Helper()
	b, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	d, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestStoreNamespaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := memStore(t)
	a, b := kv.Of(d, kv.Status), kv.Of(d, kv.Unique)
	if _, err := a.Create(ctx, "k", []byte("a"), 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Get(ctx, "k"); !errors.Is(err, driver.ErrKeyNotFound) {
		t.Fatalf("another namespace sees the key: %v", err)
	}
	if _, err := b.Create(ctx, "k", []byte("b"), 0); err != nil {
		t.Fatalf("another namespace cannot create the same key: %v", err)
	}
	v, _, err := a.Get(ctx, "k")
	if err != nil || string(v) != "a" {
		t.Fatalf("Get = %q, %v; want a", v, err)
	}
	// The backend holds the key under the namespace's prefix.
	if raw, _, err := d.Get(ctx, kv.Status.Prefix()+"k"); err != nil || string(raw) != "a" {
		t.Fatalf("the backend's key %q = %q, %v", kv.Status.Prefix()+"k", raw, err)
	}
}

func TestStoreCompareAndSwap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := kv.Of(memStore(t), kv.Flow)
	rev, err := s.Create(ctx, "k", []byte("1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "k", []byte("2"), 0); !errors.Is(err, driver.ErrKeyExists) {
		t.Fatalf("Create of a present key: %v, want ErrKeyExists", err)
	}
	rev2, err := s.Update(ctx, "k", []byte("2"), rev, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx, "k", []byte("2"), rev, 0); !errors.Is(err, driver.ErrRevision) {
		t.Fatalf("Update at a stale revision: %v, want ErrRevision", err)
	}
	for _, bad := range []string{"", string(make([]byte, driver.MaxRevisionLen+1))} {
		if _, err := s.Update(ctx, "k", []byte("3"), bad, 0); !errors.Is(err, driver.ErrRevision) {
			t.Errorf("Update at revision of %d bytes: %v, want ErrRevision", len(bad), err)
		}
	}
	if err := s.Delete(ctx, "k", rev); !errors.Is(err, driver.ErrRevision) {
		t.Fatalf("Delete at a stale revision: %v, want ErrRevision", err)
	}
	if err := s.Delete(ctx, "k", rev2); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "k", ""); err != nil {
		t.Fatalf("Delete of an absent key without a revision: %v", err)
	}
}

func TestStoreChecksBeforeTheBackend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := kv.Of(memStore(t), kv.Flow)
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"EmptyKey", func() error { _, err := s.Create(ctx, "", nil, 0); return err }(), driver.ErrBadKey},
		{"BadKey", func() error { _, _, err := s.Get(ctx, "a b"); return err }(), driver.ErrBadKey},
		{"LargeValue", func() error {
			_, err := s.Create(ctx, "v", make([]byte, driver.MaxValueLen+1), 0)
			return err
		}(), driver.ErrValueTooLarge},
		{"NegativeTTL", func() error { _, err := s.Create(ctx, "t", nil, -time.Second); return err }(), driver.ErrBadTTL},
		{"BadPrefix", func() error { _, _, err := s.List(ctx, "a b", "", 0); return err }(), driver.ErrBadKey},
		{"BadCursor", func() error { _, _, err := s.List(ctx, "", "a b", 0); return err }(), driver.ErrBadKey},
		{"ZeroStore", func() error { _, _, err := (&kv.Store{}).Get(ctx, "k"); return err }(), kv.ErrNil},
		{"NilStore", func() error { var z *kv.Store; return z.Delete(ctx, "k", "") }(), kv.ErrNil},
	}
	for _, tt := range tests {
		var e *kv.Error
		if !errors.Is(tt.err, tt.want) || !errors.As(tt.err, &e) {
			t.Errorf("%s: %v, want a *kv.Error matching %v", tt.name, tt.err, tt.want)
		}
	}
}

func TestStoreListPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := memStore(t)
	s := kv.Of(d, kv.Schedules)
	other := kv.Of(d, kv.ScheduleDefs) // its keys sort after, and must not be listed
	const n = 7
	for i := range n {
		if _, err := s.Create(ctx, fmt.Sprintf("p/%d", i), nil, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := other.Create(ctx, fmt.Sprintf("p/%d", i), nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	cursor, pages := "", 0
	for pages < 10 { // bounded: a cursor that never advances must fail, not hang
		keys, next, err := s.List(ctx, "p/", cursor, 3)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(keys) > 3 {
			t.Fatalf("a page of %d keys, limit 3", len(keys))
		}
		got = append(got, keys...)
		if next == "" {
			break
		}
		cursor = next
	}
	if len(got) != n || pages != 3 {
		t.Fatalf("listed %v in %d pages; want %d keys in 3", got, pages, n)
	}
	for i, k := range got {
		if want := fmt.Sprintf("p/%d", i); k != want {
			t.Errorf("key %d = %q, want %q (in order, without the namespace)", i, k, want)
		}
	}
	var all []string
	if err := s.ListAll(ctx, "", func(k string) (bool, error) { all = append(all, k); return len(all) < 5, nil }); err != nil {
		t.Fatal(err)
	}
	if len(all) != 5 {
		t.Fatalf("ListAll stopped after %d keys; fn asked to stop at 5", len(all))
	}
}
