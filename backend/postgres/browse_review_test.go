package postgres

import (
	"context"
	"errors"
	"testing"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestBrowseForgedKeyCursor: a key cursor of the right form whose time is
// before any row's (from a query string, say) is refused as a bad cursor,
// not sent to the server as a time out of its range (an untyped server
// error); one far past every row's is an empty page or a bad cursor.
func TestBrowseForgedKeyCursor(t *testing.T) {
	t.Parallel()
	reachable(t)
	ctx := context.Background()
	b, err := New(ctx, Config{URL: testURL(), Prefix: testPrefix(t, "brcur"), MaxConns: testConns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	q := "forged-cursor"
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	if err := b.Enqueue(ctx, q, []driver.Message{{Body: []byte("a")}, {Body: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{driver.KeyCursor(-(1 << 62), 1), driver.KeyCursor(-62135596800000001, 0)} {
		pg, err := b.Browse(ctx, q, driver.BrowseReady, c, 10)
		if !errors.Is(err, driver.ErrBadCursor) {
			t.Errorf("Browse from %q: %d items, next %q, %v; want a bad cursor", c, len(pg.Items), pg.Next, err)
		}
	}
	for _, c := range []string{driver.KeyCursor(1<<62, 1), driver.KeyCursor(9223372036854775807, 9223372036854775807)} {
		pg, err := b.Browse(ctx, q, driver.BrowseReady, c, 10)
		if (err != nil && !errors.Is(err, driver.ErrBadCursor)) || len(pg.Items) != 0 {
			t.Errorf("Browse from %q: %d items, %v; want none, or a bad cursor", c, len(pg.Items), err)
		}
	}
	if pg, err := b.Browse(ctx, q, driver.BrowseReady, "", 10); err != nil || len(pg.Items) != 2 {
		t.Errorf("Browse from the start: %d items, %v; want 2", len(pg.Items), err)
	}
}
