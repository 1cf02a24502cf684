package status

import (
	"bytes"
	"errors"
	json "github.com/go-json-experiment/json/v1"
	"strings"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// MaxHistory is how many state changes a record keeps: the latest ones,
// with the count of those dropped before them (History.Dropped).
const MaxHistory = 20

// MaxChangeReason is the longest Change.Reason kept, in bytes: a retry's
// reason is its error's first line, cut to this.
const MaxChangeReason = 200

// maxDropped bounds History.Dropped, whatever a record says.
const maxDropped = 1 << 30

// Change is one state change of a job, as its record keeps it.
type Change struct {
	State State     `json:"state"`
	At    time.Time `json:"at"`
	// Try is the try the change is about: the job's try count as it
	// entered State (0 before its first run).
	Try int `json:"try,omitempty"`
	// Reason says why: the dead-letter reason (dead_lettered, cancelled),
	// the error's first line (retrying), the outcome that scheduled the
	// job again (scheduled: rejected, requeued, deferred; waiting:
	// handed_back). At most MaxChangeReason bytes.
	Reason string `json:"reason,omitempty"`
}

// History is a record's state changes, oldest first: the latest
// MaxHistory, and how many were dropped before them.
//
// A record is untrusted (see the package doc): decoding keeps at most
// MaxHistory changes, the latest, whatever the record holds (those before
// are counted in Dropped); a change that is not one (an unknown state, a
// time that does not decode, a negative try) is dropped and counted; a
// reason is cut to MaxChangeReason bytes; Dropped is at least 0 and at most
// 2^30. Memory is bounded by MaxHistory, time by the record's size.
type History struct {
	Changes []Change `json:"changes,omitempty"`
	Dropped int      `json:"dropped,omitempty"`
}

// maxPlainHistory is the size up to which a history is decoded in one
// json.Unmarshal (at most maxPlainHistory/2 changes: bounded), and kept
// when every change in it is valid; a larger one, or one with a change to
// drop, is decoded a change at a time.
const maxPlainHistory = 8 << 10

// errNotHistory reports a history field that is not an object of changes.
var errNotHistory = errors.New("asyncplatform: a status record's history is not a list of state changes")

// UnmarshalJSON decodes a history bounded and checked (see History).
func (h *History) UnmarshalJSON(b []byte) error {
	*h = History{}
	if string(b) == "null" {
		return nil
	}
	if len(b) <= maxPlainHistory && h.plain(b) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return errNotHistory
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return errNotHistory
		}
		key, _ := tok.(string)
		switch {
		case strings.EqualFold(key, "changes"): // as json.Unmarshal matches names
			if err := h.decodeChanges(dec); err != nil {
				return err
			}
		case strings.EqualFold(key, "dropped"):
			var n int64
			if err := dec.Decode(&n); err != nil {
				return errNotHistory
			}
			h.Dropped = addDropped(h.Dropped, int(max(min(n, maxDropped), 0)))
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return errNotHistory
			}
		}
	}
	return nil
}

// plain decodes b, a small history, in one call, and reports whether it
// is kept as it is: every change valid, at most MaxHistory of them.
func (h *History) plain(b []byte) bool {
	var p struct {
		Changes []Change `json:"changes"`
		Dropped int      `json:"dropped"`
	}
	if json.Unmarshal(b, &p) != nil || len(p.Changes) > MaxHistory || p.Dropped < 0 || p.Dropped > maxDropped {
		return false
	}
	for i := range p.Changes {
		if c := &p.Changes[i]; !c.valid() || len(c.Reason) > MaxChangeReason {
			return false
		}
	}
	*h = History{Changes: p.Changes, Dropped: p.Dropped}
	return true
}

