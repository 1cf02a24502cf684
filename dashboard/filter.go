package dashboard

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// filter selects dead letters: every set field must match.
type filter struct {
	Type   string // exact, or a prefix when it ends in '*'
	Reason string // exact
	Older  string // dead for at least this long (a duration, "2d" for days)
	Newer  string // dead for at most this long
	Text   string // in any text of the record, case folded
	AsOf   int64  // Unix seconds the ages count from, so paging and acting see one cut

	older, newer time.Duration
	text         []byte
}

// maxFilterText bounds each field of a filter.
const maxFilterText = 500

// parseFilter reads a filter from a query or a form. AsOf is now when v has
// none.
func parseFilter(v url.Values, now time.Time) (filter, error) {
	f := filter{
		Type:   strings.TrimSpace(v.Get("type")),
		Reason: strings.TrimSpace(v.Get("reason")),
		Older:  strings.TrimSpace(v.Get("older")),
		Newer:  strings.TrimSpace(v.Get("newer")),
		Text:   strings.TrimSpace(v.Get("text")),
		AsOf:   now.Unix(),
	}
	for _, s := range []string{f.Type, f.Reason, f.Older, f.Newer, f.Text} {
		if len(s) > maxFilterText {
			return f, fmt.Errorf("a filter is longer than %d bytes", maxFilterText)
		}
	}
	if s := v.Get("asof"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return f, errors.New("bad asof: Unix seconds expected")
		}
		f.AsOf = n
	}
	var err error
	if f.older, err = parseAge(f.Older); err != nil {
		return f, fmt.Errorf("older than: %w", err)
	}
	if f.newer, err = parseAge(f.Newer); err != nil {
		return f, fmt.Errorf("newer than: %w", err)
	}
	f.text = bytes.ToLower([]byte(f.Text))
	return f, nil
}

// parseAge reads a duration as Go writes them (90s, 1h30m), with d for days
// (2d, 1d12h); empty is none.
func parseAge(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.Atoi(s[:i])
		if err != nil || n < 0 || n > 100_000 {
			return 0, fmt.Errorf("%q is not a duration such as 30m, 2h or 3d", s)
		}
		days = time.Duration(n) * 24 * time.Hour
		s = s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a duration such as 30m, 2h or 3d", s)
	}
	return days + d, nil
}

// set reports whether the filter selects anything less than everything.
func (f filter) set() bool {
	return f.Type != "" || f.Reason != "" || f.older > 0 || f.newer > 0 || f.Text != ""
}

// values returns the filter as query parameters.
func (f filter) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"type": f.Type, "reason": f.Reason, "older": f.Older, "newer": f.Newer, "text": f.Text} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if f.older > 0 || f.newer > 0 {
		v.Set("asof", strconv.FormatInt(f.AsOf, 10))
	}
	return v
}

// describe says what the filter selects, in words.
func (f filter) describe() string {
	var parts []string
	if f.Type != "" {
		parts = append(parts, "type "+f.Type)
	}
	if f.Reason != "" {
		parts = append(parts, "reason "+f.Reason)
	}
	if f.Older != "" {
		parts = append(parts, "dead for more than "+f.Older)
	}
	if f.Newer != "" {
		parts = append(parts, "dead for less than "+f.Newer)
	}
	if f.Text != "" {
		parts = append(parts, "containing “"+f.Text+"”")
	}
	if len(parts) == 0 {
		return "every dead letter"
	}
	return strings.Join(parts, ", ")
}

func (f filter) match(dl *ap.DeadLetter) bool {
	if f.Type != "" {
		if p, ok := strings.CutSuffix(f.Type, "*"); ok {
			if !strings.HasPrefix(dl.Job.Type, p) {
				return false
			}
		} else if dl.Job.Type != f.Type {
			return false
		}
	}
	if f.Reason != "" && string(dl.Reason) != f.Reason {
		return false
	}
	asOf := time.Unix(f.AsOf, 0)
	if f.older > 0 && dl.DeadAt.After(asOf.Add(-f.older)) {
		return false
	}
	if f.newer > 0 && dl.DeadAt.Before(asOf.Add(-f.newer)) {
		return false
	}
	if len(f.text) > 0 && !f.matchText(dl) {
		return false
	}
	return true
}

