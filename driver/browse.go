package driver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// BrowseState names the part of a queue Browser.Browse lists.
type BrowseState string

// The parts of a queue a Browse lists.
const (
	// BrowseReady: deliverable now, in the order Receive hands them out
	// (as far as the broker keeps one).
	BrowseReady BrowseState = "ready"
	// BrowseScheduled: waiting for their NotBefore (a retry's backoff
	// included), soonest first.
	BrowseScheduled BrowseState = "scheduled"
	// BrowseInFlight: handed out under a lease not yet run out, soonest
	// lease end first.
	BrowseInFlight BrowseState = "in_flight"
)

// Bounds of a Browse.
const (
	// MaxBrowseLimit is the most items one Browse returns: a larger limit
	// is cut to it, a limit under 1 means DefaultBrowseLimit.
	MaxBrowseLimit = 500
	// DefaultBrowseLimit is the page size of a Browse given no limit.
	DefaultBrowseLimit = 50
	// MaxBrowseBody is the largest body a Browse returns: an item whose
	// stored body is larger has no Body, and its BodySize says how large
	// it is.
	MaxBrowseBody = 64 << 10
	// MaxBrowseCursor is the longest cursor a Browse accepts.
	MaxBrowseCursor = 200
	// MaxBrowseID is the longest BrowseItem.ID a Browse returns: a longer
	// stored name (forged: anyone with the broker can write one) is cut
	// to it.
	MaxBrowseID = 1 << 10
)

// ErrBadCursor is matched by a *CursorError.
var ErrBadCursor = errors.New("bad browse cursor")

// CursorError is the error of a Browse given a cursor it did not return
// (for that queue and state). Cursor is what the caller gave, cut to
// MaxBrowseCursor bytes; print it quoted (%q), as Error does.
type CursorError struct {
	Cursor string
	State  BrowseState
}

// Error implements error.
func (e *CursorError) Error() string {
	return fmt.Sprintf("%v %q for the %s jobs", ErrBadCursor, e.Cursor, e.State)
}

// Is makes a *CursorError match ErrBadCursor.
func (e *CursorError) Is(target error) bool { return target == ErrBadCursor }

// NewCursorError returns the *CursorError of cursor, cut to
// MaxBrowseCursor bytes.
func NewCursorError(state BrowseState, cursor string) *CursorError {
	if len(cursor) > MaxBrowseCursor {
		cursor = cursor[:MaxBrowseCursor]
	}
	return &CursorError{Cursor: cursor, State: state}
}

// BrowseItem is one message as Browse shows it.
type BrowseItem struct {
	// ID is the broker's name of the stored copy (Message.ID where the
	// broker keeps it, else its own key: a row ID, a sequence number), cut
	// to MaxBrowseID bytes.
	ID string
	// Body is the stored Message.Body, exactly (nil when BodySize is over
	// MaxBrowseBody).
	Body []byte
	// BodySize is the size of the stored body, in bytes.
	BodySize int
	// At is when the message is or became deliverable: for ready items
	// when it became ready (zero when the broker cannot tell), for
	// scheduled items its NotBefore, for in-flight ones its lease's end.
	At time.Time
	// Deliveries is how many times this copy was handed out so far, as
	// Delivery.Deliveries counts; -1 when the broker cannot tell.
	Deliveries int
}

// BrowsePage is one page of Browse.
type BrowsePage struct {
	Items []BrowseItem
	// Next is the cursor of the next page; empty at the end.
	Next string
	// Partial: the broker shows only part of the state (a peek of the
	// first few), so there may be more than the pages hold.
	Partial bool
}

// Browser is an optional interface: a backend whose broker can list a
// queue's messages without consuming them implements it. The platform uses
// it to show the jobs of queues that keep no status records.
//
// Browse returns up to limit (at most MaxBrowseLimit) messages of the
// queue in the given state, starting after the opaque cursor (empty: from
// the first), and the cursor of the next page. It must change nothing a
// worker can see: no message is received, leased, delayed, reordered or
// counted as delivered, and no consumer is created that takes or holds
// deliveries. With no Receive, Enqueue or settle in between, paging from
// the empty cursor to an empty Next returns every message of the state
// once. Under traffic a page is a snapshot: messages may move between
// states, and a paged walk may miss or repeat one that moved. A cursor it
// did not return for that state is refused with a *CursorError. Browse
// never returns a body of more than MaxBrowseBody bytes.
//
// Bodies are returned as stored; they came off the broker, which others
// can write to, and the platform treats them as untrusted. A state the
// broker cannot list (in-flight messages on most) returns an empty page
// with Partial set.
type Browser interface {
	Browse(ctx context.Context, queue string, state BrowseState, cursor string, limit int) (BrowsePage, error)
}

// BrowseLimit is limit as a Browse uses it: DefaultBrowseLimit when under
// 1, at most MaxBrowseLimit.
func BrowseLimit(limit int) int {
	switch {
	case limit < 1:
		return DefaultBrowseLimit
	case limit > MaxBrowseLimit:
		return MaxBrowseLimit
	}
	return limit
}

// ParseOffsetCursor reads a cursor made by OffsetCursor: the empty
// cursor is 0. Any other string is refused with a *CursorError.
func ParseOffsetCursor(state BrowseState, cursor string) (int64, error) {
	if cursor == "" {
		return 0, nil
	}
	if len(cursor) < 2 || len(cursor) > 20 || cursor[0] != 'o' {
		return 0, NewCursorError(state, cursor)
	}
	n, err := strconv.ParseInt(cursor[1:], 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != cursor[1:] {
		return 0, NewCursorError(state, cursor)
	}
	return n, nil
}

// OffsetCursor is the cursor of a page that starts at offset n of a list,
// for a backend that pages by position.
func OffsetCursor(n int64) string { return "o" + strconv.FormatInt(n, 10) }

// KeyCursor is the cursor of a page that starts after the row keyed
// (at, id), for a backend that pages by an ordered key (a table's index
// on due time and row ID).
func KeyCursor(at, id int64) string {
	return "k" + strconv.FormatInt(at, 10) + "." + strconv.FormatInt(id, 10)
}

// ParseKeyCursor reads a cursor made by KeyCursor; ok is false for the
// empty cursor. Any other string is refused with a *CursorError.
func ParseKeyCursor(state BrowseState, cursor string) (at, id int64, ok bool, err error) {
	if cursor == "" {
		return 0, 0, false, nil
	}
	bad := NewCursorError(state, cursor)
	if len(cursor) > 42 || cursor[0] != 'k' {
		return 0, 0, false, bad
	}
	a, b, found := strings.Cut(cursor[1:], ".")
	if !found {
		return 0, 0, false, bad
	}
	at, err1 := strconv.ParseInt(a, 10, 64)
	id, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil || KeyCursor(at, id) != cursor {
		return 0, 0, false, bad
	}
	return at, id, true, nil
}
