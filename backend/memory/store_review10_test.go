package memory_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// List on the B-tree agrees with a model (a map of the live keys) through
// creates, deletes, re-creates, expiries left unswept and pages of every
// size, from every after inside, below and beyond the prefix.
func TestListMatchesAModelReview10(t *testing.T) {
	ctx := t.Context()
	b, err := memory.New(ctx, memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	rng := rand.New(rand.NewPCG(10, 1))
	live := map[string]bool{}
	keys := []string{"a", "a/1", "a/2", "a/3", "a0", "b/1", "b/2", "b/22", "b/3", "c", "c/x/1", "c/x/2"}
	for round := range 400 {
		k := keys[rng.IntN(len(keys))]
		switch rng.IntN(4) {
		case 0:
			if _, err := b.Create(ctx, k, []byte("v"), 0); err == nil {
				live[k] = true
			}
		case 1:
			b.Delete(ctx, k, "")
			delete(live, k)
		case 2: // expires, unswept
			b.Delete(ctx, k, "")
			if _, err := b.Create(ctx, k, []byte("v"), time.Millisecond); err != nil {
				t.Fatal(err)
			}
			delete(live, k)
			time.Sleep(2 * time.Millisecond)
		case 3:
			b.Delete(ctx, k, "")
			if _, err := b.Create(ctx, k, []byte("v"), time.Hour); err != nil {
				t.Fatal(err)
			}
			live[k] = true
		}
		for _, prefix := range []string{"", "a", "a/", "b/", "b/2", "c/x/", "z"} {
			for _, after := range []string{"", "0", "a", "a/1", "a/9", "b/", "b/2", "c/x/1", "zz"} {
				var want []string
				for x := range live {
					if strings.HasPrefix(x, prefix) && (after == "" || x > after) {
						want = append(want, x)
					}
				}
				sort.Strings(want)
				for _, limit := range []int{1, 2, 100} {
					got, err := b.List(ctx, prefix, after, limit)
					if err != nil {
						t.Fatal(err)
					}
					w := want[:min(limit, len(want))]
					if !slices.Equal(got, w) {
						t.Fatalf("round %d: List(%q, %q, %d) = %q, want %q", round, prefix, after, limit, got, w)
					}
				}
			}
		}
	}
}

// Lists and writes from many goroutines at once (run with -race).
func TestListConcurrentReview10(t *testing.T) {
	ctx := t.Context()
	b, err := memory.New(ctx, memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				k := fmt.Sprintf("k/%d/%d", g, i%50)
				switch i % 4 {
				case 0:
					b.Create(ctx, k, nil, time.Millisecond)
				case 1:
					b.Delete(ctx, k, "")
				case 2:
					b.Create(ctx, k, nil, 0)
				case 3:
					keys, err := b.List(ctx, "k/", "", 30)
					if err != nil || !slices.IsSorted(keys) {
						t.Errorf("List = %q, %v", keys, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}
