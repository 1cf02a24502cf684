package memory

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// A listing while keys are created, removed and created again gives every
// present key under the prefix once, in byte order, a key removed and put
// again among them.
func TestListWhileCreating(t *testing.T) {
	ctx := context.Background()
	b, err := New(ctx, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	want := map[string]bool{}
	put := func(k string) {
		t.Helper()
		if _, err := b.Create(ctx, k, []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
		want[k] = true
	}
	for i := range 1000 {
		put(fmt.Sprintf("job/%04d", i))
	}
	check := func(round int) {
		t.Helper()
		got, err := b.List(ctx, "job/", "", 10000)
		if err != nil {
			t.Fatal(err)
		}
		var exp []string
		for k := range want {
			exp = append(exp, k)
		}
		slices.Sort(exp)
		if !slices.Equal(got, exp) {
			t.Fatalf("round %d: List gave %d keys, want %d (sorted, each once)", round, len(got), len(exp))
		}
	}
	check(0)
	for round := 1; round <= 50; round++ {
		gone := fmt.Sprintf("job/%04d", round*7)
		if err := b.Delete(ctx, gone, ""); err != nil {
			t.Fatal(err)
		}
		delete(want, gone)
		put(fmt.Sprintf("job/%04d", round*7)) // back, once removed
		put(fmt.Sprintf("job/%04d", 2000+round))
		put(fmt.Sprintf("job/%04d-x", round))
		check(round)
	}
}

// BenchmarkListWhileCreating: one key created, then a listing of a small
// prefix, among 100,000 keys: what a worker's poll of the cancel marks
// costs while tracked jobs' records are created.
func BenchmarkListWhileCreating(b *testing.B) {
	ctx := context.Background()
	be, err := New(ctx, Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	for i := range 100000 {
		if _, err := be.Create(ctx, fmt.Sprintf("job/%06d", i), []byte("v"), 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := be.Create(ctx, fmt.Sprintf("job/n%09d", i), []byte("v"), 0); err != nil {
			b.Fatal(err)
		}
		if _, err := be.List(ctx, "cancel/", "", 1000); err != nil {
			b.Fatal(err)
		}
	}
}

// The index of keys holds the present keys only: a key deleted, or found
// expired, leaves it, so a List walks no key that is gone.
func TestIndexHoldsPresentKeys(t *testing.T) {
	ctx := context.Background()
	b, err := New(ctx, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for i := range 100 {
		ttl := time.Duration(0)
		if i%2 == 0 {
			ttl = time.Millisecond
		}
		if _, err := b.Create(ctx, fmt.Sprintf("k/%03d", i), []byte("v"), ttl); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i < 100; i += 4 {
		if err := b.Delete(ctx, fmt.Sprintf("k/%03d", i), ""); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Millisecond)
	got, err := b.List(ctx, "k/", "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	kv := &b.broker.kv
	kv.mu.Lock()
	n, entries := kv.index.Len(), len(kv.entries)
	kv.mu.Unlock()
	if len(got) != 25 || n != 25 || entries != 25 {
		t.Errorf("listed %d keys; the index holds %d, the entries %d; want 25 each", len(got), n, entries)
	}
}
