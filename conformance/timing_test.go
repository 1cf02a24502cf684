package conformance

import (
	"testing"
	"time"
)

// TestStallWatchKeepsLongStalls: a long stall is still reported after more
// than stallKeep short ones have followed it, as on a loaded machine within
// one round of Lease/ExtendedForSlowHandler.
func TestStallWatchKeepsLongStalls(t *testing.T) {
	var w stallWatch
	start := time.Unix(1000, 0)
	at := start
	next := func(d time.Duration) {
		at = at.Add(100 * time.Millisecond)
		w.record(stall{end: at, d: d})
	}
	next(1200 * time.Millisecond)
	for range 2 * stallKeep {
		next(stallMin)
	}
	if got := w.longest(start); got != 1200*time.Millisecond {
		t.Errorf("longest since the start: %v, want the 1.2s stall", got)
	}
	if got := w.longest(start.Add(200 * time.Millisecond)); got != stallMin {
		t.Errorf("longest since after the long stall: %v, want %v", got, stallMin)
	}
}
