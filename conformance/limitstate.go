package conformance

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// logLimitState logs, for a failed limit case, what its children and the
// backend held when it failed: the queue's depths and its dead letters'
// reasons (read through p), each cluster slot of typ (its key's holder
// and revision, read from the backend's store as internal/admit keeps
// them), and each child's last warnings. holders are the children's
// worker names, by process number.
func (e *env) logLimitState(t *testing.T, p *ap.Platform, typ string, slots int, holders []string, logs func(proc int) ([]string, int)) {
	t.Helper()
	ctx := ctxT(t, e.opts.Wait)
	b := e.backend()
	if st, err := b.Stats(ctx, e.queue); err != nil {
		t.Logf("queue depths: %v", err)
	} else {
		t.Logf("queue depths: ready %d, scheduled %d, in flight %d, dead %d, oldest ready %s",
			st.Ready, st.Scheduled, st.InFlight, st.Dead, age(st.OldestReady))
	}
	if page, err := p.DeadLetters(ctx, e.queue, "", 100); err != nil {
		t.Logf("dead letters: %v", err)
	} else {
		reasons := map[ap.Reason]int{}
		for _, dl := range page.Letters {
			if reasons[dl.Reason]++; reasons[dl.Reason] == 1 {
				t.Logf("a dead letter (%s): %s", dl.Reason, dl.Error)
			}
		}
		t.Logf("dead letters (first page): %d, by reason %v", len(page.Letters), reasons)
	}
	d, err := driver.StoreOf(b)
	if err != nil {
		t.Logf("the cluster slots: no store: %v", err)
	} else {
		store := kv.Of(d, kv.Limits)
		var held []string
		for i := range slots {
			key := fmt.Sprintf("sem/%s/%d", kv.Segment(typ), i)
			v, rev, err := store.Get(ctx, key)
			switch {
			case errors.Is(err, driver.ErrKeyNotFound):
				held = append(held, fmt.Sprintf("%d free", i))
			case err != nil:
				held = append(held, fmt.Sprintf("%d: %v", i, err))
			default:
				held = append(held, fmt.Sprintf("%d held by %s (proc %d) at rev %s", i, v, procOf(holders, string(v)), rev))
			}
		}
		t.Logf("the cluster slots of %q: %s", typ, strings.Join(held, "; "))
	}
	logChildLogs(t, len(holders), logs)
}

// logChildLogs logs each child's last warnings.
func logChildLogs(t *testing.T, procs int, logs func(proc int) ([]string, int)) {
	t.Helper()
	for proc := range procs {
		last, n := logs(proc)
		t.Logf("proc %d: %d warnings logged", proc, n)
		for _, l := range last {
			t.Logf("proc %d: %s", proc, l)
		}
	}
}

// procOf returns the process number of the worker named holder, -1 when
// none is.
func procOf(holders []string, holder string) int {
	for i, h := range holders {
		if h == holder {
			return i
		}
	}
	return -1
}

// age says how long ago t was; "-" for the zero time.
func age(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Millisecond).String() + " ago"
}
