package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// browser returns the case's backend as a driver.Browser, declared, or
// skips the case, saying so, for a backend that does not implement it.
func (e *env) browser(t *testing.T) (driver.Backend, driver.Browser) {
	b := e.declared()
	br, ok := b.(driver.Browser)
	if !ok {
		t.Skipf("the backend does not implement driver.Browser (%T): its jobs are listed from status records only", b)
	}
	return b, br
}

// browseAll pages through one state of the queue, limit at a time, and
// fails on a repeated cursor or an over-long page.
func (e *env) browseAll(t *testing.T, br driver.Browser, state driver.BrowseState, limit int) ([]driver.BrowseItem, bool) {
	t.Helper()
	ctx := ctxT(t, e.opts.Wait)
	var out []driver.BrowseItem
	partial := false
	seen := map[string]bool{}
	for cursor := ""; ; {
		pg, err := br.Browse(ctx, e.queue, state, cursor, limit)
		if err != nil {
			t.Fatalf("Browse(%s, cursor %q): %v", state, cursor, err)
		}
		if len(pg.Items) > limit {
			t.Fatalf("Browse(%s, limit %d) returned %d items", state, limit, len(pg.Items))
		}
		partial = partial || pg.Partial
		out = append(out, pg.Items...)
		if cursor = pg.Next; cursor == "" {
			return out, partial
		}
		e.cursorAdvances(seen, cursor)
	}
}

func browseBodies(items []driver.BrowseItem) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = string(it.Body)
	}
	return out
}

// testBrowseLeavesQueue: a Browse lists the ready and the scheduled
// messages apart, every one once when paged by cursor, with its body as
// stored; it refuses a cursor it did not make with a *CursorError; and it
// changes nothing Receive hands out: the same messages, in the order the
// ready listing showed, each on its first delivery (driver.Browser).
func testBrowseLeavesQueue(t *testing.T, e *env) {
	b, br := e.browser(t)
	ready := bodies("ready", 7)
	e.put(b, time.Time{}, ready...)
	due := time.Now().Add(10 * time.Minute)
	sched := bodies("sched", 3)
	e.put(b, due, sched...)
	big := driver.MaxBrowseBody + 1
	if e.caps.MaxBody > 0 && e.caps.MaxBody < big {
		big = 0 // the backend cannot store one
	} else {
		big := driver.Message{ID: e.queue + "-big", Body: []byte(strings.Repeat("b", big)), NotBefore: due.Add(time.Minute)}
		if err := b.Enqueue(ctxT(t, e.opts.Wait), e.queue, []driver.Message{big}); err != nil {
			t.Fatalf("Enqueue of a body of %d bytes: %v", len(big.Body), err)
		}
	}

	items, partial := e.browseAll(t, br, driver.BrowseReady, 3)
	if partial {
		t.Logf("the ready listing is partial")
	}
	got := browseBodies(items)
	if !sameSet(got, ready) {
		t.Fatalf("the ready messages browsed 3 at a time are %q, want each of %q once", got, ready)
	}
	for _, it := range items {
		if it.Deliveries != 0 && it.Deliveries != -1 {
			t.Errorf("ready message %q never received shows Deliveries %d, want 0 (or -1: unknown)", it.Body, it.Deliveries)
		}
		if it.BodySize != len(it.Body) {
			t.Errorf("ready message %q shows BodySize %d, want %d", it.Body, it.BodySize, len(it.Body))
		}
	}

	sitems, spartial := e.browseAll(t, br, driver.BrowseScheduled, 2)
	want := len(sched)
	if big > 0 {
		want++
	}
	if spartial && len(sitems) < want {
		// The broker shows only part of what is scheduled (Azure: only
		// visible messages): what it shows must be scheduled.
		t.Logf("the scheduled listing is partial: %d of %d shown", len(sitems), want)
		for _, it := range sitems {
			if len(it.Body) > 0 && it.Body[0] == 'r' {
				t.Errorf("ready message %q listed as scheduled", it.Body)
			}
		}
		sitems = nil
	} else if len(sitems) != want {
		t.Fatalf("browsed %d scheduled messages, want %d (%d of them ready: ready ones must not be listed as scheduled)", len(sitems), want, len(ready))
	}
	if sitems == nil {
		// checked above
	} else if got := browseBodies(sitems[:len(sched)]); !sameSet(got, sched) {
		t.Errorf("the scheduled messages browsed 2 at a time are %q, want %q first (soonest due first)", got, sched)
	}
	for _, it := range sitems[:min(len(sched), len(sitems))] {
		if d := it.At.Sub(due); d < -time.Second || d > time.Second {
			t.Errorf("scheduled message %q shows At %v, want its NotBefore %v", it.Body, it.At, due)
		}
	}
	if big > 0 && sitems != nil {
		if it := sitems[len(sched)]; it.Body != nil || it.BodySize != big {
			t.Errorf("a body of %d bytes browsed as %d bytes with BodySize %d: want no body (over MaxBrowseBody) and its size", big, len(it.Body), it.BodySize)
		}
	}

	ctx := ctxT(t, e.opts.Wait)
	for _, state := range []driver.BrowseState{driver.BrowseReady, driver.BrowseScheduled, driver.BrowseInFlight} {
		for _, bad := range []string{"x\x1b[31m", "o-1", strings.Repeat("9", 300)} {
			_, err := br.Browse(ctx, e.queue, state, bad, 3)
			var ce *driver.CursorError
			if !errors.Is(err, driver.ErrBadCursor) || !errors.As(err, &ce) {
				t.Errorf("Browse(%s, cursor %q) = %v, want a *driver.CursorError", state, bad, err)
			} else if len(ce.Cursor) > driver.MaxBrowseCursor {
				t.Errorf("the CursorError holds a cursor of %d bytes, want at most %d", len(ce.Cursor), driver.MaxBrowseCursor)
			}
		}
	}

	// Receive one, under a lease that outlasts the case: the in-flight
	// listing may show it; a Browse leaves its lease alone.
	first := e.receiveN(b, 1, 4*e.opts.Wait)[0]
	if e.opts.Unordered == "" && string(first.Body) != ready[0] && string(first.Body) != string(items[0].Body) {
		t.Errorf("the first Receive after a Browse handed out %q, want %q (first in the ready listing)", first.Body, items[0].Body)
	}
	if inflight, partial := e.browseAll(t, br, driver.BrowseInFlight, 3); !partial || len(inflight) > 0 {
		if len(inflight) != 1 || !bytes.Equal(inflight[0].Body, first.Body) {
			t.Errorf("browsed in flight %q, want the one held delivery %q (or an empty partial page)", browseBodies(inflight), first.Body)
		} else if d := inflight[0].Deliveries; d != 1 && d != -1 {
			t.Errorf("the held delivery shows Deliveries %d, want 1 (or -1)", d)
		}
	}
	if again, _ := e.browseAll(t, br, driver.BrowseReady, 50); len(again) != len(ready)-1 {
		t.Errorf("after one Receive the ready listing has %d messages, want %d", len(again), len(ready)-1)
	}
	e.ack(b, first)

	// The rest, one Receive at a time: in the listing's order, each on its
	// first delivery.
	var order []string
	for range len(ready) - 1 {
		d := e.receiveN(b, 1, 4*e.opts.Wait)[0]
		if d.Deliveries != 1 {
			t.Errorf("message %q browsed twice came on delivery %d, want 1: a Browse counted a delivery", d.Body, d.Deliveries)
		}
		order = append(order, string(d.Body))
		e.ack(b, d)
	}
	if want := browseBodies(items[1:]); e.opts.Unordered != "" {
		if !sameSet(order, want) {
			t.Errorf("Receive handed out %q after the Browse, want each of %q", order, want)
		}
	} else if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("Receive handed out %q after the Browse, want the ready listing's order %q", order, want)
	}
	if items, _ := e.browseAll(t, br, driver.BrowseReady, 3); len(items) != 0 {
		t.Errorf("every ready message received and acked, the ready listing still shows %q", browseBodies(items))
	}
	if st, err := b.Stats(ctx, e.queue); err == nil && st.Scheduled != -1 && st.Scheduled != int64(want) {
		t.Errorf("after the Browses Stats.Scheduled = %d, want %d", st.Scheduled, want)
	}
}

