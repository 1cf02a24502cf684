package status

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// stepClock returns a clock that moves one second at each reading, from
// the tests' clock.
func stepClock() func() time.Time {
	var mu sync.Mutex
	now := clock
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Second)
		return now
	}
}

// states lists the states of h's changes, with their tries and reasons.
func states(h History) string {
	var b strings.Builder
	for i, c := range h.Changes {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s/%d", c.State, c.Try)
		if c.Reason != "" {
			fmt.Fprintf(&b, "(%s)", c.Reason)
		}
	}
	return b.String()
}

// checkTimes fails the test unless h's times are strictly increasing (the
// tests' clocks step at each reading).
func checkTimes(t *testing.T, h History) {
	t.Helper()
	for i := 1; i < len(h.Changes); i++ {
		if !h.Changes[i].At.After(h.Changes[i-1].At) {
			t.Errorf("change %d at %v, not after change %d at %v", i, h.Changes[i].At, i-1, h.Changes[i-1].At)
		}
	}
}

// A job retried twice, then dead-lettered, has each of its state changes
// in its record, in order, with its try, its reason and its time, as
// every process reads it, also when an end written after its running
// state is refused and merged again; the history costs no write of its
// own: the enqueue, each end and the one running state written (a long
// handler) are the writes.
func TestHistoryOfRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	tk, other := newTracker(d, "w1"), newTracker(d, "w2")
	tk.cfg.Now = stepClock()
	tk.cfg.Poll = time.Hour // the running state is written by the test's flushRunning alone
	before := d.n.Load()
	j := Job{ID: "j1", Queue: "q", Type: "t", Nonce: "n"}
	tk.Enqueued(ctx, []Job{j})
	for try := 1; try <= 3; try++ {
		j.TryCount, j.Failures, j.Copy = try-1, try-1, uint64(try-1)
		tr := deliver(t, tk, j)
		if r := get(t, tk, "j1"); !strings.HasSuffix(states(r.History), fmt.Sprintf("running/%d", try)) || r.History.Changes[0].State != Waiting {
			t.Errorf("here, while try %d runs: %s; want the record's history, then running", try, states(r.History))
		}
		if try == 2 { // a long handler: its running state is written
			tr.wmu.Lock()
			tr.since = time.Now().Add(-time.Hour)
			tr.wmu.Unlock()
			tk.flushRunning(ctx)
			// Another process writes the record meanwhile (uncounted):
			// the end's write at the running state's revision fails, and
			// the end is merged into the record read again.
			s := kv.Of(d.Store, kv.Status)
			v, rev, err := s.Get(ctx, "job/j1")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Update(ctx, "job/j1", v, rev, time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		tr.Ended(ctx, true)
		dec := decide.Decision{Outcome: decide.Retried, RetryAt: clock.Add(time.Hour), Failures: try}
		if try == 3 {
			dec = decide.Decision{Outcome: decide.DeadLettered, Reason: decide.RetriesExceeded, Failures: try}
		}
		tr.Settled(ctx, dec, try, nil, fmt.Sprintf("boom %d", try))
		flush(t, tk)
	}
	want := "waiting/0 running/1 retrying/1(boom 1) running/2 retrying/2(boom 2) running/3 dead_lettered/3(retries_exceeded)"
	for name, tk := range map[string]*Tracker{"here": tk, "elsewhere": other} {
		r := get(t, tk, "j1")
		if got := states(r.History); got != want || r.History.Dropped != 0 {
			t.Errorf("%s: history %s, %d dropped; want %s", name, got, r.History.Dropped, want)
		}
		checkTimes(t, r.History)
		if last := r.History.Changes[len(r.History.Changes)-1]; !last.At.Equal(r.UpdatedAt) {
			t.Errorf("%s: the last change at %v, the record updated at %v", name, last.At, r.UpdatedAt)
		}
	}
	if n := d.n.Load() - before; n != 6 {
		t.Errorf("%d writes; want 6 (the enqueue, three ends, one running, the end refused after the other process's write)", n)
	}
}

// Ends of the same job waiting together for the writer are written once,
// with the changes of both.
func TestHistoryOfEndsWrittenTogether(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &batcher{Store: newStore(t)}
	tk := newTracker(b, "w1")
	tk.cfg.Now = stepClock()
	tk.Enqueued(ctx, []Job{{ID: "a", Queue: "q", Type: "t"}, {ID: "j1", Queue: "q", Type: "t"}})
	open := b.shut()
	settle(t, tk, Job{ID: "a", Queue: "q", Type: "t"}) // the writer takes it, and waits
	waitFor(t, "the writer to take the first end", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.getEach) > 0
	})
	j := Job{ID: "j1", Queue: "q", Type: "t"}
	tr := deliver(t, tk, j)
	tr.Settled(ctx, decide.Decision{Outcome: decide.Retried, Failures: 1}, 1, nil, "boom")
	j.TryCount, j.Failures, j.Copy = 1, 1, 1
	settle(t, tk, j)

	// The retry's copy ends before the attempt that scheduled it hands
	// its end over: the later end takes the earlier one's changes first.
	tk.Enqueued(ctx, []Job{{ID: "j2", Queue: "q", Type: "t"}})
	first := deliver(t, tk, Job{ID: "j2", Queue: "q", Type: "t"})
	second := deliver(t, tk, Job{ID: "j2", Queue: "q", Type: "t", TryCount: 1, Failures: 1, Copy: 1})
	second.Settled(ctx, decide.Decision{Outcome: decide.Succeeded, Failures: 1}, 2, nil, "")
	first.Settled(ctx, decide.Decision{Outcome: decide.Retried, Failures: 1}, 1, nil, "boom")

	want := "waiting/0 running/1 retrying/1(boom) running/2 succeeded/2"
	for _, id := range []string{"j1", "j2"} {
		if got := states(get(t, tk, id).History); got != want {
			t.Errorf("%s here, before the write: %s; want %s", id, got, want)
		}
	}
	open()
	flush(t, tk)
	for _, id := range []string{"j1", "j2"} {
		r := get(t, newTracker(b, "w2"), id)
		if got := states(r.History); got != want {
			t.Errorf("%s elsewhere, after the write: %s; want %s", id, got, want)
		}
		if id == "j1" { // j2's changes are in the order the deliveries read the clock
			checkTimes(t, r.History)
		}
		if r.Error != "boom" {
			t.Errorf("%s after its ends were written together: last error %q, want the retry's \"boom\"", id, r.Error)
		}
	}
}

