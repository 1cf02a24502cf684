package rabbit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// The count base (baseHeader) is the one count a writer to the broker
// sets: RabbitMQ overwrites x-delivery-count whatever the publisher wrote
// (TestForgedDeliveryCountFact). Unchecked, a writer could replay a
// message with a large base and have the platform take that copy for a
// poison job. So a base is counted only when it is bound or bounded:
//
//   - with Config.Store, a hand-back writes the key p:base/<instance> of
//     each copy that carries a base (the copy's own instance, new for every
//     copy), with the base as its value, before it publishes the copies; a
//     delivery's base counts only when that key holds that value. The key
//     lives baseTTL: a copy handed out later than that counts no base;
//   - without a store, a base counts up to maxBase.
//
// A base that does not count is logged at WARN with a *BaseError, and the
// delivery is handed out counting the broker's deliveries alone.
const (
	// baseTTL is how long a copy's base key is kept.
	baseTTL = 7 * 24 * time.Hour

	// maxBase is the largest base counted without a store: a base is the
	// deliveries of a message that were never handed out by this backend
	// before it was handed back, a handful at most.
	maxBase = 16
)

// BaseError says why a delivery's count base (the header
// x-asyncplatform-base, which any writer to the broker can set) was not
// counted: the delivery is handed out counting the broker's deliveries
// alone.
type BaseError struct {
	ID       string // the message's AMQP message-id, quoted when shown
	Instance string // its instance ("" when it has none this backend wrote)
	Base     int64  // the base it carried
	Reason   string // why it does not count
}

func (e *BaseError) Error() string {
	return fmt.Sprintf("rabbit: message %q (instance %q): count base %d not counted: %s", e.ID, e.Instance, e.Base, e.Reason)
}

func (b *Backend) baseKey(inst string) string { return b.cfg.Prefix + ":base/" + inst }

// bindTries is how many instances bindBases tries for one copy whose
// base key is taken before it gives up.
const bindTries = 3

// errBaseKeyTaken is matched by the error of bindBases when a copy's base
// key was taken for each of bindTries fresh instances: the hand-back then
// fails, and the originals come back with their own bases still bound.
var errBaseKeyTaken = errors.New("rabbit: a handed-back copy's count base key is taken")

// bindBases writes the base keys of the copies among msgs that carry a
// base, before they are published (see the comment above). A key that is
// taken already (written by another writer to the store) would leave the
// copy's base uncounted when it is handed out: the copy gets a new
// instance and its key is written again, up to bindTries instances, then
// the error matches errBaseKeyTaken. Without a store it writes nothing.
func (b *Backend) bindBases(ctx context.Context, msgs []outMsg) error {
	if b.cfg.Store == nil {
		return nil
	}
	var carry []int // indices in msgs of the copies that carry a base
	for i, m := range msgs {
		if n, ok := asInt(m.pub.Headers[baseHeader]); ok && n > 0 {
			carry = append(carry, i)
		}
	}
	for try := 1; len(carry) > 0; try++ {
		var taken []int
		for part := range chunks(carry, goneBatch) {
			items := make([]driver.BatchItem, len(part))
			for k, i := range part {
				n, _ := asInt(msgs[i].pub.Headers[baseHeader])
				items[k] = driver.BatchItem{Key: b.baseKey(instanceOf(msgs[i].pub.Headers)), Value: []byte(strconv.FormatInt(n, 10)), TTL: baseTTL}
			}
			rs, err := driver.CreateEach(ctx, b.cfg.Store, items)
			if err != nil {
				return fmt.Errorf("rabbit: write the count bases of handed-back copies: %w", err)
			}
			for k, r := range rs {
				if r.Err != nil { // driver.ErrKeyExists
					taken = append(taken, part[k])
				}
			}
		}
		if len(taken) > 0 && try == bindTries {
			return fmt.Errorf("%w: message %q, %d instances tried", errBaseKeyTaken, msgs[taken[0]].pub.MessageId, bindTries)
		}
		for _, i := range taken {
			msgs[i].pub.Headers = withInstance(msgs[i].pub.Headers)
		}
		carry = taken
	}
	return nil
}

// basesEach returns the base each of ds counts (see the comment above):
// one store call for those that carry one, none when no delivery does.
func (b *Backend) basesEach(ctx context.Context, ds []amqp.Delivery) []int {
	out := make([]int, len(ds))
	var asked []int // indices in ds to look up
	refuse := func(i int, n int64, reason string) {
		d := ds[i]
		b.log.Warn("a delivery's count base is not counted", "queue", d.RoutingKey, "err", &BaseError{ID: d.MessageId, Instance: instanceOf(d.Headers), Base: n, Reason: reason})
	}
	for i, d := range ds {
		n, ok := asInt(d.Headers[baseHeader])
		switch {
		case !ok || n <= 0:
		case b.cfg.Store == nil && n > maxBase:
			refuse(i, n, fmt.Sprintf("more than %d, the most counted without a store", maxBase))
		case b.cfg.Store == nil:
			out[i] = int(n)
		case instanceOf(d.Headers) == "":
			refuse(i, n, "the message has no instance, so no base key")
		default:
			asked = append(asked, i)
		}
	}
	if len(asked) == 0 {
		return out
	}
	// The deliveries are in hand whatever ctx does, but a stalled store
	// must not hold them (and the Receive) for good: a lookup that ends
	// with the timeout counts no base.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.PublishTimeout)
	defer cancel()
	for part := range chunks(asked, driver.MaxBatch) {
		keys := make([]string, len(part))
		for k, i := range part {
			keys[k] = b.baseKey(instanceOf(ds[i].Headers))
		}
		rs, err := driver.GetEach(ctx, b.cfg.Store, keys)
		for k, i := range part {
			n, _ := asInt(ds[i].Headers[baseHeader])
			switch {
			case err != nil:
				refuse(i, n, "its base key could not be read: "+err.Error())
			case rs[k].Err != nil:
				refuse(i, n, "no base key holds it (not written by a hand-back of this backend, or older than "+baseTTL.String()+")")
			case string(rs[k].Value) != strconv.FormatInt(n, 10):
				refuse(i, n, "its base key holds another base")
			default:
				out[i] = int(n)
			}
		}
	}
	return out
}