// decodeChanges decodes the list of changes dec is at, keeping the latest
// MaxHistory valid ones in order and counting the rest in h.Dropped.
func (h *History) decodeChanges(dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return errNotHistory
	}
	if tok == nil { // null
		return nil
	}
	if tok != json.Delim('[') {
		return errNotHistory
	}
	var ring [MaxHistory]Change
	n := 0 // valid changes seen
	for dec.More() {
		var c Change
		if err := dec.Decode(&c); err != nil || !c.valid() {
			var se *json.SyntaxError
			if errors.As(err, &se) {
				return errNotHistory
			}
			h.Dropped = addDropped(h.Dropped, 1)
			continue
		}
		c.Reason = cutReason(c.Reason)
		ring[n%MaxHistory] = c
		n++
	}
	if _, err := dec.Token(); err != nil { // ]
		return errNotHistory
	}
	kept := min(n, MaxHistory)
	h.Dropped = addDropped(h.Dropped, n-kept)
	h.Changes = make([]Change, kept)
	for i := range kept {
		h.Changes[i] = ring[(n-kept+i)%MaxHistory]
	}
	return nil
}

// valid reports whether c is a change the platform writes.
func (c *Change) valid() bool {
	switch c.State {
	case Waiting, Scheduled, Running, Retrying, Succeeded, DeadLettered, Cancelled:
	default:
		return false
	}
	return !c.At.IsZero() && c.Try >= 0
}

// cutReason cuts s to MaxChangeReason bytes, on a rune boundary.
func cutReason(s string) string {
	if len(s) <= MaxChangeReason {
		return s
	}
	return wire.CutUTF8(s, MaxChangeReason)
}

// addDropped adds n to dropped, at most maxDropped.
func addDropped(dropped, n int) int {
	return min(dropped+min(n, maxDropped), maxDropped)
}

// record adds c to r's history as a change of r's own (not written yet:
// see Record.fresh), dropping the oldest beyond MaxHistory. The history is
// copied, never appended to in place: copies of r share it.
func (r *Record) record(c Change) {
	c.Reason = cutReason(c.Reason)
	h := r.History.Changes
	out := make([]Change, 0, min(len(h)+1, MaxHistory))
	if drop := len(h) + 1 - MaxHistory; drop > 0 {
		h = h[drop:]
		r.History.Dropped = addDropped(r.History.Dropped, drop)
	}
	out = append(append(out, h...), c)
	r.History.Changes = out
	r.fresh = min(r.fresh+1, len(out))
}

// own returns the changes of r's own not written yet.
func (r *Record) own() []Change {
	h := r.History.Changes
	return h[len(h)-min(r.fresh, len(h)):]
}

// joinHistory makes r's history cur's followed by r's own changes (see
// record), the oldest dropped beyond MaxHistory: r is about to be written
// over cur, or shown in its place.
func joinHistory(cur, r *Record) {
	r.History = appendChanges(cur.History, r.own())
}

// appendChanges returns h followed by own, the oldest dropped beyond
// MaxHistory; h is not written to.
func appendChanges(h History, own []Change) History {
	all := make([]Change, 0, min(len(h.Changes)+len(own), MaxHistory))
	dropped := h.Dropped
	cs := h.Changes
	if drop := len(cs) + len(own) - MaxHistory; drop > 0 {
		n := min(drop, len(cs))
		cs, own = cs[n:], own[drop-n:]
		dropped = addDropped(dropped, drop)
	}
	all = append(append(all, cs...), own...)
	return History{Changes: all, Dropped: dropped}
}

// follow makes r's own changes (see record) follow those of earlier, the
// end of an earlier delivery of the same enqueue that r replaces unwritten.
func (r *Record) follow(earlier *Record) {
	own, before := r.own(), earlier.own()
	h := r.History
	base := History{Changes: h.Changes[:len(h.Changes)-len(own)], Dropped: h.Dropped}
	all := make([]Change, 0, len(before)+len(own))
	all = append(append(all, before...), own...)
	r.History = appendChanges(base, all)
	r.fresh = min(len(all), len(r.History.Changes))
}
