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

// A message this backend replaces (Requeue, DeadLetter, a delay hop or
// sweep, a release's hand-back) is replaced by writing its successor, then
// acking it. AMQP acks are not confirmed: an ack lost to a cut connection
// or a broker restart brings the replaced message back, counted, beside
// its successor, and the job then runs in two lines of copies, each
// counting its own tries. With a companion store the backend keeps marks
// of the messages it replaces, and a delivery that may have been delivered
// before is acked without being handed out when its mark says it was
// replaced:
//
//   - every message this backend publishes carries a random instance
//     (instanceHeader, 128 bits from crypto/rand); a copy gets a new one,
//     so a mark names one stored message and a writer to the broker cannot
//     name a live one it has not read;
//   - a replacement writes a going mark (goingKey) before it writes the
//     successors, and a gone mark (goneKey) once they are stored, or
//     deletes the going marks when they were not: a release writes the
//     marks of all it hands back in one store call each; a delay hop, a
//     sweep and a release write the gone marks before their ack; Requeue
//     and DeadLetter after it, on a goroutine of their own, so that the
//     platform's outcome, which follows their return, is not held back by
//     a store round trip while the successor may already run and report
//     its own;
//   - a delivery that went back to the queue unsettled (x-delivery-count
//     or the redelivered flag) is looked up, a batch in one store call: a
//     gone mark, it is acked and dropped; a going mark alone, the lookup
//     waits for the writer's outcome, at most goneWait (a writer that died
//     meanwhile leaves the going mark until goingTTL: the delivery is then
//     handed out, as without a mark). The wait is short because it holds
//     up the Receive and every delivery buffered behind it: a wait of
//     PublishTimeout plus 10s, with workers killed at random
//     (RandomFaults), sent such deliveries round from worker to worker,
//     each kill counting a crash, until the soak ended with them unrun.
//
// A going mark is not deleted once its gone mark is written: a lookup that
// reads the two keys apart (a store without batches) and sees neither
// would hand a replaced message out.
//
// A process that dies after the successor is stored and before the gone
// mark is written still leaves the two lines; a cut connection or a broker
// restart no longer does. Gone marks expire after goneTTL: a replaced
// message that comes back later than that runs again.

// instanceHeader carries a message's instance: 32 hex digits, new for
// every message and copy this backend publishes.
const instanceHeader = "x-asyncplatform-instance"

const (
	// goneTTL is how long a gone mark is kept.
	goneTTL = 24 * time.Hour

	// goneWait is how long a lookup waits for a going mark to be settled:
	// a live writer settles it a store round trip after the successor's
	// confirm.
	goneWait = 2 * time.Second

	// gonePoll is how often a lookup reads a going mark again.
	gonePoll = 50 * time.Millisecond

	// goneBatch is how many instances one lookup or mark call carries (two
	// keys each in a lookup): within driver.MaxBatch.
	goneBatch = driver.MaxBatch / 2
)

