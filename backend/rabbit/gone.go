package rabbit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// A message this backend replaces (Requeue, DeadLetter, a delay hop, a
// release's hand-back) is replaced by writing its successor, then acking
// it. AMQP acks are not confirmed: an ack lost to a cut connection or a
// broker restart brings the replaced message back, counted, beside its
// successor, and the job then runs in two lines of copies, each counting
// its own tries. With a companion store the backend keeps a gone mark
// per replaced message, and a delivery that may have been delivered
// before is acked without being handed out when its mark says it was
// replaced:
//
//   - every message this backend publishes carries a random instance
//     (instanceHeader); a copy gets a new one;
//   - a replacement writes the mark pending before it writes the
//     successor, and done once the successor is stored (it deletes the
//     mark when the successor was not stored): a delay hop, a sweep and a
//     release's hand-back before their ack; Requeue and DeadLetter after
//     it, on a goroutine of their own, so that the platform's outcome,
//     which follows their return, is not held back by a store round trip
//     while the successor may already run and report its own;
//   - a delivery with x-delivery-count (it went back to the queue
//     unsettled) is looked up: done, it is acked and dropped; pending,
//     the lookup waits for the writer's outcome, at most goneWait (a
//     writer that died meanwhile leaves it pending for good: the delivery
//     is then handed out, as without a mark). The wait is short because
//     it holds up the Receive and every delivery buffered behind it: a
//     wait of PublishTimeout plus 10s, with workers killed at random
//     (RandomFaults), sent such deliveries round from worker to worker,
//     each kill counting a crash, until the soak ended with them unrun.
//
// A process that dies after the successor is stored and before the mark
// is done still leaves the two lines; a cut connection or a broker restart
// no longer does. Marks expire after goneTTL: a replaced message that
// comes back later than that runs again.

// instanceHeader carries a message's instance: 32 hex digits, new for
// every message and copy this backend publishes.
const instanceHeader = "x-asyncplatform-instance"

const (
	// goneTTL is how long a gone mark is kept.
	goneTTL = 24 * time.Hour

	// goneWait is how long a lookup waits for a pending mark to be
	// settled: a live writer settles it a store round trip after the
	// successor's confirm.
	goneWait = 2 * time.Second

	// gonePoll is how often a lookup reads a pending mark again.
	gonePoll = 50 * time.Millisecond
)

// Values of a gone mark.
var (
	gonePending = []byte("p")
	goneDone    = []byte("d")
)

// newInstance returns a fresh instance for instanceHeader.
func newInstance() string {
	var r [16]byte
	rand.Read(r[:])
	return hex.EncodeToString(r[:])
}

// instanceOf returns the instance of a delivery's headers, or "" when it
// has none this backend could have written (the headers are untrusted).
func instanceOf(h amqp.Table) string {
	s, ok := h[instanceHeader].(string)
	if !ok || len(s) != 32 {
		return ""
	}
	if _, err := hex.DecodeString(s); err != nil {
		return ""
	}
	return s
}

// withInstance returns h (made when nil) with a fresh instance.
func withInstance(h amqp.Table) amqp.Table {
	if h == nil {
		h = amqp.Table{}
	}
	h[instanceHeader] = newInstance()
	return h
}

func (b *Backend) goneKey(inst string) string { return b.cfg.Prefix + ":gone/" + inst }

// replacing marks the message of instance inst as being replaced, and
// returns the function that settles the mark once the successor's write
// has ended: done when stored is true, deleted otherwise. Without a store
// or an instance, or when the mark cannot be written, it marks nothing and
// the replacement goes on as before (a lost ack may then leave the two
// lines of copies the marks prevent).
func (b *Backend) replacing(ctx context.Context, inst string) (settle func(stored bool)) {
	st := b.cfg.Store
	if st == nil || inst == "" {
		return func(bool) {}
	}
	key := b.goneKey(inst)
	rev, err := st.Create(ctx, key, gonePending, goneTTL)
	if err != nil {
		b.log.Debug("gone mark not written; a lost ack would bring the replaced message back", "err", err)
		return func(bool) {}
	}
	return func(stored bool) {
		// The successor's write has ended: the mark is settled even when
		// the caller's context has ended meanwhile.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.PublishTimeout)
		defer cancel()
		var err error
		if stored {
			_, err = st.Update(ctx, key, goneDone, rev, goneTTL)
		} else {
			err = st.Delete(ctx, key, rev)
		}
		if err != nil {
			b.log.Debug("gone mark not settled; a lookup waits for it, then hands the message out", "stored", stored, "err", err)
		}
	}
}

// replaced reports whether d is a message whose successor is stored (see
// replacing). Only a delivery that went back to the queue unsettled is
// looked up.
func (b *Backend) replaced(ctx context.Context, d amqp.Delivery) bool {
	st := b.cfg.Store
	if st == nil || deliveryCount(d.Headers) == 0 && !d.Redelivered {
		return false
	}
	inst := instanceOf(d.Headers)
	if inst == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), goneWait)
	defer cancel()
	key := b.goneKey(inst)
	for {
		v, _, err := st.Get(ctx, key)
		switch {
		case errors.Is(err, driver.ErrKeyNotFound):
			return false
		case err != nil:
			b.log.Debug("gone mark not read; the delivery is handed out", "err", err)
			return false
		case string(v) == string(goneDone):
			return true
		}
		select {
		case <-ctx.Done():
			b.log.Warn("gone mark still pending; the delivery is handed out", "id", d.MessageId)
			return false
		case <-time.After(gonePoll):
		}
	}
}

// later runs f on a goroutine Close waits for, or at once when the
// Backend is closed.
func (b *Backend) later(f func()) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		f()
		return
	}
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		f()
	}()
}

// testBeforeAck runs Backend.beforeAck, a test's hook between a
// replacement's stored successor and its ack.
func (b *Backend) testBeforeAck() {
	if f := b.beforeAck.Load(); f != nil {
		(*f)()
	}
}
