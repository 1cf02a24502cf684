package redis

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// maxAckBatch bounds the acks one script call carries.
const maxAckBatch = 256

// ackFlushers is how many ack calls of one queue may be in flight at once.
// One gives the largest batches and so the least work for Redis; more would
// let an Ack go out while a batch is on the wire, at the price of smaller
// batches. On the 2-core benchmark machine, 2 and 3 were no faster.
const ackFlushers = 1

// ackFlushTimeout bounds one batched ack script call.
const ackFlushTimeout = 10 * time.Second

// acker groups the concurrent Acks of one queue into one script call, as a
// database groups commits: an Ack that finds no flusher running starts one,
// which makes a call at once with whatever is pending (so a lone Ack waits for
// nobody), and the Acks that arrive meanwhile ride on its next call. The
// flusher goroutine belongs to the Backend and ends when nothing is pending.
type acker struct {
	mu       sync.Mutex
	pending  []*ackReq
	flushers int // running flushAcks goroutines, at most ackFlushers
}

type ackReq struct {
	h    handle
	done chan error // buffered, receives exactly one result
}

func (b *Backend) acker(queue string) *acker {
	b.mu.Lock()
	defer b.mu.Unlock()
	a, ok := b.ackers[queue]
	if !ok {
		a = &acker{}
		b.ackers[queue] = a
	}
	return a
}

// Ack removes the delivered message. Concurrent Acks on one queue share a
// script call; each is still checked against its own lease token.
func (b *Backend) Ack(ctx context.Context, d *driver.Delivery) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if d == nil {
		return fmt.Errorf("redis: ack: nil delivery")
	}
	h, ok := d.Handle.(handle)
	if !ok {
		return fmt.Errorf("redis: ack: delivery handle %T is not from this backend", d.Handle)
	}
	a := b.acker(d.Queue)
	r := &ackReq{h: h, done: make(chan error, 1)}
	a.mu.Lock()
	a.pending = append(a.pending, r)
	if a.flushers < ackFlushers {
		if !b.spawn(func() { b.flushAcks(d.Queue, a) }) {
			a.pending = a.pending[:len(a.pending)-1]
			a.mu.Unlock()
			return driver.ErrClosed
		}
		a.flushers++
	}
	a.mu.Unlock()
	select {
	case err := <-r.done:
		if err != nil {
			return fmt.Errorf("redis: ack on %q: %w", d.Queue, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("redis: ack on %q: %w", d.Queue, ctx.Err())
	}
}

// flushAcks runs batches until nothing is pending. Each call is bound by
// ackFlushTimeout and by Close, not by any one caller's context, since it
// carries several callers' acks.
func (b *Backend) flushAcks(queue string, a *acker) {
	keys := b.keys(queue)[:keyJobs+1]
	for {
		a.mu.Lock()
		batch := a.pending
		if len(batch) > maxAckBatch {
			batch = batch[:maxAckBatch]
		}
		a.pending = a.pending[len(batch):]
		if len(batch) == 0 {
			a.flushers--
			a.pending = nil
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		args := make([]any, 0, 2*len(batch))
		for _, r := range batch {
			args = append(args, r.h.id, r.h.token)
		}
		ctx, cancel := context.WithTimeout(b.ctx, ackFlushTimeout)
		res, err := ackScript.Run(ctx, b.rdb, keys, args...).Int64Slice()
		cancel()
		if err == nil && len(res) != len(batch) {
			err = fmt.Errorf("unexpected reply of %d items for %d acks", len(res), len(batch))
		}
		for i, r := range batch {
			switch {
			case err != nil:
				r.done <- err
			case res[i] == 0:
				r.done <- driver.ErrLeaseLost
			default:
				r.done <- nil
			}
		}
	}
}
