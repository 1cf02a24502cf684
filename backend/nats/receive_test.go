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
	// A channel subscription: the client puts each request in it on its
	// read loop, so once watch.Flush returns every request the server
	// routed before is there.
	reqs := make(chan *gonats.Msg, 64)
	sub, err := watch.ChanSubscribe("$JS.API.CONSUMER.MSG.NEXT."+b.cfg.Stream+"."+workConsumer(q), reqs)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	pull := func(m *gonats.Msg) pullRequest {
		var r pullRequest
		_ = json.Unmarshal(m.Data, &r)
		return r
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
		case m := <-reqs:
			polled = pull(m).Expires > 0
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
	if res.err != nil || len(res.ds) != 1 {
		t.Fatalf("Receive after a long poll: %d deliveries, %v; want the one that ended the poll, at once", len(res.ds), res.err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case m := <-reqs:
			// Another long poll is the poll's own renewal (PollWait ran
			// out before the enqueue on a stalled machine).
			if r := pull(m); r.NoWait {
				t.Fatalf("after the long poll's message came, the Receive sent a pull without waiting (%+v) before returning", r)
			}
		default:
			return
		}
	}
}
