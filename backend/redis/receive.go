package redis

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

// unixMs is a NotBefore as the scripts compare it with the server's clock:
// the first whole millisecond not before t (rounded up, so that a message
// is never due in the millisecond before its NotBefore), 0 for none.
func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	ms := t.UnixMilli()
	if time.UnixMilli(ms).Before(t) {
		ms++
	}
	return ms
}

func leaseMs(d time.Duration) int64 {
	return max(d.Milliseconds(), 1)
}

// Receive claims up to max messages. When the queue is empty it waits for a
// wake-up signal (one BLPOP per queue and Backend, shared by every idle
// Receive), for the next scheduled job or lease deadline, or IdleWait,
// whichever comes first, and claims again.
func (b *Backend) Receive(ctx context.Context, queue string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	if max < 1 {
		return nil, fmt.Errorf("redis: receive from %q: max %d must be at least 1", queue, max)
	}
	if lease <= 0 {
		return nil, fmt.Errorf("redis: receive from %q: lease %v must be positive", queue, lease)
	}
	max = min(max, maxClaim)
	w := b.waiter(queue)
	keys := b.keys(queue)
	for {
		// Take the wake channel before claiming, so a signal that arrives
		// between an empty claim and the wait is not missed.
		wake := w.current()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ds, wait, err := b.claim(ctx, queue, keys, max, lease)
		if err != nil && b.closed.Load() {
			// Close came while the claim ran (and the owner may have
			// closed the client after it): this Receive ends with Close.
			return nil, driver.ErrClosed
		}
		if err != nil || len(ds) > 0 {
			return ds, err
		}
		d := b.cfg.IdleWait
		if wait >= 0 && wait < d {
			d = wait
		}
		w.enter(b, keys[keySignal])
		t := time.NewTimer(d)
		select {
		case <-wake:
		case <-t.C:
		case <-ctx.Done():
		case <-b.ctx.Done():
		}
		t.Stop()
		w.leave()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if b.closed.Load() {
			return nil, driver.ErrClosed
		}
	}
}

// claim runs the claim script once. Once started, it is not cancelled with
// ctx: a claim cut off after the script ran would leave its jobs leased to
// nobody, to come back only after the lease with a crash counted. Redis
// client timeouts still bound it.
func (b *Backend) claim(ctx context.Context, queue string, keys []string, max int, lease time.Duration) ([]*driver.Delivery, time.Duration, error) {
	res, err := claimScript.Run(context.WithoutCancel(ctx), b.rdb, keys[:keySignal+1], max, leaseMs(lease), b.token()).Slice()
	if err != nil {
		return nil, 0, fmt.Errorf("redis: receive from %q: %w", queue, err)
	}
	if len(res) < 1 || (len(res)-1)%4 != 0 {
		return nil, 0, fmt.Errorf("redis: receive from %q: unexpected reply of %d items", queue, len(res))
	}
	wait, _ := res[0].(int64)
	if len(res) == 1 {
		return nil, time.Duration(wait) * time.Millisecond, nil
	}
	ds := make([]*driver.Delivery, 0, (len(res)-1)/4)
	for i := 1; i < len(res); i += 4 {
		id, _ := res[i].(string)
		n, _ := res[i+1].(int64)
		tok, _ := res[i+2].(string)
		body, _ := res[i+3].(string)
		ds = append(ds, &driver.Delivery{
			Queue:      queue,
			Body:       []byte(body),
			Deliveries: int(n),
			Handle:     handle{id: id, token: tok},
		})
	}
	return ds, 0, nil
}

// settle runs one of the token-checked scripts for d.
func (b *Backend) settle(ctx context.Context, what string, s *goredis.Script, d *driver.Delivery, args ...any) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if d == nil {
		return fmt.Errorf("redis: %s: nil delivery", what)
	}
	h, ok := d.Handle.(handle)
	if !ok {
		return fmt.Errorf("redis: %s: delivery handle %T is not from this backend", what, d.Handle)
	}
	args = append([]any{h.id, h.token}, args...)
	n, err := s.Run(ctx, b.rdb, b.keys(d.Queue), args...).Int()
	if err != nil && b.closed.Load() {
		return driver.ErrClosed
	}
	if err != nil {
		return fmt.Errorf("redis: %s on %q: %w", what, d.Queue, err)
	}
	if n == 0 {
		return fmt.Errorf("redis: %s on %q: %w", what, d.Queue, driver.ErrLeaseLost)
	}
	return nil
}

// Extend renews the delivery's lease to lease from now (server time).
func (b *Backend) Extend(ctx context.Context, d *driver.Delivery, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("redis: extend: lease %v must be positive", lease)
	}
	return b.settle(ctx, "extend", extendScript, d, leaseMs(lease))
}

// Requeue replaces the delivered message with msg in one script.
func (b *Backend) Requeue(ctx context.Context, d *driver.Delivery, msg driver.Message) error {
	return b.settle(ctx, "requeue", requeueScript, d, unixMs(msg.NotBefore), msg.Body)
}

// DeadLetter moves the delivered message to the dead list in one script.
func (b *Backend) DeadLetter(ctx context.Context, d *driver.Delivery, rec driver.DeadMessage) error {
	return b.settle(ctx, "dead-letter", deadLetterScript, d, encodeDead(rec))
}
