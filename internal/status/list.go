package status

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// Listing bounds. A listing reads the records in key order (the job keys),
// a store page at a time, and filters them here: the store keeps no index
// by queue, state or type.
const (
	// DefaultListLimit is the jobs a listing page holds when none is asked.
	DefaultListLimit = 50
	// MaxListLimit is the most jobs a listing page holds.
	MaxListLimit = 500
	// MaxListScan is the most records one listing page reads: a filter
	// that matches few records returns a short page with a cursor before
	// the records run out.
	MaxListScan = 5000
	// MaxCountScan is the most records one Count reads; past it the counts
	// are of the first MaxCountScan records and say so.
	MaxCountScan = 20000
)

// Filter selects records; an empty field selects every value.
type Filter struct {
	Queue string
	State State
	Type  string
}

func (f *Filter) match(r *Record) bool {
	return (f.Queue == "" || r.Queue == f.Queue) && (f.State == "" || r.State == f.State) && (f.Type == "" || r.Type == f.Type)
}

// Page is one page of a listing.
type Page struct {
	Records []Record
	// Next is the cursor of the next page; empty when the records ran
	// out.
	Next string
	// Scanned is how many records the page read; Unreadable how many of
	// them were not status records (skipped).
	Scanned, Unreadable int
}

// ErrBadCursor is matched by the error of a cursor List did not give.
var ErrBadCursor = errors.New("asyncplatform: bad job listing cursor")

// List returns up to limit records (DefaultListLimit when zero or less, at
// most MaxListLimit) that match f, in the order of their keys, from after
// cursor (empty: from the first). It reads at most MaxListScan records: a
// page may be short, or empty, with a Next to go on from. The records are
// as written to the store: a job running here whose running state is not
// written yet shows its state before.
func (t *Tracker) List(ctx context.Context, f Filter, cursor string, limit int) (Page, error) {
	s, err := t.store()
	if err != nil {
		return Page{}, err
	}
	if limit <= 0 {
		limit = DefaultListLimit
	}
	limit = min(limit, MaxListLimit)
	after := ""
	if cursor != "" {
		if kv.Segment(cursor) != cursor || driver.CheckKey("job/"+cursor) != nil {
			return Page{}, fmt.Errorf("%w: %q", ErrBadCursor, cursor)
		}
		after = "job/" + cursor
	}
	var p Page
	err = t.scan(ctx, s, after, MaxListScan, limit, func(k string, r *Record, ok bool) bool {
		p.Scanned++
		if !ok {
			p.Unreadable++
			return true
		}
		if f.match(r) {
			p.Records = append(p.Records, *r)
		}
		return len(p.Records) < limit
	}, &p.Next)
	if err != nil {
		return Page{}, err
	}
	return p, nil
}

// Counts is how many records there are by queue and state.
type Counts struct {
	ByQueue map[string]map[State]int
	// Scanned is how many records were read; Unreadable how many of them
	// were not status records. Complete: every record was read (else the
	// counts are of the first MaxCountScan in key order).
	Scanned, Unreadable int
	Complete            bool
}

// Count counts the records by queue and state, of queue alone when it is
// not empty, reading at most MaxCountScan records.
func (t *Tracker) Count(ctx context.Context, queue string) (Counts, error) {
	s, err := t.store()
	if err != nil {
		return Counts{}, err
	}
	c := Counts{ByQueue: map[string]map[State]int{}}
	var next string
	err = t.scan(ctx, s, "", MaxCountScan, kv.MaxListLimit, func(_ string, r *Record, ok bool) bool {
		c.Scanned++
		if !ok {
			c.Unreadable++
			return true
		}
		if queue != "" && r.Queue != queue {
			return true
		}
		m := c.ByQueue[r.Queue]
		if m == nil {
			m = map[State]int{}
			c.ByQueue[r.Queue] = m
		}
		m[r.State]++
		return true
	}, &next)
	if err != nil {
		return Counts{}, err
	}
	c.Complete = next == ""
	return c, nil
}

// scan calls fn with the key segment and record of each job key after
// after, in key order, at most budget of them, until fn returns false (ok:
// the value decoded as a record). *next is left as the segment of the
// last key fn was called with when more may follow, else set empty. It
// reads first records in its first round trip, and twice as many in each
// next (up to kv.MaxListLimit): a page whose filter matches most records
// reads about as many as it returns, one that matches few reads on in
// larger steps.
func (t *Tracker) scan(ctx context.Context, s *kv.Store, after string, budget, first int, fn func(k string, r *Record, ok bool) bool, next *string) error {
	cursor := after
	seen := 0
	step := max(first, 1)
	for {
		keys, more, err := s.List(ctx, "job/", cursor, min(step, kv.MaxListLimit, budget-seen))
		step *= 2
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			*next = ""
			return nil
		}
		rs, err := s.GetEach(ctx, keys)
		if err != nil {
			return err
		}
		for i, res := range rs {
			*next = strings.TrimPrefix(keys[i], "job/")
			if res.Err != nil { // gone since the listing
				continue
			}
			seen++
			r, err := decode(res.Value)
			ok := err == nil
			if !fn(*next, &r, ok) {
				if i == len(rs)-1 && more == "" {
					*next = ""
				}
				return nil
			}
		}
		if more == "" {
			*next = ""
			return nil
		}
		if seen >= budget {
			return nil
		}
		cursor = more
	}
}