// Values of the marks.
var (
	goingValue = []byte("p")
	goneValue  = []byte("d")
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

func (b *Backend) goneKey(inst string) string  { return b.cfg.Prefix + ":gone/" + inst }
func (b *Backend) goingKey(inst string) string { return b.cfg.Prefix + ":going/" + inst }

// goingTTL is how long a going mark is kept: well past the longest a
// writer takes from it to its successor's confirm.
func (b *Backend) goingTTL() time.Duration { return b.cfg.PublishTimeout + time.Minute }

// replacing writes the going marks of the messages of instances insts,
// which are being replaced, and returns the function that settles them
// once the successors' write has ended: gone marks written when stored is
// true, the going marks deleted otherwise. Without a store, for messages
// without an instance, or when a mark cannot be written, it marks nothing
// and the replacement goes on as before (a lost ack may then leave the two
// lines of copies the marks prevent).
func (b *Backend) replacing(ctx context.Context, insts ...string) (settle func(stored bool)) {
	st := b.cfg.Store
	var marked []string
	if st != nil {
		seen := make(map[string]bool, len(insts))
		for _, inst := range insts {
			if inst != "" && !seen[inst] {
				seen[inst] = true
				marked = append(marked, inst)
			}
		}
	}
	if len(marked) == 0 {
		return func(bool) {}
	}
	if err := b.markEach(ctx, marked, b.goingKey, goingValue, b.goingTTL()); err != nil {
		b.log.Debug("going marks not written; a lost ack would bring the replaced messages back", "messages", len(marked), "err", err)
		return func(bool) {}
	}
	return func(stored bool) {
		// The successors' write has ended: the marks are settled even
		// when the caller's context has ended meanwhile.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.PublishTimeout)
		defer cancel()
		var err error
		if stored {
			err = b.markEach(ctx, marked, b.goneKey, goneValue, goneTTL)
		} else {
			err = b.unmarkEach(ctx, marked)
		}
		if err != nil {
			b.log.Debug("marks of replaced messages not settled; a lookup waits for them, then hands the messages out", "stored", stored, "messages", len(marked), "err", err)
		}
	}
}

// markEach creates key(inst) for each of insts, goneBatch to a store call;
// one already there is as good.
func (b *Backend) markEach(ctx context.Context, insts []string, key func(string) string, v []byte, ttl time.Duration) error {
	for part := range chunks(insts, goneBatch) {
		items := make([]driver.BatchItem, len(part))
		for i, inst := range part {
			items[i] = driver.BatchItem{Key: key(inst), Value: v, TTL: ttl}
		}
		if _, err := driver.CreateEach(ctx, b.cfg.Store, items); err != nil {
			return err
		}
	}
	return nil
}

// unmarkEach deletes the going marks of insts.
func (b *Backend) unmarkEach(ctx context.Context, insts []string) error {
	for part := range chunks(insts, goneBatch) {
		items := make([]driver.BatchItem, len(part))
		for i, inst := range part {
			items[i] = driver.BatchItem{Key: b.goingKey(inst)}
		}
		if _, err := driver.DeleteEach(ctx, b.cfg.Store, items); err != nil {
			return err
		}
	}
	return nil
}

// chunks yields s in parts of at most n.
func chunks[T any](s []T, n int) func(func([]T) bool) {
	return func(yield func([]T) bool) {
		for len(s) > 0 {
			k := min(n, len(s))
			if !yield(s[:k]) {
				return
			}
			s = s[k:]
		}
	}
}

// redelivered reports whether d went back to the queue unsettled at least
// once: only such a delivery is looked up among the doubtful acks and the
// gone marks.
func redelivered(d amqp.Delivery) bool {
	return deliveryCount(d.Headers) > 0 || d.Redelivered
}

// replacedEach reports, for each of ds, whether it is a message whose
// successor is stored (see replacing). Only deliveries that went back to
// the queue unsettled are looked up, goneBatch to a store call; a lookup
// that fails counts as no mark.
func (b *Backend) replacedEach(ctx context.Context, ds []amqp.Delivery) []bool {
	out := make([]bool, len(ds))
	pending := map[string][]int{} // instance → indices in ds still to settle
	now := time.Now()
	for i, d := range ds {
		inst := instanceOf(d.Headers)
		switch {
		case inst == "":
		case b.doubt.has(now, inst) || b.recent.has(inst): // acked already (see lostack.go)
			out[i] = true
		case b.ran.has(now, originOf(d.Headers)): // a twin of one that ran (see twins.go)
			out[i] = true
		case b.cfg.Store != nil && redelivered(d):
			pending[inst] = append(pending[inst], i)
		}
	}
	if len(pending) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), goneWait)
	defer cancel()
	for {
		insts := make([]string, 0, len(pending))
		for inst := range pending {
			insts = append(insts, inst)
		}
		for part := range chunks(insts, goneBatch) {
			keys := make([]string, 0, 2*len(part))
			for _, inst := range part {
				keys = append(keys, b.goneKey(inst), b.goingKey(inst))
			}
			rs, err := driver.GetEach(ctx, b.cfg.Store, keys)
			if err != nil {
				b.log.Debug("gone marks not read; the deliveries are handed out", "messages", len(part), "err", err)
				for _, inst := range part {
					delete(pending, inst)
				}
				continue
			}
			for k, inst := range part {
				gone, going := rs[2*k], rs[2*k+1]
				switch {
				case gone.Err == nil:
					for _, i := range pending[inst] {
						out[i] = true
					}
					delete(pending, inst)
				case !errors.Is(going.Err, driver.ErrKeyNotFound):
					// The writer has not settled it yet: read it again.
				default:
					delete(pending, inst)
				}
			}
		}
		if len(pending) == 0 {
			return out
		}
		select {
		case <-ctx.Done():
			b.log.Warn("marks of replaced messages still pending; the deliveries are handed out", "messages", len(pending))
			return out
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

// testTraceDelivery reports d to Backend.traceDelivery, a test's hook,
// with what Receive did with it.
func (b *Backend) testTraceDelivery(d amqp.Delivery, what string) {
	if f := b.traceDelivery.Load(); f != nil {
		(*f)(d, what)
	}
}
