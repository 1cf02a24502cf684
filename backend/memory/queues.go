package memory

import (
	"context"
	"sort"

	"github.com/asyncplatform/asyncplatform/driver"
)

var _ driver.QueueLister = (*Backend)(nil)

// Queues implements driver.QueueLister: every queue of the broker, sorted.
// The broker keeps a queue from the first call that names it (Declare,
// Enqueue, Receive, Stats, a dead-letter call) until DeleteQueue, so a queue
// that was only looked at is listed too, empty.
func (b *Backend) Queues(ctx context.Context) ([]string, error) {
	if err := b.lock(); err != nil {
		return nil, err
	}
	defer b.broker.mu.Unlock()
	names := make([]string, 0, len(b.broker.queues))
	for name := range b.broker.queues {
		if driver.CheckQueue(name) == nil {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names, nil
}