// waitFor waits up to a minute for cond.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A record keeps its latest MaxHistory changes and counts those dropped.
func TestHistoryBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	tk := newTracker(d, "w1")
	tk.cfg.Now = stepClock()
	j := Job{ID: "j1", Queue: "q", Type: "t"}
	tk.Enqueued(ctx, []Job{j})
	const tries = 15 // two changes each, after the enqueue's
	for try := 1; try <= tries; try++ {
		j.TryCount, j.Copy = try-1, uint64(try-1)
		tr := deliver(t, tk, j)
		tr.Settled(ctx, decide.Decision{Outcome: decide.Rejected, RetryAt: clock}, try, nil, "")
		flush(t, tk)
	}
	r := get(t, newTracker(d, "w2"), "j1")
	h := r.History
	if len(h.Changes) != MaxHistory || h.Dropped != 1+2*tries-MaxHistory {
		t.Fatalf("%d changes, %d dropped; want %d, %d", len(h.Changes), h.Dropped, MaxHistory, 1+2*tries-MaxHistory)
	}
	if last := h.Changes[MaxHistory-1]; last.State != Scheduled || last.Try != tries || last.Reason != "rejected" {
		t.Errorf("the last change: %+v; want scheduled, try %d, rejected", last, tries)
	}
	checkTimes(t, h)
}

