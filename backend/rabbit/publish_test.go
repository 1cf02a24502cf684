package rabbit

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestNackLeavesOthersSingle: a nacked publish makes the backend move to a
// new publishing channel, and the publishes of other callers still waiting
// for their confirms on the old one must not be stored twice. Closing the
// old channel at once resolved their confirms as not acked, and they were
// sent again although the broker had already enqueued them: two copies of a
// job (Outcomes/OutputOnePerJob on a cluster, where a new quorum queue
// nacks now and then). The nacks here come from a queue that rejects every
// publish (x-max-length 0, reject-publish).
func TestNackLeavesOthersSingle(t *testing.T) {
	b := newBackend(t, Config{URL: testURL()})
	ctx := testCtx(t)
	q := queueName(t, b)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	full := b.workName(q) + ".full"
	ch := amqpChannel(t, testURL())
	if _, err := ch.QueueDeclare(full, false, false, false, false, amqp.Table{"x-max-length": int64(0), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.QueueDelete(full, false, false, false) })

	stop := make(chan struct{})
	var nacked atomic.Int64
	var nackers sync.WaitGroup
	nackers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			err := b.publish(ctx, outMsg{key: full, pub: amqp.Publishing{MessageId: "full", Body: []byte("x")}})
			if !errors.Is(err, ErrNacked) {
				t.Errorf("publish to a full queue: %v, want ErrNacked", err)
				return
			}
			nacked.Add(1)
		}
	})
	const writers, each = 8, 60
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				m := outMsg{key: b.workName(q), pub: amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: fmt.Sprintf("w%d-%d", w, i), Body: []byte("x")}}
				if err := b.publish(ctx, m); err != nil {
					t.Errorf("publish %s: %v", m.pub.MessageId, err)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	nackers.Wait()
	if nacked.Load() == 0 {
		t.Fatal("no publish was nacked meanwhile")
	}
	st, err := b.Stats(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(writers * each); st.Ready != want {
		t.Errorf("the work queue holds %d messages, want the %d published once each (%d nacked publishes meanwhile)", st.Ready, want, nacked.Load())
	}
}
