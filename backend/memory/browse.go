package memory

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

// Browse implements driver.Browser: it pages by position in the state's
// order (the ready line, due time, lease end), under the broker's lock.
func (b *Backend) Browse(ctx context.Context, name string, state driver.BrowseState, cursor string, limit int) (driver.BrowsePage, error) {
	off, err := driver.ParseOffsetCursor(state, cursor)
	if err != nil {
		return driver.BrowsePage{}, err
	}
	limit = driver.BrowseLimit(limit)
	if err := b.lock(); err != nil {
		return driver.BrowsePage{}, err
	}
	defer b.broker.mu.Unlock()
	q := b.broker.queue(name)
	b.broker.tidy(q, time.Now())
	var ms []*message
	switch state {
	case driver.BrowseReady:
		ms = q.ready.items[q.ready.head:]
	case driver.BrowseScheduled:
		ms = slices.Clone(q.scheduled)
		slices.SortFunc(ms, func(a, c *message) int {
			if r := a.notBefore.Compare(c.notBefore); r != 0 {
				return r
			}
			return cmp.Compare(a.seq, c.seq)
		})
	case driver.BrowseInFlight:
		for m := range q.inflight {
			ms = append(ms, m)
		}
		slices.SortFunc(ms, func(a, c *message) int {
			if r := a.leaseUntil.Compare(c.leaseUntil); r != 0 {
				return r
			}
			return cmp.Compare(a.token, c.token)
		})
	default:
		return driver.BrowsePage{}, fmt.Errorf("memory: browse: unknown state %q", state)
	}
	off = min(off, int64(len(ms))) // the state shrank since the cursor was made
	end := min(int(off)+limit, len(ms))
	page := driver.BrowsePage{Items: make([]driver.BrowseItem, 0, end-int(off))}
	for _, m := range ms[off:end] {
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
			it.At = m.leaseUntil
		}
		page.Items = append(page.Items, it)
	}
	if end < len(ms) {
		page.Next = driver.OffsetCursor(int64(end))
	}
	return page, nil
}