// A record written before histories reads, and the next write starts its
// history.
func TestHistoryOfAnOldRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	s := kv.Of(d, kv.Status)
	old := `{"id":"j1","queue":"q","type":"t","state":"waiting","tries":0,"failures":0,"crashes":0,"updated_at":"2026-11-29T09:00:00Z","nonce":"n"}`
	if _, err := s.Create(ctx, "job/j1", []byte(old), time.Hour); err != nil {
		t.Fatal(err)
	}
	tk := newTracker(d, "w1")
	if r := get(t, tk, "j1"); r.State != Waiting || len(r.History.Changes) != 0 {
		t.Fatalf("the old record: %+v", r)
	}
	settle(t, tk, Job{ID: "j1", Queue: "q", Type: "t", Nonce: "n"})
	flush(t, tk)
	if got := states(get(t, newTracker(d, "w2"), "j1").History); got != "running/1 succeeded/1" {
		t.Errorf("after a delivery: %s; want running/1 succeeded/1", got)
	}
}

// A record is untrusted: its history decodes bounded and checked, however
// it was forged, and a change the platform would not write is dropped and
// counted, never shown.
func TestHistoryForged(t *testing.T) {
	t.Parallel()
	at := `"2026-11-29T10:00:00Z"`
	ok := `{"state":"running","at":` + at + `,"try":1}`
	rec := func(history string) string {
		return `{"id":"j1","state":"running","updated_at":` + at + `,"history":` + history + `}`
	}
	tests := []struct {
		name    string
		history string
		changes int // kept
		dropped int
		bad     bool // the record does not decode
	}{
		{name: "Null", history: `null`},
		{name: "NullChanges", history: `{"changes":null}`},
		{name: "Kept", history: `{"changes":[` + ok + `,` + ok + `],"dropped":3}`, changes: 2, dropped: 3},
		{name: "UnknownState", history: `{"changes":[{"state":"<script>","at":` + at + `},` + ok + `]}`, changes: 1, dropped: 1},
		{name: "BadTime", history: `{"changes":[{"state":"running","at":"yesterday"},{"state":"running","at":12},{"state":"running"},` + ok + `]}`, changes: 1, dropped: 3},
		{name: "NegativeTry", history: `{"changes":[{"state":"running","at":` + at + `,"try":-1}]}`, dropped: 1},
		{name: "HugeTry", history: `{"changes":[{"state":"running","at":` + at + `,"try":1e300}]}`, dropped: 1},
		{name: "NotAChange", history: `{"changes":[1,"x",[],null,true]}`, dropped: 5},
		{name: "NegativeDropped", history: `{"dropped":-5}`},
		{name: "HugeDropped", history: `{"dropped":999999999999999999}`, dropped: maxDropped},
		{name: "ExponentDropped", history: `{"dropped":1e18}`, bad: true},
		{name: "FloatDropped", history: `{"dropped":1.5}`, bad: true},
		{name: "UnknownField", history: `{"changes":[` + ok + `],"more":[1,2,3]}`, changes: 1},
		{name: "NotAnObject", history: `[` + ok + `]`, bad: true},
		{name: "ChangesNotAList", history: `{"changes":{"state":"running"}}`, bad: true},
		{name: "String", history: `"history"`, bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := decode([]byte(rec(tt.history)))
			if tt.bad {
				if err == nil {
					t.Fatalf("decoded %+v; want an error", r.History)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(r.History.Changes) != tt.changes || r.History.Dropped != tt.dropped {
				t.Errorf("%d changes, %d dropped; want %d, %d", len(r.History.Changes), r.History.Dropped, tt.changes, tt.dropped)
			}
		})
	}

	t.Run("LongReason", func(t *testing.T) {
		long := strings.Repeat("é", MaxChangeReason) // two bytes each
		r, err := decode([]byte(rec(`{"changes":[{"state":"retrying","at":` + at + `,"reason":"` + long + `"}]}`)))
		if err != nil {
			t.Fatal(err)
		}
		if got := r.History.Changes[0].Reason; len(got) > MaxChangeReason || !strings.HasPrefix(long, got) || got == "" {
			t.Errorf("a %d-byte reason kept as %d bytes; want it cut to at most %d on a rune boundary", len(long), len(got), MaxChangeReason)
		}
	})

	t.Run("Million", func(t *testing.T) {
		// A record is at most a store value (64 KiB): one of a million
		// changes (48 MB) is refused before it is decoded.
		const n = 1_000_000
		b := changes(n)
		start := time.Now()
		if _, err := decode([]byte(rec(b))); err == nil || !strings.Contains(err.Error(), "larger than") {
			t.Errorf("a %d-byte record: %v; want it refused as too large", len(rec(b)), err)
		}
		t.Logf("refused in %v", time.Since(start))
	})

	t.Run("Many", func(t *testing.T) {
		// A history of more changes than a store value holds decodes
		// with its latest MaxHistory, the rest counted.
		const n = 10_000
		var h History
		if err := json.Unmarshal([]byte(changes(n)), &h); err != nil {
			t.Fatal(err)
		}
		if len(h.Changes) != MaxHistory || h.Dropped != 5+n-MaxHistory || h.Changes[0].Try != n-MaxHistory || h.Changes[MaxHistory-1].Try != n-1 {
			t.Fatalf("%d changes (tries %d to %d), %d dropped; want the latest %d, %d dropped",
				len(h.Changes), h.Changes[0].Try, h.Changes[len(h.Changes)-1].Try, h.Dropped, MaxHistory, 5+n-MaxHistory)
		}
	})
}

// changes is a history of n valid changes (tries 0 to n-1), 5 dropped
// before them.
func changes(n int) string {
	var b strings.Builder
	b.WriteString(`{"changes":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"state":"running","at":"2026-11-29T10:00:00Z","try":%d}`, i)
	}
	b.WriteString(`],"dropped":5}`)
	return b.String()
}