func (f filter) matchText(dl *ap.DeadLetter) bool {
	has := func(s string) bool { return containsFold([]byte(s), f.text) }
	if has(dl.ID) || has(dl.Job.ID) || has(dl.Job.Type) || has(string(dl.Reason)) || has(dl.Error) || has(dl.Worker) {
		return true
	}
	for _, e := range dl.Job.Errors {
		if has(e) {
			return true
		}
	}
	for k, v := range dl.Job.Headers {
		if has(k) || has(v) {
			return true
		}
	}
	return containsFold(dl.Job.Payload, f.text) || containsFold(dl.Raw, f.text)
}

// containsFold reports whether b holds lower (already lower case),
// ignoring case.
func containsFold(b, lower []byte) bool {
	if len(b) < len(lower) {
		return false
	}
	return bytes.Contains(b, lower) || bytes.Contains(bytes.ToLower(b), lower)
}

// A position in a dead-letter queue: the backend's cursor of a page, the
// number of records to skip in it, and the index of that page's first
// record (for "records 1,001–1,050"). The dashboard's cursors encode one.
type position struct {
	Off    int64
	Skip   int
	Cursor string
}

func (p position) encode() string {
	if p == (position{}) {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(p.Off, 10) + "." + strconv.Itoa(p.Skip) + "." + p.Cursor))
}

func decodePosition(s string) (position, error) {
	if s == "" {
		return position{}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) > 4096 {
		return position{}, errors.New("bad cursor")
	}
	parts := strings.SplitN(string(b), ".", 3)
	if len(parts) != 3 {
		return position{}, errors.New("bad cursor")
	}
	off, err1 := strconv.ParseInt(parts[0], 10, 64)
	skip, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || off < 0 || skip < 0 || skip >= maxBatch {
		return position{}, errors.New("bad cursor")
	}
	return position{Off: off, Skip: skip, Cursor: parts[2]}, nil
}

// maxBatch is the largest page Platform.DeadLetters returns.
const maxBatch = 1000

// found is a dead letter with where it was found.
type found struct {
	DL   ap.DeadLetter
	Pos  int64    // its index in the queue, from 0
	Page position // the page it is on (Skip 0)
}

// scanResult is what a scan found and where it stopped.
type scanResult struct {
	Found   []found
	Next    position // where to go on; zero with Done
	Done    bool     // the end of the queue was reached
	Scanned int      // records examined
	Cut     bool     // stopped by the budget before the page was full
}

