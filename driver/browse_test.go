package driver

import (
	"errors"
	"strings"
	"testing"
)

// The cursors of Browse round-trip, and anything else is refused with a
// *CursorError holding at most MaxBrowseCursor bytes of it.
func TestBrowseCursors(t *testing.T) {
	for _, n := range []int64{1, 42, 1 << 40} {
		if got, err := ParseOffsetCursor(BrowseReady, OffsetCursor(n)); err != nil || got != n {
			t.Errorf("offset %d: %d, %v", n, got, err)
		}
	}
	for _, k := range [][2]int64{{0, 1}, {-5, 7}, {1 << 50, 1 << 40}} {
		at, id, ok, err := ParseKeyCursor(BrowseScheduled, KeyCursor(k[0], k[1]))
		if err != nil || !ok || at != k[0] || id != k[1] {
			t.Errorf("key %v: %d %d %v %v", k, at, id, ok, err)
		}
	}
	if n, err := ParseOffsetCursor(BrowseReady, ""); n != 0 || err != nil {
		t.Errorf("empty offset cursor: %d, %v", n, err)
	}
	if _, _, ok, err := ParseKeyCursor(BrowseReady, ""); ok || err != nil {
		t.Errorf("empty key cursor: %v, %v", ok, err)
	}
	long := strings.Repeat("9", 1000)
	for _, c := range []string{"o", "o0", "o-1", "o01", "o1x", "k1", "k1.", "k.1", "k01.1", "\x1b[31m", long, "o" + long} {
		var ce *CursorError
		if _, err := ParseOffsetCursor(BrowseReady, c); !errors.Is(err, ErrBadCursor) || !errors.As(err, &ce) || len(ce.Cursor) > MaxBrowseCursor {
			t.Errorf("offset cursor %.20q: %v", c, err)
		}
		if _, _, _, err := ParseKeyCursor(BrowseReady, c); !errors.Is(err, ErrBadCursor) {
			t.Errorf("key cursor %.20q: %v", c, err)
		}
	}
	if got := BrowseLimit(0); got != DefaultBrowseLimit {
		t.Errorf("BrowseLimit(0) = %d", got)
	}
	if got := BrowseLimit(1 << 20); got != MaxBrowseLimit {
		t.Errorf("BrowseLimit(1<<20) = %d", got)
	}
}