// testBrowseLapsedIsReady: a message whose lease ran out, with no Receive
// since, is listed as ready (with its delivery counted), not in flight,
// and a message due now is ready, not scheduled; unless the listing says
// it is partial (driver.Browser).
func testBrowseLapsedIsReady(t *testing.T, e *env) {
	b, br := e.browser(t)
	e.put(b, time.Time{}, "lapsing")
	e.receiveN(b, 1, e.lease)
	e.put(b, time.Now().Add(e.lease/2), "due")
	e.settle() // the lease lapses, the NotBefore passes
	ready, partial := e.browseAll(t, br, driver.BrowseReady, 1)
	got := browseBodies(ready)
	if !partial && !sameSet(got, []string{"lapsing", "due"}) {
		t.Errorf("ready after a lease lapsed and a NotBefore passed: %q, want the lapsed and the due message", got)
	}
	for _, it := range ready {
		if string(it.Body) == "lapsing" && it.Deliveries != 1 && it.Deliveries != -1 {
			t.Errorf("the lapsed message shows Deliveries %d, want 1 (or -1)", it.Deliveries)
		}
		if string(it.Body) == "due" && it.Deliveries != 0 && it.Deliveries != -1 {
			t.Errorf("the due message shows Deliveries %d, want 0 (or -1)", it.Deliveries)
		}
	}
	if fl, _ := e.browseAll(t, br, driver.BrowseInFlight, 10); len(fl) != 0 {
		t.Errorf("in flight after the lease lapsed: %q, want none", browseBodies(fl))
	}
	// A backend that moves due messages on its own (NATS's mover) may
	// take a moment: waited for, within the case's bound.
	e.waitFor("the due message to leave the scheduled listing", func() bool {
		sc, _ := e.browseAll(t, br, driver.BrowseScheduled, 10)
		return len(sc) == 0
	})
	var counts []string
	for _, d := range e.receiveN(b, 2, 4*e.opts.Wait) {
		counts = append(counts, fmt.Sprintf("%s:%d", d.Body, d.Deliveries))
		e.ack(b, d)
	}
	if !sameSet(counts, []string{"lapsing:2", "due:1"}) {
		t.Errorf("received after the browses: %q, want lapsing on its 2nd delivery and due on its 1st", counts)
	}
}
