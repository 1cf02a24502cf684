package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/asyncplatform/asyncplatform/driver"
)

// NextDead implements driver.Backend. A durable pull consumer per queue on
// the dead-letter stream (AckWait = Config.DeadLease) hands out records in
// stream order, each to one caller: a record delivered and not yet acked is
// pending on the consumer and not handed out again until it is naked
// (SettleDead keep), or its AckWait runs out (the caller vanished). While
// the caller holds it, a renewer sends InProgress every DeadLease/3.
func (b *Backend) NextDead(ctx context.Context, queue string) (*driver.DeadDelivery, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	if err := checkQueue(queue); err != nil {
		return nil, err
	}
	qs := b.queue(queue)
	for attempt := 0; ; attempt++ {
		if err := b.ensureDead(ctx, qs, queue); err != nil {
			return nil, err
		}
		msgs, start, err := b.pull(ctx, b.deadName(), deadConsumer(queue), 1, 0, b.release)
		if errors.Is(err, errNoConsumer) && attempt == 0 {
			qs.mu.Lock()
			qs.dead = false
			qs.mu.Unlock()
			continue
		}
		if err != nil {
			return nil, err
		}
		if len(msgs) == 0 {
			return nil, driver.ErrNoDeadLetters
		}
		m := msgs[0]
		md, err := parseAck(m.Reply)
		if err != nil {
			return nil, err
		}
		r := &receipt{reply: m.Reply, seq: md.seq, ackWait: b.cfg.DeadLease, deadline: start.Add(b.cfg.DeadLease), stopped: make(chan struct{})}
		var rctx context.Context
		rctx, r.stop = context.WithCancel(b.ctx)
		if !b.spawn(func() { b.renew(rctx, r) }) {
			b.release(m)
			return nil, driver.ErrClosed
		}
		return &driver.DeadDelivery{
			DeadMessage: driver.DeadMessage{ID: m.Header.Get(hdrDeadID), Body: m.Data},
			Handle:      r,
		}, nil
	}
}

// renew keeps a held dead letter hidden until it is settled; when the
// Backend closes first, it hands the record back at once.
func (b *Backend) renew(ctx context.Context, r *receipt) {
	defer close(r.stopped)
	t := time.NewTicker(r.ackWait / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if b.ctx.Err() != nil {
				r.mu.Lock()
				if !r.done {
					r.done = true
					_ = b.nc.Publish(r.reply, ackNak)
				}
				r.mu.Unlock()
			}
			return
		case <-t.C:
			r.mu.Lock()
			err := error(nil)
			if !r.done {
				err = b.extend(ctx, r)
			}
			done := r.done
			r.mu.Unlock()
			if done {
				return
			}
			if err != nil && ctx.Err() == nil {
				b.log.Warn("nats: renew a held dead letter", "seq", r.seq, "err", err)
			}
		}
	}
}

// release hands a dead letter back at once.
func (b *Backend) release(m *gonats.Msg) {
	_ = b.nc.Publish(m.Reply, ackNak)
}

func (b *Backend) ensureDead(ctx context.Context, qs *queueState, queue string) error {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.dead {
		return nil
	}
	_, err := b.dead.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       deadConsumer(queue),
		Description:   "asyncplatform dead letters of queue " + queue,
		FilterSubject: b.deadSubject(queue),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       b.cfg.DeadLease,
		MaxDeliver:    -1,
		MaxAckPending: -1,
	})
	if err != nil {
		return fmt.Errorf("nats: dead-letter consumer for queue %s: %w", queue, err)
	}
	qs.dead = true
	return nil
}

// SettleDead implements driver.Backend. remove deletes the record from the
// stream and acks it on the consumer; keep naks it, which puts it first in
// line for the next NextDead.
func (b *Backend) SettleDead(ctx context.Context, d *driver.DeadDelivery, remove bool) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	r, err := handle(d.Handle)
	if err != nil {
		return err
	}
	if r.stop == nil {
		return fmt.Errorf("nats: settle dead: the handle is not from NextDead")
	}
	r.stop()
	<-r.stopped
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.live() {
		return driver.ErrLeaseLost
	}
	if remove {
		err := b.dead.DeleteMsg(ctx, r.seq)
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("nats: delete dead letter seq %d: %w", r.seq, err)
		}
		err = b.ackSync(ctx, r, ackAck)
		r.done = true // deleted: the consumer skips it even if the ack was lost
		return err
	}
	if err := b.ackSync(ctx, r, ackNak); err != nil {
		return err
	}
	r.done = true
	return nil
}

// ListDead implements driver.Backend by walking the dead-letter stream's
// messages on the queue's subject; the cursor is the next stream sequence.
func (b *Backend) ListDead(ctx context.Context, queue, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	if b.closed.Load() {
		return nil, "", driver.ErrClosed
	}
	if err := checkQueue(queue); err != nil {
		return nil, "", err
	}
	if limit < 1 {
		return nil, "", fmt.Errorf("nats: list dead letters of %s: limit %d: want at least 1", queue, limit)
	}
	from := uint64(1)
	if cursor != "" {
		n, err := strconv.ParseUint(cursor, 10, 64)
		if err != nil || n == 0 {
			return nil, "", fmt.Errorf("nats: list dead letters of %s: bad cursor %q", queue, cursor)
		}
		from = n
	}
	var recs []driver.DeadMessage
	next := ""
	err := b.walkDead(ctx, queue, from, func(m *jetstream.RawStreamMsg) bool {
		if len(recs) == limit {
			next = strconv.FormatUint(m.Sequence, 10)
			return false
		}
		recs = append(recs, driver.DeadMessage{ID: m.Header.Get(hdrDeadID), Body: m.Data})
		return true
	})
	return recs, next, err
}

// walkDead calls fn with each record of the queue from sequence from on,
// until fn returns false or the records end.
func (b *Backend) walkDead(ctx context.Context, queue string, from uint64, fn func(*jetstream.RawStreamMsg) bool) error {
	subj := b.deadSubject(queue)
	for seq := from; ; {
		m, err := b.dead.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("nats: read dead letters of %s at seq %d: %w", queue, seq, err)
		}
		if !fn(m) {
			return nil
		}
		seq = m.Sequence + 1
	}
}

// DeleteDead implements driver.Backend: it walks the queue's records and
// deletes those whose ID is among ids, held ones included.
func (b *Backend) DeleteDead(ctx context.Context, queue string, ids []string) (int, error) {
	if b.closed.Load() {
		return 0, driver.ErrClosed
	}
	if err := checkQueue(queue); err != nil {
		return 0, err
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	var seqs []uint64
	err := b.walkDead(ctx, queue, 1, func(m *jetstream.RawStreamMsg) bool {
		if want[m.Header.Get(hdrDeadID)] {
			seqs = append(seqs, m.Sequence)
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, seq := range seqs {
		err := b.dead.DeleteMsg(ctx, seq)
		switch {
		case err == nil:
			n++
		case errors.Is(err, jetstream.ErrMsgNotFound):
			// deleted meanwhile by someone else
		default:
			return n, fmt.Errorf("nats: delete dead letter of %s at seq %d: %w", queue, seq, err)
		}
	}
	return n, nil
}

// PurgeDead implements driver.Backend by deleting the queue's records one
// by one (see deleteAll for why not a purge).
func (b *Backend) PurgeDead(ctx context.Context, queue string) (int, error) {
	if b.closed.Load() {
		return 0, driver.ErrClosed
	}
	if err := checkQueue(queue); err != nil {
		return 0, err
	}
	return b.deleteAll(ctx, b.dead, b.deadSubject(queue))
}
