package rabbit

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestReturnMatchesItsPublish: a return is matched to the publish it
// names (queue, message ID, instance), each return to one publish. Matched
// by message ID alone, a publish to a live queue took the return of one of
// the same job's to a queue that was gone, and that one was reported
// stored.
func TestReturnMatchesItsPublish(t *testing.T) {
	t.Parallel()
	p := &publisher{returns: make(chan amqp.Return, 8), returned: map[returnKey]returns{}}
	pub := func(queue, id string) outMsg {
		return outMsg{key: queue, pub: amqp.Publishing{MessageId: id, Headers: withInstance(nil)}}
	}
	back := func(m outMsg) {
		p.returns <- amqp.Return{RoutingKey: m.key, MessageId: m.pub.MessageId, Headers: m.pub.Headers}
	}
	gone, live := pub("gone", "job.1"), pub("live", "job.1")
	back(gone)
	if p.wasReturned(live) {
		t.Error("a publish to a live queue took the return of another of its message ID, to a queue that was gone")
	}
	if !p.wasReturned(gone) {
		t.Error("the returned publish was not reported returned")
	}
	twin := gone
	twin.pub.Headers = withInstance(nil)
	back(gone)
	if p.wasReturned(twin) {
		t.Error("a publish took the return of another instance to the same queue")
	}
	p.wasReturned(gone)
	// Two publishes without an instance, the same ID and queue, both back.
	a := outMsg{key: "gone", pub: amqp.Publishing{MessageId: "rec"}}
	back(a)
	back(a)
	for i := range 2 {
		if !p.wasReturned(a) {
			t.Errorf("two returns of one key: publish %d of them not matched", i+1)
		}
	}
	if p.wasReturned(a) {
		t.Error("a third publish of the key matched a return that was not there")
	}
}

// TestReturnedTwinsOnTheBroker: publishes of one message ID at once, one to
// a queue that does not exist and one to a live queue, on the real broker:
// the unroutable one always fails with ErrUnroutable, the other never.
func TestReturnedTwinsOnTheBroker(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	ctx := longCtx(t)
	q := queueName(t, b)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	missing := b.workName(q) + "-never-declared"
	var lies, swaps atomic.Int64
	const rounds, pairs = 250, 8
	for i := range rounds {
		var wg sync.WaitGroup
		for k := range pairs {
			id := fmt.Sprintf("job-%d-%d", i, k)
			wg.Go(func() {
				if err := b.publish(ctx, outMsg{key: missing, pub: amqp.Publishing{MessageId: id, Headers: withInstance(nil)}}); err == nil {
					lies.Add(1)
				}
			})
			wg.Go(func() {
				if err := b.publish(ctx, outMsg{key: b.workName(q), pub: amqp.Publishing{MessageId: id, Headers: withInstance(nil)}}); errors.Is(err, ErrUnroutable) {
					swaps.Add(1)
				}
			})
		}
		wg.Wait()
	}
	if lies.Load() > 0 || swaps.Load() > 0 {
		t.Errorf("of %d pairs: %d publishes to a missing queue reported stored, %d to a live queue reported unroutable", rounds*pairs, lies.Load(), swaps.Load())
	}
}
