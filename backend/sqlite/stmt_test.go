package sqlite

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// The Backend's statements are prepared once and reused, on the pool and
// in its transactions; the cache is bounded and emptied by Close.
func TestStatementsPreparedOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := New(ctx, Config{Path: filepath.Join(t.TempDir(), "stmt.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for i := range 3 {
		if _, err := b.Create(ctx, "k"+strconv.Itoa(i), []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.Get(ctx, "k0"); err != nil {
			t.Fatal(err)
		}
	}
	b.stmts.mu.Lock()
	get, create := b.stmts.m[b.q.get], b.stmts.m[b.q.create]
	n := len(b.stmts.m)
	b.stmts.mu.Unlock()
	if get == nil || create == nil {
		t.Fatalf("Get and Create (in a transaction) left no prepared statement: %d cached", n)
	}
	if s, _ := b.stmts.get(ctx, b.db, b.q.get); s != get {
		t.Error("the statement of Get was prepared again")
	}
	for i := n; i < maxStmts; i++ {
		if _, err := b.stmts.get(ctx, b.db, "SELECT "+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if s, err := b.stmts.get(ctx, b.db, "SELECT 'one too many'"); s != nil || err != nil {
		t.Errorf("past %d statements: %v, %v; want none cached", maxStmts, s, err)
	}
	if _, _, err := b.Get(ctx, "k1"); err != nil {
		t.Errorf("Get with the cache full: %v", err)
	}
	b.stmts.close()
	if s, _ := b.stmts.get(ctx, b.db, b.q.get); s != nil {
		t.Error("a statement was cached after close")
	}
}