// scan walks the queue from start, collecting up to want records matching
// f (want < 0: all), examining at most budget records (< 0: no bound) and
// stopping at deadline (zero: none).
func scan(ctx context.Context, p *ap.Platform, queue string, f filter, start position, want, budget int, deadline time.Time, visit func(found) bool) (scanResult, error) {
	var res scanResult
	batch := maxBatch
	if !f.set() && want > 0 {
		batch = max(want, 1) // every record matches: read no more than shown
	}
	pos := start
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		size := min(maxBatch, max(batch, pos.Skip+1))
		if budget >= 0 {
			size = min(size, max(pos.Skip+budget-res.Scanned, 1)) // read no more than the budget lets examine
		}
		page, err := p.DeadLetters(ctx, queue, pos.Cursor, size)
		if err != nil {
			return res, err
		}
		pageAt := position{Off: pos.Off, Cursor: pos.Cursor}
		for i := pos.Skip; i < len(page.Letters); i++ {
			res.Scanned++
			dl := &page.Letters[i]
			if f.match(dl) {
				fd := found{DL: *dl, Pos: pos.Off + int64(i), Page: pageAt}
				if visit != nil && !visit(fd) {
					res.Next = position{Off: pos.Off, Skip: i + 1, Cursor: pos.Cursor}
					return res, nil
				}
				if want >= 0 {
					res.Found = append(res.Found, fd)
				}
				if want > 0 && len(res.Found) >= want {
					res.Next = position{Off: pos.Off, Skip: i + 1, Cursor: pos.Cursor}
					if i+1 == len(page.Letters) {
						if page.Next == "" {
							res.Next, res.Done = position{}, true
						} else {
							res.Next = position{Off: pos.Off + int64(len(page.Letters)), Cursor: page.Next}
						}
					}
					return res, nil
				}
			}
			if (budget >= 0 && res.Scanned >= budget) || (!deadline.IsZero() && res.Scanned%100 == 0 && time.Now().After(deadline)) {
				res.Cut = true
				res.Next = position{Off: pos.Off, Skip: i + 1, Cursor: pos.Cursor}
				if i+1 == len(page.Letters) {
					if page.Next == "" {
						res.Next, res.Done, res.Cut = position{}, true, false
					} else {
						res.Next = position{Off: pos.Off + int64(len(page.Letters)), Cursor: page.Next}
					}
				}
				return res, nil
			}
		}
		if page.Next == "" || len(page.Letters) == 0 {
			res.Done = true
			return res, nil
		}
		pos = position{Off: pos.Off + int64(len(page.Letters)), Cursor: page.Next}
	}
}

// errNotFound is find's answer for an ID no record has.
var errNotFound = errors.New("no such dead letter")

// lookupCut is find's answer when it stopped looking for the ID: at the
// look-up's limit of records, or at its deadline.
type lookupCut struct{ Scanned int }

func (e *lookupCut) Error() string {
	return fmt.Sprintf("no such dead letter among the first %d dead letters", e.Scanned)
}

// named reports whether id names the record by its own ID (the job's ID
// and copy number), and byJob whether it names it by its job's ID, which
// names the oldest of the job's records. One string can be both: "v.1" is
// the record of job v's copy 1 and the job ID of another job, so a
// record's own ID wins over a job's.
func named(dl ap.DeadLetter, id string) bool { return dl.ID == id }

func byJob(dl ap.DeadLetter, id string) bool { return dl.Job.ID == id }

// find returns the record named by the ID (named; else the first byJob),
// looking first in the page at hint (where a listing saw it), then through
// the queue from its start: in all, at most limit records and until
// deadline (zero: none). Past them it returns a *lookupCut, unless a
// record of the job was found. A lookup by a job's ID reads up to limit
// records, in case a record has that ID of its own.
func find(ctx context.Context, p *ap.Platform, queue, id string, hint position, limit int, deadline time.Time) (found, error) {
	if hint != (position{}) {
		page, err := p.DeadLetters(ctx, queue, hint.Cursor, min(maxBatch, limit))
		if err == nil {
			for i, dl := range page.Letters {
				if named(dl, id) {
					return found{DL: dl, Pos: hint.Off + int64(i), Page: position{Off: hint.Off, Cursor: hint.Cursor}}, nil
				}
			}
			limit -= len(page.Letters)
		}
	}
	if limit < 1 {
		return found{}, &lookupCut{}
	}
	var hit, jobHit *found
	res, err := scan(ctx, p, queue, filter{}, position{}, -1, limit, deadline, func(fd found) bool {
		switch {
		case named(fd.DL, id):
			hit = &fd
			return false
		case jobHit == nil && byJob(fd.DL, id):
			jobHit = &fd
		}
		return true // go on
	})
	if err != nil {
		return found{}, err
	}
	if hit != nil {
		return *hit, nil
	}
	if jobHit != nil {
		return *jobHit, nil
	}
	if res.Cut {
		return found{}, &lookupCut{Scanned: res.Scanned}
	}
	return found{}, errNotFound
}
