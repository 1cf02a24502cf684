package sqlite

import (
	"context"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// With Config.MaxConns 1 (allowed), a write's transaction holds the only
// connection: a statement first prepared inside it must not wait for
// another connection of the pool.
func TestStatementCacheOneConn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := New(ctx, Config{Path: filepath.Join(t.TempDir(), "one.db"), MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if _, err := b.Create(wctx, "k", []byte("v"), 0); err != nil {
		t.Fatalf("Create with MaxConns 1: %v", err)
	}
	if _, _, err := b.Get(wctx, "k"); err != nil {
		t.Fatalf("Get with MaxConns 1: %v", err)
	}
}

// With one connection, writers and readers at once, each first meeting
// its statements: none waits for another holding the connection.
func TestStatementCacheOneConnConcurrent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := New(ctx, Config{Path: filepath.Join(t.TempDir(), "one2.db"), MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			k := "k" + strconv.Itoa(i)
			for j := range 20 {
				if _, err := b.Create(wctx, k+"."+strconv.Itoa(j), []byte("v"), 0); err != nil {
					t.Error(err)
					return
				}
				if _, err := b.List(wctx, k, "", 100); err != nil {
					t.Error(err)
					return
				}
				if _, err := b.GetEach(wctx, []string{k + ".0", "none"}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
