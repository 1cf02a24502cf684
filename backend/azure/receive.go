package azure

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/queueerror"

	"github.com/asyncplatform/asyncplatform/driver"
)

// receipt is Delivery.Handle: the message, its current pop receipt and the
// end of its lease.
//
// A pop receipt stays valid after the visibility timeout, until the message
// is received again: the service accepts a delete or update with it in the
// meantime. So the lease's end is kept here too, and a receipt refuses to
// act (driver.ErrLeaseLost, nothing sent) once its lease has run out on the
// local clock. The end is measured from when the request that took or
// renewed the lease was sent, so it is never later than the service's.
type receipt struct {
	b            *Backend
	q            *azqueue.QueueClient
	id           string
	dequeueCount int64
	closed       chan struct{}

	mu      sync.Mutex
	pop     string
	content string        // the message text as stored, for Extend
	lease   time.Duration // the last lease asked for
	until   time.Time     // the lease's end: sent + lease of the last receive or update
	pending chan struct{} // closed when the last update has finished
}

// held is current, or driver.ErrLeaseLost when the lease has run out: the
// check every settle makes before it sends anything.
func (r *receipt) held(ctx context.Context) (pop, content string, err error) {
	pop, content, err = r.current(ctx)
	if err != nil {
		return "", "", err
	}
	r.mu.Lock()
	until := r.until
	r.mu.Unlock()
	if late := time.Since(until); late >= 0 {
		return "", "", fmt.Errorf("%w: the lease ran out %v ago", driver.ErrLeaseLost, late.Round(time.Millisecond))
	}
	return pop, content, nil
}

