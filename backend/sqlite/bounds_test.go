package sqlite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestForeignTextBodyBounded: a body another writer to the file stored as
// TEXT of two-byte characters is read up to MaxBody+1 bytes, not MaxBody+1
// characters, by a claim, NextDead and ListDead.
func TestForeignTextBodyBounded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const maxBody = 1000
	b, err := New(ctx, Config{Path: filepath.Join(t.TempDir(), "bounds.db"), MaxBody: maxBody})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Declare(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	text := strings.Repeat("é", 4*maxBody) // 8,000 bytes, 4,000 characters
	if _, err := b.DB().ExecContext(ctx, `INSERT INTO asyncplatform_jobs (queue, body, run_at) VALUES ('q', ?, 0)`, text); err != nil {
		t.Fatal(err)
	}
	deadText := strings.Repeat("é", b.maxDeadBody()) // twice the bound in bytes
	if _, err := b.DB().ExecContext(ctx, `INSERT INTO asyncplatform_dead (queue, rec_id, body) VALUES ('q', 'r', ?)`, deadText); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, "q", 1, 5*time.Second)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d deliveries, %v", len(ds), err)
	}
	if n := len(ds[0].Body); n > maxBody+1 {
		t.Errorf("a claim read %d bytes of a foreign TEXT body; want at most MaxBody+1 = %d", n, maxBody+1)
	}
	if page, _, err := b.ListDead(ctx, "q", "", 10); err != nil || len(page) != 1 {
		t.Fatalf("ListDead: %d, %v", len(page), err)
	} else if n := len(page[0].Body); n > b.maxDeadBody()+1 {
		t.Errorf("ListDead read %d bytes; want at most %d", n, b.maxDeadBody()+1)
	}
}
