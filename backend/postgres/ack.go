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

// ackFlights is how many ack statements a Backend runs at once: acks
// wait for company only while every one of them is in flight.
const ackFlights = 4

// acker commits the Acks of concurrent callers together, like a group
// commit. A caller that finds fewer than ackFlights statements in flight
// runs one itself, deleting the rows of every ack queued (its own among
// them, up to maxAckBatch) in one statement, a transaction of its own;
// otherwise it queues its ack and waits. A statement that ends with acks
// queued keeps its flight and runs the next one, on a goroutine of its
// own so that its caller returns at once, until the queue is empty. An
// ack alone thus goes out at once on its caller's goroutine, and under
// load each statement carries every ack that arrived while all were in
// flight. Each caller gets its own result: its row deleted (nil), not
// deleted (lease lost), or the statement's error, once the statement
// that carries it has committed.
type acker struct {
	// exec deletes the rows of handles whose token matches and whose lease
	// holds, in one statement, and returns the handles it deleted.
	exec func(ctx context.Context, hs []handle) ([]handle, error)

	mu      sync.Mutex
	queue   []*ackReq
	flights int // statements in flight, or about to be

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
	return &acker{exec: exec}
}

// ack queues h and waits until the statement that carries it has
// committed (or failed), or ctx ends first: the ack may then still
// commit, as a cancelled statement may.
func (a *acker) ack(ctx context.Context, h handle) (gone bool, err error) {
	r := &ackReq{h: h, done: make(chan struct{})}
	a.mu.Lock()
	a.queue = append(a.queue, r)
	lead := a.flights < ackFlights
	if lead {
		a.flights++
	}
	a.mu.Unlock()
	if lead && a.flush() {
		go a.drain()
	}
	select {
	case <-r.done:
		return r.gone, r.err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// drain runs statements until the queue is empty.
func (a *acker) drain() {
	for a.flush() {
	}
}

// flush runs one statement for up to maxAckBatch queued acks, holding a
// flight. It reports whether acks are queued after it: the flight is then
// still held, for the caller to flush again; else it is given back.
// Each statement runs under a context of its own (bounded by
// DefaultQueryWait), so one caller's ended context never fails another.
func (a *acker) flush() (more bool) {
	a.mu.Lock()
	n := min(len(a.queue), maxAckBatch)
	batch := a.queue[:n:n]
	a.queue = a.queue[n:]
	a.mu.Unlock()
	if n > 0 {
		a.run(batch)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.queue) == 0 {
		a.queue = nil
		a.flights--
		return false
	}
	return true
}

// run deletes the batch's rows and tells each caller its result.
func (a *acker) run(batch []*ackReq) {
	// The statement meets the rows in id order where its plan follows the
	// input's.
	slices.SortFunc(batch, func(x, y *ackReq) int { return cmp.Compare(x.h.id, y.h.id) })
	hs := make([]handle, len(batch))
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