// current waits for an update still in flight (see update) and returns the
// pop receipt and content.
func (r *receipt) current(ctx context.Context) (pop, content string, err error) {
	r.mu.Lock()
	pending := r.pending
	r.mu.Unlock()
	if pending != nil {
		select {
		case <-pending:
		case <-ctx.Done():
			return "", "", ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pop, r.content, nil
}

// update runs one UpdateMessage that ctx does not cut short, when the lease
// still holds. An update changes the pop receipt, so one abandoned halfway
// could succeed on the server and leave us with a dead receipt. When ctx
// ends first, update returns ctx.Err() and the request goes on (bounded by
// requestTimeout); its new receipt is kept, and the next call on the
// delivery waits for it. The message is then held for lease from when the
// request was sent (0: no longer held, as after a Requeue).
func (r *receipt) update(ctx context.Context, content string, vis int32, lease time.Duration) error {
	pop, _, err := r.held(ctx)
	if err != nil {
		return err
	}
	done := make(chan struct{})
	var uerr error
	r.mu.Lock()
	r.pending = done
	r.mu.Unlock()
	r.b.bg.Add(1)
	go func() {
		defer r.b.bg.Done()
		defer close(done)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		defer cancel()
		sent := time.Now()
		resp, err := r.q.UpdateMessage(rctx, r.id, pop, content, &azqueue.UpdateMessageOptions{VisibilityTimeout: &vis})
		uerr = err
		if err == nil {
			r.mu.Lock()
			r.pop, r.content = *resp.PopReceipt, content
			r.until = sent.Add(lease)
			if lease > 0 {
				r.lease = lease
			}
			r.mu.Unlock()
		}
	}()
	select {
	case <-done:
		return uerr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Receive implements driver.Backend. Azure cannot signal new work, so an
// empty queue is polled, the wait doubling from 10ms to Config.PollInterval.
func (b *Backend) Receive(ctx context.Context, queue string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	if b.isClosed() {
		return nil, driver.ErrClosed
	}
	n := b.names(queue)
	if max <= 0 {
		return nil, fmt.Errorf("azure: receive: max %d: want a positive number", max)
	}
	max = min(max, 32)
	vis := max32(visibility(lease), 1)
	q := b.svc.NewQueueClient(n.work)
	wait := minPoll
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// The request is not cut short by ctx: a dequeue whose response were
		// dropped would count a delivery for every message it took. When ctx
		// ends meanwhile, the messages are handed back uncounted.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		sent := time.Now()
		resp, err := q.DequeueMessages(rctx, &azqueue.DequeueMessagesOptions{
			NumberOfMessages:  to.Ptr(int32(max)),
			VisibilityTimeout: to.Ptr(vis),
		})
		cancel()
		if err == nil && ctx.Err() != nil {
			b.handBack(queue, q, resp.Messages)
			return nil, ctx.Err()
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if b.isClosed() {
				return nil, driver.ErrClosed
			}
			return nil, fmt.Errorf("azure: receive from %s: %w", n.work, err)
		}
		var out []*driver.Delivery
		for _, m := range resp.Messages {
			if d := b.delivery(ctx, queue, q, m, lease, sent); d != nil {
				out = append(out, d)
			}
		}
		if len(out) > 0 {
			return out, nil
		}
		if len(resp.Messages) > 0 {
			continue // all were early: look again at once
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-b.closed:
			t.Stop()
			return nil, driver.ErrClosed
		case <-t.C:
		}
		wait = min(wait*2, b.pollInterval)
	}
}

// requestTimeout bounds a receive request that ctx does not cut short.
const requestTimeout = 30 * time.Second

// handBack makes messages received for a caller that has gone visible again
// at once, with the base moved up by one so this receive is not counted.
// The updates run Config.EnqueueParallel at a time, each with a
// requestTimeout of its own: a slow service (Azurite at depth) must not
// leave the last of 32 messages hidden for their lease with a crash counted,
// nor hold the cancelled Receive for 32 round trips.
func (b *Backend) handBack(queue string, q *azqueue.QueueClient, msgs []*azqueue.DequeuedMessage) {
	var (
		wg  sync.WaitGroup
		sem = make(chan struct{}, b.parallel)
	)
	for _, m := range msgs {
		if m.MessageText == nil {
			continue
		}
		f, err := decodeWork(*m.MessageText)
		if err != nil {
			continue // foreign: it comes back after its lease
		}
		// Uncount this receive only: earlier deliveries that ended without
		// an outcome still count.
		f.base++
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
			defer cancel()
			if _, err := q.UpdateMessage(ctx, *m.MessageID, *m.PopReceipt, f.encode(), &azqueue.UpdateMessageOptions{
				VisibilityTimeout: to.Ptr(int32(0)),
			}); err != nil {
				b.log.Warn("azure: handing back a message received after cancellation failed; it comes back after its lease, counted", "queue", queue, "err", err)
			}
		}()
	}
	wg.Wait()
}

func max32(a, b int32) int32 {
	if a > b {
		return a
	}
	return b
}

// delivery turns a dequeued message into a Delivery held for lease from
// sent (when the receive request was sent), or hides it again and returns
// nil when it surfaced before its NotBefore (a delay over 7 days).
func (b *Backend) delivery(ctx context.Context, queue string, q *azqueue.QueueClient, m *azqueue.DequeuedMessage, lease time.Duration, sent time.Time) *driver.Delivery {
	r := &receipt{b: b, q: q, id: *m.MessageID, pop: *m.PopReceipt, dequeueCount: *m.DequeueCount, lease: lease, until: sent.Add(lease), closed: b.closed}
	if m.MessageText != nil {
		r.content = *m.MessageText
	}
	f, err := decodeWork(r.content)
	if err != nil {
		// Not ours: hand the raw text to the platform, which dead-letters it.
		return &driver.Delivery{Queue: queue, Body: []byte(r.content), Deliveries: int(r.dequeueCount), Handle: r}
	}
	if !f.notBefore.IsZero() {
		if early := time.Until(f.notBefore); early > 0 {
			// Surfaced early: hide it again. Not a delivery, so the base
			// moves up by one (earlier crashes of this copy still count).
			f.base++
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
			defer cancel()
			if _, err := q.UpdateMessage(ctx, r.id, r.pop, f.encode(), &azqueue.UpdateMessageOptions{
				VisibilityTimeout: to.Ptr(visibility(early)),
			}); err != nil && !leaseLost(err) {
				b.log.Warn("azure: hiding an early message again failed; it will surface after its lease", "queue", queue, "err", err)
			}
			return nil
		}
	}
	deliveries := int(r.dequeueCount - int64(f.base))
	if deliveries < 1 {
		deliveries = 1
	}
	return &driver.Delivery{Queue: queue, Body: f.body, Deliveries: deliveries, Handle: r}
}

// leaseLost reports whether err means the pop receipt no longer holds the
// message: it was deleted, or received (or updated) since.
func leaseLost(err error) bool {
	return queueerror.HasCode(err, queueerror.MessageNotFound, queueerror.PopReceiptMismatch, queueerror.QueueNotFound)
}

func (b *Backend) receipt(d *driver.Delivery) (*receipt, error) {
	if b.isClosed() {
		return nil, driver.ErrClosed
	}
	r, ok := d.Handle.(*receipt)
	if !ok || r == nil {
		return nil, fmt.Errorf("azure: delivery handle %T is not this backend's", d.Handle)
	}
	if r.closed != b.closed {
		return nil, fmt.Errorf("azure: delivery belongs to another backend: %w", driver.ErrLeaseLost)
	}
	return r, nil
}

func wrapSettle(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("azure: %s: %w", op, err)
	}
	if leaseLost(err) {
		return fmt.Errorf("azure: %s: %w (%v)", op, driver.ErrLeaseLost, err)
	}
	return fmt.Errorf("azure: %s: %w", op, err)
}

// Ack implements driver.Backend with DeleteMessage.
func (b *Backend) Ack(ctx context.Context, d *driver.Delivery) error {
	r, err := b.receipt(d)
	if err != nil {
		return err
	}
	pop, _, err := r.held(ctx)
	if err != nil {
		return wrapSettle("ack", err)
	}
	return wrapSettle("ack", r.deleteMessage(ctx, pop))
}

// Extend implements driver.Backend with an UpdateMessage that keeps the
// content and sets the visibility timeout; the new pop receipt replaces the
// old one in the handle.
func (b *Backend) Extend(ctx context.Context, d *driver.Delivery, lease time.Duration) error {
	r, err := b.receipt(d)
	if err != nil {
		return err
	}
	_, content, err := r.held(ctx)
	if err != nil {
		return wrapSettle("extend", err)
	}
	return wrapSettle("extend", r.update(ctx, content, max32(visibility(lease), 1), lease))
}

// Requeue implements driver.Backend with one UpdateMessage: the new body, the
// base set to the current DequeueCount, and the visibility up to NotBefore.
func (b *Backend) Requeue(ctx context.Context, d *driver.Delivery, msg driver.Message) error {
	r, err := b.receipt(d)
	if err != nil {
		return err
	}
	if len(msg.Body) > maxBody {
		return tooLarge(len(msg.Body))
	}
	text := workFrame{base: uint32(r.dequeueCount), notBefore: msg.NotBefore, body: msg.Body}.encode()
	var vis int32
	if !msg.NotBefore.IsZero() {
		vis = visibility(time.Until(msg.NotBefore))
	}
	return wrapSettle("requeue", r.update(ctx, text, vis, 0))
}
