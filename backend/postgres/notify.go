package postgres

import (
	"context"
	"sync"
)

// notifier sends the wake-ups of enqueues made outside a caller's
// transaction, after their INSERT committed, in a statement of their own
// (which writes no WAL). A NOTIFY in the writing statement would hold
// PostgreSQL's database-wide notify lock while its commit is flushed, so
// that concurrent enqueues no longer share a WAL flush. Wake-ups added
// while one is being sent are summed per queue and sent together next; a
// wake-up lost to an error or to Close is covered by Receive's IdleWait.
type notifier struct {
	mu      sync.Mutex
	pending map[string]int // queue -> jobs due
	sending bool
}

// notifyLater announces n jobs due on queue, and sends the wake-ups unless
// a sender is already at work, which will send them after its own.
func (b *Backend) notifyLater(queue string, n int) {
	b.notes.mu.Lock()
	if b.ctx.Err() != nil {
		b.notes.mu.Unlock()
		return
	}
	if b.notes.pending == nil {
		b.notes.pending = map[string]int{}
	}
	b.notes.pending[queue] += n
	if b.notes.sending {
		b.notes.mu.Unlock()
		return
	}
	b.notes.sending = true
	b.notes.mu.Unlock()
	b.wg.Add(1)
	go b.sendNotes()
}

// sendNotes sends every pending wake-up, one statement per round, until
// none is left.
func (b *Backend) sendNotes() {
	defer b.wg.Done()
	for {
		b.notes.mu.Lock()
		if len(b.notes.pending) == 0 || b.ctx.Err() != nil {
			b.notes.pending, b.notes.sending = nil, false
			b.notes.mu.Unlock()
			return
		}
		queues, counts := make([]string, 0, len(b.notes.pending)), make([]int32, 0, len(b.notes.pending))
		for q, n := range b.notes.pending {
			queues, counts = append(queues, q), append(counts, int32(min(n, 1<<30)))
		}
		b.notes.pending = map[string]int{}
		b.notes.mu.Unlock()
		ctx, cancel := context.WithTimeout(b.ctx, DefaultQueryWait)
		if _, err := b.pool.Exec(ctx, b.q.notify, b.channel, queues, counts); err != nil && b.ctx.Err() == nil {
			b.cfg.Logger.Warn("postgres: sending wake-ups; idle receivers find the jobs within IdleWait", "err", err)
		}
		cancel()
	}
}
