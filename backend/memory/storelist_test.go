package memory_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// TestListAfterRemovals checks that a List after most keys were deleted
// (each removed from the B-tree of keys) lists exactly those left,
// in order, with keys put and deleted between the listings among them.
func TestListAfterRemovals(t *testing.T) {
	ctx := t.Context()
	b, err := memory.New(ctx, memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	key := func(i int) string { return fmt.Sprintf("k/%04d", i) }
	const n = 1000
	for i := range n {
		if _, err := b.Create(ctx, key(i), []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
	}
	if keys, err := b.List(ctx, "k/", "", 2*n); err != nil || len(keys) != n {
		t.Fatalf("List = %d keys, %v; want %d", len(keys), err, n)
	}
	var want []string
	for round := range 3 { // each round removes most of what is left
		want = want[:0]
		for i := range n {
			k := key(i)
			switch {
			case i%(round+3) != 0:
				if err := b.Delete(ctx, k, ""); err != nil {
					t.Fatal(err)
				}
			case i%7 == 0 && round == 1: // deleted and put again
				if err := b.Delete(ctx, k, ""); err != nil {
					t.Fatal(err)
				}
				if _, err := b.Create(ctx, k, []byte("again"), 0); err != nil {
					t.Fatal(err)
				}
				want = append(want, k)
			default:
				if _, _, err := b.Get(ctx, k); err == nil {
					want = append(want, k)
				}
			}
		}
		keys, err := b.List(ctx, "k/", "", 2*n)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(keys, want) {
			t.Fatalf("round %d: List = %d keys %q..., want %d %q...", round, len(keys), keys[:min(3, len(keys))], len(want), want[:min(3, len(want))])
		}
	}
}
