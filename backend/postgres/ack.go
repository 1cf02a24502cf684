package postgres

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// maxAckBatch bounds the acks one statement commits.
const maxAckBatch = 1000

// acker commits the Acks of concurrent callers together, like a group
// commit: one goroutine per Backend (run) takes every ack queued, up to
// maxAckBatch, and deletes their rows in one statement, a transaction of
// its own; acks arriving while that statement runs wait for the next one.
// The window is the statement itself: an ack alone goes out at once, and
// under load each commit carries every ack that arrived during the one
// before it. Each caller gets its own result: its row deleted (nil), not
// deleted (lease lost), or the statement's error. A caller returns only
// after the statement that deletes its row committed.
type acker struct {
	// exec deletes the rows of handles whose token matches and whose lease
	// holds, in one statement, and returns the handles it deleted.
	exec func(ctx context.Context, hs []handle) ([]handle, error)

	mu      sync.Mutex
	queue   []*ackReq
	stopped error         // set when run has returned: acks fail with it
	kick    chan struct{} // wakes run: the queue is not empty

	stmts atomic.Int64 // statements run, for tests and benchmarks
}

// ackReq is one queued ack.
type ackReq struct {
	h    handle
	err  error
	gone bool          // no row was deleted for h
	done chan struct{} // closed when err and gone are set
}

func newAcker(exec func(ctx context.Context, hs []handle) ([]handle, error)) *acker {
	return &acker{exec: exec, kick: make(chan struct{}, 1)}
}

// ack queues h and waits until the statement that carries it has
// committed (or failed), or ctx ends first: the ack may then still
// commit, as a cancelled statement may.
func (a *acker) ack(ctx context.Context, h handle) (gone bool, err error) {
	r := &ackReq{h: h, done: make(chan struct{})}
	a.mu.Lock()
	if a.stopped != nil {
		a.mu.Unlock()
		return false, a.stopped
	}
	a.queue = append(a.queue, r)
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
	select {
	case <-r.done:
		return r.gone, r.err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// run flushes the queue until stop ends, then fails what is left with
// errStop. Each statement runs under a context of its own (bounded by
// DefaultQueryWait), so one caller's ended context never fails the others.
func (a *acker) run(stop context.Context, errStop error) {
	for {
		select {
		case <-a.kick:
			for a.flush() {
			}
		case <-stop.Done():
			a.mu.Lock()
			rest := a.queue
			a.queue, a.stopped = nil, errStop
			a.mu.Unlock()
			for _, r := range rest {
				r.err = errStop
				close(r.done)
			}
			return
		}
	}
}

// flush runs one statement for up to maxAckBatch queued acks and reports
// whether more are queued.
func (a *acker) flush() (more bool) {
	a.mu.Lock()
	n := min(len(a.queue), maxAckBatch)
	batch := a.queue[:n:n]
	a.queue = a.queue[n:]
	more = len(a.queue) > 0
	if !more {
		a.queue = nil
	}
	a.mu.Unlock()
	if n == 0 {
		return more
	}
	// The statement meets the rows in id order where its plan follows the
	// input's.
	slices.SortFunc(batch, func(x, y *ackReq) int { return cmp.Compare(x.h.id, y.h.id) })
	hs := make([]handle, n)
	for i, r := range batch {
		hs[i] = r.h
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultQueryWait)
	a.stmts.Add(1)
	done, err := a.exec(ctx, hs)
	cancel()
	deleted := make(map[handle]struct{}, len(done))
	for _, h := range done {
		deleted[h] = struct{}{}
	}
	for _, r := range batch {
		if err != nil {
			r.err = err
		} else {
			_, ok := deleted[r.h]
			r.gone = !ok
		}
		close(r.done)
	}
	return more
}

// deleteAcked is the acker's statement on the pool.
func (b *Backend) deleteAcked(ctx context.Context, hs []handle) ([]handle, error) {
	ids, tokens := make([]int64, len(hs)), make([]int64, len(hs))
	for i, h := range hs {
		ids[i], tokens[i] = h.id, h.token
	}
	rows, err := b.pool.Query(ctx, b.q.ackMany, ids, tokens)
	if err != nil {
		return nil, err
	}
	var done []handle
	var h handle
	_, err = pgx.ForEachRow(rows, []any{&h.id, &h.token}, func() error {
		done = append(done, h)
		return nil
	})
	return done, err
}