// The largest record a store holds, filled with changes, reads at once
// with MaxHistory of them.
func TestHistoryForgedInTheStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	var b bytes.Buffer
	b.WriteString(`{"id":"j1","queue":"q","type":"t","state":"running","updated_at":"2026-11-29T10:00:00Z","nonce":"n","history":{"changes":[`)
	n := 0
	for b.Len() < driver.MaxValueLen-100 {
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"state":"running","at":"2026-11-29T10:00:00Z"}`)
		n++
	}
	b.WriteString(`]}}`)
	if _, err := kv.Of(d, kv.Status).Create(ctx, "job/j1", b.Bytes(), time.Hour); err != nil {
		t.Fatal(err)
	}
	tk := newTracker(d, "w1")
	r := get(t, tk, "j1")
	if len(r.History.Changes) != MaxHistory || r.History.Dropped != n-MaxHistory {
		t.Fatalf("%d changes, %d dropped; want %d, %d", len(r.History.Changes), r.History.Dropped, MaxHistory, n-MaxHistory)
	}
	// The job's next end is written over it, with a bounded history.
	settle(t, tk, Job{ID: "j1", Queue: "q", Type: "t", Nonce: "n"})
	flush(t, tk)
	r = get(t, newTracker(d, "w2"), "j1")
	if r.State != Succeeded || len(r.History.Changes) != MaxHistory || r.History.Dropped != n-MaxHistory+2 {
		t.Errorf("after the end: %s, %d changes, %d dropped; want succeeded, %d, %d", r.State, len(r.History.Changes), r.History.Dropped, MaxHistory, n-MaxHistory+2)
	}
}

// A worker that writes a job's state before the enqueue writes its record
// keeps its state, and the history gets the enqueue's change first.
func TestHistoryEnqueuedAfterTheWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	tk := newTracker(d, "w1")
	tk.cfg.Now = stepClock()
	j := Job{ID: "j1", Queue: "q", Type: "t", Nonce: "n"}
	enqueuedAt := tk.cfg.Now()
	settle(t, tk, j)
	flush(t, tk)
	tk.cfg.Now = func() time.Time { return enqueuedAt } // the enqueue read its clock before the worker
	tk.Enqueued(ctx, []Job{j})
	tk.Enqueued(ctx, []Job{j}) // again: nothing more
	r := get(t, newTracker(d, "w2"), "j1")
	if got := states(r.History); r.State != Succeeded || got != "waiting/0 running/1 succeeded/1" {
		t.Errorf("%s, history %s; want succeeded, waiting/0 running/1 succeeded/1", r.State, got)
	}
	checkTimes(t, r.History)
}
