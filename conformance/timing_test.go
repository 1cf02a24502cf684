package conformance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
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

// TestRenewalWatch: a renewal the platform reports unanswered within its
// bound counts as a broker stall; a lost lease or another error does not.
func TestRenewalWatch(t *testing.T) {
	for _, c := range []struct {
		msg  string
		err  error
		late bool
	}{
		{"asyncplatform: extending a lease failed; will retry", fmt.Errorf("azure: extend: %w", context.DeadlineExceeded), true},
		{"asyncplatform: could not extend a lease before it lapsed; the handler is cancelled and the job will be delivered again", fmt.Errorf("azure: extend: %w", context.DeadlineExceeded), true},
		{"asyncplatform: lease lost; the handler is cancelled and the job will be delivered again", fmt.Errorf("azure: extend: %w", driver.ErrLeaseLost), false},
		{"asyncplatform: extending a lease failed; will retry", errors.New("connection refused"), false},
		{"asyncplatform: reading paused queues failed; keeping the last known states", context.DeadlineExceeded, false},
	} {
		w := &renewalWatch{}
		slog.New(w).Warn(c.msg, "queue", "q", "error", c.err)
		if got := w.late.Load(); got != c.late {
			t.Errorf("%q with %v: late %v, want %v", c.msg, c.err, got, c.late)
		}
	}
}
