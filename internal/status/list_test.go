package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// putRecords writes n records straight to the store: record i is on queue
// "q<i%3>", in state states[i%len(states)], of type "t<i%2>".
func putRecords(t *testing.T, s *kv.Store, n int) []Record {
	t.Helper()
	states := []State{Waiting, Scheduled, Running, Retrying, Succeeded, DeadLettered, Cancelled}
	var out []Record
	for i := range n {
		r := Record{ID: fmt.Sprintf("job-%05d", i), Queue: fmt.Sprintf("q%d", i%3), Type: fmt.Sprintf("t%d", i%2), State: states[i%len(states)], UpdatedAt: clock}
		b, _ := json.Marshal(&r)
		if _, err := s.Create(context.Background(), "job/"+key(r.ID), b, 0); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// A listing paged by its cursor returns every matching record once, and
// nothing else, however small its pages; an unreadable record is skipped
// and counted.
func TestListPagesEveryMatchOnce(t *testing.T) {
	d := newStore(t)
	tk := newTracker(d, "w")
	s := kv.Of(d, kv.Status)
	all := putRecords(t, s, 700)
	if _, err := s.Create(context.Background(), "job/job-00100x", []byte("<not json>"), 0); err != nil {
		t.Fatal(err)
	}
	f := Filter{Queue: "q1", State: Retrying, Type: "t1"}
	// Spelled out, not f.match: the test checks match too.
	matches := func(r *Record) bool { return r.Queue == "q1" && r.State == Retrying && r.Type == "t1" }
	want := map[string]bool{}
	for i := range all {
		if matches(&all[i]) {
			want[all[i].ID] = true
		}
	}
	if len(want) == 0 {
		t.Fatal("the filter matches nothing: the test proves nothing")
	}
	got := map[string]bool{}
	cursor, pages, unreadable := "", 0, 0
	for {
		p, err := tk.List(context.Background(), f, cursor, 3)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		unreadable += p.Unreadable
		if len(p.Records) > 3 {
			t.Fatalf("page of %d records, limit 3", len(p.Records))
		}
		for _, r := range p.Records {
			if !matches(&r) || got[r.ID] {
				t.Fatalf("record %+v: not matching, or listed twice", r)
			}
			got[r.ID] = true
		}
		if p.Next == "" {
			break
		}
		if p.Next <= cursor {
			t.Fatalf("cursor went from %q to %q", cursor, p.Next)
		}
		cursor = p.Next
	}
	if len(got) != len(want) {
		t.Fatalf("listed %d records, want %d", len(got), len(want))
	}
	if unreadable != 1 {
		t.Fatalf("unreadable = %d, want 1", unreadable)
	}
	if pages < len(want)/3 {
		t.Fatalf("%d pages for %d records", pages, len(want))
	}
}

// A page reads at most MaxListScan records: a filter that matches nothing
// returns an empty page and a cursor to go on from, never a scan of the
// whole store.
func TestListScanIsBounded(t *testing.T) {
	d := newStore(t)
	tk := newTracker(d, "w")
	putRecords(t, kv.Of(d, kv.Status), MaxListScan+10)
	p, err := tk.List(context.Background(), Filter{Queue: "nosuch"}, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Records) != 0 || p.Scanned != MaxListScan || p.Next == "" {
		t.Fatalf("page: %d records, scanned %d, next %q; want 0, %d, a cursor", len(p.Records), p.Scanned, p.Next, MaxListScan)
	}
	p, err = tk.List(context.Background(), Filter{Queue: "nosuch"}, p.Next, 10)
	if err != nil {
		t.Fatal(err)
	}
	if p.Scanned != 10 || p.Next != "" {
		t.Fatalf("second page: scanned %d, next %q; want 10, none", p.Scanned, p.Next)
	}
}

// A cursor List cannot have given is refused, not taken as a key.
func TestListBadCursor(t *testing.T) {
	d := newStore(t)
	tk := newTracker(d, "w")
	for _, c := range []string{"a/b", "\x1b[31m", "sha-zz", string(make([]byte, 300))} {
		if _, err := tk.List(context.Background(), Filter{}, c, 10); !errors.Is(err, ErrBadCursor) {
			t.Errorf("List(cursor %q) = %v, want ErrBadCursor", c, err)
		}
	}
}

// Count counts every record by queue and state.
func TestCount(t *testing.T) {
	d := newStore(t)
	tk := newTracker(d, "w")
	all := putRecords(t, kv.Of(d, kv.Status), 100)
	want := map[string]map[State]int{}
	for _, r := range all {
		if want[r.Queue] == nil {
			want[r.Queue] = map[State]int{}
		}
		want[r.Queue][r.State]++
	}
	c, err := tk.Count(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Complete || c.Scanned != 100 || fmt.Sprint(c.ByQueue) != fmt.Sprint(want) {
		t.Fatalf("Count = %+v, want %v, complete", c, want)
	}
	c, err = tk.Count(context.Background(), "q2")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.ByQueue) != 1 || fmt.Sprint(c.ByQueue["q2"]) != fmt.Sprint(want["q2"]) {
		t.Fatalf("Count(q2) = %v, want %v", c.ByQueue, want["q2"])
	}
}
