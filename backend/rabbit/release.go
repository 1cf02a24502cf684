package rabbit

import (
	"context"

	"github.com/asyncplatform/asyncplatform/driver"
)

var _ driver.Releaser = (*Backend)(nil)

// Release implements driver.Releaser: it cancels the queue's consumer and
// hands back, uncounted, what the consumer buffered and Receive has not
// handed out. The platform calls it from Stop, so a stopped worker does not
// hold its prefetch window until Close or the idle timer.
func (b *Backend) Release(ctx context.Context, queue string) error {
	b.mu.Lock()
	c := b.cons[queue]
	if b.closed || c == nil || c.receivers > 0 { // another platform still reads it
		b.mu.Unlock()
		return nil
	}
	if c.idle != nil {
		c.idle.Stop()
		c.idle = nil
	}
	b.detachLocked(c)
	b.wg.Add(1)
	b.mu.Unlock()
	defer b.wg.Done()
	b.release(c, true)
	return nil
}
