package reference

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

var _ driver.Browser = (*Backend)(nil)

// Browse implements driver.Browser: ready messages in arrival order (the
// order Receive takes them), scheduled ones soonest due first, in-flight
// ones soonest lease end first, paged by position.
func (b *Backend) Browse(_ context.Context, name string, state driver.BrowseState, cursor string, limit int) (driver.BrowsePage, error) {
	off, err := driver.ParseOffsetCursor(state, cursor)
	if err != nil {
		return driver.BrowsePage{}, err
	}
	limit = driver.BrowseLimit(limit)
	if err := b.lock(); err != nil {
		return driver.BrowsePage{}, err
	}
	defer b.br.mu.Unlock()
	q := b.br.queue(name)
	now := time.Now()
	if !b.br.is(BrowseLapsedInFlight) {
		b.br.tidy(q, now)
	}
	var ms []*message
	for _, m := range q.msgs {
		var in driver.BrowseState
		switch {
		case m.token != 0:
			in = driver.BrowseInFlight
		case m.notBefore.After(now):
			in = driver.BrowseScheduled
		default:
			in = driver.BrowseReady
		}
		if in == state {
			ms = append(ms, m)
		}
	}
	switch state {
	case driver.BrowseReady:
	case driver.BrowseScheduled:
		slices.SortStableFunc(ms, func(a, c *message) int { return a.notBefore.Compare(c.notBefore) })
	case driver.BrowseInFlight:
		slices.SortStableFunc(ms, func(a, c *message) int { return cmp.Compare(a.until.UnixNano(), c.until.UnixNano()) })
	default:
		return driver.BrowsePage{}, fmt.Errorf("reference: browse: unknown state %q", state)
	}
	off = min(off, int64(len(ms)))
	end := min(int(off)+limit, len(ms))
	var page driver.BrowsePage
	for _, m := range ms[off:end] {
		if b.br.is(BrowseCounts) {
			m.deliveries++
		}
		it := driver.BrowseItem{ID: m.id, BodySize: len(m.body), Deliveries: m.deliveries}
		if len(m.body) <= driver.MaxBrowseBody {
			it.Body = bytes.Clone(m.body)
		}
		switch state {
		case driver.BrowseReady:
			it.At = m.readyAt
		case driver.BrowseScheduled:
			it.At = m.notBefore
		default:
			it.At = m.until
		}
		page.Items = append(page.Items, it)
	}
	if end < len(ms) {
		next := end
		if b.br.is(BrowseCursorRepeats) {
			next--
		}
		page.Next = driver.OffsetCursor(int64(next))
	}
	return page, nil
}
