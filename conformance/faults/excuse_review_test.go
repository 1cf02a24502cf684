package faults

import (
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// reviewG: only a parent attempt whose handler returned nil can have
// enqueued the join before its lease was lost (contract section 16 rule 15).
// A parent whose lease was lost while its handler ran is cancelled
// (ResultCancel): it enqueued nothing, and its redelivery enqueues the join
// once. A join started and completed twice there was enqueued twice by
// something else; runsOnce excuses it all the same.
func TestRunsOnceCancelledParentExcusesNothing(t *testing.T) {
	var h History
	at := time.Unix(0, 0)
	add := func(e Event) {
		at = at.Add(time.Millisecond)
		e.At = at
		h = append(h, e)
	}
	add(Event{Kind: KindEnqueue, ID: "join"})
	add(Event{Kind: KindStart, ID: "p0", Worker: "w1", Try: 1})
	add(Event{Kind: KindEnd, ID: "p0", Worker: "w1", Try: 1, Result: ResultCancel})
	add(Event{Kind: KindAck, ID: "p0", Worker: "w1", Try: 1, Result: string(ap.OutcomeLeaseLost)})
	add(Event{Kind: KindStart, ID: "p0", Worker: "w2", Try: 1, Copy: 1})
	add(Event{Kind: KindEnd, ID: "p0", Worker: "w2", Try: 1, Copy: 1, Result: ResultOK})
	add(Event{Kind: KindAck, ID: "p0", Worker: "w2", Try: 1, Copy: 1, Result: string(ap.OutcomeSucceeded)})
	for cp := range uint64(2) {
		add(Event{Kind: KindStart, ID: "join", Worker: "w1", Copy: cp, Try: 1})
	}
	for cp := range uint64(2) {
		add(Event{Kind: KindEnd, ID: "join", Worker: "w1", Copy: cp, Try: 1, Result: ResultOK})
		add(Event{Kind: KindAck, ID: "join", Worker: "w1", Copy: cp, Try: 1, Result: string(ap.OutcomeSucceeded)})
	}
	if w := h.runsOnce("join", nil, []string{"p0"}); len(w) != 2 {
		t.Errorf("a parent's lease lost while its handler ran (cancelled, nothing enqueued): got %q, want two complaints", w)
	}
}
