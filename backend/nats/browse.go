package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/asyncplatform/asyncplatform/driver"
)

var _ driver.Browser = (*Backend)(nil)

// Browse implements driver.Browser with stream message gets by subject
// (STREAM.MSG.GET, next by subject from a sequence), one per message: no
// consumer is made, none is changed. Ready is the queue's copies on the
// work stream after the work consumer's last delivered sequence (never
// handed out), in stream order, the order Receive takes them; a copy
// handed out before and due again (a lapsed lease, a hand-back) is not
// told apart from one in flight, so the page is partial while the
// consumer has any pending acknowledgement or redelivery. Scheduled is
// the queue's copies on the delay stream, in stream order (not of due
// time). In flight is not listed (an empty, partial page). The cursor is
// the last stream sequence read. An item's ID is its Nats-Msg-Id header
// (cut to driver.MaxBrowseID bytes), else its stream sequence.
func (b *Backend) Browse(ctx context.Context, queue string, state driver.BrowseState, cursor string, limit int) (driver.BrowsePage, error) {
	if b.closed.Load() {
		return driver.BrowsePage{}, driver.ErrClosed
	}
	var (
		s    jetstream.Stream
		subj string
	)
	switch state {
	case driver.BrowseReady:
		s, subj = b.work, b.workSubject(queue)
	case driver.BrowseScheduled:
		s, subj = b.delay, b.delaySubject(queue)
	case driver.BrowseInFlight:
		if _, err := driver.ParseOffsetCursor(state, cursor); err != nil {
			return driver.BrowsePage{}, err
		}
		return driver.BrowsePage{Partial: true}, nil
	default:
		return driver.BrowsePage{}, fmt.Errorf("nats: browse: unknown state %q", state)
	}
	after, err := driver.ParseOffsetCursor(state, cursor)
	if err != nil {
		return driver.BrowsePage{}, err
	}
	limit = driver.BrowseLimit(limit)
	page := driver.BrowsePage{}
	seq := uint64(after) + 1
	if state == driver.BrowseReady {
		c, err := b.work.Consumer(ctx, workConsumer(queue))
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound): // nothing handed out yet
		case err != nil:
			return driver.BrowsePage{}, fmt.Errorf("nats: browse: consumer info for queue %s: %w", queue, err)
		default:
			info := c.CachedInfo()
			seq = max(seq, info.Delivered.Stream+1)
			page.Partial = info.NumAckPending > 0 || info.NumRedelivered > 0
		}
	}
	for len(page.Items) <= limit {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return driver.BrowsePage{}, fmt.Errorf("nats: browse %s at seq %d: %w", subj, seq, err)
		}
		if len(page.Items) == limit {
			page.Next = driver.OffsetCursor(int64(seq - 1))
			break
		}
		it := driver.BrowseItem{ID: strconv.FormatUint(m.Sequence, 10), BodySize: len(m.Data), At: m.Time}
		if id := m.Header.Get(hdrMsgID); id != "" {
			it.ID = id[:min(len(id), driver.MaxBrowseID)] // a header anyone publishing can forge
		}
		if it.BodySize <= driver.MaxBrowseBody {
			it.Body = m.Data
		}
		if state == driver.BrowseScheduled {
			if ns, err := strconv.ParseInt(m.Header.Get(hdrNotBefore), 10, 64); err == nil {
				it.At = time.Unix(0, ns)
			}
		}
		page.Items = append(page.Items, it)
		seq = m.Sequence + 1
	}
	return page, nil
}
