package azure

import (
	"context"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/queueerror"

	"github.com/asyncplatform/asyncplatform/driver"
)

var _ driver.Browser = (*Backend)(nil)

// maxPeek is the most messages PeekMessages shows: the first visible ones.
const maxPeek = 32

// Browse implements driver.Browser with PeekMessages, which shows only the
// first 32 visible messages and changes nothing: a page of ready messages
// is partial when the peek was full; scheduled messages are seen only
// while visible (a NotBefore beyond the service's longest visibility
// timeout), so that listing is always partial; in-flight messages are
// invisible, and that listing is empty and partial. The cursor is a
// position in the peek.
func (b *Backend) Browse(ctx context.Context, queue string, state driver.BrowseState, cursor string, limit int) (driver.BrowsePage, error) {
	if b.isClosed() {
		return driver.BrowsePage{}, driver.ErrClosed
	}
	switch state {
	case driver.BrowseReady, driver.BrowseScheduled, driver.BrowseInFlight:
	default:
		return driver.BrowsePage{}, fmt.Errorf("azure: browse: unknown state %q", state)
	}
	off, err := driver.ParseOffsetCursor(state, cursor)
	if err != nil {
		return driver.BrowsePage{}, err
	}
	limit = driver.BrowseLimit(limit)
	if state == driver.BrowseInFlight {
		return driver.BrowsePage{Partial: true}, nil
	}
	n := b.names(queue)
	resp, err := b.svc.NewQueueClient(n.work).PeekMessages(ctx, &azqueue.PeekMessagesOptions{NumberOfMessages: to.Ptr(int32(maxPeek))})
	if err != nil && !queueerror.HasCode(err, queueerror.QueueNotFound) {
		return driver.BrowsePage{}, fmt.Errorf("azure: browse %s of %s: %w", state, n.work, err)
	}
	now := time.Now()
	var all []driver.BrowseItem
	for _, m := range resp.Messages {
		if m == nil || m.MessageText == nil {
			continue
		}
		it := driver.BrowseItem{Deliveries: -1}
		if m.MessageID != nil {
			it.ID = *m.MessageID
		}
		f, err := decodeWork(*m.MessageText)
		if err != nil { // not ours: shown as the text it is
			if state == driver.BrowseReady {
				it.BodySize = len(*m.MessageText)
				if it.BodySize <= driver.MaxBrowseBody {
					it.Body = []byte(*m.MessageText)
				}
				all = append(all, it)
			}
			continue
		}
		if f.notBefore.After(now) != (state == driver.BrowseScheduled) {
			continue
		}
		it.Body, it.BodySize, it.At = f.body, len(f.body), f.notBefore
		if it.At.IsZero() && m.InsertionTime != nil {
			it.At = *m.InsertionTime
		}
		if m.DequeueCount != nil {
			it.Deliveries = int(*m.DequeueCount - int64(f.base))
		}
		all = append(all, it)
	}
	off = min(off, int64(len(all)))
	end := min(int(off)+limit, len(all))
	page := driver.BrowsePage{Items: all[off:end], Partial: state == driver.BrowseScheduled || len(resp.Messages) == maxPeek}
	if end < len(all) {
		page.Next = driver.OffsetCursor(int64(end))
	}
	return page, nil
}
