package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	gonats "github.com/nats-io/nats.go"
)

// TestCancelledReceiveSkipsLaterCopies: on a server without the
// stale-request bug (the in-process 2.15), once a Receive whose ctx ended
// has returned, its pull request (still open on the server for up to
// PollWait) takes nothing this process publishes afterwards. The platform
// relies on it when it isolates a suspect: it cancels the Receive, hands
// back the deliveries it had queued (new copies, published by the same
// Backend) and runs the suspect, which may kill the process; a copy the
// old request took died with it, and an innocent job was charged a crash
// (the fault suite's PoisonIsolation, about 1 run in 20). The message
// published after the cancelled Receive must not be delivered at all.
// (Before 2.10.14 the request keeps its inbox: see the package
// documentation, Receiving.)
func TestCancelledReceiveSkipsLaterCopies(t *testing.T) {
	t.Parallel()
	url := startServer(t, t.TempDir(), 0).ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 5 {
		q := queueName(t) + "-" + string(rune('a'+i))
		b := newBackend(t, url, q)
		rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond) // long-polls: the queue is empty
		ds, err := b.Receive(rctx, q, 10, 5*time.Second)
		rcancel()
		if !errors.Is(err, context.DeadlineExceeded) || len(ds) != 0 {
			t.Fatalf("Receive on an empty queue: %d deliveries, %v", len(ds), err)
		}
		if err := b.Enqueue(ctx, q, []driver.Message{{ID: q, Body: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // a request left open would have taken it by now
		c, err := b.work.Consumer(ctx, workConsumer(q))
		if err != nil {
			t.Fatal(err)
		}
		if info := c.CachedInfo(); info.Delivered.Consumer != 0 || info.NumPending != 1 {
			t.Fatalf("round %d: after a cancelled Receive, a message published later was delivered %d times (pending %d, want 1): "+
				"the cancelled Receive's pull request took it", i, info.Delivered.Consumer, info.NumPending)
		}
	}
}

// TestLongPollReturnsAtOnce: a Receive that found the queue empty and
// long-polled returns the message that ended the poll without sending
// another pull request for the rest, so the first job of a burst does not
// wait a round trip (what else is ready is the next Receive's). The pull
// requests are watched on their API subject from a connection of the
// test's own.
func TestLongPollReturnsAtOnce(t *testing.T) {
	t.Parallel()
	url := startServer(t, t.TempDir(), 0).ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := queueName(t)
	b := newBackend(t, url, q)
	watch, err := gonats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	pulls := make(chan pullRequest, 16)
	sub, err := watch.Subscribe("$JS.API.CONSUMER.MSG.NEXT."+b.cfg.Stream+"."+workConsumer(q), func(m *gonats.Msg) {
		var r pullRequest
		_ = json.Unmarshal(m.Data, &r)
		pulls <- r
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}

	type result struct {
		ds  []*driver.Delivery
		err error
	}
	done := make(chan result, 1)
	go func() {
		ds, err := b.Receive(ctx, q, 10, 5*time.Second)
		done <- result{ds, err}
	}()
	for polled := false; !polled; {
		select {
		case r := <-pulls:
			polled = r.Expires > 0
		case <-ctx.Done():
			t.Fatal("the Receive never long-polled")
		}
	}
	msgs := make([]driver.Message, 5)
	for i := range msgs {
		msgs[i] = driver.Message{ID: fmt.Sprintf("%s-%d", q, i), Body: []byte("x")}
	}
	if err := b.Enqueue(ctx, q, msgs); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil || len(res.ds) == 0 {
		t.Fatalf("Receive: %d deliveries, %v", len(res.ds), res.err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	select {
	case r := <-pulls:
		t.Fatalf("after the long poll's message came, the Receive sent another pull request (%+v) before returning %d deliveries", r, len(res.ds))
	default:
	}
}
